"""Named stages and the runner that drives them.

Stages of a build:  reader -> decode -> backbone -> head -> write_redis -> commit
                    ... then (once) write_faiss -> activate.
`StageTimes` accumulates seconds per stage name. Decode runs in a thread pool
(`workers` threads, Pillow releases the GIL) a few batches ahead of the main
thread, which encodes and writes; so decode time is thread time that mostly
overlaps the encoder, and `decode_wait` is how long the encoder sat idle waiting
for pixels (near 0 means decode is not the bottleneck).
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, TypeVar

from tqdm import tqdm

J = TypeVar("J")
P = TypeVar("P")


class StageTimes:
    def __init__(self):
        self._s: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()

    @contextmanager
    def stage(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t
            with self._lock:
                self._s[name] += dt

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self._s[name] += seconds

    def as_dict(self) -> dict[str, float]:
        with self._lock:
            return {k: round(v, 4) for k, v in self._s.items()}


def run_overlapped(jobs: list[J], produce: Callable[[J], P], consume: Callable[[J, P], None],
                   workers: int, times: StageTimes, produce_name: str = "decode") -> None:
    """produce(job) in `workers` threads, up to workers+1 jobs ahead; consume(job, product) in order here."""
    if not jobs:
        return

    def timed(job: J) -> P:
        with times.stage(produce_name):
            return produce(job)

    depth = workers + 1  # one ready while the encoder runs, `workers` more being decoded
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=produce_name) as pool:
        pending: list[Future] = [pool.submit(timed, j) for j in jobs[:depth]]
        for i, job in enumerate(jobs):
            with times.stage(produce_name + "_wait"):
                product = pending[i].result()
            pending[i] = None  # let the pixels go as soon as they are consumed
            if i + depth < len(jobs):
                pending.append(pool.submit(timed, jobs[i + depth]))
            consume(job, product)


def progress(total: int, initial: int, desc: str, enabled: bool) -> tqdm:
    """A tqdm bar over items (rate in img/s and ETA; resumed builds start at `initial`)."""
    return tqdm(total=total, initial=initial, desc=desc, unit="img", disable=not enabled, dynamic_ncols=True,
                smoothing=0.1)
