"""A free text gate: the ImageNet classes of things that carry writing, read off the head the indexer already runs.

The indexer computes EfficientNet-Lite0's 7x7 grid for every photo, and the label bridge its 1,000 ImageNet
probabilities from the same grid (models/bridge.py): a 1280 x 1000 matmul, well under a millisecond. Classes such
as street sign, scoreboard, menu, web site, book jacket, envelope, monitor carry text. Gate score: the summed
probability of TEXT_CLASSES; photos above a threshold go to OCR. This measures, on textset.py's set, the gate's
recall on photos with text against its pass rate on photos without, over thresholds, beside ocr_compare.py's
detector gate.

    python -m research.text_search.gate_classes [--set artifacts/textset/dev]
        -> docs/research/results/text_search.json "gate_imagenet_classes"
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from crossprobe.core import inputs
from crossprobe.models.backbones import ImageBackbone
from crossprobe.models.bridge import _lite0_head
from crossprobe.models.evaluation.report import machine

# ImageNet-1k indexes (models/data/imagenet_classes.tsv) of things that usually carry writing
TEXT_CLASSES = {418: "ballpoint", 424: "barbershop", 446: "binder", 454: "bookshop", 478: "carton",
                480: "cash machine", 530: "digital clock", 531: "digital watch", 549: "envelope", 582: "grocery store",
                624: "library", 664: "monitor", 681: "notebook", 685: "odometer", 692: "packet", 704: "parking meter",
                707: "pay-phone", 709: "pencil box", 762: "restaurant", 769: "rule", 781: "scoreboard", 782: "screen",
                798: "slide rule", 800: "slot", 851: "television", 860: "tobacco shop", 865: "toyshop",
                886: "vending machine", 916: "web site", 917: "comic book", 918: "crossword puzzle",
                919: "street sign", 921: "book jacket", 922: "menu"}


@torch.inference_mode()
def scores(folder: Path, names: list[str]) -> tuple[np.ndarray, float]:
    net = ImageBackbone().eval()
    w, b = _lite0_head()
    idx = torch.tensor(sorted(TEXT_CLASSES))
    out, head_ms = [], []
    for i in range(0, len(names), 32):
        px = torch.from_numpy(np.stack([inputs.load_image(folder / n) for n in names[i:i + 32]]))
        grid = net(px)  # (B, 49, 1280)
        t = time.perf_counter()
        p = torch.softmax(grid.mean(1) @ w.T + b, dim=-1)  # (B, 1000): the bridge's probabilities
        out.append(p[:, idx].sum(1).numpy())
        head_ms.append((time.perf_counter() - t) * 1000 / len(px))
    return np.concatenate(out), float(np.mean(head_ms))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", type=Path, default=Path("artifacts/textset/dev"))
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/text_search.json"))
    args = ap.parse_args()
    truth = json.loads((args.set / "truth.json").read_text())
    names = list(truth)
    s, head_ms = scores(args.set / "images", names)
    has = np.asarray([bool(truth[n]) for n in names])
    rows = {}
    for thr in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1):
        rows[str(thr)] = {"recall_on_photos_with_text": round(float((s[has] >= thr).mean()), 4),
                          "pass_rate_on_photos_without_text": round(float((s[~has] >= thr).mean()), 4)}
        print(thr, rows[str(thr)])
    res = {"how": "summed ImageNet probability of TEXT_CLASSES (research/text_search/gate_classes.py), from the "
                  "grid the indexer computes anyway", "classes": sorted(TEXT_CLASSES.values()),
           "head_ms_per_photo": round(head_ms, 3), "by_threshold": rows,
           "command": f"python -m research.text_search.gate_classes --set {args.set}", "machine": machine()}
    j = json.loads(args.out.read_text()) if args.out.exists() else {}
    j["gate_imagenet_classes"] = res
    args.out.write_text(json.dumps(j, indent=1))


if __name__ == "__main__":
    main()
