"""Reranker heads on another model's backbone (issue 47): crossprobe's own Cross-probe and T-EMDE (cross_probe.py,
temde.py) reading a family model's frozen outputs instead of MiniLM's states and Lite0's grid:

    image side   tokens (B, P, W) the trunk's patch tokens          -> p_v (B, n, dc), b_bar (B, dc), s_i (B, N*K)
    text side    tokens (B, T, W_t) its text token states, mask     -> p_t (B, m, dc), w_bar (B, dc), s_q (B, N*K)
    scoring      as the committed checkpoint's scorers (graphs.CPScorer, graphs.TemdeScorer), fused with the
                 backbone's own two-tower score s_tt

Widths come from the backbone (W, W_t); no 2D grid positions are added: a ViT's patch tokens carry their positions.
No region labels (they come from crossprobe's ImageNet head). The backbone's towers stay frozen: the heads are
trained on its cached outputs (training/backbone_heads.py), and the two-tower score stays the backbone's.

A heads checkpoint is a directory like crossprobe's own (checkpoint.py): config.json {"kind": "heads", "backbone":
SPEC, "backbone_fingerprint", "fingerprint", "model": HeadsConfig, training facts}, model.safetensors (float32: the
heads are small) and MODEL_CARD.md. Its fingerprint hashes the backbone's fingerprint, the heads' config and their
weights: an index built with the heads is bound to both.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import load_file

from crossprobe.core import read_config
from crossprobe.models import checkpoint
from crossprobe.models.cross_probe import CrossProbe, CrossProbeConfig
from crossprobe.models.region_labels import RegionConfig
from crossprobe.models.temde import Temde, TemdeConfig

KIND = "heads"  # config.json's "kind" (inference/heads.py reads it without torch)


@dataclass
class HeadsConfig:
    image_width: int  # W: width of the backbone's patch tokens
    text_width: int  # W_t: width of its text token states
    d: int  # its two-tower width (g)
    cells: int  # P: patch tokens per image
    cp: CrossProbeConfig = field(default_factory=lambda: CrossProbeConfig(inputs="backbone"))
    temde: TemdeConfig = field(default_factory=lambda: TemdeConfig(inputs="backbone"))

    def __post_init__(self):
        if self.cp.inputs != "backbone" or self.temde.inputs != "backbone":
            raise ValueError("heads read the backbone's own tokens: cp.inputs and temde.inputs must be 'backbone'")

    @property
    def region(self) -> RegionConfig:
        """No region labels (graphs' scorers ask): they come from crossprobe's own ImageNet head."""
        return RegionConfig()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "HeadsConfig":
        return cls(**{**d, "cp": CrossProbeConfig(**d["cp"]), "temde": TemdeConfig(**d["temde"])})


class HeadsModel(nn.Module):
    """CP and T-EMDE over a backbone's tokens (module docstring). Attribute names as SearchModel's (cp, temde, cfg),
    so reranker training (training/rerankers.py), its PairScorer and the scorer graphs take either."""

    def __init__(self, cfg: HeadsConfig):
        super().__init__()
        self.cfg = cfg
        self.cp = CrossProbe(cfg.cp, text_width=cfg.text_width, image_width=cfg.image_width, grid=None)
        self.temde = Temde(cfg.temde, text_width=cfg.text_width, image_width=cfg.image_width)

    def encode_image(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, P, W) patch tokens -> p_v (B, n, dc), b_bar (B, dc), s_i (B, N*K): what the index stores per image."""
        p_v, b_bar = self.cp.encode_image(None, tokens)
        return p_v, b_bar, self.temde.sketch_image(None, tokens)

    def encode_text(self, tokens: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, W_t) token states, (B, T) mask (1 = token) -> p_t (B, m, dc), w_bar (B, dc), s_q (B, N*K)."""
        mask = mask.bool()
        p_t, w_bar = self.cp.encode_text(None, mask, tokens)
        return p_t, w_bar, self.temde.sketch_text(None, mask, tokens)

    def trained_state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.state_dict())


def fingerprint(model: HeadsModel, backbone_fingerprint: str) -> str:
    return checkpoint.fingerprint(_tensors(model), _identity(model.cfg.to_dict(), backbone_fingerprint))


def _identity(model_cfg: dict, backbone_fingerprint: str) -> dict:
    """What the fingerprint hashes besides the weights."""
    return {"kind": KIND, "backbone_fingerprint": backbone_fingerprint, "model": model_cfg}


def _tensors(model: HeadsModel) -> dict[str, torch.Tensor]:
    """The stored tensors: float32, each its own copy (T-EMDE's coders share their centroids with the module, and
    safetensors stores no shared memory; loading ties them again)."""
    return {
        k: v.detach().float().clone() if v.is_floating_point() else v.clone()
        for k, v in model.trained_state_dict().items()
    }


def save(
    model: HeadsModel,
    out: Path,
    backbone: str,
    backbone_fingerprint: str,
    meta: dict | None = None,
    card: str | None = None,
) -> str:
    """The heads checkpoint directory (module docstring), written atomically -> its fingerprint."""
    tensors, cfg = _tensors(model), model.cfg.to_dict()
    fp = checkpoint.fingerprint(tensors, _identity(cfg, backbone_fingerprint))
    config = {
        "kind": KIND,
        "backbone": backbone,
        "backbone_fingerprint": backbone_fingerprint,
        "fingerprint": fp,
        "model": cfg,
        **(meta or {}),
    }
    checkpoint.write(out, tensors, config, {"MODEL_CARD.md": card} if card else None)
    return fp


def load(path: Path) -> tuple[HeadsModel, dict]:
    """-> (HeadsModel in eval mode, config.json), its weights checked against the fingerprint."""
    meta = read_config(path)
    if meta.get("kind") != KIND:
        raise ValueError(f"{path}: not a heads checkpoint (config.json kind {meta.get('kind')!r})")
    tensors = load_file(str(Path(path) / "model.safetensors"))
    if checkpoint.fingerprint(tensors, _identity(meta["model"], meta["backbone_fingerprint"])) != meta["fingerprint"]:
        raise ValueError(f"heads checkpoint {path}: weights do not match the fingerprint in config.json")
    model = HeadsModel(HeadsConfig.from_dict(meta["model"]))
    model.load_state_dict(tensors)
    return model.eval(), meta
