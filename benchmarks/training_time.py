"""How long the default training run takes on this machine, all stages, from nothing.

`crossprobe train` records each stage's wall time in runs/default/timings.json (and the
checkpoint's config.json); stages run in separate invocations add up there. The cache stage
of a resumed run only loads features already on disk, so this script times building the
feature cache from nothing (in a temporary directory; the dataset is read in place) and
writes the budget with it:

    .venv/bin/python -m benchmarks.training_time  ->  docs/research/training_time.md, docs/research/results/training_time.json

Run it on an otherwise idle machine (2 threads, as `crossprobe train`).
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from crossprobe.models import checkpoint
from crossprobe.models.data.flickr8k import available, dataset_root
from crossprobe.models.evaluation.report import machine
from crossprobe.models.model import ModelConfig
from crossprobe.models.training.data import CachedData

BUDGET_MIN = 90


def main() -> None:
    if not available():
        print(f"Flickr8k not found at {dataset_root()}; nothing to time. Skipped.")
        sys.exit(0)
    torch.set_num_threads(2)
    meta = checkpoint.read_config(checkpoint.DEFAULT_CHECKPOINT)
    stages = dict(meta["training"]["timings_s"])
    Path("cache").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir="cache") as d:
        t0 = time.time()
        CachedData.build(Path(d), ModelConfig.from_dict(meta["model"]).text.frozen_layers, in_memory=False)
        fresh = round(time.time() - t0, 1)
    recorded_cache = stages.pop("cache", None)
    total = fresh + sum(stages.values())
    out = {"cache_from_nothing_s": fresh, "cache_recorded_s": recorded_cache, "stages_s": stages,
           "total_min": round(total / 60, 1), "budget_min": BUDGET_MIN, "checkpoint": meta["fingerprint"],
           "machine": machine(), "command": "python -m benchmarks.training_time"}
    Path("docs/research/results").mkdir(parents=True, exist_ok=True)
    Path("docs/research/results/training_time.json").write_text(json.dumps(out, indent=2))
    rows = [("cache (built from nothing, this script)", fresh)] + list(stages.items())
    lines = ["# The default training run's wall time (`crossprobe train`, all stages)", "",
             f"Command: `{out['command']}`  ", f"Machine: {out['machine']}  ", f"Checkpoint: `{meta['fingerprint']}`", "",
             "Stage times other than the cache are the ones `crossprobe train` recorded for this checkpoint "
             "(config.json `training.timings_s`; a stage's time is summed over the invocations that ran it). "
             "The CP frontier is not a stage of the default run: it is `crossprobe frontier` (docs/research/frontier.md); "
             "`crossprobe train` trains the one CP shape pinned in ModelConfig.cp.", "",
             "| stage | seconds | minutes |", "|---|---|---|"]
    lines += [f"| {k} | {v} | {round(v / 60, 1)} |" for k, v in rows]
    lines += [f"| **total** | {round(total, 1)} | **{out['total_min']}** |", "",
              f"Budget (issue 2): under {BUDGET_MIN} minutes on this 2-core machine: "
              + ("met." if out["total_min"] < BUDGET_MIN else "NOT met."), ""]
    Path("docs/research/training_time.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
