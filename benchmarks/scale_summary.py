"""docs/research/results/scale.json's summary keys, from the measurements that produced them (no new measurement):

    .venv/bin/python -m benchmarks.scale_summary

  "1000000": faiss_hnsw / faiss_ivfpq  benchmarks/scale_bench.py (through the service: p50/p99 of /v1/search with
                                       cp, recall@100 of the ANN stage with text queries, rss_gb, build_s)
             milvus                    benchmarks/ann_backends.py (milvus-lite HNSW: the ANN stage alone, in the
                                       benchmark's process; not through the service)
  "redis_cluster_fetch_ms"             benchmarks/redis_cluster_fetch.py (p50 of a 100-item shortlist fetch)
Each block keeps its own "command" and "machine".
"""
from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path("docs/research/results")


def main() -> None:
    scale = json.loads((RESULTS / "scale.json").read_text())
    ann = json.loads((RESULTS / "ann_backends.json").read_text())
    cluster = json.loads((RESULTS / "redis_cluster.json").read_text())
    block = scale.setdefault("1000000", {})
    for key in ("faiss_hnsw", "faiss_ivfpq"):
        if key in block:
            row = block[key]
            row.setdefault("command", f"python -m benchmarks.scale_bench --factories {row['factory']}")
            row.setdefault("machine", scale.get("machine_1m"))
            row.update(
                       measured="through `crossprobe serve`: /v1/search with rerank cp (p50/p99); the ANN stage "
                                "alone with text queries (recall@100)")
    m = ann.get("1000000", {}).get("milvus_hnsw")
    if m:
        block["milvus"] = {"p50_ms": m["p50_ms"], "p99_ms": m["p99_ms"], "recall@100": m["recall@100"],
                           "rss_gb": m["index_rss_gb"], "build_s": m["build_s"], "index": m["index"],
                           "ef_sweep": m.get("ef_sweep"), "command": m.get("command"), "machine": m.get("machine"),
                           "measured": "the ANN stage alone (milvus-lite in the benchmark's process, 200 text "
                                       "queries), not through the service; milvus-lite's speed is its Python "
                                       "engine's, not a Milvus server's (docs/research/scaling-milvus.md)"}
    scale["redis_cluster_fetch_ms"] = {"single": cluster["single"]["p50_ms"], "cluster": cluster["cluster"]["p50_ms"],
                                       "p99": {"single": cluster["single"]["p99_ms"],
                                               "cluster": cluster["cluster"]["p99_ms"]},
                                       "command": cluster["command"], "machine": cluster["machine"]}
    scale["command"] = ("python -m benchmarks.scale_bench --factories HNSW32 && python -m benchmarks.scale_bench "
                        "--factories IVF4096,PQ32 && python -m benchmarks.scale_summary (milvus: "
                        f"{(m or {}).get('command')}; redis_cluster_fetch_ms: {cluster['command']})")
    (RESULTS / "scale.json").write_text(json.dumps(scale, indent=2) + "\n")


if __name__ == "__main__":
    main()
