"""Quality through the API: captions sent over HTTP to a real server (uvicorn on
loopback, embedded Redis, indexes built by the indexer) must reproduce the
offline evaluation's text->image R@1 for each rerank mode: none = TT,
cp = CP@100, temde = TEMDE@100. Two sets: the Flickr8k test captions
(docs/research/results/flickr8k.json) and the out-of-domain dev set, coco-mini-dev among
the Flickr8k dev images (docs/research/results/ood.json).

    .venv/bin/python -m benchmarks.service_quality [--limit N] [--sets test,ood]
        -> docs/research/service_quality.md, docs/research/results/service_quality.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx

from crossprobe.models.data.captioned import CaptionedFolder, coco_root
from crossprobe.models.data.flickr8k import Flickr8k, available, dataset_root
from crossprobe.models.evaluation.report import machine
from crossprobe.indexer import build
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.service.server import running, wait_ready
from crossprobe.service.settings import Settings

OFFLINE = {"none": "TT", "cp": "CP@100", "temde": "TEMDE@100"}
DEFAULT_PRECISIONS = "fp32,int8"  # the service's default first


def query_set(name: str, ds: Flickr8k, limit: int | None, workdir: Path) -> dict:
    """One caption set as the API sees it: a manifest of its candidate images, (query, gold id) pairs and the
    offline R@1 it must reproduce.
      test  the 5,000 Flickr8k test captions over the 1,000 test images (docs/research/results/flickr8k.json)
      ood   coco-mini-dev's 400 captions over its 80 photos among the 1,000 Flickr8k dev images
            (docs/research/results/ood.json, "coco-mini-dev+f8k-dev", the default checkpoint's rows): the
            out-of-domain dev set the label bridge was chosen on"""
    if name == "test":
        test = ds.splits["test"]
        items = [(ds.images[i], ds.image_path(i)) for i in test]
        pairs = [(ds.captions[j], ds.images[ds.caption_image[j]]) for j in ds.captions_of(test)]
        offline = json.loads(Path("docs/research/results/flickr8k.json").read_text())["t2i"]
    else:
        folder = CaptionedFolder.load(coco_root())
        # ids prefixed by their source: a COCO and a Flickr8k file name may coincide
        items = [(f"coco/{n}", folder.image_path(i)) for i, n in enumerate(folder.images)]
        items += [(f"f8k/{ds.images[i]}", ds.image_path(i)) for i in ds.splits["dev"]]
        pairs = [(c, f"coco/{folder.images[folder.caption_image[j]]}") for j, c in enumerate(folder.captions)]
        offline = json.loads(Path("docs/research/results/ood.json").read_text())["coco-mini-dev+f8k-dev"]["default"]
    manifest = workdir / f"{name}.jsonl"
    manifest.write_text("".join(json.dumps({"id": i, "uri": str(u)}) + "\n" for i, u in items))
    return {"manifest": manifest, "pairs": pairs[:limit], "offline": offline, "images": len(items)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=None, help="first N captions of each set (default: all)")
    ap.add_argument("--sets", default="test,ood", help="caption sets, comma separated: test, ood")
    ap.add_argument("--workdir", type=Path, default=Path("artifacts/quality"))
    ap.add_argument("--query-precision", default=DEFAULT_PRECISIONS, help="query-tower graphs to check, comma separated")
    args = ap.parse_args()
    if not available() or ("ood" in args.sets and not CaptionedFolder.available(coco_root())):
        print(f"Flickr8k ({dataset_root()}) or coco-mini-dev ({coco_root()}) not found; skipped.")
        sys.exit(0)
    ds = Flickr8k.load()
    root = args.workdir / "indexes"
    args.workdir.mkdir(parents=True, exist_ok=True)
    ixs = IndexerSettings(index_root=root, progress=False)
    sets = {name: query_set(name, ds, args.limit, args.workdir) for name in args.sets.split(",")}
    for name, qs in sets.items():
        build(f"quality-{name}", manifest=qs["manifest"], settings=ixs, log=lambda *_: None)
    out = {"sets": {name: {"queries": len(qs["pairs"]), "images": qs["images"], "by_query_precision": {}}
                    for name, qs in sets.items()}}
    for prec in args.query_precision.split(","):
        settings = Settings(index_root=root, port=0, indexes=",".join(f"quality-{n}" for n in sets),
                            access_log=False, log_level="warning", query_precision=prec,
                            int8_min_cosine=0.98)  # the checkpoint's int8 holds ~0.99 (harness.service_env)
        with running(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
            wait_ready(client)
            for name, qs in sets.items():
                modes = out["sets"][name]["by_query_precision"][prec] = {}
                for mode, method in OFFLINE.items():
                    hits = {1: 0, 5: 0, 10: 0}
                    t = time.perf_counter()
                    for query, gold in qs["pairs"]:
                        r = client.post("/v1/search", json={"query": query, "mode": "vector", "k": 10, "rerank": mode, "shortlist": 100,
                                                            "index": f"quality-{name}"})
                        r.raise_for_status()
                        ids = [x["id"] for x in r.json()["results"]]
                        for k in hits:
                            hits[k] += gold in ids[:k]
                    n = len(qs["pairs"])
                    api = {f"R@{k}": round(100 * v / n, 2) for k, v in hits.items()}
                    ref = {k: qs["offline"][method][k] for k in ("R@1", "R@5", "R@10")}
                    modes[mode] = {"api": api, "offline": ref, "offline_method": method,
                                   "R@1_diff": round(api["R@1"] - ref["R@1"], 2), "seconds": round(time.perf_counter() - t, 1)}
                    print(name, prec, mode, modes[mode], flush=True)
    out["command"] = "python -m benchmarks.service_quality" + (f" --limit {args.limit}" if args.limit else "") + \
        (f" --sets {args.sets}" if args.sets != "test,ood" else "") + \
        (f" --query-precision {args.query_precision}" if args.query_precision != DEFAULT_PRECISIONS else "")
    out["machine"] = machine()
    Path("docs/research/results").mkdir(parents=True, exist_ok=True)
    Path("docs/research/results/service_quality.json").write_text(json.dumps(out, indent=2))
    lines = ["# Quality through the API (captions over HTTP vs the offline evaluation)", "",
             f"Command: `{out['command']}`  ", f"Machine: {out['machine']}", "",
             "Each caption is a POST /v1/search (k=10, shortlist 100) to a uvicorn server on loopback, over an index "
             "built by `crossprobe index build` (embedded Redis, FAISS Flat) of the set's candidate images:", "",
             "- test: the Flickr8k test captions over the 1,000 test images; offline: docs/research/results/flickr8k.json.",
             "- ood: coco-mini-dev's 400 captions over its 80 photos among the 1,000 Flickr8k dev images; offline: "
             "docs/research/results/ood.json (coco-mini-dev+f8k-dev, the default checkpoint).", "",
             "Ties are counted against the gold image offline. The offline evaluation runs the fp32 query tower, as "
             "the service does by default; CROSSPROBE_QUERY_PRECISION=int8 (opt-in) runs its MiniLM layers in int8 "
             "(docs/research/query_tower_quant.md).", "",
             "| set | captions | query tower | rerank | offline method | offline R@1 | API R@1 | API - offline | API R@5 | API R@10 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, res in out["sets"].items():
        for prec, modes in res["by_query_precision"].items():
            for mode, m in modes.items():
                lines.append(f"| {name} | {res['queries']} | {prec} | {mode} | {m['offline_method']} | {m['offline']['R@1']} | "
                             f"{m['api']['R@1']} | {m['R@1_diff']:+} | {m['api']['R@5']} | {m['api']['R@10']} |")
    Path("docs/research/service_quality.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
