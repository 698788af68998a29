"""`crossprobe models export | list | pull` (cli/models.py, models/families/pull.py). pull never reaches a real
hub here: its refusals are tested with HF_HUB_OFFLINE=1, a refused connection, and a host that accepts and never
answers (the command must give up within its --timeout, not hang)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from typer.testing import CliRunner

from crossprobe.cli import app
from tests.support import reference_models as rm


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return rm.build("hf_clip", tmp_path_factory.mktemp("ref") / "clip", size="tiny")


def test_export_prints_the_folder_and_fingerprint_and_list_shows_it(clip, tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["models", "export", f"hf:{clip.path}", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    meta = json.loads(next(tmp_path.glob("*/model.json")).read_text())
    assert str(tmp_path / meta["fingerprint"]) in r.output and f"fingerprint {meta['fingerprint']}" in r.output
    assert "ids equal" in r.output and "image.onnx" in r.output  # the checks it ran
    r = runner.invoke(app, ["models", "list", "--root", str(tmp_path)])
    assert r.exit_code == 0
    row = [line for line in r.output.splitlines() if meta["fingerprint"] in line][0]
    assert "hf_clip" in row and f"hf:{clip.path}" in row and "d 16 grid 49x64 text 32" in row and "MiB" in row


def test_export_refusals_exit_with_a_usage_error(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["models", "export", "clip:ViT-B-32", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "unknown family" in r.output
    r = runner.invoke(app, ["models", "export", "open_clip:ViT-B-32/laion2b_s34b_b79k", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "pip install 'crossprobe[open_clip]'" in r.output  # no open_clip in the main .venv
    r = runner.invoke(app, ["models", "list", "--root", str(tmp_path / "none")])
    assert r.exit_code == 0 and "no exported models" in r.output


def _pull(*args, timeout=60, **env):
    """The real command line in a process of its own (HF_HUB_OFFLINE is read when the command starts)."""
    full = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")} | env
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-c", "from crossprobe.cli import app; app()", "models", "pull", *args],
                       env=full,
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr, time.monotonic() - t


WHAT_TO_DO = "Download the model on a machine that has a network"


def test_pull_says_what_to_do_when_offline_mode_is_set():
    rc, out, _ = _pull("hf:openai/clip-vit-base-patch32", HF_HUB_OFFLINE="1")
    assert rc == 3 and "HF_HUB_OFFLINE=1 is set" in out and WHAT_TO_DO in out and "hf:<dir>" in out


def test_pull_says_what_to_do_when_the_network_is_blocked():
    with socket.socket() as s:  # a port nothing listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, out, _ = _pull("hf:openai/clip-vit-base-patch32", "--timeout", "2", HF_ENDPOINT=f"http://127.0.0.1:{port}")
    assert rc == 3 and "no network" in out and "Connection refused" in out and WHAT_TO_DO in out


def test_pull_gives_up_on_a_host_that_never_answers():
    """A host that accepts connections and never answers (a captive proxy, a dead hub): every request has the
    command's timeout, so it ends with the same advice instead of hanging (huggingface_hub sets none itself)."""
    server = socket.create_server(("127.0.0.1", 0))
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass

    threading.Thread(target=accept, daemon=True).start()
    try:
        rc, out, took = _pull("hf:openai/clip-vit-base-patch32", "--timeout", "1",
                              HF_ENDPOINT=f"http://127.0.0.1:{server.getsockname()[1]}")
    finally:
        stop.set()
        server.close()
        for c in held:
            c.close()
    assert rc == 3 and "stopped answering" in out and WHAT_TO_DO in out
    assert took < 40, f"took {took:.0f} s"  # interpreter start + retries with 1 s timeouts, not a hang


def test_pull_of_a_local_folder_has_nothing_to_do(clip):
    r = CliRunner().invoke(app, ["models", "pull", f"hf:{clip.path}"])
    assert r.exit_code == 0 and "nothing to pull" in r.output
