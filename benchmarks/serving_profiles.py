"""ONNX Runtime threads and query-tower batches, per model (issue 54, item 4): what service/profiles.py's defaults
are chosen from. Each model serves the same photos; each variant of the thread settings runs in a fresh
`crossprobe serve`, warmed (20 other captions), then 1 client sends --queries searches one after another (p50,
p99) and 4 clients send 2 x --queries (queries/s). Rounds alternate the variants' order. The query-vector cache is
off (CROSSPROBE_QUERY_CACHE_MB=0): every search runs its query tower.

Models: crossprobe's committed checkpoint (its two MiniLM layers) and a random-weight open_clip ViT-B-32 (a
CLIP-sized text tower; exported in the export venv, as benchmarks/peer_clip_retrieval.py does, whose photos and
captions these are: the first --photos Flickr8k dev photos).

    .venv/bin/python -m benchmarks.serving_profiles [--photos 500] [--queries 100] [--rounds 3]
        -> docs/research/results/serving_profiles.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.harness import start_server, stop_server
from benchmarks.loadgen import search_requests
from benchmarks.model_end_to_end import _host
from benchmarks.peer_clip_retrieval import REPO, WORK, _clean_env, data, export_open_clip, measure, run, summarize
from crossprobe.core.atomic import atomic_write

OUT = REPO / "docs" / "research" / "results" / "serving_profiles.json"
VARIANTS = {  # name -> the service's settings
    "t1_shared_pool": {"CROSSPROBE_THREADS": "1", "CROSSPROBE_ORT_SHARED_POOL": "true", "CROSSPROBE_QUERY_ENCODERS": "1"},
    "t2_shared_pool": {"CROSSPROBE_THREADS": "2", "CROSSPROBE_ORT_SHARED_POOL": "true", "CROSSPROBE_QUERY_ENCODERS": "1"},
    "t2_own_no_spin": {"CROSSPROBE_THREADS": "2", "CROSSPROBE_ORT_SHARED_POOL": "false",
                       "CROSSPROBE_ORT_SPINNING": "false", "CROSSPROBE_QUERY_ENCODERS": "1"},
    "t1_own_no_spin_2_encoders": {"CROSSPROBE_THREADS": "1", "CROSSPROBE_ORT_SHARED_POOL": "false",
                                  "CROSSPROBE_ORT_SPINNING": "false", "CROSSPROBE_QUERY_ENCODERS": "2"},
}


def _searches(host: str, port: int, texts: list[str]) -> list[bytes]:
    return search_requests(host, port, texts, None, None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--photos", type=int, default=500)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=WORK)
    args = ap.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "profiles.log"
    photos, queries, warm = data(args.photos, args.queries, work)
    graphs = work / "graphs"
    models = {"crossprobe": "", "open_clip_vit_b32": f"open_clip:ViT-B-32/{export_open_clip(work, graphs)}"}
    from crossprobe.service.server import free_port

    results: dict = {}
    for model, spec in models.items():
        root = work / f"profile-indexes-{model}"
        env = {**_clean_env(), "CROSSPROBE_INDEX_ROOT": str(root), "CROSSPROBE_MODELS_DIR": str(graphs),
               "CROSSPROBE_MODEL": spec, "CROSSPROBE_INDEX_PROGRESS": "false"}
        if not (root / "bench").is_dir():
            run([sys.executable, "-m", "crossprobe.cli", "index", "build", "--name", "bench", "--images", str(photos)],
                log, env)
        rounds = []
        for r in range(args.rounds):
            names = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
            got = {}
            for name in names:
                port = free_port()
                proc = start_server({**env, "CROSSPROBE_INDEXES": "bench", "CROSSPROBE_ACCESS_LOG": "false",
                                     "CROSSPROBE_LOG_LEVEL": "warning", "CROSSPROBE_QUERY_CACHE_MB": "0",
                                     "HF_HUB_OFFLINE": "1", **VARIANTS[name]}, port, log)
                try:
                    got[name] = measure(port, queries, warm, _searches)
                finally:
                    stop_server(proc)
                print(f"{model} round {r + 1} {name}: p50 {got[name]['one_client']['p50_ms']} ms, "
                      f"4 clients {got[name]['four_clients']['qps']} q/s", flush=True)
            rounds.append(got)
        results[model] = {
            "spec": spec.split("/", 1)[0] + "/<file>" if spec else "crossprobe: (the committed checkpoint)",
            "summary": summarize(rounds, list(VARIANTS)),
            "raw": rounds}
    doc = {"command": "python -m benchmarks.serving_profiles " + " ".join(sys.argv[1:]), "host": _host(),
           "photos": f"the first {args.photos} Flickr8k dev photos", "queries": len(queries), "rounds": args.rounds,
           "request": "POST /v1/search {query, k: 10}, the service's defaults otherwise (crossprobe: T-EMDE rerank, "
                      "hybrid; the family model: two-tower, hybrid)", "variants": VARIANTS, "models": results}
    atomic_write(OUT, json.dumps(doc, indent=1) + "\n")
    print(json.dumps({m: r["summary"] for m, r in results.items()}, indent=1))


if __name__ == "__main__":
    main()
