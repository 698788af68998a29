"""models/temde.py: a merged ensemble is one wider T-EMDE that scores its members' mean."""
import pytest
import torch

from crossprobe.models.temde import Temde, TemdeConfig, merge


def _trained_like(seed: int, N: int, log_tau: float) -> Temde:
    """A T-EMDE with non-trivial BatchNorm statistics and its own temperature, as training leaves one."""
    torch.manual_seed(seed)
    t = Temde(TemdeConfig(d_in=16, N=N, K=4, inner=3))
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
    b = Temde(TemdeConfig(d_in=16, N=3, K=8, inner=3))
    with pytest.raises(ValueError, match="share K"):
        merge([a, b])

