"""`crossprobe train --backbone SPEC --data PATH`: Cross-probe and T-EMDE heads (models/heads.py) on another model's
backbone, its towers frozen and its own two-tower score the shortlist.

    cache    the backbone's outputs over the folder, once, through the inference seam (backbone_cache.py)
    banks    per split: its text token states and patch tokens as the rerankers' backbone features, its unit-norm
             embeddings as the two-tower vectors (TextBank / ImageBank, as crossprobe's own training has them)
    cp       the served rerankers' recipe (training/run.py): in-batch pretraining on the reranker's own score, then
    temde    listwise training over hard negatives mined from the backbone's two-tower ranking, the reranker's own
             score with its fusion weight chosen on the dev split (training/rerankers.py, unchanged)
    save     the heads checkpoint (heads.py) with a model card, its graphs exported (export.ensure_heads_graphs)
             and checked against PyTorch

Selection (epoch, fusion weight) uses the folder's dev split, or the training split where there is none (the
report says which). Each split present is evaluated on at most `eval_images` of its images with all their captions:
two-tower (TT) and each reranker over the two-tower top K (CP@K, TEMDE@K; below K the two-tower order stays).
Resumable: a killed run continues from its last finished epoch (<run_dir>/<backbone fp>-<data>-<recipe digests>/).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from crossprobe.core import inference
from crossprobe.core.inference.exported import unit
from crossprobe.models import export, heads
from crossprobe.models.cross_probe import CrossProbeConfig
from crossprobe.models.data.captioned import SPLITS, CaptionedFolder
from crossprobe.models.evaluation.encode import ImageBank, PairScorer, TextBank
from crossprobe.models.evaluation.report import machine
from crossprobe.models.evaluation.retrieval import both_directions, reranked, tt_scores
from crossprobe.models.heads import HeadsConfig, HeadsModel
from crossprobe.models.temde import TemdeConfig
from crossprobe.models.training.backbone_cache import BackboneOutputs, cache_outputs, digest
from crossprobe.models.training.rerankers import RerankTrainConfig, train_reranker
from crossprobe.models.training.state import seed_everything

METHODS = ("cp", "temde")


@dataclass
class HeadsTrainConfig:
    backbone: str  # the model spec (core/inference/spec.py)
    data: Path  # a captioned folder (models/data/captioned.py)
    out: Path | None  # the heads checkpoint directory (None: artifacts/heads/<backbone fingerprint>)
    graphs: Path  # where the backbone's exported graphs are (or go), and where the heads' go
    cache: Path = Path("cache/backbones")
    run_dir: Path = Path("runs/heads")
    epochs: int = 6  # listwise epochs per reranker (the served CP's)
    pretrain_epochs: int = 5  # in-batch epochs first (the served rerankers')
    pretrain_batch: int = 64  # captions of distinct images per in-batch step (batch^2 pairs)
    lr: float = 3e-4
    queries: int = 32  # captions per listwise step
    negatives: int = 15  # hard negatives per caption, from the two-tower top mine_k
    mine_k: int = 64
    k: int = 100  # the reranked shortlist in the evaluation and the card (today's tables: CP@100)
    eval_images: int = 1000  # images per split evaluated (with all their captions): the Flickr8k test's size
    seed: int = 0
    threads: int = 2
    cp: CrossProbeConfig = field(default_factory=lambda: CrossProbeConfig(inputs="backbone"))
    temde: TemdeConfig = field(default_factory=lambda: TemdeConfig(inputs="backbone"))
    command: str = ""


@dataclass
class Split:
    text: TextBank
    images: ImageBank
    gold: np.ndarray  # (C,) caption -> image column

    @property
    def banks(self) -> tuple[TextBank, ImageBank, np.ndarray]:
        return self.text, self.images, self.gold


def split_banks(
    outs: BackboneOutputs, folder: CaptionedFolder, split: str, max_images: int | None = None
) -> Split | None:
    """A split's banks over the readable images (at most max_images, by name) and their captions; None if empty."""
    imgs, caps = folder.rows(split)
    imgs = [i for i in imgs if outs.readable[i]][:max_images]
    if not imgs:
        return None
    col = {r: c for c, r in enumerate(imgs)}
    caps = [j for j in caps if folder.caption_image[j] in col]
    mask = torch.from_numpy(np.asarray(outs.mask[caps])).bool()
    T = max(1, int(mask.sum(1).max()))
    text = TextBank(
        torch.empty(0),
        mask[:, :T],
        torch.from_numpy(unit(outs.text[caps])),
        torch.from_numpy(np.ascontiguousarray(outs.tokens[caps][:, :T])),
    )
    images = ImageBank(
        torch.empty(0),
        torch.from_numpy(unit(outs.pooled[imgs])),
        torch.from_numpy(np.ascontiguousarray(outs.cells[imgs])),
    )
    return Split(text, images, np.array([col[folder.caption_image[j]] for j in caps]))


def backbone(spec: str, graphs: Path, threads: int):
    """The backbone's backend: a model family's export (crossprobe's own model has its rerankers already)."""
    b = inference.load(spec, inference.RuntimeOptions(graphs=graphs, threads=threads))
    if not hasattr(b, "text_tokens"):
        raise ValueError(
            f"model {spec}: heads train on a model family's backbone (open_clip:, hf:); crossprobe's "
            f"own checkpoints and heads checkpoints have their rerankers (`crossprobe train` trains them)"
        )
    return b


def train_heads(cfg: HeadsTrainConfig, log=print) -> dict:
    """Train, save and export the heads (module docstring) -> the report written into config.json."""
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _train(cfg, log)
    finally:
        torch.set_num_threads(threads)  # the caller's (a test session's) setting


def _train(cfg: HeadsTrainConfig, log) -> dict:
    t0 = time.perf_counter()
    b = backbone(cfg.backbone, cfg.graphs, cfg.threads)
    folder = CaptionedFolder.load(cfg.data)
    outs = cache_outputs(b, folder, cfg.cache)
    train = split_banks(outs, folder, "train")
    if train is None or len(train.images.g) < 2:
        raise ValueError(
            f"{cfg.data}: heads need at least 2 readable training photos (captions per split: "
            f"{folder.split_counts()}, unreadable photos: {outs.skipped or 'none'})"
        )
    dev = split_banks(outs, folder, "dev")
    log(
        f"backbone {cfg.backbone} ({b.fingerprint}): {len(train.images.g)} training images, "
        f"{len(train.gold)} captions; selection on the {'dev' if dev else 'training'} split"
    )
    seed_everything(cfg.seed)
    model = HeadsModel(
        HeadsConfig(
            outs.cells.shape[2], outs.tokens.shape[2], outs.pooled.shape[1], outs.cells.shape[1], cfg.cp, cfg.temde
        )
    )
    n_img = len(train.images.g)
    rcfg = rerank_config(cfg, n_img, len((dev or train).images.g))
    run = Path(cfg.run_dir) / f"{b.fingerprint}-{digest(folder)}-{recipe_digest(cfg)}"
    history = {
        m: train_reranker(model, m, train.banks, (dev or train).banks, rcfg, run / f"{m}.pt", cfg.seed, log=log)
        for m in METHODS
    }
    model.eval()
    metrics = {
        s: evaluate(model, sp, cfg.k)
        for s in SPLITS
        if (sp := split_banks(outs, folder, s, cfg.eval_images)) is not None
    }
    report = {
        "data": {
            "folder": str(cfg.data),
            "captions": folder.split_counts(),
            "bad_lines": folder.bad_summary(),
            "unreadable_images": outs.skipped,
            "selection": "dev" if dev else "train",
        },
        "train_config": _jsonable(dataclasses.asdict(cfg)),
        "training": history,
        "metrics": metrics,
        "command": cfg.command,
        "host": machine(),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    out = Path(cfg.out or Path("artifacts/heads") / b.fingerprint)
    fp = heads.save(model, out, cfg.backbone, b.fingerprint, _finite(report), card(cfg, b.fingerprint, report))
    folder_out = export.ensure_heads_graphs(cfg.graphs, out, model=model, fingerprint=fp)
    log(f"heads {fp}: {out}; graphs {folder_out} (max |ONNX Runtime - PyTorch| {check_graphs(model, folder_out):.1e})")
    return {"fingerprint": fp, "out": str(out), **report}


def recipe_digest(cfg: HeadsTrainConfig) -> str:
    """What a resumed run must share with the killed one: the heads' shapes and the training settings."""
    recipe = {k: v for k, v in _jsonable(dataclasses.asdict(cfg)).items() if k in SETTINGS + ("cp", "temde", "seed")}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:8]


def rerank_config(cfg: HeadsTrainConfig, n_train: int, n_dev: int) -> RerankTrainConfig:
    """The served rerankers' recipe (standalone, in-batch pretraining first) at this folder's size: hard negatives
    from at most the other n_train - 1 images, selection at K no larger than the dev images."""
    mine_k = max(1, min(cfg.mine_k, n_train - 1))
    return RerankTrainConfig(
        epochs=cfg.epochs,
        queries=cfg.queries,
        negatives=min(cfg.negatives, mine_k),
        mine_k=mine_k,
        lr=cfg.lr,
        dev_k=min(cfg.k, n_dev),
        pretrain_epochs=cfg.pretrain_epochs,
        pretrain_batch=min(cfg.pretrain_batch, n_train),
        standalone=True,
    )


@torch.inference_mode()
def evaluate(model: HeadsModel, sp: Split, k: int) -> dict:
    """TT and each reranker over the two-tower top K, both directions (the Flickr8k protocol's definitions)."""
    scores = tt_scores(sp.text, sp.images)
    k = min(k, scores.shape[1])
    out = {"images": int(scores.shape[1]), "captions": int(scores.shape[0]), "TT": both_directions(scores, sp.gold)}
    for m in METHODS:
        out[f"{m.upper()}@{k}"] = reranked(PairScorer(model, m, sp.text, sp.images), scores, sp.gold, k, [k])[k]
    return out


def check_graphs(model: HeadsModel, folder: Path) -> float:
    """max |ONNX Runtime - PyTorch| over the heads' graphs on their example inputs (refused above 1e-4)."""
    from crossprobe.core import runtime
    from crossprobe.models import graphs

    worst = 0.0
    for name, inputs in graphs.heads_example_inputs(model).items():
        make, names, _, _ = graphs.HEADS_GRAPHS[name]
        with torch.inference_mode():
            want = make(model)(*inputs)
        want = want if isinstance(want, tuple) else (want,)
        got = runtime.session(folder / f"{name}.onnx", 1).run(None, {n: x.numpy() for n, x in zip(names, inputs)})
        worst = max([worst] + [float(np.abs(g - w.numpy()).max()) for g, w in zip(got, want)])
    if worst > 1e-4:
        raise RuntimeError(f"the exported heads graphs in {folder} differ from PyTorch by {worst:.1e} (> 1e-4)")
    return worst


def _jsonable(d: dict) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}


def _finite(x):
    """JSON without Infinity: a fusion weight of inf (the reranker alone, rerankers.FUSION_GRID) becomes "inf"."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return "inf" if isinstance(x, float) and math.isinf(x) else x


# the settings `crossprobe train --backbone --heads k=v,...` may change: training knobs, and the heads' shapes
SETTINGS = ("epochs", "pretrain_epochs", "pretrain_batch", "lr", "queries", "negatives", "mine_k", "k", "eval_images")
SHAPES = {"cp": ("d", "m", "n", "layers", "heads", "dropout", "attention"), "temde": ("N", "K", "inner")}


def with_settings(cfg: HeadsTrainConfig, text: str) -> HeadsTrainConfig:
    """cfg with "key=value,..." applied: SETTINGS by name, head shapes as cp.<field> / temde.<field> (SHAPES)."""
    top: dict = {}
    parts: dict[str, dict] = {"cp": {}, "temde": {}}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = item.partition("=")
        head, _, name = key.strip().rpartition(".")
        allowed = SHAPES.get(head, ()) if head else SETTINGS
        if not sep or name not in allowed:
            raise ValueError(
                f"--heads {item!r}: one of {', '.join(SETTINGS)}, or "
                + ", ".join(f"{h}.{f}" for h, fs in SHAPES.items() for f in fs)
                + ", as key=value"
            )
        owner = getattr(cfg, head) if head else cfg
        kind = type(getattr(owner, name))
        (parts[head] if head else top)[name] = kind(value.strip())
    return dataclasses.replace(
        cfg,
        **top,
        cp=dataclasses.replace(cfg.cp, **parts["cp"]),
        temde=dataclasses.replace(cfg.temde, **parts["temde"]),
    )


def card(cfg: HeadsTrainConfig, backbone_fp: str, report: dict) -> str:
    """MODEL_CARD.md: what the heads are, what they were trained on, and how they rank (every number from report)."""
    lines = [
        f"# Reranker heads on {cfg.backbone}",
        "",
        f"Cross-probe and T-EMDE heads trained on the frozen backbone `{cfg.backbone}` (fingerprint "
        f"{backbone_fp}): its patch tokens and text token states in, its own two-tower score as the shortlist.",
        "",
        f"- data: `{cfg.data}`, captions per split {report['data']['captions']}; selection on the "
        f"{report['data']['selection']} split",
        f"- command: `{cfg.command}`",
        f"- host: {report['host']}",
        f"- wall time: {report['wall_s']} s",
        "",
        "| split | images | captions | method | t2i R@1 | t2i R@5 | t2i R@10 | i2t R@1 | i2t R@5 | i2t R@10 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for split, m in report["metrics"].items():
        for method, r in m.items():
            if isinstance(r, dict) and "t2i" in r:
                t, i = r["t2i"], r["i2t"]
                lines.append(
                    f"| {split} | {m['images']} | {m['captions']} | {method} | {t['R@1']:.1f} | "
                    f"{t['R@5']:.1f} | {t['R@10']:.1f} | {i['R@1']:.1f} | {i['R@5']:.1f} | {i['R@10']:.1f} |"
                )
    lines += [
        "",
        "Rerankers reorder the two-tower top K; below K the two-tower order stays. Training loss by epoch:",
        "",
    ]
    for m, h in report["training"].items():
        losses = ", ".join(f"{r['loss']:.3f}" for r in h["history"])
        lines.append(f"- {m}: best epoch {h['best_epoch']}, fusion weight {h.get('fusion_w')}; loss {losses}")
    return "\n".join(lines) + "\n"
