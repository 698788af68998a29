"""ACE-RPE: anchor-based cross-modal relative positions, an option for the TV
single stream (models/research/single_stream.py) and the split-merge reference
(models/research/split_merge.py).

Text tokens have positions on a line and regions on the 7x7 grid, but a text
token and a region have no position relative to each other. ACE-RPE links them
through anchors and measures distance along the resulting graph:

  anchors   G groups (one per attention head) of token-patch cosine similarity
            S_g (P, G, T, 49) from learned projections, soft-shrunk
            (S' = softshrink(S, lambda): weak matches become exactly 0). Each
            real token's anchor in group g is its most similar patch, kept only
            if S' > 0 there.
  graph     nodes = T text positions + 49 grid cells; edges: neighbouring
            tokens (1), 4-neighbouring cells (1), token <-> its anchor (1).
  distance  all-pairs shortest paths (Floyd-Warshall, capped at max_dist + 1 =
            "far"); symmetric by construction, always finite.
  bias      per group (= per head) a learned scalar per distance bucket, plus
            gamma_g * S' on the text<->region logits (this is what lets the
            anchors learn without the anchor loss; the distances themselves are
            discrete). [CLS] rows/columns (TV's; SM has none) get a bucket of their own.
  anchor loss (optional) listwise cross-entropy over each query's candidates of
            the alignment a(q, I) = mean over groups and real tokens of
            max_patch S'; trains the anchors to find the caption's words.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from crossprobe.core import inputs


@dataclass
class AceRpeConfig:
    """ACE-RPE in a joint reranker (TV: research/single_stream.py, SM: research/split_merge.py), one group per head."""

    enabled: bool = False  # anchor-based cross-modal relative positions
    shrink: float = 0.2  # lambda of the soft-shrink: weaker token-patch matches are no anchor
    max_dist: int = 8  # distances beyond this share the "far" bucket
    anchor_loss: float = 0.0  # weight of the anchor loss in reranker training (0 = off)
    # A checkpoint's config.json holds these flat in the reranker's config, under the names they had before they
    # were nested; its fingerprint hashes that form, so it is the one written and read (AceRpeField).
    FLAT: ClassVar[dict[str, str]] = {
        "enabled": "ace_rpe",
        "shrink": "ace_shrink",
        "max_dist": "ace_max_dist",
        "anchor_loss": "anchor_loss",
    }


class AceRpeField:
    """For a reranker config with an `ace: AceRpeConfig` field: to_dict / from_dict in the flat saved form."""

    if TYPE_CHECKING:  # for mypy only: what the dataclasses this is mixed into have (nothing added at run time)
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

        def __init__(self, **kwargs: Any) -> None: ...

    def to_dict(self) -> dict:
        out: dict = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out.update(
                {flat: getattr(v, name) for name, flat in AceRpeConfig.FLAT.items()} if f.name == "ace" else {f.name: v}
            )
        return out

    @classmethod
    def from_dict(cls, d: dict):
        ace = {name: d[flat] for name, flat in AceRpeConfig.FLAT.items() if flat in d}
        rest = {k: v for k, v in d.items() if k not in AceRpeConfig.FLAT.values()}
        return cls(**rest, ace=AceRpeConfig(**ace))


def ace_field():
    return field(default_factory=AceRpeConfig)


def grid_manhattan(grid: int = inputs.GRID) -> torch.Tensor:
    """(grid*grid, grid*grid) shortest path lengths on the 4-neighbour grid."""
    ys, xs = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    ys, xs = ys.flatten(), xs.flatten()
    return (ys[:, None] - ys[None, :]).abs() + (xs[:, None] - xs[None, :]).abs()


def anchor_distances(s_shrunk: torch.Tensor, t_mask: torch.Tensor, cap: int) -> torch.Tensor:
    """Shortest-path distances over text positions, grid cells and anchor edges.

    (P, G, T, R) shrunk similarities, (P, T) bool mask -> (P, G, T+R, T+R) uint8,
    text nodes first, every entry in [0, cap] (cap = unreachable or at least cap).
    """
    P, G, T, R = s_shrunk.shape
    n = T + R
    dev = s_shrunk.device
    D = torch.full((P, G, n, n), cap, dtype=torch.uint8, device=dev)
    pos = torch.arange(T, device=dev)
    tt = (pos[:, None] - pos[None, :]).abs().clamp(max=cap).to(torch.uint8)  # (T, T)
    real = t_mask[:, None, :, None] & t_mask[:, None, None, :]  # (P, 1, T, T)
    D[:, :, :T, :T] = torch.where(real, tt, torch.tensor(cap, dtype=torch.uint8, device=dev))
    side = int(round(R**0.5))
    D[:, :, T:, T:] = grid_manhattan(side).clamp(max=cap).to(torch.uint8).to(dev)
    best = s_shrunk.max(-1)
    has = (best.values > 0) & t_mask[:, None, :]  # (P, G, T)
    p, g, i = has.nonzero(as_tuple=True)
    r = best.indices[p, g, i] + T
    D[p, g, i, r] = 1
    D[p, g, r, i] = 1
    idx = torch.arange(n, device=dev)
    D[:, :, idx, idx] = 0  # padded tokens included: distance to themselves is 0
    capt = torch.tensor(cap, dtype=torch.uint8, device=dev)
    for k in range(n):  # Floyd-Warshall; values stay <= cap so uint8 sums cannot overflow
        D = torch.minimum(D, torch.minimum(D[:, :, :, k : k + 1] + D[:, :, k : k + 1, :], capt))
    return D


class AceRpe(nn.Module):
    """Relative-position logit bias for a [CLS] + T text + 49 region sequence (cls=False: T + 49).

    (P, T, d) text inputs, (P, T) mask, (P, 49, d) region inputs -> (P, G, c+T+49, c+T+49), c = int(cls)."""

    def __init__(self, d: int, groups: int, cfg: AceRpeConfig | None = None, cls: bool = True):
        super().__init__()
        assert d % groups == 0, (d, groups)
        cfg = cfg or AceRpeConfig(enabled=True)
        max_dist = cfg.max_dist
        self.G, self.shrink, self.cap, self.c = groups, cfg.shrink, max_dist + 1, int(cls)
        self.t_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.table = nn.Parameter(torch.zeros(groups, max_dist + 3))  # buckets 0..max_dist, far, [CLS]
        self.gamma = nn.Parameter(torch.ones(groups))
        self.alignment: torch.Tensor | None = None  # (P,) after each forward, for the anchor loss

    def similarity(self, t: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(P, T, d), (P, R, d) -> (P, G, T, R) per-group cosine similarity."""
        P, T, d = t.shape
        tg = F.normalize(self.t_proj(t).view(P, T, self.G, d // self.G), dim=-1).transpose(1, 2)
        vg = F.normalize(self.v_proj(v).view(P, v.shape[1], self.G, d // self.G), dim=-1).transpose(1, 2)
        return tg @ vg.transpose(-1, -2)

    def forward(self, t: torch.Tensor, t_mask: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(P, T, d), (P, T), (P, R, d) -> (P, G, c+T+R, c+T+R) logit bias; sets self.alignment (P,)."""
        t_mask = t_mask.bool()
        P, T = t_mask.shape
        s = F.softshrink(self.similarity(t, v), self.shrink)  # (P, G, T, R)
        m = t_mask[:, None, :].to(s.dtype)
        self.alignment = ((s.max(-1).values * m).sum(-1) / m.sum(-1).clamp_min(1.0)).mean(1)  # (P,)
        with torch.no_grad():
            D = anchor_distances(s.detach(), t_mask, self.cap).long()  # (P, G, n, n)
        n, c = D.shape[-1], self.c
        D = F.pad(D, (c, 0, c, 0), value=self.cap + 1)  # [CLS] first, with the dedicated last bucket
        gi = torch.arange(self.G, device=D.device)[None, :, None, None]
        bias = self.table[gi, D]  # (P, G, c+n, c+n)
        cross = self.gamma[None, :, None, None] * s  # (P, G, T, R) learnable text<->region term
        return bias + F.pad(cross, (c + T, 0, c, n - T)) + F.pad(cross.transpose(-1, -2), (c, n - T, c + T, 0))
