"""Reranker heads served behind the seam (core/inference/heads.py): `crossprobe:<heads dir>` encodes with the
backbone's graphs plus the heads', and its rerank over the 64 training pairs gives the trained ranking."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from crossprobe.core import inference
from crossprobe.models import heads
from crossprobe.cli import app
from crossprobe.models.data.captioned import CaptionedFolder
from crossprobe.models.evaluation.captioned import candidates, encode_images, encode_texts
from crossprobe.core.inference import ItemDims, RerankerUnavailable, RuntimeOptions
from crossprobe.core.inference.heads import BackboneChanged, HeadsBackend
from tests.support.tiny_heads import PAIRS


@pytest.fixture(scope="module")
def served(tiny_heads):
    backend = inference.load(tiny_heads.spec, RuntimeOptions(graphs=tiny_heads.graphs, threads=1))
    folder = CaptionedFolder.load(tiny_heads.data)
    feats, kept, _ = encode_images(backend, folder, list(range(len(folder.images))))
    return backend, folder, feats, encode_texts(backend, folder.captions)


def test_a_heads_dir_is_served_with_its_backbone(tiny_heads, served):
    backend, _, _, _ = served
    cfg = tiny_heads.config
    assert isinstance(backend, HeadsBackend) and backend.rerankers == ("cp", "temde")
    assert backend.fingerprint == cfg["fingerprint"] != cfg["backbone_fingerprint"]
    assert backend.dims.item == ItemDims(4, 32, 32 * 8, 0) and backend.dims.d == cfg["model"]["d"]
    two_tower = inference.load(tiny_heads.backbone, RuntimeOptions(graphs=tiny_heads.graphs))
    assert two_tower.rerankers == () and two_tower.dims.item == ItemDims(0, 0, 0, 0)  # no heads: two-tower only
    with pytest.raises(RerankerUnavailable):
        two_tower.require_reranker("cp")


def test_the_two_tower_score_is_the_backbones_own(tiny_heads, served):
    backend, folder, feats, queries = served
    two_tower = inference.load(tiny_heads.backbone, RuntimeOptions(graphs=tiny_heads.graphs))
    bf, _, _ = encode_images(two_tower, folder, list(range(len(folder.images))))
    np.testing.assert_allclose(feats.g, bf.g, atol=1e-6)
    np.testing.assert_allclose(np.stack([q.g_q for q in queries]),
                               np.stack([q.g_q for q in two_tower.encode_texts(folder.captions)]), atol=1e-6)


def test_the_graphs_compute_what_the_trained_heads_do(tiny_heads, served):
    backend, folder, feats, queries = served
    model, _ = heads.load(tiny_heads.heads)
    grid = backend.image_grid(np.stack([backend.preprocess(Image.open(folder.image_path(i))) for i in range(4)]))
    with torch.inference_mode():
        want = model.encode_image(torch.from_numpy(grid.cells))
        _, tokens, mask = backend.backbone.text_tokens(folder.captions[:4])
        want_q = model.encode_text(torch.from_numpy(tokens), torch.from_numpy(mask))
    for got, w in zip((feats.p_v[:4], feats.b_bar[:4], feats.s_i[:4]), want):
        np.testing.assert_allclose(got, w.numpy(), atol=1e-4)
    for i, q in enumerate(queries[:4]):
        for got, w in zip((q.p_t, q.w_bar, q.s_q), want_q):
            np.testing.assert_allclose(got, w[i].numpy(), atol=1e-4)


def test_reranking_the_64_gives_the_trained_ranking(served):
    backend, folder, feats, queries = served
    s_tt = np.stack([q.g_q for q in queries]) @ feats.g.T
    everything = np.arange(len(folder.images))
    firsts = [int(np.argmax(backend.rerank("cp", q, candidates(feats, everything), s_tt[j])))
              for j, q in enumerate(queries)]
    assert firsts == folder.caption_image  # every caption's own photo first, as in training (R@1 100)
    assert np.mean(s_tt.argmax(1) == np.asarray(folder.caption_image)) < 0.5  # the backbone alone: far from it


def test_eval_on_the_folder_reports_both_rankings(tiny_heads, tmp_path):
    runner = CliRunner()
    out = tmp_path / "eval.json"
    res = runner.invoke(app, ["eval", "--data", str(tiny_heads.data), "--model", tiny_heads.spec, "--split", "train",
                              "--graphs", str(tiny_heads.graphs), "--json", str(out)])
    assert res.exit_code == 0, res.output
    j = json.loads(out.read_text())
    assert (j["images"], j["captions"], j["fingerprint"]) == (PAIRS, PAIRS, tiny_heads.config["fingerprint"])
    assert j[f"CP@{PAIRS}"]["t2i"]["R@1"] == 100.0 and j[f"shortlist_recall@{PAIRS}"] == 100.0
    trained = tiny_heads.config["metrics"]["train"]
    assert j["TT"]["t2i"]["R@1"] == trained["TT"]["t2i"]["R@1"]
    res = runner.invoke(app, ["eval", "--data", str(tiny_heads.data), "--model", tiny_heads.backbone, "--split", "train",
                              "--graphs", str(tiny_heads.graphs), "--json", str(tmp_path / "tt.json")])
    assert res.exit_code == 0, res.output
    two_tower = json.loads((tmp_path / "tt.json").read_text())
    assert two_tower["TT"] == j["TT"] and "CP@64" not in two_tower  # the same two-tower numbers, no rerankers


def test_heads_on_other_weights_are_refused(tiny_heads, tmp_path):
    copy = tiny_heads.copy_with(tmp_path / "heads", backbone_fingerprint="0" * 16)
    with pytest.raises(BackboneChanged, match="train the heads again"):
        inference.load(f"crossprobe:{copy}", RuntimeOptions(graphs=tiny_heads.graphs))


def test_missing_head_graphs_are_exported_on_first_use(tiny_heads, tmp_path):
    graphs = tmp_path / "graphs"
    shutil.copytree(tiny_heads.graphs, graphs, ignore=shutil.ignore_patterns(tiny_heads.config["fingerprint"]))
    backend = inference.load(tiny_heads.spec, RuntimeOptions(graphs=graphs))
    assert len(backend.encode_texts(["a dog"])[0].s_q) == 32 * 8
    assert (graphs / tiny_heads.config["fingerprint"] / "text_head.onnx").is_file()
