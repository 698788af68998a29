"""crossprobe's own model behind the inference seam (core/inference/crossprobe.py): what it loads, when, and that
its two image steps, its texts and its scorers give what the PyTorch model gives."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from crossprobe.core import inference
from crossprobe.models import checkpoint
from crossprobe.core.inference import FeatureDims, ImageGrid, RuntimeOptions
from crossprobe.core.inference.crossprobe import describe
from tests.service.conftest import artifacts, svc_ckpt  # noqa: F401 (fixtures)


def _pixels(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 3, 224, 224)).astype(np.float32)


def test_an_indexer_loads_only_the_image_parts(svc_ckpt, artifacts):
    model = inference.load(svc_ckpt, RuntimeOptions(graphs=artifacts, threads=1))
    assert not model.sessions(), "nothing is loaded before a part is used"
    feats = model.encode_images(_pixels(2))
    assert set(model.sessions()) == {"backbone", "head"}  # no query tower, no scorer
    assert feats.g.shape == (2, model.dims.d)
    np.testing.assert_allclose(np.linalg.norm(feats.g, axis=1), 1.0, atol=1e-5)
    i = model.dims.item
    assert feats.p_v.shape == (2, i.n, i.dc) and feats.b_bar.shape == (2, i.dc) and feats.s_i.shape == (2, i.nk)
    assert feats.labels is not None and feats.labels.shape == (2, i.cells)


def test_the_two_image_steps_and_the_texts_match_the_pytorch_model(svc_ckpt, artifacts, bert):
    from crossprobe.models.graphs import ImageGraph, QueryGraph
    from crossprobe.core import inputs

    model = inference.load(svc_ckpt, RuntimeOptions(graphs=artifacts, threads=1))
    ref, _ = checkpoint.load(svc_ckpt, bert)
    grid = model.image_grid(_pixels(3, seed=1))
    assert isinstance(grid, ImageGrid) and grid.cells.shape == (3, 49, 1280) and grid.pooled is None
    got = model.image_features(grid)
    with torch.inference_mode():
        want = [o.numpy() for o in ImageGraph(ref.eval())(torch.from_numpy(grid.cells))]
    np.testing.assert_allclose(got.g, want[0], atol=1e-4)
    np.testing.assert_allclose(got.s_i, want[3], atol=1e-4)
    texts = ["a dog runs on the beach", "two people"]
    q = model.encode_texts(texts)
    ids, mask = inputs.tokenize(inputs.load_tokenizer(), texts)
    with torch.inference_mode():
        g, p_t, *_ = QueryGraph(ref.eval())(torch.from_numpy(ids), torch.from_numpy(mask))
    np.testing.assert_allclose(np.stack([v.g_q for v in q]), g.numpy(), atol=1e-4)
    np.testing.assert_allclose(np.stack([v.p_t for v in q]), p_t.numpy(), atol=1e-4)


def test_rerank_scores_each_candidate_as_one_at_a_time(svc_ckpt, artifacts):
    """One scorer run over K candidates gives each candidate the logit it gets alone (no batch effects)."""
    model = inference.load(svc_ckpt, RuntimeOptions(graphs=artifacts, threads=1))
    feats = model.encode_images(_pixels(4, seed=2))
    q = model.encode_texts(["a red car"])[0]
    s_tt = feats.g @ q.g_q
    for kind in model.rerankers:
        stored = {"p_v": feats.p_v, "b_bar": feats.b_bar, "s_i": feats.s_i, "labels": feats.labels}
        all_k = model.rerank(kind, q, stored, s_tt)
        one = [model.rerank(kind, q, {k: v[i:i + 1] for k, v in stored.items()}, s_tt[i:i + 1])[0] for i in range(4)]
        np.testing.assert_allclose(all_k, one, atol=1e-5)


def test_describe_reads_the_checkpoint_without_loading_it(svc_ckpt, artifacts):
    fp, dims = describe(svc_ckpt)
    assert fp == checkpoint.read_config(svc_ckpt)["fingerprint"]
    fp2, dims2 = describe(svc_ckpt, graphs=artifacts)  # from the exported image tower: no torch needed
    assert (fp2, dims2) == (fp, dims)
    assert FeatureDims.from_manifest(dims.manifest()) == dims


def test_the_text_gate_reads_this_backbone(svc_ckpt, artifacts):
    model = inference.load(svc_ckpt, RuntimeOptions(graphs=artifacts, threads=1))
    gate = model.text_gate(0.5)
    assert gate.cfg.threshold == 0.5
    cells = model.image_grid(_pixels(1)).cells
    assert gate.cells(cells).shape == (1, 49)


def test_an_unknown_reranker_is_refused(svc_ckpt, artifacts):
    model = inference.load(svc_ckpt, RuntimeOptions(graphs=artifacts, threads=1))
    with pytest.raises(inference.RerankerUnavailable, match="no trained 'tv' reranker"):
        model.require_reranker("tv")
