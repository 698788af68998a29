"""models/temde.py: a merged ensemble is one wider T-EMDE that scores its members' mean."""
import pytest
import torch

from crossprobe.models.temde import Temde, TemdeConfig, merge


def _trained_like(seed: int, N: int, log_tau: float) -> Temde:
    """A T-EMDE with non-trivial BatchNorm statistics and its own temperature, as training leaves one."""
    torch.manual_seed(seed)
    t = Temde(TemdeConfig(d_in=16, N=N, K=4, inner=3, inputs="tower"))
    with torch.no_grad():
        t.log_tau.fill_(log_tau)
        for c in (t.text_coder, t.image_coder):
            c.bn.weight.uniform_(0.5, 2.0)
            c.bn.bias.normal_()
            c.bn.running_mean.normal_()
            c.bn.running_var.uniform_(0.5, 2.0)
    return t.eval()


def test_merged_members_score_their_n_weighted_mean():
    a, b = _trained_like(0, 3, -0.7), _trained_like(1, 5, 0.4)
    m = merge([a, b])
    assert m.cfg.N == 8
    tokens, mask = torch.randn(2, 6, 16), torch.ones(2, 6, dtype=torch.bool)
    regions = torch.randn(4, 49, 16)
    with torch.no_grad():
        got = m.score(m.sketch_text(tokens, mask)[:, None], m.sketch_image(regions)[None])
        want = [t.score(t.sketch_text(tokens, mask)[:, None], t.sketch_image(regions)[None]) for t in (a, b)]
    assert torch.allclose(got, (3 * want[0] + 5 * want[1]) / 8, atol=1e-5)




def test_merge_refuses_members_of_other_shapes():
    a = _trained_like(0, 3, 0.0)
    b = Temde(TemdeConfig(d_in=16, N=3, K=8, inner=3, inputs="tower"))
    with pytest.raises(ValueError, match="share K"):
        merge([a, b])



@pytest.mark.parametrize("K", [4, 8, 16])
def test_coder_softmax_layouts_agree_with_the_distances(K):
    """The coder takes its softmax over a transposed view when K <= 8 and over the last dim above (speed only):
    either way each (token, partition) row is softmax(-||z - c||^2 / tau) over that partition's K centroids,
    and the raw sketch sums real tokens only."""
    torch.manual_seed(K)
    t = Temde(TemdeConfig(d_in=16, N=5, K=K, inner=3, inputs="tower")).eval()
    x = torch.randn(2, 7, 16)
    c = t.image_coder
    with torch.no_grad():
        t.log_tau.fill_(-0.5)
        a = c(x)
        z = c.bn(c.lin(x).reshape(14, -1)).view(2, 7, 5, 1, 3)
        want = (-((z - t.centroids) ** 2).sum(-1) / t.log_tau.exp()).softmax(-1)
        mask = torch.tensor([[1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
        sketch = t.raw_sketch(a, mask)
    assert a.shape == (2, 7, 5, K) and torch.allclose(a, want, atol=1e-5)
    assert torch.allclose(sketch[0], want[0, :3].sum(0), atol=1e-5) and torch.allclose(sketch[1], want[1].sum(0), atol=1e-5)
