"""`crossprobe train --backbone` (models/training/backbone_heads.py): reranker heads on a tiny random HF CLIP's
frozen outputs overfit 64 pairs (issue 47's must-show "Training on a backbone works"); the checkpoint and its graphs."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from crossprobe.models import heads
from crossprobe.cli import app
from crossprobe.models.training.backbone_heads import HeadsTrainConfig, with_settings
from tests.support.tiny_heads import PAIRS


def test_heads_overfit_64_pairs_of_a_random_backbone(tiny_heads):
    cfg = tiny_heads.config
    train = cfg["metrics"]["train"]
    assert train["images"] == train["captions"] == PAIRS
    # with the reranker every caption finds its photo first; the backbone's own random two-tower ranking does not
    assert train[f"CP@{PAIRS}"]["t2i"]["R@1"] == 100.0
    assert train["TT"]["t2i"]["R@1"] < 50.0 < train[f"TEMDE@{PAIRS}"]["t2i"]["R@1"]
    for method in ("cp", "temde"):  # the loss falls: in-batch pretraining, then listwise over mined negatives
        pre = [r["loss"] for r in cfg["training"][method]["pretrain"]]
        assert len(pre) == 150 and pre[-1] < 0.5 * pre[0]
    assert cfg["data"]["selection"] == "train"  # no dev split in the folder: said, not hidden
    assert f"| train | {PAIRS} | {PAIRS} | CP@{PAIRS} | 100.0 |" in tiny_heads.output  # the card, printed


def test_the_checkpoint_is_a_heads_dir_bound_to_its_backbone(tiny_heads):
    cfg = tiny_heads.config
    backbone = json.loads(next(tiny_heads.graphs.glob("*/model.json")).read_text())
    assert cfg["kind"] == "heads" and cfg["backbone"] == tiny_heads.backbone
    assert cfg["backbone_fingerprint"] == backbone["fingerprint"]
    grid, text_width = backbone["dims"]["grid"], backbone["dims"]["text_width"]
    assert (cfg["model"]["cells"], cfg["model"]["image_width"], cfg["model"]["text_width"]) == (*grid, text_width)
    model, meta = heads.load(tiny_heads.heads)
    assert heads.fingerprint(model, cfg["backbone_fingerprint"]) == cfg["fingerprint"] == meta["fingerprint"]
    assert heads.fingerprint(model, "0" * 16) != cfg["fingerprint"]  # the backbone is part of the heads' identity
    assert model.cp.pos is None  # no grid positions added to ViT tokens
    for name in ("image_head", "text_head", "cp_scorer", "temde_scorer"):
        assert (tiny_heads.graphs / cfg["fingerprint"] / f"{name}.onnx").is_file()
    assert (tiny_heads.heads / "MODEL_CARD.md").read_text().startswith(f"# Reranker heads on {tiny_heads.backbone}")


def test_tampered_heads_are_refused(tiny_heads, tmp_path):
    with pytest.raises(ValueError, match="fingerprint"):  # other heads' backbone, or edited weights
        heads.load(tiny_heads.copy_with(tmp_path / "heads", backbone_fingerprint="0" * 16))


def test_settings_and_usage_errors():
    cfg = with_settings(HeadsTrainConfig("hf:x", "d", None, "g"), "epochs=3, lr=1e-3,cp.d=64,temde.N=10")
    assert (cfg.epochs, cfg.lr, cfg.cp.d, cfg.temde.N, cfg.cp.inputs) == (3, 1e-3, 64, 10, "backbone")
    for bad in ("cp.inputs=tower", "epoch=3", "lr"):
        with pytest.raises(ValueError, match="--heads"):
            with_settings(cfg, bad)
    runner = CliRunner()
    res = runner.invoke(app, ["train", "--backbone", "hf:x"])
    assert res.exit_code == 2 and "go together" in res.output


def test_crossprobes_own_model_is_not_a_backbone(tmp_path):
    (tmp_path / "d" / "images").mkdir(parents=True)
    (tmp_path / "d" / "captions.tsv").write_text("image\tcaption\n")
    res = CliRunner().invoke(app, ["train", "--backbone", "crossprobe:", "--data", str(tmp_path / "d"), "--graphs",
                                   str(tmp_path / "g")])
    assert res.exit_code == 2 and "heads train on a model family's backbone" in res.output
