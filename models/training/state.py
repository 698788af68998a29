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

from crossprobe.models.atomic import atomic_path, atomic_write


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
