"""Training losses.

- Two-tower: symmetric in-batch InfoNCE (CLIP) and/or VSE++ max-violation hinge;
  optionally SEAM's order-embedding hinge (order-violation penalty as -similarity).
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
    return vsepp_max_violation_scores(g_q @ g_i.T, margin)


def listwise(logits: torch.Tensor) -> torch.Tensor:
    """(Q, K) fused logits with the positive in column 0 -> scalar loss."""
    return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device))


def order_violation(text: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
    """Order-embedding penalty E(caption, image) = ||max(0, |t| - |v|)||^2 (Vendrov et al.,
    as SEAM uses it): a caption is an abstraction of its image, so in the reversed
    product order on |coordinates| the image should dominate the caption.
    (Q, d) x (I, d) -> (Q, I), zero exactly when |t| <= |v| in every coordinate."""
    return (text.abs()[:, None, :] - image.abs()[None, :, :]).clamp_min(0).pow(2).sum(-1)


def order_hinge(g_q: torch.Tensor, g_i: torch.Tensor, margin: float = 0.05) -> torch.Tensor:
    """Max-violation hinge with similarity -E (order_violation) over the in-batch pairs."""
    return vsepp_max_violation_scores(-order_violation(g_q, g_i), margin)


def vsepp_max_violation_scores(s: torch.Tensor, margin: float) -> torch.Tensor:
    """VSE++ hinge on a (B, B) similarity matrix whose diagonal holds the positives."""
    pos = s.diag()
    off = s - torch.eye(len(s), device=s.device) * 1e4  # exclude the positives
    cost_i = (margin + off.max(1).values - pos).clamp_min(0)  # hardest image per caption
    cost_q = (margin + off.max(0).values - pos).clamp_min(0)  # hardest caption per image
    return (cost_i + cost_q).mean()
