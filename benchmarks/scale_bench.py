"""A 1M-item node on this machine (issue 18 item 4): /v1/search p50 / p99 for none / temde / cp, the ANN stage's
recall@100 against exact search, build time, RSS and bytes per item, for FAISS HNSW and IVF-PQ.

    .venv/bin/python -m benchmarks.scale_bench [--total 1000000] [--factories 'HNSW32;IVF4096,PQ32'] [--requests 300]
        -> docs/research/results/scale.json (the "1000000" block's faiss_* keys; other keys are kept) and the 1M rows of
           docs/research/scaling.md's measured table (written by hand from this JSON)

Index: the 8,091 Flickr8k images built by the indexer with the committed checkpoint (the --workdir that
benchmarks/image_query_quality.py and filter_latency.py share, reused), grown to --total items by
indexer/jobs/synthetic.py (real items plus noisy copies with copies of their Redis values, written through the
store's own layout), once per FAISS factory; the previous factory's index is dropped first (its 2M Redis keys
would double the embedded Redis's memory). Per factory:
  build_s       the FAISS build alone (train + add), as the indexer's build_faiss does it
  faiss_bytes   index.faiss on disk per item;  redis_bytes  Redis used_memory growth per item (features +
                metadata); vectors.npy is 4 x d bytes per item more on disk (memory-mapped by the service)
  p50/p99       `crossprobe serve` in a subprocess (shipped defaults, access log off), one client, k 10,
                shortlist 100, Flickr8k test captions, --requests per rerank mode after a warm-up
  rss_gb        the service process's resident memory after those requests (VmRSS)
  recall@100    the ANN stage alone (the service's efSearch 64 / nprobe 16) against exact inner-product search
                over all items (offline); queries: the served query tower's vectors of 1,000 test captions
                ("image_queries": the test images' stored vectors, flattering here: see the code)
  ann_ms        p50 / p99 of that ANN stage alone, one query at a time (CROSSPROBE_THREADS=1, as served)
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import faiss
import httpx
import numpy as np

from crossprobe.indexer import open_index
from crossprobe.indexer.jobs import synthetic
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.indexer.storage.redis_conn import close_embedded, connect
from crossprobe.models import checkpoint
from crossprobe.models.data.flickr8k import Flickr8k
from crossprobe.service.server import free_port
from benchmarks.indexer_bench import machine, require_flickr8k

RERANKS = ("none", "temde", "cp")


def rss_gb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 2**20, 2)
    return float("nan")


def service_rows(url: str, name: str, captions: list[str], n: int, warmup: int) -> dict:
    rows = {}
    with httpx.Client(base_url=url, timeout=60) as http:
        for rerank in RERANKS:
            lat, degraded = [], 0
            for i in range(warmup + n):
                t = time.perf_counter()
                r = http.post("/v1/search", json={"query": captions[i % len(captions)], "k": 10, "rerank": rerank,
                                                  "index": name})
                dt = (time.perf_counter() - t) * 1000
                r.raise_for_status()
                if i >= warmup:
                    lat.append(dt)
                    degraded += bool(r.json()["degraded"])
            p = np.percentile(lat, [50, 99])
            rows[rerank] = {"p50_ms": round(float(p[0]), 2), "p99_ms": round(float(p[1]), 2),
                            "requests": n, "degraded": degraded}
            print(f"  {rerank:>5}: p50 {rows[rerank]['p50_ms']} p99 {rows[rerank]['p99_ms']} ms")
    return rows


def ann_stage(reader, queries: np.ndarray, k: int = 100) -> dict:
    """recall@k of the served ANN index against exact search, and its per-query latency."""
    faiss.omp_set_num_threads(1)  # as served (CROSSPROBE_THREADS=1)
    lat, found = [], []
    for q in queries:
        t = time.perf_counter()
        _, rows = reader.index.search(q[None], k)
        lat.append((time.perf_counter() - t) * 1000)
        found.append(rows[0])
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    vecs = np.load(reader.store.version_dir(reader.name, reader.version) / "vectors.npy", mmap_mode="r")
    exact = faiss.IndexFlatIP(vecs.shape[1])
    for i in range(0, len(vecs), 100_000):
        exact.add(np.ascontiguousarray(vecs[i:i + 100_000]))
    _, truth = exact.search(queries, k)
    recall = float(np.mean([len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(found, truth)]))
    p = np.percentile(lat, [50, 99])
    return {"recall@100": round(recall, 4), "ann_ms": {"p50": round(float(p[0]), 3), "p99": round(float(p[1]), 3)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--total", type=int, default=1_000_000)
    ap.add_argument("--factories", default="HNSW32;IVF4096,PQ32", help="FAISS factories, ';'-separated")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--workdir", type=Path, default=Path("artifacts/search-features"))
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/scale.json"))
    args = ap.parse_args()
    require_flickr8k()
    factories = [f for f in args.factories.split(";") if f]
    command = "python -m benchmarks.scale_bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    from benchmarks.image_query_quality import NAME, ensure_index
    from benchmarks.service_bench import start_server, stop_server

    mach = machine()
    ds = Flickr8k.load()
    paths = [ds.image_path(i) for i in range(len(ds.images))]
    fp = checkpoint.read_config(checkpoint.DEFAULT_CHECKPOINT)["fingerprint"]
    ixs = IndexerSettings(redis_url=None, index_root=args.workdir / "indexes", progress=False)
    r = connect(ixs)
    test = ds.splits["test"]
    captions = [ds.captions[ds.captions_of([i])[0]] for i in test]
    res = json.loads(args.out.read_text()) if args.out.exists() else {}
    block = res.setdefault(str(args.total), {})
    try:
        ensure_index(ixs, fp, paths)
        # ANN queries: the served query tower's vectors of the 1,000 test captions (what the service searches
        # with). The test images' stored vectors are reported too, but they flatter recall here: every real item
        # has ~(total / 8,091) noisy copies packed around it, and an exact top 100 made of them is easy to find
        from benchmarks.service_bench import text_vectors

        queries = text_vectors(captions[:1000])
        image_queries = open_index(NAME, fp, ixs).vectors([ds.images[i] for i in test])
        for factory in factories:
            key = "faiss_hnsw" if factory.startswith("HNSW") else "faiss_ivfpq"
            name = f"{NAME}-{args.total // 1000}k-{key.split('_')[1]}"
            st = open_index(NAME, fp, ixs).store
            for other in [n for n in st.names() if n.startswith(f"{NAME}-") and n != f"{NAME}-100k"]:
                for v in st.versions(other):  # free the embedded Redis before growing the next one
                    st.drop(other, v.version)
            before = r.info("memory")["used_memory"]
            built: dict = {}
            synthetic.grow(ixs, NAME, name, args.total, factory=factory,
                           log=lambda msg: (print(msg), built.update(line=msg)))
            redis_bytes = (r.info("memory")["used_memory"] - before) / args.total
            reader = open_index(name, fp, ixs)
            vdir = reader.store.version_dir(name, reader.version)
            row = {"factory": factory, "build_s": float(built["line"].rsplit(" in ", 1)[1].rstrip("s")),
                   "faiss_bytes_per_item": round((vdir / "index.faiss").stat().st_size / args.total, 1),
                   "redis_bytes_per_item": round(redis_bytes, 1),
                   "vectors_bytes_per_item": round((vdir / "vectors.npy").stat().st_size / args.total, 1)}
            env = {**os.environ, "REDIS_URL": f"unix://{r.socket_file}", "CROSSPROBE_INDEX_ROOT": str(ixs.index_root),
                   "CROSSPROBE_ACCESS_LOG": "false", "CROSSPROBE_LOG_LEVEL": "warning",
                   "CROSSPROBE_RELOAD_INTERVAL_S": "0", "CROSSPROBE_INDEXES": name, "HF_HUB_OFFLINE": "1"}
            port = free_port()
            t = time.perf_counter()
            proc = start_server(env, port, args.workdir / "server-scale.log")
            row["service_ready_s"] = round(time.perf_counter() - t, 1)
            try:
                print(f"{name} ({factory}): ready in {row['service_ready_s']} s")
                row["search"] = service_rows(f"http://127.0.0.1:{port}", name, captions, args.requests, args.warmup)
                row["rss_gb"] = rss_gb(proc.pid)
            finally:
                stop_server(proc)
            row.update(ann_stage(reader, queries))
            row["image_queries"] = ann_stage(reader, image_queries)
            cp = row["search"]["cp"]
            row.update(p50_ms=cp["p50_ms"], p99_ms=cp["p99_ms"])  # the headline: cp, the served default
            row.update(command=command, machine=mach)
            print(f"{name}: {json.dumps(row)}")
            block[key] = row
    finally:
        close_embedded()
    block.update(items=args.total, base=f"{NAME} ({len(paths)} images) + generated neighbours (indexer/jobs/synthetic.py)")
    res["command_1m"], res["machine_1m"] = command, mach
    res.setdefault("command", command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
