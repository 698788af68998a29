"""/v1/search latency, hybrid vs vector, at 8,091 and 100K items whose every item has text (issue 31).

    .venv/bin/python -m benchmarks.hybrid_bench [--requests 300] [--big 100000]
        -> docs/research/results/text_search.json "latency"

The worst case for the keyword side: every item carries a caption (its first Flickr8k caption, as a manifest
with captions would give it), so a query's words ("a dog runs on the grass") match tens of thousands of items
and BM25 ranks them all, where OCR text alone is sparse. The 100K index is the 8,091 real items plus noisy
copies (benchmarks/support/synthetic.py), metadata and keyword index included. One client, the served default
reranker (T-EMDE), k 10; the modes alternate request by request (the same query in both, back to back), so drift
on a shared host hits both alike. Client-side wall time per request; the server's own stage timings as medians.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks.harness import ensure_ckpt, machine, require_flickr8k, service_env, start_server, stop_server, usable
from crossprobe.indexer import build
from benchmarks.support import synthetic
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.storage.redis_conn import close_embedded, connect
from crossprobe.models.data.flickr8k import Flickr8k
from crossprobe.service.server import free_port

OUT = Path("docs/research/results/text_search.json")
MODES = ("vector", "hybrid")


def indexes(ixs: IndexerSettings, ckpt: Path, fp: str, ds: Flickr8k, big: int) -> dict[str, str]:
    first = {}
    for c, i in zip(ds.captions, ds.caption_image):
        first.setdefault(int(i), c)
    name = "captioned"
    if not usable(name, fp, ixs, len(ds.images)):
        manifest = Path(ixs.index_root) / "captioned.jsonl"
        manifest.write_text("".join(json.dumps({"id": n, "uri": str(ds.image_path(i)), "caption": first[i]}) + "\n"
                                    for i, n in enumerate(ds.images)))
        print(build(name, manifest=manifest, settings=ixs, ckpt=ckpt, log=print).summary())
    names = {str(len(ds.images)): name}
    if big:
        bigname = f"captioned-{big // 1000}k"
        if not usable(bigname, fp, ixs, big):
            synthetic.grow(ixs, name, bigname, big)
        names[str(big)] = bigname
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300, help="timed requests per mode and index")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--big", type=int, default=100_000)
    ap.add_argument("--workdir", type=Path, default=Path("artifacts/bench-hybrid"))
    args = ap.parse_args()
    require_flickr8k()
    args.workdir.mkdir(parents=True, exist_ok=True)
    ckpt, _ = ensure_ckpt(None, args.workdir)
    fp = json.loads((ckpt / "config.json").read_text())["fingerprint"]
    ixs = IndexerSettings(redis_url=None, index_root=args.workdir / "indexes", progress=True)
    redis_client = connect(ixs)
    ds = Flickr8k.load()
    test = set(ds.splits["test"])
    queries = [c for c, i in zip(ds.captions, ds.caption_image) if i in test][:args.requests + args.warmup]
    out: dict = {}
    try:
        names = indexes(ixs, ckpt, fp, ds, args.big)
        port = free_port()
        proc = start_server(service_env(ixs, redis_client, ckpt, names), port, args.workdir / "server.log")
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
                for size, name in names.items():
                    lat = {m: [] for m in MODES}
                    stages = {m: [] for m in MODES}
                    hits = []
                    for n, q in enumerate(queries):
                        for m in MODES:
                            t = time.perf_counter()
                            r = http.post("/v1/search", json={"query": q, "k": 10, "mode": m, "index": name})
                            dt = (time.perf_counter() - t) * 1000
                            r.raise_for_status()
                            body = r.json()
                            if n >= args.warmup:
                                lat[m].append(dt)
                                stages[m].append(body["timings_ms"])
                                if m == "hybrid":
                                    hits.append(body["keyword"]["hits"])
                    row = {}
                    for m in MODES:
                        p = np.percentile(lat[m], [50, 99])
                        keys = list(dict.fromkeys(k for s in stages[m] for k in s))
                        row[m] = {"p50_ms": round(float(p[0]), 2), "p99_ms": round(float(p[1]), 2),
                                  "requests": len(lat[m]),
                                  "stages_ms_median": {k: round(statistics.median(s.get(k, 0.0) for s in stages[m]), 3)
                                                       for k in keys}}
                    row["keyword_hits_per_query_median"] = float(np.median(hits))
                    out[size] = row
                    print(size, json.dumps(row), flush=True)
        finally:
            stop_server(proc)
    finally:
        close_embedded()
    result = json.loads(OUT.read_text()) if OUT.exists() else {}
    result["latency"] = {"indexes": out, "rerank": "temde (the served default)", "k": 10, "clients": 1,
                         "text": "every item has a caption (its first Flickr8k caption): the keyword side's worst case",
                         "command": "python -m benchmarks.hybrid_bench" + (
                             f" --requests {args.requests}" if args.requests != 300 else ""),
                         "machine": machine()}
    OUT.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
