"""Are grayscale photos a blind spot? The towers were trained on Flickr8k's colour photos only, and several of the
demo gallery's misses are grayscale (moon, coins, clock, camera). Issue 32, item 3.

    python -m research.misses.grayscale [--ckpt DIR] [--out docs/research/results/grayscale.json]

Two measurements, no training:
  1. the Flickr8k dev photos (5,000 captions over 1,000 photos) and coco-mini-dev's 80 among them, once in colour
     and once as grayscale copies (inputs.grayscale: Pillow's ITU-R 601 luma, back to 3 channels): text->image R@1 / R@10 of the
     two-tower order and of each reranker at 100, with a paired bootstrap interval of gray - colour. A large loss
     says the towers read colour where captions do not name it, and that grayscale augmentation in training is
     worth a run; a small one says the demo's grayscale misses have other causes;
  2. the demo's 16 queries over its 16 photos (`make demo`'s gallery) with each photo in colour and as a grayscale
     copy: the expected photo's rank per query in the served order, so each miss is seen with and without colour.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from crossprobe.models import backbones as bb
from crossprobe.core import inputs
from crossprobe.models import checkpoint
from crossprobe.models.demo import EXPECTED, sample_gallery
from crossprobe.models.evaluation import metrics as M
from crossprobe.models.evaluation.encode import PairScorer, TextBank, encode_images
from crossprobe.models.evaluation.report import machine

from research.bridge.sweep import dev_views, require_dev_sets

K = 100
METHODS = ("TT", "CP@100", "TEMDE@100")


@torch.inference_mode()
def grids_of(images: list[Image.Image], batch: int = 32) -> np.ndarray:
    """PIL images -> (N, 49, 1280) float16 backbone grids, decoded as the indexer decodes."""
    net = bb.ImageBackbone().eval()
    out = []
    for s in range(0, len(images), batch):
        px = torch.from_numpy(np.stack([inputs.load_image(im) for im in images[s : s + batch]]))
        out.append(net(px).half().numpy())
    return np.concatenate(out)


def ranks_by_method(model, text, grids: np.ndarray, gold: np.ndarray) -> dict[str, np.ndarray]:
    """Every caption's rank of its photo in the two-tower order and after each reranker at K."""
    imgs = encode_images(model, grids, np.arange(len(grids)))
    S = (text.g @ imgs.g.T).numpy()
    out = {"TT": M.t2i_ranks(S, gold)}
    cand = M.topk(S, min(K, S.shape[1]))
    for method in ("cp", "temde"):
        logits = PairScorer(model, method, text, imgs).fused(torch.arange(len(S)), torch.from_numpy(cand)).numpy()
        out[f"{method.upper()}@{K}"] = M.t2i_ranks(M.apply_rerank(S, cand, logits), gold)
    return out


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m research.misses.grayscale")
    ap.add_argument("--ckpt", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/grayscale.json"))
    args = ap.parse_args()
    require_dev_sets()
    t0 = time.time()
    model, meta = checkpoint.load(args.ckpt)
    model.eval()
    views = dev_views(model)
    data, ood = views.data, views.ood
    dev_paths = [data.ds.root / "images" / data.ds.images[r] for r in views.dev]
    coco_paths = [ood.folder.image_path(i) for i in range(len(ood.folder.images))]
    colour = views.grids().half().numpy()  # (1080, 49, 1280): 80 COCO, then the 1,000 dev photos
    print("grayscale grids of the 1,080 dev photos ...", flush=True)
    grey = grids_of([inputs.grayscale(Image.open(p).convert("RGB")) for p in coco_paths + dev_paths])
    n = views.n_coco
    sets = {"f8k-dev": (views.t_dev, slice(n, None), views.dev_gold), "coco-mini-dev+f8k-dev": (views.t_ood, slice(None), ood.gold)}
    result = {}
    for name, (text, cols, gold) in sets.items():
        c = ranks_by_method(model, text, colour[cols], gold)
        g = ranks_by_method(model, text, grey[cols], gold)
        result[name] = {m: {"colour": M.summarize(c[m]), "grayscale": M.summarize(g[m]),
                            "R@1 gray - colour": M.paired_bootstrap(g[m] == 0, c[m] == 0, gold)} for m in METHODS}
        print(name, {m: (result[name][m]["colour"]["R@1"], result[name][m]["grayscale"]["R@1"]) for m in METHODS}, flush=True)

    photos = sample_gallery()
    names = list(photos)
    queries = list(EXPECTED)
    tok = inputs.load_tokenizer()
    ids, mask = inputs.tokenize(tok, queries)
    t = model.text(torch.from_numpy(ids), torch.from_numpy(mask))
    text = TextBank(t.tokens.half(), t.mask, t.g, t.states.half() if t.states is not None else None)
    gold = np.array([names.index(EXPECTED[q]) for q in queries])
    demo = {}
    for kind, ims in (("colour", [photos[k] for k in names]), ("grayscale", [inputs.grayscale(photos[k]) for k in names])):
        r = ranks_by_method(model, text, grids_of(ims), gold)
        demo[kind] = {m: {q: int(r[m][i]) + 1 for i, q in enumerate(queries)} for m in METHODS}
        demo[kind]["first"] = {m: int((r[m] == 0).sum()) for m in METHODS}
    print("demo, expected photo first (colour / gray):", {m: (demo["colour"]["first"][m], demo["grayscale"]["first"][m])
                                                          for m in METHODS})
    out = {"checkpoint": meta["fingerprint"], "dev_sets": result, "demo_rank_of_expected_photo": demo,
           "grayscale_demo_photos": [k for k in names if _is_gray(photos[k])],
           "command": " ".join(["python -m research.misses.grayscale", *sys.argv[1:]]), "machine": machine(),
           "seconds": round(time.time() - t0, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"-> {args.out} ({out['seconds']} s)")


def _is_gray(img: Image.Image) -> bool:
    a = np.asarray(img.convert("RGB"), np.int16)
    return bool(np.abs(a[..., 0] - a[..., 1]).max() <= 2 and np.abs(a[..., 1] - a[..., 2]).max() <= 2)


if __name__ == "__main__":
    main()
