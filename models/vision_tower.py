"""Vision tower: frozen Lite0 7x7x1280 grid -> d-dim region tokens with 2D
positions -> `layers` transformer blocks -> pooled, unit-norm image vector g_I.

g_I also sees EfficientNet's own global feature (the mean of the grid through a
linear map) beside the attended regions: ImageNet's pooled feature is the
strongest single signal the frozen backbone has.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from crossprobe.core import inputs
from crossprobe.models.layers import Block, grid_positions
from crossprobe.models.pooling import make_pool


@dataclass
class VisionTowerConfig:
    d: int = 256
    layers: int = 2
    heads: int = 4
    pool: str = "sap"  # "sap" | "temde" (see pooling.py)
    pool_hops: int = 1
    dropout: float = 0.1


@dataclass
class VisionOut:
    tokens: torch.Tensor  # (B, 49, d) contextual region features
    g: torch.Tensor  # (B, d) unit-norm two-tower vector


class VisionTower(nn.Module):
    def __init__(self, cfg: VisionTowerConfig):
        super().__init__()
        self.cfg = cfg
        self.inp = nn.Sequential(nn.LayerNorm(inputs.IMAGE_FEAT_DIM), nn.Linear(inputs.IMAGE_FEAT_DIM, cfg.d))
        self.register_buffer("pos", grid_positions(inputs.GRID, cfg.d), persistent=False)  # (49, d)
        self.blocks = nn.ModuleList(Block(cfg.d, cfg.heads, dropout=cfg.dropout) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d)
        self.pool = make_pool(cfg.pool, cfg.d, cfg.pool_hops)
        self.glob = nn.Sequential(nn.LayerNorm(inputs.IMAGE_FEAT_DIM), nn.Linear(inputs.IMAGE_FEAT_DIM, cfg.d))

    def forward(self, grid: torch.Tensor) -> VisionOut:
        """(B, 49, 1280) backbone grid -> VisionOut."""
        x = self.inp(grid) + self.pos  # (B, 49, d)
        for blk in self.blocks:
            x = blk(x)
        x = self.ln(x)
        g = F.normalize(self.pool(x) + self.glob(grid.mean(1)), dim=-1)
        return VisionOut(x, g)
