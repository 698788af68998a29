"""What a query-vector cache hit costs (issue 54, item 3): `crossprobe serve` over make bench's Flickr8k index (the
committed checkpoint), one client, --queries Flickr8k test captions searched once (each a miss: the query tower)
and then again in the same order (each a hit). Per pass: the response's timings_ms "encode" (the tower's run, or the
cache lookup) and "total", and the client's round trip, p50 / p99. Nothing else may run meanwhile.

    .venv/bin/python -m benchmarks.query_cache_bench [--queries 200] [--rerank temde]
        -> docs/research/results/query_cache.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks.harness import machine, prepare, server_env, start_server, stop_server
from crossprobe.core.atomic import atomic_write
from crossprobe.service.server import free_port
from crossprobe.storage.redis_conn import close_embedded

OUT = Path("docs/research/results/query_cache.json")


def pct(xs: list[float]) -> dict:
    a = np.asarray(xs)
    return {"p50_ms": round(float(np.percentile(a, 50)), 3), "p99_ms": round(float(np.percentile(a, 99)), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--rerank", default="temde")
    ap.add_argument("--workdir", type=Path, default=Path("artifacts/bench-service"))
    args = ap.parse_args()
    mach = machine()
    ixs, redis_client, ckpt, fp, _, names, queries = prepare(args.workdir, None, None, 0)
    texts = queries[: args.queries]
    port = free_port()
    proc = start_server(server_env(ixs, redis_client, list(names.values()), ckpt=ckpt), port,
                        args.workdir / "query_cache_server.log")
    passes = {}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            for t in queries[-20:]:  # warm-up on other captions
                http.post("/v1/search", json={"query": t, "k": 10, "rerank": args.rerank}).raise_for_status()
            for name in ("miss", "hit"):
                enc, total, rt = [], [], []
                for t in texts:
                    s = time.perf_counter()
                    r = http.post("/v1/search", json={"query": t, "k": 10, "rerank": args.rerank})
                    rt.append((time.perf_counter() - s) * 1000)
                    r.raise_for_status()
                    tm = r.json()["timings_ms"]
                    enc.append(tm["encode"])
                    total.append(tm["total"])
                passes[name] = {"encode": pct(enc), "total": pct(total), "round_trip": pct(rt)}
            metrics = http.get("/metrics").text
    finally:
        stop_server(proc)
        close_embedded()
    counts = {r: float(next(line.split()[-1] for line in metrics.splitlines()
                            if line.startswith(f'crossprobe_query_cache_total{{result="{r}"}}'))) for r in ("hit", "miss")}
    doc = {"passes": passes, "counters": counts, "queries": len(texts), "rerank": args.rerank,
           "index": f"{names} (the committed checkpoint, fingerprint {fp})",
           "settings": "the shipped defaults (CROSSPROBE_QUERY_CACHE_MB=32)",
           "command": f"python -m benchmarks.query_cache_bench --queries {args.queries} --rerank {args.rerank}",
           "machine": mach}
    atomic_write(OUT, json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
