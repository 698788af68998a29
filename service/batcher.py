"""Queue layer: admission control and micro-batching of the query tower.

Admission (Limiter): at most `queue_size` searches are in the service at once
(waiting for the query tower or in any later stage). The next one is refused at
once with 429 instead of queueing without bound: under overload a fast "try
again" beats a timeout, and the latency of admitted requests stays bounded.

Micro-batching (QueryBatcher): one task owns the query tower. It takes the
first waiting query, then gathers more until `batch_max` queries or
`batch_wait` seconds have passed, and runs them as one padded batch on its own
thread (ONNX Runtime releases the GIL; the event loop keeps serving). Queries
that arrive while a batch runs wait in the queue and form the next batch, so
under load batches fill without any waiting. It waits only while other searches
are in the service: a lone query (one client, a quiet service) starts at once,
so batching costs one client nothing (docs/research/latency.md).
With batching off every query runs alone (batch_max 1, no wait).

Encoders: up to `encoders` batches run at once, each on a thread of its own (one ONNX Runtime session serves
concurrent runs). One is enough for a small query tower (crossprobe's); a CLIP-sized text tower run by one thread
at a time leaves the other cores idle under load, so its default is chosen per model from measurements
(service/profiles.py).
"""

from __future__ import annotations

import asyncio
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from crossprobe.core.inference import QueryVectors
from crossprobe.service import metrics
from crossprobe.service.exceptions import Overloaded


class Limiter:
    """Counts admitted requests of one kind (searches; the routes that decode photos). Used only from the event
    loop thread, so no lock is needed."""

    def __init__(self, size: int, what: str = "searches", setting: str = "CROSSPROBE_QUEUE_SIZE", gauge: bool = True):
        self.size, self.what, self.setting, self.gauge = size, what, setting, gauge
        self.in_flight = 0

    @contextmanager
    def admit(self) -> Iterator[None]:
        if self.in_flight >= self.size:
            raise Overloaded(
                f"too many {self.what} in progress, retry shortly ({self.in_flight} {self.what} in progress "
                f"({self.setting}={self.size}))",
                retry_after_s=1,
            )
        self.in_flight += 1
        if self.gauge:
            metrics.IN_FLIGHT.set(self.in_flight)
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.gauge:
                metrics.IN_FLIGHT.set(self.in_flight)


@dataclass
class EncodeInfo:
    queue_ms: float  # waiting for a batch to start
    encode_ms: float  # the batch's query-tower run (tokenize + ONNX Runtime); a cache hit's lookup
    batch_size: int
    cached: bool = False  # answered by the query-vector cache (query_cache.py), without the query tower


@dataclass
class _Job:
    text: str
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


class QueryBatcher:
    def __init__(
        self,
        encode: Callable[[list[str]], list[QueryVectors]],
        batch_max: int,
        batch_wait_s: float,
        enabled: bool = True,
        busy: Callable[[int], bool] | None = None,
        encoders: int = 1,
    ):
        self.encode = encode
        self.batch_max = batch_max if enabled else 1
        self.batch_wait = batch_wait_s if enabled else 0.0
        # busy(n): are other searches than these n in the service? If not, nobody is likely to join
        # within batch_wait (one client, or a quiet service) and waiting would only add latency.
        self.busy = busy
        self.largest_batch = 0
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()  # bounded by the Limiter in front of it
        self.encoders = max(1, int(encoders))
        self._pool = ThreadPoolExecutor(max_workers=self.encoders, thread_name_prefix="encode")
        self._task: asyncio.Task | None = None
        self._running: set[asyncio.Task] = set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="query-batcher")

    async def stop(self) -> None:
        for t in [self._task, *self._running]:
            if t:
                t.cancel()
                try:
                    await t
                except asyncio.CancelledError:
                    pass
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def submit(self, text: str) -> tuple[QueryVectors, EncodeInfo]:
        fut = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Job(text, fut))
        return await fut

    async def _gather(self) -> list[_Job]:
        batch = [await self._queue.get()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.batch_wait
        while len(batch) < self.batch_max:
            try:
                batch.append(self._queue.get_nowait())  # already waiting: no reason to wait for it
                continue
            except asyncio.QueueEmpty:
                pass
            remaining = deadline - loop.time()
            if remaining <= 0 or (self.busy is not None and not self.busy(len(batch))):
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                break
        return [j for j in batch if not j.future.done()]  # drop callers that went away

    async def _run(self) -> None:
        slots = asyncio.Semaphore(self.encoders)
        while True:
            await slots.acquire()  # a batch is gathered only when an encoder is free to run it
            batch = await self._gather()
            if not batch:
                slots.release()
                continue
            task = asyncio.get_running_loop().create_task(self._encode(batch))
            self._running.add(task)
            task.add_done_callback(functools.partial(self._done, slots))

    def _done(self, slots: asyncio.Semaphore, task: asyncio.Task) -> None:
        self._running.discard(task)
        slots.release()

    async def _encode(self, batch: list[_Job]) -> None:
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        try:
            out = await loop.run_in_executor(self._pool, self.encode, [j.text for j in batch])
        except Exception as e:  # noqa: BLE001 - the callers get the error, the batcher keeps running
            for j in batch:
                if not j.future.done():
                    j.future.set_exception(e)
            return
        encode_ms = (time.perf_counter() - start) * 1000
        metrics.BATCH_SIZE.observe(len(batch))
        self.largest_batch = max(self.largest_batch, len(batch))
        for j, q in zip(batch, out):
            if not j.future.done():
                j.future.set_result((q, EncodeInfo((start - j.enqueued) * 1000, encode_ms, len(batch))))
