"""Where the service runs its model (CROSSPROBE_DEVICE, `crossprobe serve --device`): /readyz names the device, a GPU
asked for on a machine without one fails start-up with the reason in /readyz and the log, and the CPU path is the
one served by default here. The GPU itself is exercised by scripts/gpu-check.sh on a lent machine."""
from __future__ import annotations

import logging
import time

import pytest
import torch
from typer.testing import CliRunner

from crossprobe.service.routes.indexes import device_of
from tests.service.conftest import service_settings


def test_readyz_names_the_device(client):
    body = client.get("/readyz").json()
    assert body["status"] == "ready" and body["device"] == "cpu"


class _Backend:
    def __init__(self, providers, name=None):
        self.providers, self._name = providers, name

    def device_name(self):
        return self._name


@pytest.mark.parametrize("providers, name, want", [
    (["torch:cuda"], "NVIDIA H200", "cuda:0 (NVIDIA H200)"),
    (["torch:cuda:1"], "NVIDIA H100 80GB HBM3", "cuda:1 (NVIDIA H100 80GB HBM3)"),
    (["CUDAExecutionProvider", "CPUExecutionProvider"], None, "cuda (ONNX Runtime)"),
    (["CPUExecutionProvider"], None, "cpu"), (["torch:cpu"], "cpu", "cpu"), ([], None, "cpu")])
def test_device_of_each_backend(providers, name, want):
    assert device_of(_Backend(providers, name)) == want


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_asked_for_without_one_fails_start_up_and_says_why(built, svc_ckpt, artifacts, caplog):
    from fastapi.testclient import TestClient

    from crossprobe.service.app import create_app

    with caplog.at_level(logging.ERROR, "crossprobe.service"):
        with TestClient(create_app(service_settings(built, svc_ckpt, artifacts, device="cuda"))) as c:
            for _ in range(400):
                if c.get("/healthz").status_code == 503:
                    break
                time.sleep(0.05)
            r = c.get("/readyz")
            assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
            msg = r.json()["error"]["message"]
            assert msg.startswith("start-up failed: RuntimeError: CROSSPROBE_DEVICE=cuda: PyTorch sees no CUDA device"), msg
            assert c.get("/healthz").json()["error"]["code"] == "startup_failed"
    assert "start-up failed" in caplog.text and "PyTorch sees no CUDA device" in caplog.text


@pytest.mark.parametrize("arg, want", [("cuda", "cuda"), ("CUDA:1", "cuda:1"), ("cpu", "cpu"), ("auto", "auto")])
def test_serve_device_option_reaches_the_settings(monkeypatch, arg, want):
    from crossprobe.service import server
    from crossprobe.cli import app

    seen = []
    monkeypatch.setattr(server, "serve", seen.append)
    r = CliRunner().invoke(app, ["serve", "--device", arg])
    assert r.exit_code == 0, r.output
    assert seen[0].device == want


def test_serve_device_option_refuses_other_names(monkeypatch):
    from crossprobe.service import server
    from crossprobe.cli import app

    monkeypatch.setattr(server, "serve", lambda s: pytest.fail("must not start"))
    r = CliRunner().invoke(app, ["serve", "--device", "gpu"])
    assert r.exit_code == 2 and "cpu, cuda, cuda:N or auto" in r.output


def test_serve_without_the_option_keeps_the_environments_device(monkeypatch):
    from crossprobe.service import server
    from crossprobe.cli import app

    seen = []
    monkeypatch.setattr(server, "serve", seen.append)
    monkeypatch.setenv("CROSSPROBE_DEVICE", "cpu")
    assert CliRunner().invoke(app, ["serve"]).exit_code == 0 and seen[0].device == "cpu"
