"""The ANN stage alone, per backend: recall@100 against exact search, p50/p99 of one search, build time, RSS.

    .venv/bin/python -m benchmarks.ann_backends --n 100000 [--n 1000000] [--vectors PATH/vectors.npy]
        [--configs faiss_flat,faiss_hnsw,milvus_flat,milvus_hnsw,milvus_ivf] [--queries 200]
        -> docs/research/results/ann_backends.json (merged per size: a later run at another size keeps the earlier one)

Vectors: a built Flickr8k index's vectors.npy (--vectors; default: the newest artifacts/*/indexes/flickr8k/
v*/vectors.npy here) plus noisy copies up to --n, exactly as benchmarks/service_bench.py synthesize makes its
100K index (a real item's vector + N(0, 0.3/sqrt(d)) noise, renormalised, seed 0). Without one: --n unit-norm
d=256 vectors drawn around 8,091 seeded random "real" vectors the same way (the JSON says which).
Queries: Flickr8k test captions through the vectors' checkpoint's query tower (fp32 ONNX), so the queries are
text vectors as the service searches with; when the graphs or captions are missing, noisy item vectors.
Exact: FAISS Flat on the same vectors (recall@100 = |ANN top-100 & exact top-100| / 100, mean over queries).

Each configuration runs in a subprocess of its own (RSS is that process's: before loading the vectors, after
building, and its peak), through the interface the service calls (indexer/ann: FaissIndex.search,
MilvusIndex.search), one query at a time, k=100, after 20 warm-up queries, FAISS on 1 OpenMP thread (the
service's default CROSSPROBE_THREADS=1). Milvus is milvus-lite (the embedded engine pymilvus starts for a .db
file: pure Python + per-segment FAISS inside this same process, reached over loopback gRPC).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CONFIGS = ("faiss_flat", "faiss_hnsw", "milvus_flat", "milvus_hnsw", "milvus_ivf")
K = 100


def find_vectors() -> Path | None:
    found = sorted(REPO.glob("artifacts/*/indexes/flickr8k/v*/vectors.npy"), key=lambda p: p.parent.name)
    return found[-1] if found else None


def make_vectors(n: int, src_path: Path | None, seed: int = 0) -> tuple[np.ndarray, str]:
    """n vectors: the real ones + noisy copies (service_bench.synthesize's recipe)."""
    if src_path is not None:
        src = np.load(src_path).astype(np.float32)
        what = f"{len(src)} real Flickr8k vectors ({src_path.parent.name}) + {max(0, n - len(src))} noisy copies"
    else:
        rng0 = np.random.default_rng(12345)
        src = rng0.standard_normal((8091, 256)).astype(np.float32)
        src /= np.linalg.norm(src, axis=1, keepdims=True)
        what = f"8091 seeded random unit vectors (d=256) + {max(0, n - 8091)} noisy copies (no built index found)"
    src = src[:n]
    n_real, d = src.shape
    rng = np.random.default_rng(seed)
    pick = np.arange(n - n_real) % n_real
    gen = src[pick] + rng.standard_normal((n - n_real, d)).astype(np.float32) * (0.3 / np.sqrt(d))
    gen /= np.linalg.norm(gen, axis=1, keepdims=True)
    return np.ascontiguousarray(np.concatenate([src, gen]), np.float32), what


def make_queries(vectors: np.ndarray, src_path: Path | None, count: int, workdir: Path) -> tuple[np.ndarray, str]:
    """Text query vectors of the checkpoint that made the vectors, else noisy item vectors."""
    try:
        if src_path is None:
            raise FileNotFoundError("no real vectors")
        fp = json.loads((src_path.parent / "manifest.json").read_text())["fingerprint"]
        from crossprobe.core import inputs
        from crossprobe.core import runtime
        from crossprobe.models.checkpoint import DEFAULT_CHECKPOINT
        from crossprobe.models.data.flickr8k import Flickr8k
        from crossprobe.models import export

        if export.checkpoint_fingerprint(DEFAULT_CHECKPOINT) != fp:
            raise FileNotFoundError(f"the committed checkpoint is not {fp}")
        graphs = export.ensure_graphs(workdir / "onnx", export.SEARCH_GRAPHS, DEFAULT_CHECKPOINT)
        sess = runtime.session(graphs / "query_tower.onnx", 2, False)
        tok = inputs.load_tokenizer()
        cap = Flickr8k.load()
        test = set(cap.splits["test"])
        texts = [c for c, i in zip(cap.captions, cap.caption_image) if i in test][:count]
        out = []
        for i in range(0, len(texts), 32):
            ids, mask = inputs.tokenize(tok, texts[i:i + 32])
            out.append(sess.run(None, {"input_ids": ids, "attention_mask": mask})[0])
        q = np.concatenate(out).astype(np.float32)
        return q / np.linalg.norm(q, axis=1, keepdims=True), f"{len(q)} Flickr8k test captions (query tower {fp}, fp32)"
    except Exception as e:  # noqa: BLE001 - no graphs / captions: say so and use item-vector queries
        rng = np.random.default_rng(7)
        q = vectors[rng.choice(len(vectors), count, replace=False)]
        q = q + rng.standard_normal(q.shape).astype(np.float32) * (0.5 / np.sqrt(q.shape[1]))
        return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32), \
            f"{count} noisy item vectors (text queries unavailable: {e})"


def rss_gb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**30


def peak_gb() -> float:
    """This process's peak RSS (VmHWM: reset by exec, unlike getrusage's ru_maxrss, which a child inherits)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20  # kB
    return float("nan")


def run_one(config: str, data: Path) -> dict:
    """One configuration in this (fresh) process -> its numbers."""
    import faiss

    faiss.omp_set_num_threads(1)
    before = rss_gb()
    vectors = np.load(data / "vectors.npy")
    q = np.load(data / "queries.npy")
    truth = np.load(data / "truth.npy")
    loaded = rss_gb()
    n, d = vectors.shape
    t = time.perf_counter()
    if config.startswith("faiss"):
        from crossprobe.storage import faiss_io
        from crossprobe.storage.ann.faiss_backend import FaissIndex

        factory = {"faiss_flat": "Flat", "faiss_hnsw": "HNSW32"}[config]
        index = FaissIndex(faiss_io.build_faiss(vectors, factory))
        desc = f"faiss {factory}, efSearch 64 (the reader's)" if "hnsw" in config else "faiss Flat"
    else:
        from crossprobe.storage.ann.milvus_backend import MilvusBackend
        from crossprobe.indexer.jobs.settings import IndexerSettings

        kind = {"milvus_flat": "FLAT", "milvus_hnsw": "HNSW", "milvus_ivf": "IVF_FLAT"}[config]
        tmp = Path(tempfile.mkdtemp(prefix="ann-bench-", dir=data))
        s = IndexerSettings(index_root=tmp, ann_backend="milvus", milvus_uri=str(tmp / "milvus.db"), milvus_index=kind,
                     progress=False)
        b = MilvusBackend(s)
        w = b.writer("bench", "v20260101T000000000000", d, tmp)
        w.add(vectors, [str(i) for i in range(n)])
        factory = w.commit()
        index = b.open("bench", "v20260101T000000000000", {"dims": {"g": d}, "ann": w.manifest_entry()}, tmp)
        desc = f"milvus-lite {factory}" + (", ef max(64, k)" if kind == "HNSW" else ", nprobe 16" if kind == "IVF_FLAT" else "")
    build_s = time.perf_counter() - t
    built = rss_gb()
    out = {"index": desc, "n": n, **timed(index, q, truth), "build_s": round(build_s, 1),
           "rss_gb": {"start": round(before, 2), "vectors_loaded": round(loaded, 2), "after_build": round(built, 2),
                      "peak": round(peak_gb(), 2)},
           "index_rss_gb": round(built - loaded, 2), "queries": len(q)}
    if config.endswith("hnsw"):  # the search beam the recall target needs (the default is max(64, k) = 100)
        out["ef_sweep"] = {}
        for ef in EF_SWEEP:
            if config == "faiss_hnsw":
                index.index.hnsw.efSearch = ef
            else:
                index.b.settings = index.b.settings.model_copy(update={"milvus_ef": ef})
            out["ef_sweep"][str(ef)] = timed(index, q, truth)
    return out


EF_SWEEP = (100, 200, 400)


def timed(index, q: np.ndarray, truth: np.ndarray) -> dict:
    """recall@K against exact, p50/p99 of one search (after 20 warm-up searches)."""
    for i in range(20):
        index.search(q[i:i + 1], K)
    lat, rows = [], []
    for i in range(len(q)):
        t = time.perf_counter()
        _, r = index.search(q[i:i + 1], K)
        lat.append((time.perf_counter() - t) * 1000)
        rows.append(r[0])
    recall = float(np.mean([len(set(r[r >= 0]) & set(tr)) / K for r, tr in zip(rows, truth)]))
    return {"recall@100": round(recall, 4), "p50_ms": round(float(np.percentile(lat, 50)), 3),
            "p99_ms": round(float(np.percentile(lat, 99)), 3)}


def prepare(n: int, vec_path: Path | None, queries: int, workdir: Path) -> tuple[Path, dict]:
    import faiss

    data = workdir / f"n{n}"
    data.mkdir(parents=True, exist_ok=True)
    vectors, what = make_vectors(n, vec_path)
    q, qwhat = make_queries(vectors, vec_path, queries, workdir)
    exact = faiss.IndexFlatIP(vectors.shape[1])
    exact.add(vectors)
    _, truth = exact.search(q, K)
    np.save(data / "vectors.npy", vectors)
    np.save(data / "queries.npy", q)
    np.save(data / "truth.npy", truth)
    return data, {"vectors": what, "queries": qwhat, "k": K}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, action="append", help="collection size (repeat for several); default 100000")
    ap.add_argument("--vectors", type=Path, default=None, help="a built index's vectors.npy (default: found here)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--workdir", type=Path, default=REPO / "artifacts/bench-ann")
    ap.add_argument("--out", type=Path, default=REPO / "docs/research/results/ann_backends.json")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_one(args.one, args.data)))
        return
    from benchmarks.harness import machine

    command = "python -m benchmarks.ann_backends " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    vec_path = args.vectors or find_vectors()
    res = json.loads(args.out.read_text()) if args.out.exists() else {}
    res.update(command=command, machine=machine())
    for n in args.n or [100_000]:
        data, info = prepare(n, vec_path, args.queries, args.workdir)
        print(f"n={n}: {info}", flush=True)
        row = res.setdefault(str(n), {})
        row["data"] = info
        for config in args.configs.split(","):
            p = subprocess.run([sys.executable, "-m", "benchmarks.ann_backends", "--one", config, "--data", str(data)],
                               capture_output=True, text=True, timeout=3600, cwd=REPO,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
            line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                row[config] = {"error": (p.stderr or p.stdout)[-2000:]}
                print(f"  {config}: FAILED\n{p.stderr[-2000:]}", flush=True)
                continue
            row[config] = {**json.loads(line[len("RESULT "):]), "command": command, "machine": res["machine"]}
            print(f"  {config}: {row[config]}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
