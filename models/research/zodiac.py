"""ZoDIAC attention (Zoneup Dropout Injection Attention Calculation), an
option for the CP cross layers and the TV single stream.

Standard attention, refined and then intensified:
  refine     GELU on the inputs, on q / k / v and on the logits before softmax;
             the attended values get their own dropout rate (`zodiac_dropout`)
  intensity  a secondary query q2 scores the values: I = sigmoid(masked mean of
             GELU(q2 v^T / sqrt(hd))), ONE NUMBER PER SAMPLE AND PER HEAD
  zoneup     out = dropout(A v) * (1 + z * I), z a learned scalar (init 1)

The reference implementation averages the secondary scores over the whole
tensor (batch included) and divides by the mask's sum once, so a sample's
output depends on the rest of its batch and padding dilutes the mean. Here the
mean runs over each sample's real (query, key) pairs only, per head: a query
scores the same whatever it is batched with, which a reranker must guarantee.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

NEG_INF = -1e4


class ZodiacAttention(nn.Module):
    """Queries (B, Tq, D) over keys/values (B, Tk, D); same call as layers.Attention."""

    def __init__(self, d: int, heads: int, dropout: float = 0.0, zodiac_dropout: float = 0.2):
        super().__init__()
        assert d % heads == 0, (d, heads)
        self.h, self.hd = heads, d // heads
        self.q = nn.Linear(d, d)
        self.q2 = nn.Linear(d, d)  # secondary query: only feeds the intensity
        self.kv = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, d)
        self.attn_drop = nn.Dropout(dropout)
        self.value_drop = nn.Dropout(zodiac_dropout)
        self.zoneup = nn.Parameter(torch.tensor(1.0))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return F.gelu(x).view(B, T, self.h, self.hd).transpose(1, 2)  # (B, h, T, hd)

    def forward(
        self,
        x: torch.Tensor,
        ctx: torch.Tensor,
        ctx_mask: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        x_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, Tq, D) queries, (B, Tk, D) keys/values, (B, Tk) / (B, Tq) bool masks, (B, h, Tq, Tk) bias
        -> (B, Tq, D)."""
        B, Tq, D = x.shape
        x, ctx = F.gelu(x), F.gelu(ctx)
        q, q2 = self._heads(self.q(x)), self._heads(self.q2(x))
        k, v = (self._heads(t) for t in self.kv(ctx).chunk(2, dim=-1))
        scale = self.hd**-0.5
        logits = F.gelu(q @ k.transpose(-1, -2) * scale)  # (B, h, Tq, Tk) refined logits
        if bias is not None:
            logits = logits + bias
        # (B, 1, Tq, Tk) real pairs: key is real and (when known) the query is real
        pair = torch.ones(B, 1, Tq, ctx.shape[1], dtype=torch.bool, device=x.device)
        if ctx_mask is not None:
            pair = pair & ctx_mask[:, None, None, :]
            logits = logits.masked_fill(~ctx_mask[:, None, None, :], NEG_INF)
        if x_mask is not None:
            pair = pair & x_mask[:, None, :, None]
        a = self.attn_drop(logits.softmax(-1))
        o = a @ v  # (B, h, Tq, hd)
        s2 = F.gelu(q2 @ v.transpose(-1, -2) * scale)  # (B, h, Tq, Tk)
        w = pair.to(s2.dtype)
        intensity = torch.sigmoid(
            (s2 * w).sum((2, 3), keepdim=True) / w.sum((2, 3), keepdim=True).clamp_min(1.0)
        )  # (B, h, 1, 1)
        self.last_intensity = intensity.detach()[..., 0, 0]  # (B, h), for inspection and tests
        o = self.value_drop(o) * (1 + self.zoneup * intensity)
        return self.out(o.transpose(1, 2).reshape(B, Tq, D))
