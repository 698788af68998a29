import pytest
import torch

from crossprobe.models.temde import Temde


def _text(B, T, d, real):
    tokens = torch.randn(B, T, d)
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[:, :real] = True
    return tokens, mask


def test_cross_probe_shapes_and_padding(small_model):
    cp = small_model.cp
    tokens, mask = _text(2, 8, 64, 5)
    p_t, w_bar = cp.encode_text(tokens, mask)
    assert p_t.shape == (2, 3, 32) and w_bar.shape == (2, 32)
    # padding (garbage in the padded slots, more of them) never changes the query side
    tokens2 = torch.cat([tokens, torch.randn(2, 6, 64)], 1)
    tokens2[:, 5:] = torch.randn(2, 9, 64) * 10
    mask2 = torch.zeros(2, 14, dtype=torch.bool)
    mask2[:, :5] = True
    p_t2, w_bar2 = cp.encode_text(tokens2, mask2)
    assert torch.allclose(p_t, p_t2, atol=1e-5) and torch.allclose(w_bar, w_bar2, atol=1e-5)
    p_v, b_bar = cp.encode_image(torch.randn(4, 49, 64))
    assert p_v.shape == (4, 4, 32) and b_bar.shape == (4, 32)
    logits = cp.rerank(p_t, w_bar, p_v.unsqueeze(0).expand(2, -1, -1, -1), b_bar.unsqueeze(0).expand(2, -1, -1), torch.rand(2, 4))
    assert logits.shape == (2, 4)


def test_split_merge_and_single_stream_padding(small_model):
    tokens, mask = _text(1, 6, 64, 4)
    v = small_model.sm.embed_image(torch.randn(3, 49, 64))
    t = small_model.sm.embed_text(tokens)
    a = small_model.sm.rerank(t, mask, v[None], torch.zeros(1, 3))
    t_pad = torch.cat([t, torch.randn(1, 5, 32)], 1)
    m_pad = torch.cat([mask, torch.zeros(1, 5, dtype=torch.bool)], 1)
    b = small_model.sm.rerank(t_pad, m_pad, v[None], torch.zeros(1, 3))
    assert torch.allclose(a, b, atol=1e-5)

    states, mask = _text(1, 6, 384, 4)
    v = small_model.tv.embed_image(torch.randn(3, 49, 1280))
    a = small_model.tv.rerank(small_model.tv.embed_text(states), mask, v[None], torch.zeros(1, 3))
    states_pad = torch.cat([states, torch.randn(1, 5, 384)], 1)
    m_pad = torch.cat([mask, torch.zeros(1, 5, dtype=torch.bool)], 1)
    b = small_model.tv.rerank(small_model.tv.embed_text(states_pad), m_pad, v[None], torch.zeros(1, 3))
    assert torch.allclose(a, b, atol=1e-5)


def test_temde_sketch_unit_norm_per_partition(small_model):
    temde: Temde = small_model.temde
    N, K = temde.cfg.N, temde.cfg.K
    s_i = temde.sketch_image(torch.randn(5, 49, 64))
    assert s_i.shape == (5, N * K)
    norms = s_i.view(5, N, K).norm(dim=-1)
    assert torch.allclose(norms, torch.ones(5, N), atol=1e-5)
    tokens, mask = _text(2, 7, 64, 3)
    s_q = temde.sketch_text(tokens, mask)
    assert torch.allclose(s_q.view(2, N, K).norm(dim=-1), torch.ones(2, N), atol=1e-5)
    score = temde.score(s_q[:, None], s_i[None])
    assert score.shape == (2, 5) and bool((score <= 1 + 1e-5).all()) and bool((score >= -1e-5).all())


def test_temde_sketches_are_additive_over_parts(small_model):
    """The raw sketch of a sequence is the sum of the raw sketches of its parts,
    and assignments are a distribution over each partition's centroids."""
    temde = small_model.temde
    x = torch.randn(1, 10, 64)
    assign = temde.image_coder(x)
    assert torch.allclose(assign.sum(-1), torch.ones(1, 10, temde.cfg.N), atol=1e-5)
    whole = temde.raw_sketch(assign)
    parts = temde.raw_sketch(assign[:, :4]) + temde.raw_sketch(assign[:, 4:])
    assert torch.allclose(whole, parts, atol=1e-5)
    # masking a token removes exactly its contribution
    mask = torch.ones(1, 10, dtype=torch.bool)
    mask[0, 7] = False
    assert torch.allclose(temde.raw_sketch(assign, mask), whole - assign[:, 7], atol=1e-5)


def _cp(inputs: str):
    from crossprobe.models.cross_probe import CrossProbe, CrossProbeConfig

    torch.manual_seed(0)
    return CrossProbe(CrossProbeConfig(d_in=64, d=32, m=3, n=4, layers=1, heads=4, inputs=inputs)).eval()


@pytest.mark.parametrize("inputs", ["backbone", "both"])
def test_cross_probe_on_backbone_features(inputs):
    """CP reading the frozen MiniLM states and the raw Lite0 grid: shapes, padding never
    changes the query side, and the backbone features do change the result."""
    cp = _cp(inputs)
    tokens, mask = _text(2, 8, 64, 5)
    states = torch.randn(2, 8, 384)
    p_t, w_bar = cp.encode_text(tokens, mask, states)
    assert p_t.shape == (2, 3, 32) and w_bar.shape == (2, 32)
    states2 = torch.cat([states, torch.randn(2, 6, 384) * 10], 1)
    tokens2 = torch.cat([tokens, torch.randn(2, 6, 64) * 10], 1)
    mask2 = torch.cat([mask, torch.zeros(2, 6, dtype=torch.bool)], 1)
    p_t2, w_bar2 = cp.encode_text(tokens2, mask2, states2)
    assert torch.allclose(p_t, p_t2, atol=1e-5) and torch.allclose(w_bar, w_bar2, atol=1e-5)
    other, _ = cp.encode_text(tokens, mask, states + torch.randn_like(states))
    assert not torch.allclose(p_t, other, atol=1e-3)
    grid = torch.rand(4, 49, 1280) * 6
    p_v, b_bar = cp.encode_image(torch.randn(4, 49, 64), grid)
    assert p_v.shape == (4, 4, 32) and b_bar.shape == (4, 32)
    # positions are added to the grid: the same regions in another order are another image
    tower = torch.randn(4, 49, 64)
    assert not torch.allclose(cp.encode_image(tower, grid)[0], cp.encode_image(tower.flip(1), grid.flip(1))[0], atol=1e-4)
    with pytest.raises(ValueError, match="backbone features"):
        cp.encode_image(torch.randn(4, 49, 64))


def test_cross_probe_backbone_ignores_tower_tokens():
    cp = _cp("backbone")
    _, mask = _text(2, 8, 64, 5)
    states, grid = torch.randn(2, 8, 384), torch.rand(3, 49, 1280)
    a = cp.encode_text(torch.randn(2, 8, 64), mask, states)[0]
    b = cp.encode_text(None, mask, states)[0]
    assert torch.equal(a, b)
    assert torch.equal(cp.encode_image(None, grid)[0], cp.encode_image(torch.randn(3, 49, 64), grid)[0])


def test_cross_probe_inputs_validated():
    from crossprobe.models.cross_probe import CrossProbeConfig

    with pytest.raises(ValueError, match="inputs"):
        CrossProbeConfig(inputs="pixels")


def test_temde_on_backbone_features():
    """T-EMDE coding the frozen features: unit norm per partition, padding ignored, needs the features."""
    from crossprobe.models.temde import Temde, TemdeConfig

    torch.manual_seed(0)
    te = Temde(TemdeConfig(d_in=64, N=4, K=4, inner=4, inputs="backbone")).eval()
    _, mask = _text(2, 8, 64, 5)
    states = torch.randn(2, 8, 384)
    s_q = te.sketch_text(None, mask, states)
    assert s_q.shape == (2, 16)
    assert torch.allclose(s_q.view(2, 4, 4).norm(dim=-1), torch.ones(2, 4), atol=1e-5)
    padded = torch.cat([states, torch.randn(2, 3, 384) * 10], 1)
    mask2 = torch.cat([mask, torch.zeros(2, 3, dtype=torch.bool)], 1)
    assert torch.allclose(s_q, te.sketch_text(None, mask2, padded), atol=1e-5)
    assert te.sketch_image(None, torch.rand(3, 49, 1280)).shape == (3, 16)
    with pytest.raises(ValueError, match="backbone features"):
        te.sketch_image(torch.randn(3, 49, 64))
    with pytest.raises(ValueError, match="inputs"):
        TemdeConfig(inputs="both")


def test_temde_assignment_equals_the_distance_softmax(small_model):
    """The coder's matmul form is the softmax of -||z - c||^2 / tau over each partition's centroids
    (||z||^2 drops out of the softmax): checked against the distances computed directly."""
    temde = small_model.temde
    coder = temde.image_coder.eval()
    with torch.no_grad():
        temde.log_tau.fill_(-0.7)  # a sharp temperature, where a wrong term would show
        x = torch.randn(3, 7, 64)
        N, K, inner = temde.cfg.N, temde.cfg.K, temde.cfg.inner
        z = coder.bn(coder.lin(x).reshape(21, -1)).view(3, 7, N, 1, inner)
        direct = (-((z - temde.centroids) ** 2).sum(-1) / temde.log_tau.exp()).softmax(-1)
        assert torch.allclose(coder(x), direct, atol=1e-5)
