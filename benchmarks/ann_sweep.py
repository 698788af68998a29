"""The ANN stage's search-time knob (HNSW efSearch, IVF nprobe) against recall@100 and latency, for text
queries (the served query tower's vectors of Flickr8k captions): chosen on dev captions, reported on test.

    .venv/bin/python -m benchmarks.ann_sweep --index artifacts/search-features/indexes/flickr8k-1000k-hnsw
        [--values 64,128,256,512,1024] -> docs/research/results/ann_sweep_<name>.json

Reads the newest complete version under the index folder (index.faiss + vectors.npy; no Redis needed). Truth:
exact inner-product search over all vectors. Latency: one query at a time, one thread (as served,
CROSSPROBE_THREADS=1), the ANN call alone. Run it with nothing else on the cores.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import faiss
import numpy as np

from crossprobe.models.data.flickr8k import Flickr8k


def newest_version(folder: Path) -> Path:
    done = sorted(p.parent for p in folder.glob("*/manifest.json"))
    if not done:
        raise SystemExit(f"no complete version under {folder}")
    return done[-1]


def truth(vecs: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    exact = faiss.IndexFlatIP(vecs.shape[1])
    for i in range(0, len(vecs), 100_000):
        exact.add(np.ascontiguousarray(vecs[i:i + 100_000], np.float32))
    return exact.search(q, k)[1]


def sweep(index, q: np.ndarray, gold: np.ndarray, values: list[int], k: int) -> dict:
    faiss.omp_set_num_threads(1)
    out = {}
    for v in values:
        if hasattr(index, "hnsw"):
            index.hnsw.efSearch = v
        else:
            faiss.extract_index_ivf(index).nprobe = v
        lat, rec = [], []
        for qi, g in zip(q, gold):
            t = time.perf_counter()
            _, rows = index.search(qi[None], k)
            lat.append((time.perf_counter() - t) * 1000)
            rec.append(len(set(rows[0].tolist()) & set(g.tolist())) / k)
        p = np.percentile(lat, [50, 99])
        out[str(v)] = {"recall@100": round(float(np.mean(rec)), 4), "p50_ms": round(float(p[0]), 3),
                       "p99_ms": round(float(p[1]), 3)}
        print(f"  {v:>5}: recall@{k} {out[str(v)]['recall@100']}  p50 {out[str(v)]['p50_ms']} ms  "
              f"p99 {out[str(v)]['p99_ms']} ms")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", type=Path, required=True, help="an index folder <root>/<name>")
    ap.add_argument("--values", default=None, help="efSearch (HNSW) or nprobe (IVF) values")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    command = "python -m benchmarks.ann_sweep " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    from benchmarks.harness import machine, text_vectors

    mach = machine()
    vdir = newest_version(args.index)
    index = faiss.read_index(str(vdir / "index.faiss"))
    vecs = np.load(vdir / "vectors.npy", mmap_mode="r")
    hnsw = hasattr(index, "hnsw")
    values = [int(v) for v in (args.values or ("64,128,256,512,1024" if hnsw else "16,32,64,128,256")).split(",")]
    ds = Flickr8k.load()
    res: dict = {"index": str(args.index), "version": vdir.name, "items": int(index.ntotal),
                 "knob": "efSearch" if hnsw else "nprobe", "k": 100, "command": command, "machine": mach}
    for split in ("dev", "test"):
        caps = [ds.captions[ds.captions_of([i])[0]] for i in ds.splits[split]][: args.queries]
        q = text_vectors(caps)
        gold = truth(vecs, q, 100)
        print(f"{split} captions ({len(q)}):")
        res[split] = sweep(index, q, gold, values, 100)
    out = args.out or Path("docs/research/results") / f"ann_sweep_{args.index.name}.json"
    out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
