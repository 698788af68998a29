"""`crossprobe checkpoint set-region-labels` / `set-temde` (cli/checkpoint.py over training/adopt.py) on a tiny
checkpoint: the written checkpoint loads with the setting asked for, and a setting the service cannot run is an
error (exit 2) that writes nothing."""
import dataclasses
import json

import pytest
import torch
from typer.testing import CliRunner

from crossprobe.models import checkpoint
from crossprobe.cli import app
from crossprobe.models.temde import Temde

runner = CliRunner()


@pytest.fixture()
def src(small_model, tmp_path):
    checkpoint.save(small_model, tmp_path / "src")
    return tmp_path / "src"


def _run(*args):
    return runner.invoke(app, ["checkpoint", *map(str, args)])


def test_checkpoint_commands_are_listed():
    out = _run("--help")
    assert out.exit_code == 0 and "set-region-labels" in out.output and "set-temde" in out.output


def test_set_region_labels_writes_a_loadable_checkpoint(src, bert, tmp_path):
    out = _run("set-region-labels", "--ckpt", src, "--out", tmp_path / "out", "--cp", 0.1, "--pool", 2)
    assert out.exit_code == 0, out.output
    model, meta = checkpoint.load(tmp_path / "out", bert)
    assert model.cfg.region.weights == {"cp": 0.1} and model.cfg.region.pool == 2
    assert meta["fingerprint"] in out.output and meta["region_labels"]["command"].startswith("crossprobe ")
    assert meta["region_labels"]["source_checkpoint"] == checkpoint.read_config(src)["fingerprint"]


@pytest.mark.parametrize("bad", [("--pool", 0), ("--cp", -1)])
def test_set_region_labels_refuses_a_bad_setting(src, tmp_path, bad):
    out = _run("set-region-labels", "--ckpt", src, "--out", tmp_path / "out", *bad)
    assert out.exit_code == 2 and not (tmp_path / "out").exists()


def test_set_temde_takes_a_train_stage_file(src, small_model, bert, tmp_path):
    other = Temde(dataclasses.replace(small_model.cfg.temde, N=6))
    torch.save({"weights": other.state_dict(), "report": {"best_epoch": 2}}, tmp_path / "temde.done.pt")
    out = _run("set-temde", tmp_path / "temde.done.pt", "--ckpt", src, "--out", tmp_path / "out")
    assert out.exit_code == 0, out.output
    model, meta = checkpoint.load(tmp_path / "out", bert)
    assert model.cfg.temde.N == 6 and meta["training"]["temde"]["best_epoch"] == 2
    assert meta["training"]["temde"]["from"] == str(tmp_path / "temde.done.pt")
    assert torch.allclose(model.temde.centroids, other.centroids, atol=1e-3)
    torch.save({"nothing": 1}, tmp_path / "bad.pt")
    bad = _run("set-temde", tmp_path / "bad.pt", "--ckpt", src, "--out", tmp_path / "out2")
    assert bad.exit_code == 2 and not (tmp_path / "out2").exists()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["fingerprint"] == meta["fingerprint"]


def test_fit_text_gate_refuses_other_fonts_and_writes_nothing(tmp_path, monkeypatch):
    """Drawn with other fonts, the generated signs are other sets and the fit another gate: the command says what to
    install instead of overwriting the served gate with it."""
    pytest.importorskip("rapidocr_onnxruntime")  # the ocr extra: its own message comes first without it
    from crossprobe.models.data import flickr8k
    from crossprobe.models.training import text_gate_sets

    monkeypatch.setattr(flickr8k, "available", lambda root=None: True)
    monkeypatch.setattr(text_gate_sets, "FONTS", text_gate_sets.FONTS + ["/nonexistent/LiberationSans-Regular.ttf"])
    out = runner.invoke(app, ["fit-text-gate", "--out", str(tmp_path / "gate"), "--workdir", str(tmp_path / "w")])
    assert out.exit_code == 2 and "fonts-liberation" in out.output and "/nonexistent/" in out.output
    assert not (tmp_path / "gate").exists() and not (tmp_path / "w").exists()
