"""ACE-RPE: anchor distances (symmetric, finite, exact on hand-made anchors) and the TV / SM options."""
import pytest
import torch

from crossprobe.models.research.ace_rpe import AceRpe, AceRpeConfig, anchor_distances, grid_manhattan
from crossprobe.models.research.single_stream import SingleStream, SingleStreamConfig
from crossprobe.models.research.split_merge import SplitMerge, SplitMergeConfig

CAP = 9


def _one_hot_anchors(T: int, anchors: dict[int, int]) -> torch.Tensor:
    """(1, 1, T, 49) shrunk similarity with token i matched only to cell anchors[i]."""
    s = torch.zeros(1, 1, T, 49)
    for i, r in anchors.items():
        s[0, 0, i, r] = 0.5
    return s


def test_distances_are_symmetric_finite_and_bounded():
    torch.manual_seed(0)
    s = torch.nn.functional.softshrink(torch.randn(8, 4, 11, 49) * 0.5, 0.2)
    mask = torch.ones(8, 11, dtype=torch.bool)
    mask[3, 6:] = False
    D = anchor_distances(s, mask, CAP).long()
    assert D.shape == (8, 4, 60, 60)
    assert torch.equal(D, D.transpose(-1, -2))
    assert (D >= 0).all() and (D <= CAP).all()
    assert (D.diagonal(dim1=-2, dim2=-1) == 0).all()
    # anchors can only shorten paths: never longer than the line (real tokens) and the grid on their own
    pos = torch.arange(11)
    full = torch.arange(8) != 3
    assert (D[full][..., :11, :11] <= (pos[:, None] - pos[None]).abs().clamp(max=CAP)).all()
    assert (D[..., 11:, 11:] <= grid_manhattan().clamp(max=CAP)).all()
    # a padded token is far from everything but itself
    assert (D[3, :, 7, :][:, torch.arange(60) != 7] == CAP).all()


def test_distances_follow_the_anchor_graph_exactly():
    # 3 tokens; token 0 anchored at cell 0 (top-left), token 2 at cell 48 (bottom-right)
    D = anchor_distances(_one_hot_anchors(3, {0: 0, 2: 48}), torch.ones(1, 3, dtype=torch.bool), 30).long()[0, 0]
    T = 3
    assert D[0, T + 0] == 1  # token 0 -> its anchor
    assert D[1, T + 0] == 2  # token 1 -> token 0 -> anchor
    assert D[0, T + 48] == 3  # token 0 -> token 1 -> token 2 -> cell 48, shorter than 1 + 12 through the grid
    assert D[T + 0, T + 48] == 4  # corner to corner through the text (cell 0 -> t0 -> t1 -> t2 -> cell 48), not 12
    assert D[T + 1, T + 47] == 6  # neighbours of the two anchors
    # weak similarities (shrunk to 0) create no anchor
    D0 = anchor_distances(torch.zeros(1, 1, 3, 49), torch.ones(1, 3, dtype=torch.bool), 30).long()[0, 0]
    assert (D0[:T, T:] == 30).all()


def test_bias_shape_cls_bucket_and_padding():
    torch.manual_seed(0)
    ace = AceRpe(32, 4).eval()
    t, v = torch.randn(2, 6, 32), torch.randn(2, 49, 32)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    with torch.no_grad():
        ace.table.copy_(torch.randn_like(ace.table))
        bias = ace(t, mask, v)
    assert bias.shape == (2, 4, 1 + 6 + 49, 1 + 6 + 49)
    assert torch.isfinite(bias).all()
    assert torch.allclose(bias[:, :, 0, 1:], ace.table[:, -1][None, :, None].expand(2, 4, 55))  # [CLS] row
    assert ace.alignment.shape == (2,)


def test_without_cls_the_bias_is_the_cls_bias_minus_its_row_and_column():
    """SM has no [CLS]: same parameters, same bias over the text + region block."""
    torch.manual_seed(0)
    with_cls = AceRpe(32, 4).eval()
    no_cls = AceRpe(32, 4, cls=False).eval()
    no_cls.load_state_dict(with_cls.state_dict())
    t, v = torch.randn(2, 6, 32), torch.randn(2, 49, 32)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    with torch.no_grad():
        with_cls.table.copy_(torch.randn_like(with_cls.table))
        no_cls.table.copy_(with_cls.table)
        a, b = with_cls(t, mask, v), no_cls(t, mask, v)
    assert b.shape == (2, 4, 6 + 49, 6 + 49)
    assert torch.equal(a[:, :, 1:, 1:], b)


@pytest.mark.parametrize("make", [
    lambda: SingleStream(SingleStreamConfig(d=32, layers=2, ace=AceRpeConfig(enabled=True, anchor_loss=0.5))),
    lambda: SplitMerge(SplitMergeConfig(d_in=32, d=32, layers=2, ace=AceRpeConfig(enabled=True, anchor_loss=0.5))),
], ids=["tv", "sm"])
def test_ace_rpe_ignores_padding_and_reports_alignment(make):
    torch.manual_seed(0)
    model = make().eval()
    t, v = torch.randn(1, 5, 32), torch.randn(1, 49, 32)
    padded = torch.cat([t, torch.randn(1, 3, 32)], 1)
    with torch.no_grad():
        a = model.score(t, torch.ones(1, 5, dtype=torch.bool), v)
        b = model.score(padded, torch.tensor([[True] * 5 + [False] * 3]), v)
        assert torch.allclose(a, b, atol=1e-5)
        fused = model.rerank(t, torch.ones(1, 5, dtype=torch.bool), v[None].expand(1, 3, -1, -1), torch.rand(1, 3))
    assert fused.shape == (1, 3) and model.alignment.shape == (1, 3)


def test_anchor_loss_trains_the_anchor_projections():
    """Gradient reaches the anchor projections through the similarity term (distances are discrete)."""
    torch.manual_seed(0)
    tv = SingleStream(SingleStreamConfig(d=32, layers=1, ace=AceRpeConfig(enabled=True))).train()
    s = tv.score(torch.randn(4, 5, 32), torch.ones(4, 5, dtype=torch.bool), torch.randn(4, 49, 32))
    (s.sum() + tv.ace.alignment.sum()).backward()
    assert tv.ace.t_proj.weight.grad.abs().sum() > 0 and tv.ace.table.grad.abs().sum() > 0
