"""What decoding a photo for a chosen model costs, both ways (issue 53, item 4): the full picture (what every exported
family's reference decodes, and the index path's default for them) against reduced JPEG decoding (draft; crossprobe's
own checkpoint's reference, and CROSSPROBE_INDEX_DECODE=reduced's opt-in).

Photos: coco-mini-dev's 640 px JPEGs (read from /work/shared, never copied) and 12 MP JPEGs (4000 x 3000, quality 90,
with sensor-like grain so they are a phone's size) made by benchmarks/library_files.py. Per photo: decode_file (open,
decode, the model's resize, crop and scaling to 224 x 224, as the indexer's decode stage runs it), median of --reps
runs, one thread, page cache warm. Embedding difference: both pixel sets through a random-weight Hugging Face CLIP
ViT-B/32 (the index_path benchmark's, exported through the seam), max |difference| of the unit-norm image embeddings
and the lowest cosine; pixels: max |difference| in normalised units.

    .venv/bin/python -m benchmarks.decode_cost [--reps 5] [--big 8]
        -> docs/research/results/decode.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks import library_files
from benchmarks.harness import machine
from benchmarks.index_path import COCO, WORK, model_folder
from crossprobe.core.atomic import atomic_write

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "research" / "results" / "decode.json"


def timed(path: Path, preprocess, reduce: bool, reps: int) -> tuple[float, np.ndarray]:
    from crossprobe.core.inference.decode import DEFAULT_MAX_PIXELS, decode_file

    times, x = [], None
    for _ in range(reps):
        t = time.perf_counter()
        got = decode_file(str(path), DEFAULT_MAX_PIXELS, preprocess, 224, reduce)
        times.append((time.perf_counter() - t) * 1000)
        assert not hasattr(got, "reason"), got
        x = got[0]
    return statistics.median(times), x


def measure(name: str, paths: list[Path], backend, reps: int) -> dict:
    prep = backend.preprocessor()
    full_ms, red_ms, full_px, red_px = [], [], [], []
    for p in paths:
        a, xa = timed(p, prep, False, reps)
        b, xb = timed(p, prep, True, reps)
        full_ms.append(a)
        red_ms.append(b)
        full_px.append(xa)
        red_px.append(xb)
    fa, fb = np.stack(full_px), np.stack(red_px)
    ga, gb = backend.encode_images(fa).g, backend.encode_images(fb).g
    cos = (ga * gb).sum(1) / (np.linalg.norm(ga, axis=1) * np.linalg.norm(gb, axis=1))
    return {"photos": len(paths), "full_ms_median": round(statistics.median(full_ms), 2),
            "reduced_ms_median": round(statistics.median(red_ms), 2),
            "speedup": round(statistics.median(full_ms) / statistics.median(red_ms), 2),
            "pixels_max_abs_diff": float(np.abs(fa - fb).max()),
            "embedding_max_abs_diff": float(np.abs(ga - gb).max()), "embedding_min_cosine": float(cos.min()),
            "photos_with_equal_pixels": int(sum(np.array_equal(x, y) for x, y in zip(full_px, red_px))),
            "what": name}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--big", type=int, default=8, help="how many 12 MP JPEGs to make")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from crossprobe.core import inference

    spec, _ = model_folder("hf_clip", WORK)
    backend = inference.load(spec, inference.RuntimeOptions(graphs=WORK / "decode-graphs", threads=1))
    big_dir = WORK / "12mp"
    big_dir.mkdir(parents=True, exist_ok=True)
    big = []
    for i in range(args.big):
        p = big_dir / f"12mp_{i}.jpg"
        if not p.exists():
            library_files.picture(4000, 3000, seed=i, grain=8).save(p, quality=90)
        big.append(p)
    coco = sorted((COCO / "images").glob("*.jpg"))
    c640 = [p for p in coco if max(Image.open(p).size) == 640]
    rows = {"jpeg_640px": measure("coco-mini-dev photos with a 640 px long side", c640, backend, args.reps),
            "jpeg_12mp": measure("4000 x 3000 JPEGs, quality 90, grain 8 (benchmarks/library_files.py)", big,
                                 backend, args.reps)}
    doc = {"rows": rows, "model": "random-weight Hugging Face CLIP ViT-B/32 (openai/clip-vit-base-patch32's "
           "config, seed 0), its CLIPProcessor's preprocessing (shortest side to 224, bicubic, centre crop)",
           "default": "full decoding for every exported family (their references decode the full picture; the "
           "parity the index path must keep is 1e-4); reduced for crossprobe's own checkpoint (its reference)",
           "command": f"python -m benchmarks.decode_cost --reps {args.reps} --big {args.big}", "machine": machine()}
    atomic_write(OUT, json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
