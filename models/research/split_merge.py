"""Split-merge reference (SM) from the Cross-probe paper: the lower layers run
per modality (the towers), the upper `layers` blocks run jointly over ALL text
tokens and ALL 49 regions of each query-image pair. Same scoring head as CP
(cosine of text-side and image-side means, fused with the two-tower score), so
the only difference from CP is probes vs. every token in the cross layers.
Option: ACE-RPE relative positions in the joint layers (models/research/ace_rpe.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from crossprobe.models.layers import Block, Fusion, joint_pairs, masked_mean
from crossprobe.models.research.ace_rpe import AceRpe, AceRpeConfig, AceRpeField, ace_field


@dataclass
class SplitMergeConfig(AceRpeField):
    d_in: int = 256
    d: int = 128
    layers: int = 2
    heads: int = 4
    dropout: float = 0.1
    ace: AceRpeConfig = ace_field()  # anchor-based cross-modal relative positions in the joint layers


class SplitMerge(nn.Module):
    def __init__(self, cfg: SplitMergeConfig):
        super().__init__()
        self.cfg = cfg
        self.text_in = nn.Linear(cfg.d_in, cfg.d)
        self.vision_in = nn.Linear(cfg.d_in, cfg.d)
        self.type_emb = nn.Parameter(torch.zeros(2, cfg.d))
        self.cross = nn.ModuleList(Block(cfg.d, cfg.heads, dropout=cfg.dropout) for _ in range(cfg.layers))
        self.ace = AceRpe(cfg.d, cfg.heads, cfg.ace, cls=False) if cfg.ace.enabled else None
        self.alignment: torch.Tensor | None = None  # (Q, K) ACE-RPE alignment of the last rerank call
        self.fusion = Fusion()

    def embed_text(self, t_tokens: torch.Tensor) -> torch.Tensor:
        """(P, T, d_in) text tower tokens -> (P, T, d)."""
        return self.text_in(t_tokens) + self.type_emb[0]

    def embed_image(self, v_tokens: torch.Tensor) -> torch.Tensor:
        """(P, 49, d_in) vision tower tokens -> (P, 49, d) (per image, cacheable)."""
        return self.vision_in(v_tokens) + self.type_emb[1]

    def score(self, t, t_mask, v) -> torch.Tensor:
        """Pairs of embedded inputs: (P, T, d), (P, T), (P, 49, d) -> (P,) cosine."""
        t_mask = t_mask.bool()
        T = t.shape[1]
        x = torch.cat([t, v], 1)
        mask = torch.cat([t_mask, torch.ones(v.shape[:2], dtype=torch.bool, device=x.device)], 1)
        bias = self.ace(t, t_mask, v) if self.ace is not None else None  # (P, heads, T+49, T+49)
        for blk in self.cross:
            x = blk(x, mask, bias)
        return F.cosine_similarity(masked_mean(x[:, :T], t_mask), x[:, T:].mean(1), dim=-1)

    def rerank(self, t, t_mask, v, s_tt):
        """(Q, T, d), (Q, T), (Q, K, 49, d), (Q, K) -> fused logits (Q, K)."""
        fused = self.fusion(s_tt, joint_pairs(self.score, t, t_mask, v))
        if self.ace is not None:
            self.alignment = self.ace.alignment.view_as(s_tt)
        return fused
