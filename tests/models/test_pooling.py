"""SEAM multi-hop pooling and its penalty, T-EMDE pooling, the fast query tower,
and the order-embedding loss."""
import copy

import pytest
import torch

from crossprobe.core import inputs
from crossprobe.models.layers import SelfAttentivePooling, frobenius_penalty
from crossprobe.models.losses import order_hinge, order_violation
from crossprobe.models.model import SearchModel
from crossprobe.models.pooling import make_pool
from crossprobe.models.temde import TemdePool
from crossprobe.models.text_tower import TextTowerConfig


def test_seam_penalty_is_zero_for_orthogonal_hops_and_positive_otherwise():
    eye = torch.eye(4)[None]  # 4 hops, each one-hot on its own token
    assert frobenius_penalty(torch.cat([eye, torch.zeros(1, 4, 3)], -1)).item() == 0.0
    same = torch.zeros(1, 4, 7)
    same[:, :, 0] = 1  # every hop on the same token
    assert frobenius_penalty(same).item() == pytest.approx(12.0)  # off-diagonal ones: 4*4 - 4


def test_seam_hops_shapes_masking_and_penalty_in_training():
    torch.manual_seed(0)
    pool = SelfAttentivePooling(16, hops=3)
    x = torch.randn(2, 5, 16)
    m = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    a = pool.attention(x, m)
    assert a.shape == (2, 3, 5) and torch.allclose(a.sum(-1), torch.ones(2, 3))
    assert (a[1, :, 3:] == 0).all()  # padding gets no attention
    pool.train()
    out = pool(x, m)
    assert out.shape == (2, 16) and pool.penalty.item() > 0
    padded = torch.cat([x, torch.randn(2, 4, 16)], 1)
    pm = torch.cat([m, torch.zeros(2, 4, dtype=torch.bool)], 1)
    pool.eval()
    assert torch.allclose(pool(x, m), pool(padded, pm), atol=1e-6)


def test_temde_pool_masks_padding_and_is_independent_of_the_batch():
    torch.manual_seed(0)
    pool = TemdePool(16, N=4, K=3, inner=4).eval()
    x = torch.randn(3, 6, 16)
    m = torch.ones(3, 6, dtype=torch.bool)
    m[2, 4:] = False
    with torch.no_grad():
        out = pool(x, m)
        assert out.shape == (3, 16)
        assert torch.allclose(pool(x[2:, :4], m[2:, :4]), out[2:], atol=1e-5)  # padding changes nothing
        assert torch.allclose(pool(x[:1], m[:1]), out[:1], atol=1e-5)  # nor the rest of the batch
    assert make_pool("temde", 16).__class__ is TemdePool
    with pytest.raises(ValueError):
        make_pool("max", 16)


def test_temde_pooled_towers_train(small_cfg, bert):
    cfg = copy.deepcopy(small_cfg)
    cfg.text.pool, cfg.vision.pool = "temde", "temde"
    model = SearchModel(cfg, bert).train()
    t = model.text.forward_states(torch.randn(2, 6, inputs.TEXT_FEAT_DIM), torch.ones(2, 6, dtype=torch.bool))
    v = model.vision(torch.randn(2, 49, inputs.IMAGE_FEAT_DIM))
    (t.g @ v.g.T).trace().backward()
    assert model.vision.pool.centroids.grad.abs().sum() > 0
    assert torch.allclose(t.g.norm(dim=-1), torch.ones(2), atol=1e-5)


def test_fast_query_tower_runs_no_transformer_layer(small_cfg, bert):
    cfg = copy.deepcopy(small_cfg)
    cfg.text = TextTowerConfig(d=64, layers=0, finetune_layers=0, pool_hops=4)
    model = SearchModel(cfg, bert).eval()
    assert len(model.text.top) == 0 and len(model.text.bottom.layers) == 0 and cfg.text.frozen_layers == 0
    tok = inputs.load_tokenizer()
    ids, mask = (torch.from_numpy(a) for a in inputs.tokenize(tok, ["a dog on the beach", "two kids"]))
    with torch.no_grad():
        out = model.text(ids, mask)
        pad = model.text(torch.nn.functional.pad(ids, (0, 5)), torch.nn.functional.pad(mask, (0, 5)))
    assert out.g.shape == (2, 64) and torch.allclose(out.g, pad.g, atol=1e-5)
    with pytest.raises(ValueError):
        TextTowerConfig(layers=1, finetune_layers=2)


def test_order_violation_is_zero_when_the_image_dominates_the_caption():
    text = torch.tensor([[0.1, -0.2, 0.0]])
    image = torch.tensor([[0.3, 0.5, -0.1], [0.05, 0.5, 0.0]])
    e = order_violation(text, image)
    assert e.shape == (1, 2)
    assert e[0, 0].item() == 0.0
    assert e[0, 1].item() == pytest.approx(0.05**2)
    # the hinge prefers a batch where each caption sits below its own image
    good_t, good_i = torch.tensor([[0.1, 0.0], [0.0, 0.1]]), torch.tensor([[0.9, 0.0], [0.0, 0.9]])
    assert order_hinge(good_t, good_i).item() < order_hinge(good_t, good_i.flip(0)).item()
