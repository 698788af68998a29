"""Out-of-domain evaluation: photos unlike Flickr8k's, part of `crossprobe eval`.

Two sets from ../shared/datasets/coco-mini-dev (80 COCO photos, 400 captions; development only,
never training):
  coco-mini-dev+f8k-dev  the 400 captions rank the 80 COCO photos among the 1,000 Flickr8k dev
                         images as distractors (1,080 candidates: the steadier number)
  coco-mini-dev          the 400 captions rank the 80 COCO photos alone
Methods TT, CP@100, TEMDE@100 (text->image; below K the two-tower order is kept; on the
80-image set K covers every image). Each checkpoint evaluated (the pre-bridge baseline and the
default) is measured in the same run, on the same features.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from crossprobe.models.data.captioned import CaptionedFolder
from crossprobe.models.data.features import cache_images, cache_text
from crossprobe.models.evaluation import metrics as M
from crossprobe.models.evaluation.encode import ImageBank, PairScorer, encode_images, encode_texts
from crossprobe.models.evaluation.retrieval import reranked, tt_scores

MIXED, ALONE = "coco-mini-dev+f8k-dev", "coco-mini-dev"
METHODS = ("TT", "CP@100", "TEMDE@100")
KEYS = ("R@1", "R@5", "R@10", "MRR")


class OodFeatures:
    """Frozen-backbone features of a captioned folder (cached like Flickr8k's) + Flickr8k dev grids."""

    def __init__(self, folder: CaptionedFolder, cache_dir: Path, frozen_layers: int, distractor_grids: np.ndarray):
        cache_dir = Path(cache_dir)
        paths = [folder.image_path(i) for i in range(len(folder.images))]
        self.folder = folder
        self.grids = np.asarray(cache_images(paths, cache_dir / "images.npy", desc="ood image grids"))
        states, masks = cache_text(
            folder.captions, cache_dir / f"text_l{frozen_layers}.npy", frozen_layers, desc="ood captions"
        )
        self.states, self.masks = np.asarray(states), np.asarray(masks)
        self.distractors = np.asarray(distractor_grids)
        self.gold = np.asarray(folder.caption_image)


def _cat(a: ImageBank, b: ImageBank) -> ImageBank:
    labels = None
    if a.labels is not None:
        assert b.labels is not None  # both banks come from one model: both have cell labels or neither has
        labels = torch.cat([a.labels, b.labels])
    return ImageBank(torch.cat([a.tokens, b.tokens]), torch.cat([a.g, b.g]), torch.cat([a.grids, b.grids]), labels)


def _row(ranks: np.ndarray) -> dict:
    s = M.summarize(ranks)
    return {k: round(s[k], 2 if k != "MRR" else 4) for k in KEYS}


@torch.inference_mode()
def evaluate(model, feats: OodFeatures, k: int = 100) -> dict:
    """-> {set name: {METHOD: {R@1, R@5, R@10, MRR}}} for one model."""
    text = encode_texts(model, feats.states, feats.masks, np.arange(len(feats.states)))
    coco = encode_images(model, feats.grids, np.arange(len(feats.grids)))
    f8k = encode_images(model, feats.distractors, np.arange(len(feats.distractors)))
    out = {}
    for name, images in ((MIXED, _cat(coco, f8k)), (ALONE, coco)):
        S = tt_scores(text, images)
        res = {"TT": _row(M.t2i_ranks(S, feats.gold))}
        kk = min(k, S.shape[1])
        for method in ("cp", "temde"):
            scorer = PairScorer(model, method, text, images)
            r = reranked(scorer, S, feats.gold, kk, [kk], i2t=False)[kk]["t2i"]
            res[f"{method.upper()}@{k}"] = {key: round(r[key], 2 if key != "MRR" else 4) for key in KEYS}
        out[name] = res
    return out


def gallery_top1(demo: dict[str, list[str]], expected: dict[str, str]) -> int:
    return sum(1 for q, want in expected.items() if demo.get(q, [None])[0] == want)


def to_json(
    baseline: dict, default: dict, served: str, gallery: dict, command: str, machine: str, fingerprints: dict
) -> dict:
    j: dict = {
        name: {"baseline": baseline[name], "default": default[name], "served": served} for name in (MIXED, ALONE)
    }
    j.update({"gallery": gallery, "command": command, "machine": machine, "fingerprints": fingerprints})
    return j


def markdown(j: dict) -> str:
    fp = j["fingerprints"]
    lines = [
        "# Out-of-domain text->image retrieval (coco-mini-dev)",
        "",
        f"Command: `{j['command']}`  ",
        f"Machine: {j['machine']}  ",
        f"Baseline checkpoint `{fp['baseline']}` (`--baseline`), default `{fp['default']}`. Both measured in this run.",
        "",
        "- coco-mini-dev: 80 COCO photos with their 400 captions (../shared/datasets/coco-mini-dev), development "
        "only, never "
        "training. `+f8k-dev`: the same 400 captions rank the 80 photos among the 1,000 Flickr8k dev images as "
        "distractors "
        "(1,080 candidates); alone: among the 80 only (R@1 there moves about +-2 points by chance).",
        "- A reranker at 100 reorders the two-tower top 100 (all 80 images on the set alone); recalls in percent, MRR "
        "0..1.",
        f"- The service reranks with `{j[MIXED]['served']}` by default.",
        "",
    ]
    for name in (MIXED, ALONE):
        lines += [
            f"## {name}",
            "",
            "| method | baseline R@1 | R@5 | R@10 | MRR | default R@1 | R@5 | R@10 | MRR | R@1 gain |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for m in METHODS:
            b, d = j[name]["baseline"][m], j[name]["default"][m]
            lines.append(
                f"| {m} | {b['R@1']:.2f} | {b['R@5']:.2f} | {b['R@10']:.2f} | {b['MRR']:.4f} | {d['R@1']:.2f} | "
                f"{d['R@5']:.2f} | {d['R@10']:.2f} | {d['MRR']:.4f} | {d['R@1'] - b['R@1']:+.2f} |"
            )
        lines.append("")
    g = j["gallery"]
    lines += [
        "## The demo gallery (scikit-image's 16 photos, `crossprobe demo`: the served reranker over the whole gallery, "
        "fp32)",
        "",
        f"Expected photo first: baseline {g['baseline_top1']} / {g['queries']}, default {g['top1']} / {g['queries']} "
        "queries.",
        "",
    ]
    return "\n".join(lines)


def write(j: dict, docs: Path) -> None:
    docs = Path(docs)
    (docs / "results").mkdir(parents=True, exist_ok=True)
    (docs / "results" / "ood.json").write_text(json.dumps(j, indent=2))
    (docs / "ood.md").write_text(markdown(j))
