"""`crossprobe train`: the whole default training run, resumable stage by stage.

  cache   frozen backbone features for all 8,091 images and 40,455 captions
  towers  two-tower training (stage 1), best epoch on dev
  bridge  the label bridge's class embeddings (text tower over the 1,000 ImageNet class names; seconds)
  banks   frozen tower outputs for train/dev (inputs of the rerankers; g_I bridged)
  cp, temde, sm, tv   reranker training on mined hard negatives (stage 2); CP in the
          shape pinned in ModelConfig.cp (`crossprobe frontier` compares shapes: frontier.py)
  save    checkpoint (safetensors + config.json with fingerprint)

Every stage records its wall time in <run_dir>/timings.json.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from crossprobe.models import checkpoint
from crossprobe.models.evaluation.retrieval import split_banks
from crossprobe.models.model import TOWER_PREFIXES, ModelConfig, SearchModel
from crossprobe.models.temde import Temde
from crossprobe.models.training.data import CachedData
from crossprobe.models.training.rerankers import (
    RerankTrainConfig,
    fit_fusion,
    fit_merged_temde,
    fresh_cp,
    set_fusion,
    train_reranker,
)
from crossprobe.models.training.stacking import stacked
from crossprobe.models.training.state import Timings, atomic_save, seed_everything
from crossprobe.models.training.towers import TowerTrainConfig, train_towers


@dataclass
class TrainConfig:
    seed: int = 0
    threads: int = 2
    cache_dir: Path = Path("cache/flickr8k")
    run_dir: Path = Path("runs/default")
    out: Path = checkpoint.DEFAULT_CHECKPOINT
    model: ModelConfig = field(default_factory=ModelConfig)
    towers: TowerTrainConfig = field(default_factory=TowerTrainConfig)
    rerank: RerankTrainConfig = field(default_factory=RerankTrainConfig)
    methods: tuple[str, ...] = ("cp", "temde", "sm", "tv")
    # the references are costlier per step; their budgets are fixed here and reported. CP: 6 listwise epochs, as
    # its dev R@1 still rises after 3 (docs/research/rerank_experiments.md §6)
    epochs_by_method: dict = field(default_factory=lambda: {"cp": 6, "temde": 3, "sm": 1, "tv": 1})
    # the served rerankers' recipe (docs/research/rerank_experiments.md): in-batch pretraining on their own score,
    # then listwise training on their own score, the fusion weight chosen on dev (RerankTrainConfig.standalone)
    pretrain_by_method: dict = field(default_factory=lambda: {"cp": 5, "temde": 5})
    # captions drawn per training image per listwise epoch (RerankTrainConfig.captions_per_image elsewhere). T-EMDE:
    # all 5 captions for 3 epochs beat 1 caption for 3, 6 or 10 epochs on both dev sets, at about 3x the training
    # time (docs/research/bridge.md, "T-EMDE's training budget")
    captions_by_method: dict = field(default_factory=lambda: {"temde": 5})
    # independently seeded T-EMDEs (seeds seed, seed + 1, ...) trained one after the other and merged into one wider
    # T-EMDE (temde.merge: the score is their mean), the fusion weight fit on dev for the merge. 3 members: on average
    # a merge beats a single draw on both dev sets, for one T-EMDE training per member
    # (docs/research/bridge.md, "Seed ensembles as the T-EMDE recipe")
    members_by_method: dict = field(default_factory=lambda: {"temde": 3})
    standalone_methods: tuple[str, ...] = ("cp", "temde")
    # rerankers taken from another checkpoint (--reuse) whose fusion weight w is fit again on this run's dev banks:
    # their two-tower score s_tt changes when g_I does (e.g. the label bridge), the reranker's own score does not
    refit_fusion: tuple[str, ...] = ()


def _jsonable(o):
    if dataclasses.is_dataclass(o):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(o).items()}
    if isinstance(o, dict):
        return {k: _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    return str(o) if isinstance(o, Path) else o


def reranker_config(cfg: TrainConfig, method: str) -> RerankTrainConfig:
    """The training budget of one reranker (the ablation reuses it, so options train like the default)."""
    rcfg = dataclasses.replace(
        cfg.rerank,
        epochs=cfg.epochs_by_method.get(method, cfg.rerank.epochs),
        pretrain_epochs=cfg.pretrain_by_method.get(method, cfg.rerank.pretrain_epochs),
        captions_per_image=cfg.captions_by_method.get(method, cfg.rerank.captions_per_image),
        standalone=method in cfg.standalone_methods or cfg.rerank.standalone,
    )
    if method in ("sm", "tv"):  # joint layers over ~65 tokens per pair: a cheaper dev check
        rcfg = dataclasses.replace(rcfg, dev_k=min(20, rcfg.dev_k), dev_queries=300)
    if method == "tv":  # 4 joint layers per pair: fewer negatives per query
        rcfg = dataclasses.replace(rcfg, negatives=min(7, rcfg.negatives))
    return rcfg


def train_members(
    model, method: str, train_banks, dev_banks, rcfg: RerankTrainConfig, run: Path, seed: int, n: int, log=print
) -> dict:
    """n draws of one reranker (seeds seed .. seed + n - 1, each initialised afresh) merged into model.<method>; each
    member resumes or is skipped on its own (<run>/<method>.m<i>.pt, .done.pt). Only T-EMDE merges into one
    module that the index and the scorer graph serve unchanged (temde.merge)."""
    if method != "temde":
        raise ValueError(f"only T-EMDE merges its members into one served module, not {method}")
    members, reports = [], []
    for i in range(n):
        done = run / f"{method}.m{i}.done.pt"
        if done.exists():
            st = torch.load(done, weights_only=False)
            module = Temde(model.cfg.temde)
            module.load_state_dict(st["weights"])
            reports.append(st["report"])
        else:
            seed_everything(seed + i)
            model.temde = module = Temde(model.cfg.temde)
            reports.append(
                train_reranker(model, method, train_banks, dev_banks, rcfg, run / f"{method}.m{i}.pt", seed + i, log)
            )
            atomic_save({"weights": module.state_dict(), "report": reports[-1]}, done)
        members.append(module.eval())
    w, r1 = fit_merged_temde(model, members, dev_banks, rcfg)
    model.cfg.temde = model.temde.cfg  # the checkpoint records the merged shape (N = the members' sum)
    log(f"{method}: {n} members merged, fusion weight {w}, dev R@1 {r1:.2f}")
    return {
        "members": reports,
        "member_seeds": list(range(seed, seed + n)),
        "member_N": members[0].cfg.N,
        "fusion_w": w,
        f"fusion_dev_t2i_R@1@{rcfg.dev_k}": round(r1, 2),
        "fusion_queries": int(min(len(dev_banks[2]), rcfg.fusion_queries)),
        "best_epoch": [r["best_epoch"] for r in reports],
        "dev_score": round(r1, 2),
    }


def seed_from_checkpoint(ckpt: Path, run_dir: Path, stages: tuple[str, ...]) -> None:
    """Start a run from a checkpoint's trained stages (e.g. its towers) instead of training them again:
    each stage's weights, report and recorded wall time go where `train` would have left them, so the
    checkpoint it writes reports the full cost (e.g. adding the label bridge to towers trained without it)."""
    meta = checkpoint.read_config(ckpt)
    from safetensors.torch import load_file

    tensors = {
        k: v.float() if v.is_floating_point() else v
        for k, v in load_file(str(Path(ckpt) / "model.safetensors")).items()
    }
    tr = meta.get("training", {})
    run_dir = Path(run_dir)
    timings = Timings(run_dir)
    for stage in stages:
        if stage == "towers":
            weights = {k: v for k, v in tensors.items() if k.startswith(TOWER_PREFIXES)}
        elif stage in ("cp", "temde", "sm", "tv"):
            weights = {k[len(stage) + 1 :]: v for k, v in tensors.items() if k.startswith(stage + ".")}
        else:
            raise ValueError(f"cannot seed stage {stage!r} from a checkpoint")
        atomic_save(
            {"weights": weights, "report": {**tr.get(stage, {}), "from_checkpoint": meta["fingerprint"]}},
            run_dir / f"{stage}.done.pt",
        )
        if stage in tr.get("timings_s", {}) and stage not in timings.data:
            timings.add(stage, tr["timings_s"][stage])


def train(cfg: TrainConfig, log=print, data: CachedData | None = None) -> str:
    """data: the feature cache already in memory (the ablation trains many configs on one)."""
    torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    run = Path(cfg.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    timings = Timings(run)
    t0 = time.time()
    if data is None:
        with timings.timer("cache"):
            data = CachedData.build(cfg.cache_dir, cfg.model.text.frozen_layers)
    if cfg.towers.gray > 0 and not (run / "towers.done.pt").exists():
        with timings.timer("cache_gray"):
            data.with_gray(cfg.cache_dir)
    model = SearchModel(cfg.model)
    report: dict = {"train_config": _jsonable(cfg)}

    done = run / "towers.done.pt"
    if done.exists():
        st = torch.load(done, weights_only=False)
        # only the towers: a state saved by an older version also held the rerankers at their initialisation,
        # whose shapes may differ from this config's (e.g. CP / T-EMDE reading the backbone features)
        towers = {k: v for k, v in st["weights"].items() if k.startswith(TOWER_PREFIXES)}
        model.load_state_dict(towers, strict=False)
        report["towers"] = st["report"]
    else:
        with timings.timer("towers"):
            report["towers"] = train_towers(model, data, cfg.towers, run / "towers.pt", cfg.seed, log)
        atomic_save({"weights": model.tower_state_dict(), "report": report["towers"]}, done)

    # The rerankers learn on the towers exactly as the checkpoint serves them: float16-rounded (and without
    # dropout: split_banks encodes in eval mode whatever mode this freshly built model is in).
    checkpoint.round_to_stored(model, TOWER_PREFIXES)
    if model.cfg.bridge.enabled:  # the label bridge's class embeddings: the (stored) text tower over the class names
        with timings.timer("bridge"):
            model.bridge.set_class_embeddings(model.text)
            checkpoint.round_to_stored(model, ("bridge.",))
    pending = [m for m in cfg.methods if not (run / f"{m}.done.pt").exists()]
    train_banks = dev_banks = None
    if pending or cfg.refit_fusion:  # the rerankers' inputs: frozen tower outputs for train and dev
        with timings.timer("banks"):
            train_banks = split_banks(model, data, "train")
            dev_banks = split_banks(model, data, "dev")
        train_banks, dev_banks = stacked(train_banks, dev_banks, cfg.rerank.dev_stack)
    for method in cfg.methods:
        done = run / f"{method}.done.pt"
        if done.exists():
            st = torch.load(done, weights_only=False)
            if method == "temde":  # a merged T-EMDE (train_members) holds its members' partitions: N from its weights
                model.cfg.temde = dataclasses.replace(model.cfg.temde, N=int(st["weights"]["centroids"].shape[0]))
                model.temde = Temde(model.cfg.temde)
            getattr(model, method).load_state_dict(st["weights"])
            report[method] = st["report"]
            if method in cfg.refit_fusion:
                with timings.timer(f"{method}_refit"):
                    rcfg = reranker_config(cfg, method)
                    w, r1 = fit_fusion(model, method, dev_banks, rcfg, queries=rcfg.fusion_queries)
                    set_fusion(getattr(model, method).fusion, w)
                report[method] = {**st["report"], "refit_fusion": {"w": w, "dev_R@1": round(r1, 2)}}
                log(f"{method}: fusion weight refit on this run's dev banks: w {w}, dev R@1 {r1:.2f}")
            continue
        assert train_banks is not None and dev_banks is not None  # built above: this method is pending
        rcfg = reranker_config(cfg, method)
        seed_everything(cfg.seed)
        if method == "cp":  # initialised as the frontier initialises each setting: the default is its chosen run
            model.cp = fresh_cp(model.cfg.cp, cfg.seed)
        with timings.timer(method):
            if cfg.members_by_method.get(method, 1) > 1:
                report[method] = train_members(
                    model, method, train_banks, dev_banks, rcfg, run, cfg.seed, cfg.members_by_method[method], log
                )
            else:
                report[method] = train_reranker(
                    model, method, train_banks, dev_banks, rcfg, run / f"{method}.pt", cfg.seed, log
                )
        atomic_save({"weights": getattr(model, method).state_dict(), "report": report[method]}, done)
    report["timings_s"] = timings.data
    report["wall_s_this_invocation"] = round(time.time() - t0, 1)
    fp = checkpoint.save(model, cfg.out, {"training": report})
    (run / "report.json").write_text(json.dumps(_jsonable(report), indent=2, default=str))
    log(f"saved checkpoint {cfg.out} fingerprint {fp}")
    return fp
