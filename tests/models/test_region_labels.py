"""Region-level labels: each grid cell's ImageNet class, matched to the query through the class table, added to
the CP / T-EMDE logits in evaluation exactly as the scorer graphs add it in the service."""
import numpy as np
import pytest
import torch

from crossprobe.models.region_labels import SCALE, RegionConfig, add_region, region_score


def test_region_score_is_the_mean_of_the_best_cells():
    g = torch.Generator().manual_seed(0)
    sim = torch.rand(3, 1000, generator=g)
    labels = torch.randint(0, 1000, (3, 4, 49), generator=g)
    got = region_score(sim, labels, pool=3)
    for q in range(3):
        for k in range(4):
            cells = sorted((float(sim[q, c]) for c in labels[q, k]), reverse=True)
            assert got[q, k] == pytest.approx(np.mean(cells[:3]), abs=1e-6)
    assert torch.allclose(region_score(sim, labels, pool=1), sim.gather(1, labels.flatten(1)).view(3, 4, 49).max(-1).values)


def test_add_region_weights_per_method_and_needs_its_inputs():
    cfg = RegionConfig(weights={"cp": 0.2}, pool=3)
    logits, sim, labels = torch.zeros(2, 5), torch.rand(2, 1000), torch.randint(0, 1000, (2, 5, 49))
    assert torch.allclose(add_region(logits, cfg, "cp", sim, labels), SCALE * 0.2 * region_score(sim, labels, 3))
    assert add_region(logits, cfg, "temde", None, None) is logits  # no weight: untouched, no inputs needed
    with pytest.raises(ValueError, match="class similarities"):
        add_region(logits, cfg, "cp", None, labels)
    with pytest.raises(ValueError):
        RegionConfig(weights={"cp": -1.0})
    assert not RegionConfig().enabled and RegionConfig(weights={"cp": 0.1}).enabled


def test_cell_labels_are_the_heads_argmax_per_cell(small_model):
    grid = torch.rand(2, 49, 1280) * 6
    labels = small_model.bridge.cell_labels(grid)
    logits = grid @ small_model.bridge.head_w.T + small_model.bridge.head_b
    assert labels.shape == (2, 49) and torch.equal(labels, logits.argmax(-1))


def test_pair_scorer_adds_the_region_term_only_when_asked(small_model):
    """Evaluation and the demo rank with the term; training (region=False) sees the reranker alone."""
    from crossprobe.models.evaluation.encode import PairScorer, encode_images, encode_texts

    rng = np.random.default_rng(0)
    states = rng.normal(size=(4, 8, 384)).astype(np.float16)
    masks = np.ones((4, 8), np.uint8)
    text = encode_texts(small_model, states, masks, np.arange(4))
    images = encode_images(small_model, (rng.random((6, 49, 1280)) * 6).astype(np.float16), np.arange(6))
    assert images.labels is not None and images.labels.shape == (6, 49)
    q, cand = torch.arange(4), torch.from_numpy(rng.integers(0, 6, (4, 5)))
    for method in ("cp", "temde"):
        w = small_model.cfg.region.weight(method)
        assert w > 0  # the default config weights both rerankers
        with_term = PairScorer(small_model, method, text, images).fused(q, cand)
        plain = PairScorer(small_model, method, text, images, region=False).fused(q, cand)
        term = SCALE * w * region_score(small_model.bridge.class_sims(text.g[q]), images.labels[cand], small_model.cfg.region.pool)
        assert torch.allclose(with_term, plain + term, atol=1e-5)
        assert not torch.allclose(with_term, plain)


def test_committed_checkpoint_finds_the_coffee_cup_in_a_cell():
    """On a real photo, with the committed checkpoint's class table (its region labels are off by default: docs/research/bridge.md):
    the cells of scikit-image's coffee photo are labelled with cup / espresso classes, so a coffee query scores it
    above the other photos of the demo gallery by region labels alone."""
    from crossprobe.models import backbones as bb
    from crossprobe.core import inputs
    from crossprobe.models import checkpoint
    from crossprobe.models.bridge import class_lemmas
    from crossprobe.models.demo import sample_gallery

    model, _ = checkpoint.load()
    assert model.cfg.bridge.enabled  # the class table the cells are matched against
    model.cfg.region = RegionConfig(weights={"cp": 0.2}, pool=3)
    gallery = sample_gallery()
    names = list(gallery)
    with torch.inference_mode():
        grids = bb.ImageBackbone()(torch.from_numpy(np.stack([inputs.load_image(gallery[n]) for n in names])))
        labels = model.bridge.cell_labels(grids)  # (G, 49)
        coffee = names.index(next(n for n in names if n.startswith("coffee")))
        cell_names = {class_lemmas()[int(c)][0] for c in labels[coffee]}
        assert cell_names & {"espresso", "cup", "coffee mug", "eggnog"}, cell_names
        ids, mask = inputs.tokenize(inputs.load_tokenizer(), ["a cup of coffee"])
        g_q = model.text(torch.from_numpy(ids), torch.from_numpy(mask)).g
        s = region_score(model.bridge.class_sims(g_q), labels[None], model.cfg.region.pool)[0]
    assert int(s.argmax()) == coffee, dict(zip(names, s.tolist()))
