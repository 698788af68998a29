"""A tiny run on generated data: the losses must go down, resume must work."""
import copy

import numpy as np
import pytest
import torch

from crossprobe.models.data.flickr8k import Flickr8k
from crossprobe.models.evaluation.retrieval import split_banks
from crossprobe.models.model import SearchModel
from crossprobe.models.training.data import CachedData
from crossprobe.models.training.rerankers import RerankTrainConfig, train_reranker
from crossprobe.models.training.towers import TowerTrainConfig, train_towers


@pytest.fixture(scope="module")
def tiny_data():
    """48 images x 5 captions whose features share a hidden 'concept' per image."""
    rng = np.random.default_rng(0)
    n_img, n_cap = 48, 5
    concepts = rng.normal(size=(n_img, 16)).astype(np.float32)
    w_img = rng.normal(size=(16, 1280)).astype(np.float32)
    w_txt = rng.normal(size=(16, 384)).astype(np.float32)
    grids = (concepts @ w_img)[:, None, :] + 0.5 * rng.normal(size=(n_img, 49, 1280))
    caption_image = [i for i in range(n_img) for _ in range(n_cap)]
    states = np.zeros((n_img * n_cap, 40, 384), np.float32)
    masks = np.zeros((n_img * n_cap, 40), np.uint8)
    for j, i in enumerate(caption_image):
        T = int(rng.integers(5, 12))
        states[j, :T] = concepts[i] @ w_txt + 0.5 * rng.normal(size=(T, 384))
        masks[j, :T] = 1
    ds = Flickr8k(root=None, images=[f"img{i}.jpg" for i in range(n_img)], captions=[f"c{j}" for j in range(len(caption_image))],
                  caption_image=caption_image, splits={"train": list(range(32)), "dev": list(range(32, 48)), "test": list(range(32, 48))})
    caps = [[j for j in range(len(caption_image)) if caption_image[j] == i] for i in range(n_img)]
    return CachedData(ds, grids.astype(np.float16), states.astype(np.float16), masks, caps)


def test_tower_training_lowers_the_loss_and_resumes(tiny_data, small_cfg, bert, tmp_path):
    torch.manual_seed(0)
    model = SearchModel(copy.deepcopy(small_cfg), bert)
    cfg = TowerTrainConfig(epochs=6, batch=16, lr=2e-3, warmup_steps=2)
    rep = train_towers(model, tiny_data, cfg, tmp_path / "towers.pt", seed=0, log=lambda *_: None)
    losses = [h["loss"] for h in rep["history"]]
    assert losses[-1] < 0.8 * losses[0], losses
    assert rep["dev_rsum"] > 0
    # a second call finds the finished state and trains no further epoch
    rep2 = train_towers(model, tiny_data, cfg, tmp_path / "towers.pt", seed=0, log=lambda *_: None)
    assert rep2["history"] == rep["history"]


def test_reranker_training_lowers_the_loss(tiny_data, small_cfg, bert, tmp_path):
    torch.manual_seed(0)
    model = SearchModel(copy.deepcopy(small_cfg), bert).eval()
    train = split_banks(model, tiny_data, "train")
    dev = split_banks(model, tiny_data, "dev")
    cfg = RerankTrainConfig(epochs=5, queries=8, negatives=5, mine_k=10, lr=3e-3, dev_k=5, captions_per_image=2)
    rep = train_reranker(model, "cp", train, dev, cfg, tmp_path / "cp.pt", seed=0, log=lambda *_: None)
    losses = [h["loss"] for h in rep["history"]]
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("method", ["cp", "temde"])
def test_inbatch_pretraining_lowers_the_loss_and_is_kept(tiny_data, small_cfg, bert, tmp_path, method):
    torch.manual_seed(0)
    model = SearchModel(copy.deepcopy(small_cfg), bert).eval()
    train = split_banks(model, tiny_data, "train")
    dev = split_banks(model, tiny_data, "dev")
    cfg = RerankTrainConfig(epochs=1, queries=8, negatives=5, mine_k=10, lr=3e-3, dev_k=5,
                            pretrain_epochs=6, pretrain_batch=8)
    rep = train_reranker(model, method, train, dev, cfg, tmp_path / f"{method}.pt", seed=0, log=lambda *_: None)
    pre = [h["loss"] for h in rep["pretrain"]]
    assert len(pre) == 6 and pre[-1] < 0.9 * pre[0], pre
    assert (tmp_path / f"{method}.pretrained.pt").exists()  # a rerun reuses it instead of pretraining again
    rep2 = train_reranker(model, method, train, dev, cfg, tmp_path / f"{method}.pt", seed=0, log=lambda *_: None)
    assert rep2["pretrain"] == rep["pretrain"]


def test_standalone_reranker_on_backbone_features_gets_its_fusion_from_dev(tiny_data, small_cfg, bert, tmp_path):
    """RerankTrainConfig.standalone: alpha stays out of training, the fusion weight is the
    dev split's best, and the model as left scores exactly that on dev."""
    import dataclasses
    import math

    from crossprobe.models.evaluation.encode import PairScorer
    from crossprobe.models.evaluation.retrieval import reranked
    from crossprobe.models.training.rerankers import FUSION_GRID

    torch.manual_seed(0)
    cfg_m = copy.deepcopy(small_cfg)
    cfg_m.cp = dataclasses.replace(cfg_m.cp, inputs="backbone")
    model = SearchModel(cfg_m, bert).eval()
    train = split_banks(model, tiny_data, "train")
    dev = split_banks(model, tiny_data, "dev")
    cfg = RerankTrainConfig(epochs=3, queries=8, negatives=5, mine_k=10, lr=3e-3, dev_k=5, captions_per_image=2,
                            pretrain_epochs=2, pretrain_batch=8, standalone=True)
    rep = train_reranker(model, "cp", train, dev, cfg, tmp_path / "cp.pt", seed=0, log=lambda *_: None)
    assert all(h["fusion_w"] in FUSION_GRID for h in rep["history"])
    w, f = rep["fusion_w"], model.cp.fusion
    if math.isinf(w):
        assert f.alpha.item() == 0.0
    else:
        assert f.alpha.item() == 20.0 and math.isclose(f.beta.item(), 20.0 * w, rel_tol=1e-6)
    assert rep["fusion_queries"] == len(dev[2])  # the mix is fit on every dev caption, not only the selection rows
    text, images, gold = dev
    as_left = reranked(PairScorer(model, "cp", text, images), (text.g @ images.g.T).numpy(), gold, 5, [5])[5]["t2i"]["R@1"]
    assert as_left == rep["fusion_dev_t2i_R@1@5"]


def test_pooled_negatives_score_every_candidate_of_the_step(tiny_data, small_cfg, bert, tmp_path):
    """RerankTrainConfig.pool_negatives: each caption's row holds the same fused logits as scoring its own
    candidates, plus every other candidate of the step; its own image elsewhere in the pool is masked out."""
    from crossprobe.models.evaluation.encode import PairScorer
    from crossprobe.models.training.rerankers import pooled_logits

    torch.manual_seed(0)
    model = SearchModel(copy.deepcopy(small_cfg), bert).eval()
    text, images, gold = split_banks(model, tiny_data, "train")
    scorer = PairScorer(model, "temde", text, images, precompute=False, region=False)
    q = np.array([0, 1, 7])  # captions 0 and 1 show the same image (5 captions per image)
    cand = np.stack([np.concatenate([[gold[c]], [x for x in range(6) if x != gold[c]][:3]]) for c in q])
    with torch.no_grad():
        logits, target = pooled_logits(scorer, model.temde, q, cand, gold)
        own = scorer.fused(torch.from_numpy(q), torch.from_numpy(cand))
    Q, C = cand.shape
    assert logits.shape == (Q, Q * C) and target.tolist() == [0, C, 2 * C]
    for i in range(Q):
        assert torch.allclose(logits[i, i * C:(i + 1) * C], own[i], atol=1e-5)
    flat = cand.reshape(-1)
    for i in range(Q):
        for j in range(Q * C):
            masked = flat[j] == gold[q[i]] and j != target[i]
            assert bool(torch.isinf(logits[i, j])) == masked, (i, j)
    assert bool(torch.isinf(logits[0, C])) and bool(torch.isinf(logits[1, 0]))  # the sibling captions' positives
    # training with it lowers the loss; CP refuses it
    dev = split_banks(model, tiny_data, "dev")
    cfg = RerankTrainConfig(epochs=4, queries=8, negatives=5, mine_k=10, lr=3e-3, dev_k=5, pool_negatives=True)
    rep = train_reranker(model, "temde", (text, images, gold), dev, cfg, tmp_path / "temde.pt", seed=0, log=lambda *_: None)
    losses = [h["loss"] for h in rep["history"]]
    assert losses[-1] < losses[0], losses
    with pytest.raises(ValueError, match="pool_negatives"):
        train_reranker(model, "cp", (text, images, gold), dev, cfg, tmp_path / "cp.pt", seed=0, log=lambda *_: None)


def test_distillation_from_cp_into_temde(tiny_data, small_cfg, bert, tmp_path):
    """RerankTrainConfig.distill_from: the KL term is zero when the student's residual over the two-tower logit
    equals the teacher's, positive otherwise, and its gradient moves the student towards the teacher; a T-EMDE
    trains with CP as its teacher (its loss falls); a reranker cannot be its own teacher."""
    from crossprobe.models.evaluation.encode import PairScorer
    from crossprobe.models.temde import Temde
    from crossprobe.models.training.rerankers import distill_loss, mine

    torch.manual_seed(0)
    model = SearchModel(copy.deepcopy(small_cfg), bert).eval()
    train = split_banks(model, tiny_data, "train")
    dev = split_banks(model, tiny_data, "dev")
    text, images, gold = train
    base = dict(queries=8, negatives=5, mine_k=10, lr=3e-3, dev_k=5)
    train_reranker(model, "cp", train, dev, RerankTrainConfig(epochs=3, **base), tmp_path / "cp.pt", seed=0, log=lambda *_: None)
    teacher = PairScorer(model, "cp", text, images, region=False)
    q = np.arange(len(gold))
    cand = np.concatenate([gold[:, None], mine(text, images, gold, 5)], 1)
    with torch.no_grad():
        qt, ct = torch.from_numpy(q), torch.from_numpy(cand)
        resid = teacher.fused(qt, ct) - model.cp.fusion.alpha * teacher.tt(qt, ct)
    assert float(distill_loss(resid.clone(), teacher, q, cand, tau=1.0)) < 1e-5
    student = torch.zeros_like(resid, requires_grad=True)
    kl = distill_loss(student, teacher, q, cand, tau=2.0)
    assert float(kl) > 0
    kl.backward()
    with torch.no_grad():
        stepped = student - 10.0 * student.grad
    assert float(distill_loss(stepped, teacher, q, cand, tau=2.0)) < float(kl)

    torch.manual_seed(1)
    model.temde = Temde(model.cfg.temde)
    cfg = RerankTrainConfig(epochs=4, standalone=True, distill_from="cp", distill_weight=1.0, **base)
    rep = train_reranker(model, "temde", train, dev, cfg, tmp_path / "temde.pt", seed=0, log=lambda *_: None)
    losses = [h["loss"] for h in rep["history"]]
    assert losses[-1] < losses[0], losses
    with pytest.raises(ValueError, match="itself"):
        train_reranker(model, "cp", train, dev, RerankTrainConfig(epochs=1, distill_from="cp", distill_weight=1.0, **base),
                       tmp_path / "cp2.pt", seed=0, log=lambda *_: None)


def test_region_term_inside_the_training_logit_and_the_fusion_fit(tiny_data, small_cfg, bert, tmp_path):
    """With a region weight, the fusion weight is fit with the region term in the logit, as the model serves it:
    the dev R@1 the fit reports is the one the left model scores (and the term does move the ranking here)."""
    import dataclasses

    from crossprobe.models.evaluation.encode import PairScorer
    from crossprobe.models.evaluation.retrieval import reranked
    from crossprobe.models.region_labels import RegionConfig

    torch.manual_seed(0)
    cfg_m = copy.deepcopy(small_cfg)
    cfg_m.cp = dataclasses.replace(cfg_m.cp, inputs="backbone")
    cfg_m.region = RegionConfig(weights={"cp": 2.0}, pool=3)
    model = SearchModel(cfg_m, bert).eval()
    model.bridge.set_class_embeddings(model.text)
    train = split_banks(model, tiny_data, "train")
    dev = split_banks(model, tiny_data, "dev")
    assert train[1].labels is not None and dev[1].labels is not None  # the banks carry each cell's class
    cfg = RerankTrainConfig(epochs=2, queries=8, negatives=5, mine_k=10, lr=3e-3, dev_k=5, captions_per_image=2,
                            pretrain_epochs=1, pretrain_batch=8, standalone=True)
    rep = train_reranker(model, "cp", train, dev, cfg, tmp_path / "cp.pt", seed=0, log=lambda *_: None)
    text, images, gold = dev
    S = (text.g @ images.g.T).numpy()
    on = reranked(PairScorer(model, "cp", text, images), S, gold, 5, [5])[5]["t2i"]["R@1"]
    off = reranked(PairScorer(model, "cp", text, images, region=False), S, gold, 5, [5])[5]["t2i"]["R@1"]
    assert on == rep["fusion_dev_t2i_R@1@5"]
    assert on != off


@pytest.mark.parametrize("share", [0.0, 0.5])
def test_tower_grayscale_augmentation_swaps_in_that_share_of_grids(tiny_data, small_cfg, bert, tmp_path, monkeypatch, share):
    from crossprobe.models.training import towers

    data = copy.copy(tiny_data)
    data.gray_grids = (tiny_data.grids.astype(np.float32) + 1000).astype(np.float16)  # marked: every value > 900
    seen = []
    real = towers.tower_loss
    monkeypatch.setattr(towers, "tower_loss", lambda m, c, s, k, grid: seen.append(grid.clone()) or real(m, c, s, k, grid))
    model = SearchModel(copy.deepcopy(small_cfg), bert)
    cfg = TowerTrainConfig(epochs=4, batch=8, warmup_steps=2, hflip=0.0, gray=share)
    train_towers(model, data, cfg, tmp_path / "towers.pt", seed=0, log=lambda *_: None)
    rows = torch.cat(seen)
    gray_rows = (rows.mean((1, 2)) > 900).float().mean().item()
    assert len(rows) == 4 * 32
    if share == 0:
        assert gray_rows == 0
    else:
        assert 0.35 < gray_rows < 0.65, gray_rows
