"""Single-stream cross-encoder reference (TV): the query's tokens and the image's
49 regions pass jointly through EVERY trainable layer above the frozen
backbones (the same depth budget as tower + cross layers), and a [CLS] token
gives a matching score, as in text-vision BERT / ALBEF's ITM head. Nothing is
cacheable per image beyond the frozen grid: the cost the probes avoid.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from crossprobe.core import inputs
from crossprobe.models.layers import Block, Fusion, grid_positions, joint_pairs
from crossprobe.models.research.ace_rpe import AceRpe, AceRpeConfig, AceRpeField, ace_field


@dataclass
class SingleStreamConfig(AceRpeField):
    d: int = 128
    layers: int = 4  # = vision tower layers (2) + cross layers (2)
    heads: int = 4
    dropout: float = 0.1
    attention: str = "standard"  # "standard" | "zodiac" (models/research/zodiac.py)
    zodiac_dropout: float = 0.2
    ace: AceRpeConfig = ace_field()  # anchor-based cross-modal relative positions (models/research/ace_rpe.py)


class SingleStream(nn.Module):
    def __init__(self, cfg: SingleStreamConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d
        self.text_in = nn.Sequential(nn.LayerNorm(inputs.TEXT_FEAT_DIM), nn.Linear(inputs.TEXT_FEAT_DIM, d))
        self.vision_in = nn.Sequential(nn.LayerNorm(inputs.IMAGE_FEAT_DIM), nn.Linear(inputs.IMAGE_FEAT_DIM, d))
        self.register_buffer("pos", grid_positions(inputs.GRID, d), persistent=False)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.type_emb = nn.Parameter(torch.zeros(2, d))
        self.blocks = nn.ModuleList(
            Block(d, cfg.heads, dropout=cfg.dropout, attention=cfg.attention, zodiac_dropout=cfg.zodiac_dropout)
            for _ in range(cfg.layers)
        )
        self.ace = AceRpe(d, cfg.heads, cfg.ace) if cfg.ace.enabled else None
        self.alignment: torch.Tensor | None = None  # (Q, K) ACE-RPE alignment of the last rerank call
        self.head = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 1))
        self.fusion = Fusion(beta=1.0)

    def embed_text(self, t_states: torch.Tensor) -> torch.Tensor:
        """(P, T, 384) frozen MiniLM states -> (P, T, d) input tokens (per query)."""
        return self.text_in(t_states) + self.type_emb[0]

    def embed_image(self, grid: torch.Tensor) -> torch.Tensor:
        """(P, 49, 1280) grid -> (P, 49, d) input tokens (per image: a linear map, cacheable)."""
        return self.vision_in(grid) + self.pos + self.type_emb[1]

    def score(self, t, t_mask, v) -> torch.Tensor:
        """Pairs of embedded inputs: (P, T, d), (P, T), (P, 49, d) -> (P,) logit."""
        P = t.shape[0]
        x = torch.cat([self.cls.expand(P, -1, -1), t, v], 1)
        ones = torch.ones(P, 1, dtype=torch.bool, device=x.device)
        mask = torch.cat([ones, t_mask.bool(), ones.expand(P, v.shape[1])], 1)
        bias = self.ace(t, t_mask, v) if self.ace is not None else None  # (P, heads, L, L)
        for blk in self.blocks:
            x = blk(x, mask, bias)
        return self.head(x[:, 0]).squeeze(-1)

    def rerank(self, t, t_mask, v, s_tt):
        """(Q, T, d) embedded query, (Q, T), (Q, K, 49, d) embedded images, (Q, K) -> fused logits (Q, K)."""
        fused = self.fusion(s_tt, joint_pairs(self.score, t, t_mask, v))
        if self.ace is not None:
            self.alignment = self.ace.alignment.view_as(s_tt)
        return fused
