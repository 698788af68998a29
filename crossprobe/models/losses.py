"""Training losses.

- Two-tower: symmetric in-batch InfoNCE (CLIP) and/or VSE++ max-violation hinge.
- Rerankers: listwise softmax cross-entropy over [positive, hard negatives mined
  from the two-tower ranking], the ITM recipe of ALBEF made listwise.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def info_nce(g_q: torch.Tensor, g_i: torch.Tensor, logit_scale: torch.Tensor) -> torch.Tensor:
    """(B, d), (B, d) unit vectors, row i matches row i -> scalar loss."""
    logits = logit_scale.exp().clamp(max=100.0) * g_q @ g_i.T
    target = torch.arange(len(g_q), device=g_q.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))


def vsepp_max_violation(g_q: torch.Tensor, g_i: torch.Tensor, margin: float = 0.2) -> torch.Tensor:
    """VSE++: hinge on the hardest in-batch negative in each direction."""
    s = g_q @ g_i.T
    pos = s.diag()
    off = s - torch.eye(len(s), device=s.device) * 1e4  # exclude the positives
    cost_i = (margin + off.max(1).values - pos).clamp_min(0)  # hardest image per caption
    cost_q = (margin + off.max(0).values - pos).clamp_min(0)  # hardest caption per image
    return (cost_i + cost_q).mean()


def listwise(logits: torch.Tensor) -> torch.Tensor:
    """(Q, K) fused logits with the positive in column 0 -> scalar loss."""
    return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device))
