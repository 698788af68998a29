"""Cross-probe BERT reranker (CP).

Each side is summarised by a few learned probes in its own modality: m text
probes attend to the query's tokens, n vision probes to the image's 49 regions.
Only the probes meet: `layers` self-attention blocks over [P_t ; P_v]. Then
  q = w_bar + sum_i P_t'[i],  I = b_bar + sum_j P_v'[j],  s_cp = cos(q, I)
and the ranking logit is a learned fusion with the two-tower score.

Per image, everything except the `layers` cross blocks is cached (P_v, b_bar):
the request path pays only for (m + n) tokens x `layers` blocks per candidate.

Inputs (`inputs`): "tower" reads the towers' d_in-wide tokens, "backbone" the frozen
backbones' own features (MiniLM states below the fine-tuned layers, the raw Lite0
grid), "both" the sum of the two projections. Why "backbone" exists: the towers fit
the training split (their train loss is far below dev), so a reranker trained on
their tokens of training images learns features that are better than they will be
at test time and ends up deferring to the two-tower score. The frozen features are
equally good on every split, which makes CP a second, independent view.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from crossprobe.core import inputs
from crossprobe.models.layers import Block, Fusion, ProbePool, grid_positions, masked_mean

INPUTS = ("tower", "backbone", "both")


@dataclass
class CrossProbeConfig:
    """Defaults: the served CP, d128-n8-l1 over the backbone features (ModelConfig.from_dict reads a
    config.json saved under older defaults as it was trained)."""

    d_in: int = 256  # tower width (SearchModel sets it to the vision tower's d)
    d: int = 128  # probe width
    m: int = 5  # text probes
    n: int = 8  # vision probes
    layers: int = 1  # cross layers
    heads: int = 4
    dropout: float = 0.1
    attention: str = "standard"  # "standard" | "zodiac" in the cross layers (models/research/zodiac.py)
    zodiac_dropout: float = 0.2
    inputs: str = "backbone"  # "tower" | "backbone" | "both" (module docstring)

    def __post_init__(self):
        if self.inputs not in INPUTS:
            raise ValueError(f"CrossProbeConfig.inputs must be one of {INPUTS}, got {self.inputs!r}")

    @property
    def uses_tower(self) -> bool:
        return self.inputs in ("tower", "both")

    @property
    def uses_backbone(self) -> bool:
        return self.inputs in ("backbone", "both")


class CrossProbe(nn.Module):
    pos: torch.Tensor | None  # buffer registered in __init__ when cfg.uses_backbone

    def __init__(
        self,
        cfg: CrossProbeConfig,
        text_width: int = inputs.TEXT_FEAT_DIM,
        image_width: int = inputs.IMAGE_FEAT_DIM,
        grid: int | None = inputs.GRID,
    ):
        """text_width, image_width: the backbone features' widths (MiniLM's states, Lite0's cells; another model's
        token widths for reranker heads, models/heads.py). grid: the side of the image grid whose 2D positions are
        added to its cells; None for features that carry their positions already (a ViT's patch tokens)."""
        super().__init__()
        self.cfg = cfg
        d = cfg.d
        if cfg.uses_tower:
            self.text_in = nn.Linear(cfg.d_in, d)
            self.vision_in = nn.Linear(cfg.d_in, d)
        if cfg.uses_backbone:  # LayerNorm first: Lite0's ReLU6 grid and MiniLM states have very different scales
            self.text_bb = nn.Sequential(nn.LayerNorm(text_width), nn.Linear(text_width, d))
            self.vision_bb = nn.Sequential(nn.LayerNorm(image_width), nn.Linear(image_width, d))
            # the raw grid has no positions (the vision tower adds its own to its tokens)
            self.register_buffer("pos", grid_positions(grid, d) if grid else None, persistent=False)  # (49, d)
        self.text_probes = ProbePool(cfg.m, d, cfg.heads, cfg.dropout)
        self.vision_probes = ProbePool(cfg.n, d, cfg.heads, cfg.dropout)
        self.type_emb = nn.Parameter(torch.zeros(2, d))  # text / vision, so cross layers know which is which
        self.cross = nn.ModuleList(
            Block(d, cfg.heads, dropout=cfg.dropout, attention=cfg.attention, zodiac_dropout=cfg.zodiac_dropout)
            for _ in range(cfg.layers)
        )
        self.fusion = Fusion()

    # --- per modality (cacheable) -------------------------------------------------
    def encode_text(
        self, tokens: torch.Tensor | None, mask: torch.Tensor, states: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, d_in) tower tokens and/or (B, T, 384) frozen MiniLM states, (B, T) mask
        -> P_t (B, m, d), w_bar (B, d)."""
        x = self._embed(tokens, states, "text_in", "text_bb")
        return self.text_probes(x, mask.bool()), masked_mean(x, mask.bool())

    def encode_image(
        self, tokens: torch.Tensor | None, grid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, 49, d_in) tower tokens and/or (B, 49, 1280) Lite0 grid (heads: (B, P, W) patch tokens)
        -> P_v (B, n, d), b_bar (B, d)."""
        x = self._embed(tokens, grid, "vision_in", "vision_bb")
        if self.cfg.uses_backbone and self.pos is not None:
            x = x + self.pos
        return self.vision_probes(x), x.mean(1)

    def _embed(self, tokens, feats, tower_proj: str, backbone_proj: str) -> torch.Tensor:
        """The configured inputs, each projected to d and summed: (B, T, d)."""
        parts = []
        if self.cfg.uses_tower:
            parts.append(getattr(self, tower_proj)(tokens))
        if self.cfg.uses_backbone:
            if feats is None:
                raise ValueError(f"CP with inputs={self.cfg.inputs!r} needs the backbone features")
            parts.append(getattr(self, backbone_proj)(feats))
        return parts[0] if len(parts) == 1 else parts[0] + parts[1]

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
