"""Rerankers with region labels side by side on the two dev sets, with paired bootstrap intervals (issue 32).

    python -m research.region_labels.compare CKPT:METHOD:W [CKPT:METHOD:W ...]
        [--out docs/research/results/region_compare.json]

Each configuration is a checkpoint, a method (TT | CP | TEMDE, reranking the two-tower top 100) and the region
weight w added to its logit as the service adds it (logit + 20 w s_region, the checkpoint's class table, the mean of
the 3 best cells). Every configuration is compared with each one before it: its R@1 difference on f8k-dev (5,000
captions) and on coco-mini-dev+f8k-dev (400 captions), with a 95% interval from a paired bootstrap over the gold
photos (models/evaluation/metrics.paired_bootstrap). Choices are not made here: this says how far apart the
rows that research/region_labels/vocabulary.py chose are.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from crossprobe.models import checkpoint
from crossprobe.models.evaluation import metrics as M
from crossprobe.models.evaluation.encode import PairScorer, encode_images
from crossprobe.models.evaluation.report import machine
from crossprobe.models.region_labels import region_score

from research.bridge.sweep import dev_views, require_dev_sets

K = 100


def parse(spec: str) -> tuple[Path, str, float]:
    ckpt, method, w = spec.rsplit(":", 2)
    if method.upper() not in ("TT", "CP", "TEMDE"):
        raise argparse.ArgumentTypeError(f"{spec}: METHOD is TT, CP or TEMDE")
    return Path(ckpt), method.upper(), float(w)


@torch.inference_mode()
def hits(ckpt: Path, method: str, w: float) -> dict[str, np.ndarray]:
    """-> {dev set: (Q,) bool, the gold photo first}."""
    model, _ = checkpoint.load(ckpt)
    model.eval()
    views = dev_views(model)
    grids = views.grids()
    images = encode_images(model, grids.half().numpy(), np.arange(len(grids)))
    labels = model.bridge.cell_labels(grids)
    out = {"gold": {}}
    for name, (text, imgs, gold, off) in views.sets(images).items():
        S = (text.g @ imgs.g.T).numpy()
        cand = M.topk(S, K)
        logits = 20.0 * np.take_along_axis(S, cand, 1) if method == "TT" else PairScorer(
            model, method.lower(), text, imgs, region=False).fused(torch.arange(len(S)), torch.from_numpy(cand)).numpy()
        if w:
            sim = model.bridge.class_sims(text.g)
            logits = logits + 20.0 * w * region_score(sim, labels[torch.from_numpy(cand + off)], 3).numpy()
        out[name] = M.t2i_ranks(M.apply_rerank(S, cand, logits), gold) == 0
        out["gold"][name] = gold
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m research.region_labels.compare")
    ap.add_argument("configs", nargs="+", type=parse, help="CKPT:METHOD:W")
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/region_compare.json"))
    args = ap.parse_args()
    require_dev_sets()
    t0 = time.time()
    runs = [hits(*c) for c in args.configs]
    rows = []
    for i, ((ckpt, method, w), h) in enumerate(zip(args.configs, runs)):
        fp = checkpoint.read_config(ckpt)["fingerprint"]
        row = {"config": i, "checkpoint": fp, "method": f"{method}@{K}" if method != "TT" else "TT", "w": w}
        for name in ("f8k-dev", "coco-mini-dev+f8k-dev"):
            row[name] = round(100 * float(h[name].mean()), 2)
            # this row minus each earlier one, paired over the same captions
            row[f"{name} minus"] = {j: M.paired_bootstrap(h[name], runs[j][name], h["gold"][name]) for j in range(i)}
        rows.append(row)
        print({k: v for k, v in row.items() if "minus" not in k}, flush=True)
    out = {"rows": rows, "command": " ".join(["python -m research.region_labels.compare", *sys.argv[1:]]),
           "machine": machine(), "seconds": round(time.time() - t0, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
