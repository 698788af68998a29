"""The runner that overlaps a job's stages.

Stages of a build:  reader -> decode -> backbone -> head -> write_redis -> commit
                    ... then (once) write_faiss -> activate.
models.runtime.StageTimer accumulates seconds per stage name. Decode runs in a thread pool
(`workers` threads, Pillow releases the GIL) a few batches ahead of the main
thread, which encodes and writes; so decode time is thread time that mostly
overlaps the encoder, and `decode_wait` is how long the encoder sat idle waiting
for pixels (near 0 means decode is not the bottleneck).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, TypeVar

from tqdm import tqdm

from crossprobe.core.runtime import StageTimer

J = TypeVar("J")
P = TypeVar("P")


def run_overlapped(
    jobs: list[J],
    produce: Callable[[J], P],
    consume: Callable[[J, P], None],
    workers: int,
    times: StageTimer,
    produce_name: str = "decode",
) -> None:
    """produce(job) in `workers` threads, up to workers+1 jobs ahead; consume(job, product) in order here."""
    if not jobs:
        return

    def timed(job: J) -> P:
        with times.stage(produce_name):
            return produce(job)

    depth = workers + 1  # one ready while the encoder runs, `workers` more being decoded
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=produce_name) as pool:
        pending: dict[int, Future[P]] = {i: pool.submit(timed, j) for i, j in enumerate(jobs[:depth])}
        for i, job in enumerate(jobs):
            with times.stage(produce_name + "_wait"):
                product = pending.pop(i).result()  # popped: the pixels go as soon as they are consumed
            if i + depth < len(jobs):
                pending[i + depth] = pool.submit(timed, jobs[i + depth])
            consume(job, product)


def progress(total: int, initial: int, desc: str, enabled: bool) -> tqdm:
    """A tqdm bar over items (rate in img/s and ETA; resumed builds start at `initial`)."""
    return tqdm(
        total=total, initial=initial, desc=desc, unit="img", disable=not enabled, dynamic_ncols=True, smoothing=0.1
    )
