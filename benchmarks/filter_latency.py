"""Search features over the 100K-item index: p50 / p99 of filtered text queries at 1%, 10% and 100% selectivity,
beside the unfiltered text query and the image query (issue 17's latency table).

    .venv/bin/python -m benchmarks.filter_latency [--queries 1000] [--total 100000] [--workdir DIR]
        -> docs/research/results/search_features.json (its p50_ms, p99_ms, items, latency_100k keys; the quality keys that
           benchmarks/image_query_quality.py writes are kept)

Index: the 8,091 Flickr8k images built by the indexer with the committed checkpoint (the same --workdir as
image_query_quality.py, reused when present: benchmarks/harness.py), grown to --total items by benchmarks/support/synthetic.py (each generated item
a real one's vector plus noise with a copy of its Redis values; FAISS factory chosen by size as the indexer does:
HNSW32 at 100K), whose selectivity tags sel-0.01 / sel-0.1 / sel-1.0 sit on a seeded random 1% / 10% / all of
the items. `crossprobe serve` in a subprocess on loopback, the shipped defaults (rerank cp, shortlist 100, k 10)
except access log off, one client, one request at a time. Each Flickr8k test caption is sent in every mode in
turn (round robin, so the modes see the same queries and the same machine state):
  text          {"query": caption}
  filter_F      {"query": caption, "filter": {"field": "tags", "eq": "sel-F"}}  for F in 0.01, 0.1, 1.0
  image         {"image": the caption's test image file, base64}  (rerank none: no text for a reranker)
Latency is client-side (HTTP included), after a warm-up; stages are the median of the service's timings_ms.
Then, offline (the server stopped), the filtered ANN stage alone: recall@100 of storage/filter_columns.py's search
against an exhaustive search of the matching rows, queried with the test images' stored vectors, at each
selectivity, and the cost of reading the 100K items' metadata into filter columns (what the service does while
loading a version, Settings.filter_preload).
"""
from __future__ import annotations

import argparse
import base64
import json
import shlex
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

from benchmarks.harness import (FEATURES_SECTION, NAME, ensure_flickr8k, features_section, flickr8k_setup, machine,
                                require_flickr8k, server_env, start_server, stop_server, synthesize)
from benchmarks.support import synthetic
from crossprobe.indexer import open_index
from crossprobe.storage.redis_conn import close_embedded
from crossprobe.service.server import free_port

MODES = ("text", "filter_0.01", "filter_0.1", "filter_1.0", "image")


def body(mode: str, caption: str, image_b64: str) -> dict:
    if mode == "image":
        return {"image": image_b64, "k": 10}
    b: dict = {"query": caption, "k": 10}
    if mode.startswith("filter_"):
        b["filter"] = {"field": "tags", "eq": f"sel-{mode.split('_')[1]}"}
    return b


def summary(lat: list[float], outs: list[dict]) -> dict:
    p = np.percentile(lat, [50, 95, 99])
    keys = list(dict.fromkeys(k for o in outs for k in o["timings_ms"]))
    row = {"p50_ms": round(float(p[0]), 2), "p95_ms": round(float(p[1]), 2), "p99_ms": round(float(p[2]), 2),
           "max_ms": round(max(lat), 2), "requests": len(lat), "rerank": outs[0]["rerank"],
           "results_min": min(len(o["results"]) for o in outs),
           "degraded": sum(bool(o["degraded"]) for o in outs),
           "stages_ms": {k: round(statistics.median(o["timings_ms"].get(k, 0.0) for o in outs), 3) for k in keys}}
    if outs[0].get("filtered"):
        row["matching"] = outs[0]["filtered"]["matching"]
        row["methods"] = dict(Counter(f"{o['filtered']['method']}{'' if o['filtered']['exact'] else ' (approx)'}"
                                      for o in outs))
    return row


def ann_recall(reader, queries: np.ndarray, shortlist: int = 100) -> dict:
    """The filtered ANN stage alone (storage/filter_columns.py search, the service's settings), recall@shortlist
    against an exhaustive search of the matching rows, and how it answered; plus the preload cost (metadata ->
    columns) and unfiltered HNSW for reference. Queries: stored vectors (unit, d)."""
    from crossprobe.storage import filter_columns
    from crossprobe.storage.filter_model import Condition
    from crossprobe.service.settings import Settings

    exact_max = Settings().filter_exact_max
    t = time.perf_counter()
    cols = filter_columns.Columns(filter_columns.all_metadata(reader))
    out: dict = {"preload_s": round(time.perf_counter() - t, 2), "queries": len(queries), "shortlist": shortlist}
    vecs = reader.vectors_at(np.arange(len(reader)))
    for frac in synthetic.SELECTIVITY:
        mask = cols.mask(Condition(field="tags", eq=f"sel-{frac}"))
        cand = np.flatnonzero(mask)
        hits, methods = [], Counter()
        for q in queries:
            f = filter_columns.search(reader.index, reader.vectors_at, q, shortlist, mask, exact_max)
            best = cand[np.argpartition(-(vecs[cand] @ q), shortlist)[:shortlist]]
            hits.append(len(set(f.rows.tolist()) & set(best.tolist())) / shortlist)
            methods[f.how] += 1
        out[f"filter_{frac}"] = {"recall": round(float(np.mean(hits)), 4), "min": round(float(np.min(hits)), 2),
                                 "matching": int(mask.sum()), "methods": dict(methods)}
    _, rows = reader.index.search(np.ascontiguousarray(queries, np.float32), shortlist)
    best = np.argpartition(-(queries @ vecs.T), shortlist, axis=1)[:, :shortlist]
    out["unfiltered"] = {"recall": round(float(np.mean([len(set(a) & set(b)) / shortlist
                                                        for a, b in zip(rows.tolist(), best.tolist())])), 4)}
    return out


def write_section(docs: Path) -> None:
    page = docs / "latency.md"
    text = page.read_text() if page.exists() else "# Search service latency\n"
    head = text.split("\n" + FEATURES_SECTION, 1)[0].rstrip("\n")
    page.write_text(head + "\n" + "\n".join(features_section(docs)) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", type=int, default=1000, help="test captions (each sent in every mode)")
    ap.add_argument("--total", type=int, default=100_000, help="items in the grown index")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--workdir", type=Path, default=Path("artifacts/search-features"))
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/search_features.json"))
    args = ap.parse_args()
    require_flickr8k()
    command = "python -m benchmarks.filter_latency " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    mach = machine()  # before the work: its load average is the idle machine's
    ds, paths, fp, ixs, redis_client = flickr8k_setup(args.workdir)
    try:
        ensure_flickr8k(ixs, fp, paths)
        big = synthesize(ixs, args.total)
        factory = open_index(big, fp, ixs).manifest["factory"]
        test = ds.splits["test"]
        captions = [ds.captions[ds.captions_of([i])[0]] for i in test][: args.queries]
        images = [base64.b64encode(ds.image_path(i).read_bytes()).decode() for i in test][: args.queries]
        port = free_port()
        proc = start_server(server_env(ixs, redis_client, [big]), port, args.workdir / "server.log")
        lat: dict[str, list[float]] = {m: [] for m in MODES}
        outs: dict[str, list[dict]] = {m: [] for m in MODES}
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
                for i in range(args.warmup):
                    for m in MODES:
                        http.post("/v1/search", json=body(m, captions[i], images[i])).raise_for_status()
                for c, b in zip(captions, images):
                    for m in MODES:
                        t = time.perf_counter()
                        r = http.post("/v1/search", json=body(m, c, b))
                        lat[m].append((time.perf_counter() - t) * 1000)
                        r.raise_for_status()
                        outs[m].append(r.json())
        finally:
            stop_server(proc)
        reader = open_index(big, fp, ixs)
        recall = ann_recall(reader, reader.vectors([ds.images[i] for i in test[: args.queries]]))
        print(f"filtered ANN recall@100: {recall}")
    finally:
        close_embedded()
    rows = {m: summary(lat[m], outs[m]) for m in MODES}
    for m, r in rows.items():
        print(f"{m:>12}: p50 {r['p50_ms']} p99 {r['p99_ms']} max {r['max_ms']} ms  rerank {r['rerank']}  "
              f"{r.get('methods', '')}  stages {r['stages_ms']}")
    res = json.loads(args.out.read_text()) if args.out.exists() else {}
    quality_command = res.get("quality_command") or res.get("command", "")
    if "image_query" in res and "items_quality" not in res:  # the quality rows were measured over the 8,091
        res["items_quality"] = res.get("items")
    res.update(p50_ms={m: r["p50_ms"] for m, r in rows.items()}, p99_ms={m: r["p99_ms"] for m, r in rows.items()},
               items=args.total,
               latency_100k={"index": {"name": big, "items": args.total, "factory": factory,
                                       "base": f"{NAME} ({len(paths)} images) + generated neighbours"},
                             "modes": rows, "ann_recall": recall, "queries": len(captions), "k": 10, "shortlist": 100,
                             "command": command, "machine": mach, "checkpoint": fp,
                             "note": "one client, one request at a time over loopback, client-side latency, modes "
                                     "round robin per caption; run under /tmp/crossprobe-cpu.lock (nothing else "
                                     "timed meanwhile)"},
               quality_command=quality_command, command=f"{quality_command} && {command}".strip(" &"))
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    write_section(args.out.parent.parent)


if __name__ == "__main__":
    main()
