"""ZoDIAC attention: shapes, masking, and per-sample / per-head intensity."""
import torch

from crossprobe.models.cross_probe import CrossProbe, CrossProbeConfig
from crossprobe.models.layers import Block
from crossprobe.models.research.single_stream import SingleStream, SingleStreamConfig
from crossprobe.models.research.zodiac import ZodiacAttention


def _attn():
    torch.manual_seed(0)
    return ZodiacAttention(32, 4, dropout=0.1, zodiac_dropout=0.3).eval()


def test_shapes_and_zoneup_starts_at_one():
    a = _attn()
    out = a(torch.randn(3, 5, 32), torch.randn(3, 7, 32))
    assert out.shape == (3, 5, 32)
    assert a.zoneup.item() == 1.0


def test_one_sample_does_not_depend_on_the_rest_of_its_batch():
    """The reference implementation averaged the intensity over the whole batch; ours must not."""
    a = _attn()
    x, mask = torch.randn(4, 6, 32), torch.ones(4, 6, dtype=torch.bool)
    mask[1, 4:] = False
    with torch.no_grad():
        together = a(x, x, mask, x_mask=mask)
        for i in range(4):
            alone = a(x[i : i + 1], x[i : i + 1], mask[i : i + 1], x_mask=mask[i : i + 1])
            assert torch.allclose(alone, together[i : i + 1], atol=1e-5), i
        other = x.clone()
        other[1:] = 10 * torch.randn(3, 6, 32)  # change every other sample
        assert torch.allclose(a(other, other, mask, x_mask=mask)[0], together[0], atol=1e-5)


def test_intensity_is_one_number_per_sample_and_head_over_real_pairs_only():
    a = _attn()
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        a(x, x)
        inten = a.last_intensity
        assert inten.shape == (2, 4)
        assert ((inten > 0) & (inten < 1)).all()
        assert inten[0].unique().numel() == 4  # heads differ
        # padded keys (and padded queries) do not enter the masked mean
        y = torch.cat([x, 5 * torch.randn(2, 3, 32)], 1)
        m = torch.tensor([[True] * 5 + [False] * 3] * 2)
        assert torch.allclose(a(x, y, m), a(x, x), atol=1e-5)
        assert torch.allclose(a.last_intensity, inten, atol=1e-6)
        a(y, y, m, x_mask=m)
        assert torch.allclose(a.last_intensity, inten, atol=1e-6)


def test_padding_never_changes_real_tokens_in_a_zodiac_block():
    torch.manual_seed(0)
    blk = Block(32, 4, attention="zodiac").eval()
    x = torch.randn(1, 5, 32)
    padded = torch.cat([x, torch.randn(1, 4, 32)], 1)
    m = torch.tensor([[True] * 5 + [False] * 4])
    with torch.no_grad():
        assert torch.allclose(blk(x, torch.ones(1, 5, dtype=torch.bool)), blk(padded, m)[:, :5], atol=1e-5)


def test_zodiac_is_selectable_in_cp_and_tv():
    cp = CrossProbe(CrossProbeConfig(d_in=16, d=32, m=2, n=3, layers=1, attention="zodiac", inputs="tower")).eval()
    assert isinstance(cp.cross[0].attn, ZodiacAttention)
    p_t, w = cp.encode_text(torch.randn(2, 4, 16), torch.ones(2, 4, dtype=torch.bool))
    p_v, b = cp.encode_image(torch.randn(5, 49, 16))
    assert cp.rerank(p_t, w, p_v[None].expand(2, -1, -1, -1), b[None].expand(2, -1, -1), torch.rand(2, 5)).shape == (2, 5)
    tv = SingleStream(SingleStreamConfig(d=32, layers=2, attention="zodiac")).eval()
    assert all(isinstance(b.attn, ZodiacAttention) for b in tv.blocks)
    s = tv.score(torch.randn(3, 4, 32), torch.ones(3, 4, dtype=torch.bool), torch.randn(3, 49, 32))
    assert s.shape == (3,) and torch.isfinite(s).all()
