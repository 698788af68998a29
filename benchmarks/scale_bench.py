"""A 1M-item node on this machine (issue 18 item 4): /v1/search p50 / p99 for none / temde / cp, the ANN stage's
recall@100 against exact search, build time, RSS and bytes per item, for FAISS HNSW and IVF-PQ; with
--milvus-server (issue 35) also for a Milvus server's HNSW, back to back with FAISS in the same run.

    .venv/bin/python -m benchmarks.scale_bench [--total 1000000] [--factories 'HNSW32;IVF4096,PQ32'] [--requests 300]
        [--milvus-server [--milvus-m 32 --milvus-efc 40 --milvus-ef auto]] [--filters] [--out FILE]
        -> docs/research/results/scale.json (the "<total>" block's faiss_* / milvus_server keys; other keys are kept)
           and the 1M rows of docs/research/scaling.md / scaling-milvus.md's tables (written by hand from this JSON)

--milvus-server: a Milvus 2.3.5 standalone server (benchmarks.support.local_milvus: PyPI's `milvus` wheel in
its own venv, data dir under --workdir), the same grown index written into a collection by the Milvus backend's
writer (benchmarks/support/synthetic.py ann_backend="milvus": every item's metadata with its selectivity tags), HNSW
with --milvus-m / --milvus-efc; the search beam ef is the smallest of EF_GRID whose recall@100 on 500 Flickr8k
DEV captions reaches --target-recall (--milvus-ef auto; or a number), and recall@100 / ANN p50 / p99 are then
reported on the 1,000 TEST captions (the FAISS rows' queries). The service runs with CROSSPROBE_MILVUS_EF set to
it. Its row adds rss_bytes: the Milvus server process's resident memory after the requests (psutil; its
embedded etcd runs in it), beside the service's own rss_gb; build_s is insert + flush + index build + load.
--filters (on by default with --milvus-server): per row, /v1/search cp with {"field": "tags", "eq": "sel-F"} at
1% / 10% / 100% selectivity (the grown index's selectivity tags), p50 / p99 per selectivity.

Index: the 8,091 Flickr8k images built by the indexer with the committed checkpoint (the --workdir that
benchmarks/image_query_quality.py and filter_latency.py share, reused), grown to --total items by
benchmarks/support/synthetic.py (real items plus noisy copies with copies of their Redis values, written through the
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
from benchmarks.support import synthetic
from crossprobe.storage.redis_conn import close_embedded
from crossprobe.service.server import free_port
from benchmarks.harness import (NAME, ensure_flickr8k, flickr8k_setup, machine, require_flickr8k, start_server, stop_server,
                                text_vectors)

RERANKS = ("none", "temde", "cp")
SELECTIVITIES = ("0.01", "0.1", "1.0")
EF_GRID = (128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


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


def filtered_rows(url: str, name: str, captions: list[str], n: int, warmup: int) -> dict:
    """/v1/search cp with a tags filter of 1% / 10% / 100% selectivity, round robin (the same queries and machine
    state for each) -> {selectivity: p50 / p99}."""
    lat: dict[str, list[float]] = {f: [] for f in SELECTIVITIES}
    how: dict[str, set] = {f: set() for f in SELECTIVITIES}
    degraded = 0
    with httpx.Client(base_url=url, timeout=60) as http:
        for i in range(warmup + n):
            for f in SELECTIVITIES:
                body = {"query": captions[i % len(captions)], "k": 10, "rerank": "cp", "index": name,
                        "filter": {"field": "tags", "eq": f"sel-{f}"}}
                t = time.perf_counter()
                r = http.post("/v1/search", json=body)
                dt = (time.perf_counter() - t) * 1000
                r.raise_for_status()
                if i >= warmup:
                    lat[f].append(dt)
                    out = r.json()
                    degraded += bool(out["degraded"])
                    how[f].add((out.get("filtered") or {}).get("method"))
    rows = {}
    for f in SELECTIVITIES:
        p = np.percentile(lat[f], [50, 99])
        rows[f] = {"p50_ms": round(float(p[0]), 2), "p99_ms": round(float(p[1]), 2), "requests": n,
                   "method": sorted(m for m in how[f] if m)}
        print(f"  filter sel-{f}: p50 {rows[f]['p50_ms']} p99 {rows[f]['p99_ms']} ms ({rows[f]['method']})")
    rows["degraded"] = degraded
    return rows


_truth_cache: dict = {}


def exact_truth(reader, queries: np.ndarray, k: int = 100) -> np.ndarray:
    """The exact top k of these queries over the version's stored vectors (FAISS Flat, inner product)."""
    key = (reader.name, reader.version, queries.shape, float(queries[:4].sum()))
    if key not in _truth_cache:
        vecs = np.load(reader.store.version_dir(reader.name, reader.version) / "vectors.npy", mmap_mode="r")
        exact = faiss.IndexFlatIP(vecs.shape[1])
        for i in range(0, len(vecs), 100_000):
            exact.add(np.ascontiguousarray(vecs[i:i + 100_000]))
        _truth_cache[key] = exact.search(queries, k)[1]
    return _truth_cache[key]


def ann_stage(reader, queries: np.ndarray, k: int = 100, search=None) -> dict:
    """recall@k of the served ANN index against exact search, and its per-query latency. search: q (1, d) -> rows
    (default: the FAISS index itself, as scale_bench measured it before the Milvus row)."""
    faiss.omp_set_num_threads(1)  # as served (CROSSPROBE_THREADS=1)
    search = search or (lambda q: reader.index.search(q, k)[1])
    lat, found = [], []
    for q in queries:
        t = time.perf_counter()
        rows = search(q[None])
        lat.append((time.perf_counter() - t) * 1000)
        found.append(rows[0])
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    truth = exact_truth(reader, queries, k)
    recall = float(np.mean([len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(found, truth)]))
    p = np.percentile(lat, [50, 99])
    return {"recall@100": round(recall, 4), "ann_ms": {"p50": round(float(p[0]), 3), "p99": round(float(p[1]), 3)}}


def milvus_ann(reader, ef: int, k: int = 100):
    """A search function over the reader's Milvus collection with this ef (the reader's own MilvusIndex)."""
    ix = reader.ann
    ix.b.settings = ix.b.settings.model_copy(update={"milvus_ef": ef})
    return lambda q: ix.search(q, k)[1]


def choose_ef(reader, dev: np.ndarray, target: float) -> tuple[int, dict]:
    """The smallest ef of EF_GRID whose recall@100 on the dev queries reaches target (the largest when none
    does) -> (ef, {ef: dev recall and ANN ms})."""
    sweep = {}
    for ef in EF_GRID:
        search = milvus_ann(reader, ef)
        for q in dev[:10]:  # warm the collection's caches for this ef
            search(q[None])
        sweep[ef] = ann_stage(reader, dev, search=search)
        print(f"  ef {ef}: dev recall@100 {sweep[ef]['recall@100']}, ANN p50 {sweep[ef]['ann_ms']['p50']} ms")
        if sweep[ef]["recall@100"] >= target:
            return ef, sweep
    return EF_GRID[-1], sweep


def milvus_server_row(args, ixs, r, fp, captions: list[str], queries: np.ndarray, dev: np.ndarray, command: str,
                      mach: str) -> dict:
    """The grown index in a Milvus server's collection (HNSW), measured like the FAISS rows."""
    import importlib.metadata as md
    import shutil

    from benchmarks.support import local_milvus
    from crossprobe.storage.ann import milvus_backend

    name = f"{NAME}-{args.total // 1000}k-milvus"
    root = args.workdir / "milvus-server"
    shutil.rmtree(root, ignore_errors=True)
    server = local_milvus.LocalMilvus(root=root)
    t = time.perf_counter()
    server.start()
    row: dict = {"server": f"Milvus {local_milvus.SERVER_VERSION} standalone (PyPI milvus wheel; embedded etcd, "
                           f"local storage) on loopback", "client": f"pymilvus {md.version('pymilvus')}",
                 "server_ready_s": round(time.perf_counter() - t, 1)}
    try:
        ixm = ixs.model_copy(update={"ann_backend": "milvus", "milvus_uri": server.uri, "milvus_index": "HNSW",
                                     "milvus_hnsw_m": args.milvus_m,
                                     "milvus_hnsw_ef_construction": args.milvus_efc,
                                     "milvus_build_timeout_s": 86_400.0, "milvus_timeout_s": 60.0})
        before = r.info("memory")["used_memory"]
        built: dict = {}
        synthetic.grow(ixm, NAME, name, args.total, ann_backend="milvus",
                       log=lambda msg: (print(msg), built.update(line=msg)))
        line = built["line"]
        row.update(factory=line.split("Milvus ", 1)[1].split(" over ")[0],
                   build_s=float(line.rsplit(" in ", 1)[1].rstrip("s")),
                   insert_s=float(line.split("(insert ", 1)[1].split("s,")[0]),
                   index_s=float(line.split("index + load ", 1)[1].split("s)")[0]),
                   redis_bytes_per_item=round((r.info("memory")["used_memory"] - before) / args.total, 1),
                   server_rss_after_build_bytes=server.rss_bytes(),
                   server_disk_bytes=sum(f.stat().st_size for f in server.data.rglob("*") if f.is_file()))
        reader = open_index(name, fp, ixm)
        if args.milvus_ef == "auto":
            ef, sweep = choose_ef(reader, dev, args.target_recall)
        else:
            ef, sweep = int(args.milvus_ef), {}
        row["index"] = {"type": "HNSW", "M": args.milvus_m, "efConstruction": args.milvus_efc, "ef": ef,
                        "ef_chosen_on": f"{len(dev)} Flickr8k dev captions, smallest ef of {list(EF_GRID)} with "
                                        f"recall@100 >= {args.target_recall}" if sweep else "--milvus-ef"}
        row["ef_sweep_dev"] = {str(k): v for k, v in sweep.items()}
        search = milvus_ann(reader, ef)
        for q in queries[:20]:
            search(q[None])
        row.update(ann_stage(reader, queries, search=search))
        print(f"{name}: ef {ef}: test recall@100 {row['recall@100']}, ANN {row['ann_ms']}")
        env = {**os.environ, "REDIS_URL": f"unix://{r.socket_file}", "CROSSPROBE_INDEX_ROOT": str(ixs.index_root),
               "CROSSPROBE_ACCESS_LOG": "false", "CROSSPROBE_LOG_LEVEL": "warning",
               "CROSSPROBE_RELOAD_INTERVAL_S": "0", "CROSSPROBE_INDEXES": name, "HF_HUB_OFFLINE": "1",
               "CROSSPROBE_MILVUS_URI": server.uri, "CROSSPROBE_MILVUS_EF": str(ef),
               # 5 s, not the shipped 1 s: a slow call at 1M is then a slow answer in the percentiles, where a
               # timeout would be a 503 that ends the run
               "CROSSPROBE_MILVUS_TIMEOUT_S": "5"}
        row["service_env"] = {k: v for k, v in env.items() if k.startswith("CROSSPROBE_MILVUS_")}
        port = free_port()
        t = time.perf_counter()
        proc = start_server(env, port, args.workdir / "server-scale-milvus.log")
        row["service_ready_s"] = round(time.perf_counter() - t, 1)
        try:
            url = f"http://127.0.0.1:{port}"
            row["search"] = service_rows(url, name, captions, args.requests, args.warmup)
            if args.filters:
                row["filtered"] = filtered_rows(url, name, captions, args.requests, args.warmup)
            row["rss_gb"] = rss_gb(proc.pid)
            row["rss_bytes"] = server.rss_bytes()
        finally:
            stop_server(proc)
        cp = row["search"]["cp"]
        row.update(p50_ms=cp["p50_ms"], p99_ms=cp["p99_ms"], command=command, machine=mach,
                   measured="through `crossprobe serve` (the service's Milvus client, CROSSPROBE_MILVUS_EF = the "
                            "chosen ef): /v1/search with rerank cp (p50/p99) and with tags filters (filtered); the "
                            "ANN stage alone (MilvusIndex.search, k 100) with the 1,000 test captions (recall@100, "
                            "ann_ms); rss_bytes: the Milvus server process")
        print(f"{name}: {json.dumps(row)}")
        st = reader.store
        st.drop(name, reader.version)  # its collection and Redis values (the next row starts from a clean Redis)
        milvus_backend.close_clients()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--total", type=int, default=1_000_000)
    ap.add_argument("--factories", default="HNSW32;IVF4096,PQ32", help="FAISS factories, ';'-separated")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--workdir", type=Path, default=Path("artifacts/search-features"))
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/scale.json"))
    ap.add_argument("--milvus-server", action="store_true", help="also the index in a Milvus server (HNSW)")
    ap.add_argument("--milvus-m", type=int, default=32, help="Milvus HNSW M (FAISS's HNSW32: 32)")
    ap.add_argument("--milvus-efc", type=int, default=40, help="Milvus HNSW efConstruction (FAISS's default: 40)")
    ap.add_argument("--milvus-ef", default="auto", help="search ef, or auto: chosen on dev captions (EF_GRID)")
    ap.add_argument("--target-recall", type=float, default=0.95)
    ap.add_argument("--filters", action=argparse.BooleanOptionalAction, default=None,
                    help="filtered searches at 1%% / 10%% / 100%% selectivity (default: on with --milvus-server)")
    args = ap.parse_args()
    if args.filters is None:
        args.filters = args.milvus_server
    require_flickr8k()
    factories = [f for f in args.factories.split(";") if f]
    command = "python -m benchmarks.scale_bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])

    mach = machine()
    ds, paths, fp, ixs, r = flickr8k_setup(args.workdir)
    test = ds.splits["test"]
    captions = [ds.captions[ds.captions_of([i])[0]] for i in test]
    res = json.loads(args.out.read_text()) if args.out.exists() else {}
    block = res.setdefault(str(args.total), {})
    try:
        ensure_flickr8k(ixs, fp, paths)
        # ANN queries: the served query tower's vectors of the 1,000 test captions (what the service searches
        # with). The test images' stored vectors are reported too, but they flatter recall here: every real item
        # has ~(total / 8,091) noisy copies packed around it, and an exact top 100 made of them is easy to find
        queries = text_vectors(captions[:1000])
        dev = None
        if args.milvus_server:  # the Milvus row's ef is chosen on dev captions, reported on test
            dev_ids = ds.splits["dev"]
            dev = text_vectors([ds.captions[ds.captions_of([i])[0]] for i in dev_ids][:500])
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
                if args.filters:
                    row["filtered"] = filtered_rows(f"http://127.0.0.1:{port}", name, captions, args.requests,
                                                    args.warmup)
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
        if args.milvus_server:
            st = open_index(NAME, fp, ixs).store
            for other in [n for n in st.names() if n.startswith(f"{NAME}-") and n != f"{NAME}-100k"]:
                for v in st.versions(other):  # free the embedded Redis (the FAISS rows' 1M items) first
                    st.drop(other, v.version)
            block["milvus_server"] = milvus_server_row(args, ixs, r, fp, captions, queries, dev, command, mach)
    finally:
        close_embedded()
    block.update(items=args.total, base=f"{NAME} ({len(paths)} images) + generated neighbours (benchmarks/support/synthetic.py)")
    res["command_1m"], res["machine_1m"] = command, mach
    res.setdefault("command", command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
