"""Quality through the API: the Flickr8k test captions sent over HTTP to a real
server (uvicorn on loopback, embedded Redis, an index of the 1,000 test images
built by the indexer) must reproduce the offline evaluation's text->image R@1
(docs/results/flickr8k.json) for each rerank mode: none = TT, cp = CP@100,
temde = TEMDE@100.

    .venv/bin/python benchmarks/service_quality.py [--limit N]
        -> docs/service_quality.md, docs/results/service_quality.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx

from crossprobe.models.data.flickr8k import Flickr8k, available, dataset_root
from crossprobe.models.evaluation.report import machine
from crossprobe.indexer import build
from crossprobe.indexer.redis_conn import Settings as IndexSettings
from crossprobe.service.server import running, wait_ready
from crossprobe.service.settings import Settings

OFFLINE = {"none": "TT", "cp": "CP@100", "temde": "TEMDE@100"}
DEFAULT_PRECISIONS = "int8,fp32"  # the service's default first


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=None, help="first N test captions (default: all 5,000)")
    ap.add_argument("--workdir", type=Path, default=Path("artifacts/quality"))
    ap.add_argument("--query-precision", default=DEFAULT_PRECISIONS, help="query-tower graphs to check, comma separated")
    args = ap.parse_args()
    if not available():
        print(f"Flickr8k not found at {dataset_root()}; skipped.")
        sys.exit(0)
    ds = Flickr8k.load()
    test = ds.splits["test"]
    caps = ds.captions_of(test)[: args.limit]
    root = args.workdir / "indexes"
    manifest = args.workdir / "test.jsonl"
    args.workdir.mkdir(parents=True, exist_ok=True)
    manifest.write_text("".join(json.dumps({"id": ds.images[i], "uri": str(ds.image_path(i))}) + "\n" for i in test))
    ixs = IndexSettings(root=root, progress=False)
    build("flickr8k-test", manifest=manifest, settings=ixs, log=lambda *_: None)
    offline = json.loads(Path("docs/results/flickr8k.json").read_text())
    out = {"queries": len(caps), "by_query_precision": {}}
    for prec in args.query_precision.split(","):
        modes = out["by_query_precision"][prec] = {}
        settings = Settings(index_root=root, port=0, indexes="flickr8k-test", access_log=False, log_level="warning",
                            query_precision=prec)
        with running(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
            wait_ready(client)
            for mode, name in OFFLINE.items():
                hits = {1: 0, 5: 0, 10: 0}
                t = time.perf_counter()
                for j in caps:
                    r = client.post("/v1/search", json={"query": ds.captions[j], "k": 10, "rerank": mode, "shortlist": 100})
                    r.raise_for_status()
                    ids = [x["id"] for x in r.json()["results"]]
                    gold = ds.images[ds.caption_image[j]]
                    for k in hits:
                        hits[k] += gold in ids[:k]
                n = len(caps)
                api = {f"R@{k}": round(100 * v / n, 2) for k, v in hits.items()}
                ref = {k: offline["t2i"][name][k] for k in ("R@1", "R@5", "R@10")}
                modes[mode] = {"api": api, "offline": ref, "offline_method": name,
                               "R@1_diff": round(api["R@1"] - ref["R@1"], 2), "seconds": round(time.perf_counter() - t, 1)}
                print(prec, mode, modes[mode], flush=True)
    out["command"] = "python benchmarks/service_quality.py" + (f" --limit {args.limit}" if args.limit else "") + \
        (f" --query-precision {args.query_precision}" if args.query_precision != DEFAULT_PRECISIONS else "")
    out["machine"] = machine()
    Path("docs/results").mkdir(parents=True, exist_ok=True)
    Path("docs/results/service_quality.json").write_text(json.dumps(out, indent=2))
    lines = ["# Quality through the API (Flickr8k test captions over HTTP)", "",
             f"Command: `{out['command']}`  ", f"Machine: {out['machine']}", "",
             f"{out['queries']} captions, each a POST /v1/search (k=10, shortlist 100) to a uvicorn server on loopback, "
             "over an index of the 1,000 test images built by `crossprobe index build` (embedded Redis, FAISS Flat). "
             "Offline: docs/results/flickr8k.json (ties counted against the gold image there).", "",
             "The offline evaluation runs the fp32 query tower; the service's default (CROSSPROBE_QUERY_PRECISION=int8) "
             "runs its MiniLM layers in int8 (docs/query_tower_quant.md).", "",
             "| query tower | rerank | offline method | offline R@1 | API R@1 | API - offline | API R@5 | API R@10 |",
             "|---|---|---|---|---|---|---|---|"]
    for prec, modes in out["by_query_precision"].items():
        for mode, m in modes.items():
            lines.append(f"| {prec} | {mode} | {m['offline_method']} | {m['offline']['R@1']} | {m['api']['R@1']} | "
                         f"{m['R@1_diff']:+} | {m['api']['R@5']} | {m['api']['R@10']} |")
    Path("docs/service_quality.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
