"""Served mode and shortlist size on both dev sets, through the API: a latency/quality frontier (issue 32, item 4).

    python -m research.rerank.shortlist_frontier [--f8k-captions 1000]
        -> docs/research/results/shortlist_frontier.json

For rerank none / cp / temde and shortlists 10, 20, 50, 100 (none: one row, the shortlist does not change its
order), every caption of ood-dev (coco-mini-dev's 400 over its 80 photos among the 1,000 Flickr8k dev photos)
and the first --f8k-captions of f8k-dev (the Flickr8k dev captions over the 1,000 dev photos) is a POST
/v1/search (k 10) to a server on loopback: R@1 / R@5 / R@10, the client-side p50 / p99 of the same requests
(one client, idle machine), and each configuration's R@1 against the served default (cp, shortlist 100) with a
paired bootstrap 95% interval over the gold photos. The rule of issue 32: serve the best configuration on
ood-dev; among those within 0.5 R@1 of it, the fastest. The indexes are research/calibration/fit.py's (built
here when missing).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import httpx
import numpy as np

from crossprobe.indexer import build
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.models.evaluation.metrics import paired_bootstrap
from crossprobe.models.evaluation.report import machine
from crossprobe.service.server import running, wait_ready
from crossprobe.service.settings import Settings
from crossprobe.models.training.calibrate import dev_sets

CONFIGS = [("none", 100)] + [(m, k) for m in ("cp", "temde") for k in (10, 20, 50, 100)]
DEFAULT = ("cp", 100)


def run_set(client: httpx.Client, index: str, pairs: list, mode: str, shortlist: int) -> dict:
    ranks, ms = [], []
    for text, gold in pairs:
        t = time.perf_counter()
        r = client.post("/v1/search", json={"query": text, "mode": "vector", "k": 10, "rerank": mode, "shortlist": shortlist,
                                            "index": index})
        ms.append((time.perf_counter() - t) * 1000)
        r.raise_for_status()
        ids = [h["id"] for h in r.json()["results"]]
        ranks.append(ids.index(gold) if gold in ids else 10)
    ranks = np.asarray(ranks)
    return {"R@1": round(100 * float((ranks < 1).mean()), 2), "R@5": round(100 * float((ranks < 5).mean()), 2),
            "R@10": round(100 * float((ranks < 10).mean()), 2), "p50_ms": round(float(np.percentile(ms, 50)), 2),
            "p99_ms": round(float(np.percentile(ms, 99)), 2), "hits1": (ranks < 1).astype(int).tolist()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--f8k-captions", type=int, default=1000, help="first N f8k-dev captions (all 5,000 take long)")
    ap.add_argument("--workdir", type=Path, default=Path("artifacts/calibration"))
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/shortlist_frontier.json"))
    args = ap.parse_args()
    root = args.workdir / "indexes"
    sets = dev_sets(args.workdir, None)
    sets["f8k-dev"]["pairs"] = sets["f8k-dev"]["pairs"][:args.f8k_captions]
    ixs = IndexerSettings(index_root=root, progress=False)
    for name, s in sets.items():
        if not (root / f"cal-{name}").is_dir():
            build(f"cal-{name}", manifest=s["manifest"], settings=ixs, log=lambda *_: None)
    settings = Settings(index_root=root, port=0, indexes=",".join(f"cal-{n}" for n in sets), access_log=False,
                        log_level="warning")
    out: dict = {"sets": {n: {"captions": len(s["pairs"]), "photos": s["images"]} for n, s in sets.items()},
                 "configs": {}}
    with running(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        wait_ready(client)
        for name, s in sets.items():  # warm every mode once
            for mode in ("none", "cp", "temde"):
                client.post("/v1/search", json={"query": s["pairs"][0][0], "rerank": mode, "index": f"cal-{name}"})
        for mode, k in CONFIGS:
            row = out["configs"][f"{mode}@{k}"] = {}
            for name, s in sets.items():
                row[name] = run_set(client, f"cal-{name}", s["pairs"], mode, k)
                print(mode, k, name, {x: y for x, y in row[name].items() if x != "hits1"}, flush=True)
    golds = {n: np.unique([g for _, g in s["pairs"]], return_inverse=True)[1] for n, s in sets.items()}
    base = out["configs"][f"{DEFAULT[0]}@{DEFAULT[1]}"]
    for key, row in out["configs"].items():
        for name in sets:
            row[name]["vs_cp@100"] = paired_bootstrap(np.asarray(row[name]["hits1"]), np.asarray(base[name]["hits1"]),
                                                      golds[name])
    best = max(out["configs"], key=lambda c: out["configs"][c]["ood-dev"]["R@1"])
    near = [c for c in out["configs"] if out["configs"][c]["ood-dev"]["R@1"] >= out["configs"][best]["ood-dev"]["R@1"] - 0.5]
    out["rule"] = {"best_on_ood_dev": best, "within_0.5": near,
                   "fastest_of_those": min(near, key=lambda c: out["configs"][c]["ood-dev"]["p50_ms"])}
    for row in out["configs"].values():
        for name in sets:
            row[name].pop("hits1")
    out["command"] = "python -m research.rerank.shortlist_frontier" + (
        f" --f8k-captions {args.f8k_captions}" if args.f8k_captions != 1000 else "")
    out["machine"] = machine()
    args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps(out["rule"]))


if __name__ == "__main__":
    main()
