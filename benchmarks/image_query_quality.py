"""Query by image through the API: does a user's copy of an indexed photo find the original?

    .venv/bin/python -m benchmarks.image_query_quality [--limit N] [--workdir DIR]
        -> docs/research/results/search_features.json (docs/research/search_features.md describes it)

Index: all 8,091 Flickr8k images (../shared/datasets/flickr8k or FLICKR8K_DIR), built by the indexer with the
committed checkpoint into --workdir (kept between runs, rebuilt only when missing), embedded Redis.
Queries: each of the 1,000 official test images, altered as a user's copy would be: centre crop to 80% of each
side, resized to 192 x 192, JPEG re-encoded at quality 70 (in memory; nothing is written to disk), sent as
POST /v1/search {"image": base64, "k": 5} to `crossprobe serve` in a subprocess on loopback (one client, the
shipped defaults except access log off). A hit is the original image ranked first (top-1) or among the first 5.
The same with text + image: the image's first caption with the altered image (weight 0.5, the server's default
rerank, cp; and again with rerank none), and, for reference, that caption alone. Latency: client-side (HTTP included), one request at a time,
after a warm-up; stages are the median of the service's own timings_ms.
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from benchmarks.harness import (NAME, ensure_flickr8k, flickr8k_setup, machine, require_flickr8k, server_env, start_server,
                                stop_server)
from crossprobe.storage.redis_conn import close_embedded
from crossprobe.service.server import free_port

CROP, SIDE, QUALITY = 0.8, 192, 70
ALTERATION = f"centre crop to {CROP:.0%} of each side, resized to {SIDE}x{SIDE} (Lanczos), JPEG quality {QUALITY}"


def altered(path: Path) -> bytes:
    """A user's copy of the photo: cropped, resized, re-encoded (in memory)."""
    with Image.open(path) as img:
        img = img.convert("RGB")
        w, h = img.size
        cw, ch = round(w * CROP), round(h * CROP)
        left, top = (w - cw) // 2, (h - ch) // 2
        img = img.crop((left, top, left + cw, top + ch)).resize((SIDE, SIDE), Image.LANCZOS)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=QUALITY)
    return buf.getvalue()


def run(http: httpx.Client, bodies: list[dict], gold: list[str], warmup: int) -> dict:
    for body in bodies[:warmup]:
        http.post("/v1/search", json=body).raise_for_status()
    ranks, lat, stages = [], [], []
    for body, g in zip(bodies, gold):
        t = time.perf_counter()
        r = http.post("/v1/search", json=body)
        lat.append((time.perf_counter() - t) * 1000)
        r.raise_for_status()
        out = r.json()
        ids = [h["id"] for h in out["results"]]
        ranks.append(ids.index(g) + 1 if g in ids else None)
        stages.append(out["timings_ms"])
    n = len(ranks)
    p = np.percentile(lat, [50, 99])
    keys = list(dict.fromkeys(k for s in stages for k in s))
    return {"top1": round(100 * sum(r == 1 for r in ranks) / n, 2),
            "top5": round(100 * sum(r is not None and r <= 5 for r in ranks) / n, 2),
            "queries": n, "rerank": out["rerank"],
            "latency_ms": {"p50": round(float(p[0]), 2), "p99": round(float(p[1]), 2)},
            "stages_ms": {k: round(statistics.median(s.get(k, 0.0) for s in stages), 3) for k in keys}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="first N test images only")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--workdir", type=Path, default=Path("artifacts/search-features"))
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/search_features.json"))
    args = ap.parse_args()
    require_flickr8k()
    command = "python -m benchmarks.image_query_quality " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    ds, paths, fp, ixs, redis_client = flickr8k_setup(args.workdir)
    try:
        ensure_flickr8k(ixs, fp, paths)
        test = ds.splits["test"][: args.limit]
        gold = [ds.images[i] for i in test]
        images = [base64.b64encode(altered(ds.image_path(i))).decode() for i in test]
        captions = [ds.captions[ds.captions_of([i])[0]] for i in test]
        port = free_port()
        proc, url = start_server(server_env(ixs, redis_client, [NAME]), port, args.workdir / "server.log"), f"http://127.0.0.1:{port}"
        try:
            with httpx.Client(base_url=url, timeout=60) as http:
                res = {
                    "image_query": run(http, [{"image": b, "k": 5} for b in images], gold, args.warmup),
                    "image_text_query": run(http, [{"query": c, "image": b, "k": 5} for c, b in zip(captions, images)],
                                            gold, args.warmup),
                    # the same without the reranker: what the combined vector alone ranks
                    "image_text_query_rerank_none": run(http, [{"query": c, "image": b, "k": 5, "rerank": "none"}
                                                               for c, b in zip(captions, images)], gold, args.warmup),
                    "text_query": run(http, [{"query": c, "k": 5} for c in captions], gold, args.warmup),
                }
        finally:
            stop_server(proc)
    finally:
        close_embedded()
    res.update(items=len(paths), queries=len(test), alteration=ALTERATION,
               image_text_weight=0.5, captions="each test image's first caption", command=command,
               machine=machine(), checkpoint=fp,
               note="latency: one client, one request at a time, over loopback to `crossprobe serve`, client-side; "
                    "run under /tmp/crossprobe-cpu.lock (nothing else timed on the machine meanwhile)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # the 100K-item latency keys (benchmarks/filter_latency.py) are that script's: kept as they are
    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    kept = {k: old[k] for k in ("p50_ms", "p99_ms", "latency_100k") if k in old}
    if kept:
        res = {**res, **kept, "items_quality": res["items"], "items": old.get("items", res["items"]),
               "quality_command": command, "command": f"{command} && {old['latency_100k']['command']}"}
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    for k in ("image_query", "image_text_query", "image_text_query_rerank_none", "text_query"):
        r = res[k]
        print(f"{k:>17}: top-1 {r['top1']} top-5 {r['top5']} (rerank {r['rerank']}), latency p50 "
              f"{r['latency_ms']['p50']} p99 {r['latency_ms']['p99']} ms, stages {r['stages_ms']}")


if __name__ == "__main__":
    main()
