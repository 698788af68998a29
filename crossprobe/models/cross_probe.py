"""Cross-probe BERT reranker (CP).

Each side is summarised by a few learned probes in its own modality: m text
probes attend to the query's tokens, n vision probes to the image's 49 regions.
Only the probes meet: `layers` self-attention blocks over [P_t ; P_v]. Then
  q = w_bar + sum_i P_t'[i],  I = b_bar + sum_j P_v'[j],  s_cp = cos(q, I)
and the ranking logit is a learned fusion with the two-tower score.

Per image, everything except the `layers` cross blocks is cached (P_v, b_bar):
the request path pays only for (m + n) tokens x `layers` blocks per candidate.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from crossprobe.models.layers import Block, Fusion, ProbePool, masked_mean


@dataclass
class CrossProbeConfig:
    d_in: int = 256  # tower width
    d: int = 128  # probe width
    m: int = 5  # text probes
    n: int = 15  # vision probes
    layers: int = 2  # cross layers
    heads: int = 4
    dropout: float = 0.1
    attention: str = "standard"  # "standard" | "zodiac" in the cross layers (models/zodiac.py)
    zodiac_dropout: float = 0.2


class CrossProbe(nn.Module):
    def __init__(self, cfg: CrossProbeConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d
        self.text_in = nn.Linear(cfg.d_in, d)
        self.vision_in = nn.Linear(cfg.d_in, d)
        self.text_probes = ProbePool(cfg.m, d, cfg.heads, cfg.dropout)
        self.vision_probes = ProbePool(cfg.n, d, cfg.heads, cfg.dropout)
        self.type_emb = nn.Parameter(torch.zeros(2, d))  # text / vision, so cross layers know which is which
        self.cross = nn.ModuleList(
            Block(d, cfg.heads, dropout=cfg.dropout, attention=cfg.attention, zodiac_dropout=cfg.zodiac_dropout)
            for _ in range(cfg.layers)
        )
        self.fusion = Fusion()

    # --- per modality (cacheable) -------------------------------------------------
    def encode_text(self, tokens: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, d_in), (B, T) -> P_t (B, m, d), w_bar (B, d)."""
        x = self.text_in(tokens)
        return self.text_probes(x, mask.bool()), masked_mean(x, mask.bool())

    def encode_image(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, 49, d_in) -> P_v (B, n, d), b_bar (B, d)."""
        x = self.vision_in(tokens)
        return self.vision_probes(x), x.mean(1)

    # --- per pair (the request path) ---------------------------------------------
    def score(self, p_t: torch.Tensor, w_bar: torch.Tensor, p_v: torch.Tensor, b_bar: torch.Tensor) -> torch.Tensor:
        """Pairs in a flat batch: (P, m, d), (P, d), (P, n, d), (P, d) -> (P,) cosine."""
        m = p_t.shape[1]
        x = torch.cat([p_t + self.type_emb[0], p_v + self.type_emb[1]], dim=1)  # (P, m+n, d)
        for blk in self.cross:
            x = blk(x)
        q = w_bar + x[:, :m].sum(1)
        i = b_bar + x[:, m:].sum(1)
        return F.cosine_similarity(q, i, dim=-1)

    def rerank(self, p_t, w_bar, p_v, b_bar, s_tt):
        """One query per row against its K candidates:
        (Q, m, d), (Q, d), (Q, K, n, d), (Q, K, d), (Q, K) -> fused logits (Q, K)."""
        Q, K = s_tt.shape
        s = self.score(
            p_t.unsqueeze(1).expand(-1, K, -1, -1).reshape(Q * K, *p_t.shape[1:]),
            w_bar.unsqueeze(1).expand(-1, K, -1).reshape(Q * K, -1),
            p_v.reshape(Q * K, *p_v.shape[2:]),
            b_bar.reshape(Q * K, -1),
        ).view(Q, K)
        return self.fusion(s_tt, s)
