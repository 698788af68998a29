"""benchmarks/temde_sweep.py: its merged ensembles score the members' mean, and its variants mean the same recipe
whatever TrainConfig's defaults are."""
import sys
from pathlib import Path

import torch

from crossprobe.models.temde import Temde, TemdeConfig
from crossprobe.models.training.run import TrainConfig, reranker_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import temde_sweep  # noqa: E402


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
    m = temde_sweep.merged([a, b])
    assert m.cfg.N == 8
    tokens, mask = torch.randn(2, 6, 16), torch.ones(2, 6, dtype=torch.bool)
    regions = torch.randn(4, 49, 16)
    with torch.no_grad():
        got = m.score(m.sketch_text(tokens, mask)[:, None], m.sketch_image(regions)[None])
        want = [t.score(t.sketch_text(tokens, mask)[:, None], t.sketch_image(regions)[None]) for t in (a, b)]
    assert torch.allclose(got, (3 * want[0] + 5 * want[1]) / 8, atol=1e-5)


def test_variants_are_pinned_to_the_recipe_they_were_measured_on():
    served = reranker_config(TrainConfig(), "temde")
    assert served.captions_per_image == 5  # the adopted variant (captions5) is the default now
    assert reranker_config(TrainConfig(), "cp").captions_per_image == 1
    # a row's recipe is BEFORE + its changes, not the current default + its changes
    for name, (_, changes) in temde_sweep.VARIANTS.items():
        recipe = {**temde_sweep.BEFORE, **changes}
        assert recipe["captions_per_image"] == (5 if name == "captions5" or name.startswith("c5_") else 1), name
