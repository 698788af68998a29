"""Region-level labels: the rerankers see what the ImageNet head finds in each part of the photo.

The label bridge (bridge.py) classifies the grid's mean, so a small object in a cluttered scene (a cup
on a kitchen table) is a minority of the one label vector per image. Here the same frozen head labels
each of the 49 grid cells, and a query is matched against the cells' labels:

    label_j  = argmax head(grid_j)                          (B, 49)    index time, same forward pass
    sim      = g_q @ E.T                                    (Q, 1000)  query time, E = the bridge's class table
    s_region = mean of the `pool` largest sim[label_j]      (Q, K)     over a candidate's 49 cells
    logit    = reranker logit + SCALE * w[method] * s_region

Chosen on the two dev sets by research/region_labels/sweep.py (docs/research/bridge.md, "Region-level labels"): the
top class per cell (T 1) with the mean of the 3 best cells beat summing the top 5 or 20 classes, a
probability-weighted score, the max or the mean over cells. The index stores 49 class ids per image
(98 bytes); the scorer graphs take them with the query's class similarities, so the service runs the
same formula as evaluation. w is 0 for the references (SM, TV) and for the two-tower order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

SCALE = 20.0  # the two-tower logit scale the rerankers' fusion uses (training/rerankers.set_fusion)


@dataclass
class RegionConfig:
    weights: dict[str, float] = field(default_factory=dict)  # reranker -> w in logit + SCALE * w * s_region; {} = off
    pool: int = 3  # s_region = the mean of this many best-matching cells

    def __post_init__(self):
        if not 1 <= self.pool <= 49 or any(w < 0 for w in self.weights.values()):
            raise ValueError(f"bad region config {self}")

    @property
    def enabled(self) -> bool:
        return any(w > 0 for w in self.weights.values())

    def weight(self, method: str) -> float:
        return float(self.weights.get(method, 0.0))


def region_score(class_sim: torch.Tensor, labels: torch.Tensor, pool: int) -> torch.Tensor:
    """(Q, 1000) query-class cosines, (Q, K, 49) cell labels -> (Q, K): mean of the `pool` best cells."""
    Q, K, C = labels.shape
    cells = torch.gather(class_sim, 1, labels.reshape(Q, K * C).long()).reshape(Q, K, C)
    return cells.topk(pool, dim=-1).values.mean(-1)


def add_region(
    logits: torch.Tensor, cfg: RegionConfig, method: str, class_sim: torch.Tensor | None, labels: torch.Tensor | None
) -> torch.Tensor:
    """(Q, K) reranker logits -> the same plus the weighted region term (unchanged when w is 0)."""
    w = cfg.weight(method)
    if w <= 0:
        return logits
    if class_sim is None or labels is None:
        raise ValueError(f"{method}: the region term needs the query's class similarities and the cells' labels")
    return logits + SCALE * w * region_score(class_sim, labels, cfg.pool)
