"""Resumable training state: what a killed run needs to continue.

Each stage writes `<stage>.pt` (weights, optimizer, schedule, epoch, best so
far, RNG) atomically after every epoch, and `<stage>.done.pt` with its best
weights when finished; a restarted run skips finished stages and resumes the
current one from its last completed epoch.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import torch

from crossprobe.core.atomic import atomic_path, atomic_write


def atomic_save(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


class EpochState:
    """One stage's `<stage>.pt`: its weights (under `key`: "model" for the towers, "module" for a reranker, as runs
    already on disk have them), optimizer, schedule, epochs done, best so far, history and RNG, saved after every
    epoch. resume() at the start of the stage continues a killed run after its last completed epoch, with the
    random stream it had."""

    def __init__(self, path: Path, key: str):
        self.path, self.key = Path(path), key

    def resume(self, load_weights, opt, sched, best: dict, name: str, log=print) -> tuple[int, dict, list]:
        """-> (first epoch to run, best so far, history); (0, best, []) where nothing was saved yet."""
        if not self.path.exists():
            return 0, best, []
        st = torch.load(self.path, weights_only=False)
        load_weights(st[self.key])
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        set_rng_state(st["rng"])
        log(f"{name}: resuming after epoch {st['epoch']}")
        return st["epoch"], st["best"], st["history"]

    def save(self, weights: dict, opt, sched, epoch: int, best: dict, history: list) -> None:
        atomic_save(
            {
                self.key: weights,
                "opt": opt.state_dict(),
                "sched": sched.state_dict(),
                "epoch": epoch,
                "best": best,
                "history": history,
                "rng": rng_state(),
            },
            self.path,
        )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Timings:
    """Seconds per stage, accumulated across restarts, in <run>/timings.json."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "timings.json"
        self.data = json.loads(self.path.read_text()) if self.path.exists() else {}

    def add(self, stage: str, seconds: float) -> None:
        self.data[stage] = round(self.data.get(stage, 0.0) + seconds, 1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps(self.data, indent=2))

    def timer(self, stage: str):
        timings = self

        class _T:
            def __enter__(self):
                self.t = time.time()

            def __exit__(self, *exc):
                timings.add(stage, time.time() - self.t)

        return _T()
