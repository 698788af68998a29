"""A small load generator for POST /v1/search: one asyncio process, raw HTTP/1.1 over keep-alive loopback
connections (no HTTP library: the generator shares the service's 2 cores, so its CPU per request must be
small; `Run.client_cpu_ms_per_request` says what it cost).

Two shapes, both bounded in count and time and ending by themselves:

  open_loop(rate, seconds)      requests start on a fixed schedule (i / rate), whatever the service does; latency
                                counts from the scheduled start, so a service that falls behind shows it (no
                                coordinated omission). At most `max_in_flight` at once: a request that finds them
                                all busy is not sent and counts as an error ("client_backlog").
  closed_loop(clients, n)       `clients` connections, each sending its next request when the last one answered.

Every request has a deadline (`timeout_s`); a timeout, a refused or dropped connection, or any status other than
200 is an error, kept with its kind. Used by benchmarks/load_bench.py and benchmarks/redis_faults.py --rate.
"""
from __future__ import annotations

import asyncio
import json
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Record:
    start: float  # loop time the request was due (open loop) or sent (closed loop)
    end: float
    status: int | str  # HTTP status, or the error's kind
    degraded: bool | None = None
    retried: bool = False  # sent again on a new connection: the server had closed the idle kept-alive one

    @property
    def ms(self) -> float:
        return (self.end - self.start) * 1000


@dataclass
class Run:
    records: list[Record] = field(default_factory=list)
    wall_s: float = 0.0
    client_cpu_s: float = 0.0

    @property
    def ok(self) -> list[Record]:
        return [r for r in self.records if r.status == 200]

    @property
    def errors(self) -> list[Record]:
        return [r for r in self.records if r.status != 200]

    def summary(self) -> dict:
        import numpy as np

        lat = np.array([r.ms for r in self.ok]) if self.ok else np.array([np.nan])
        kinds: dict[str, int] = {}
        for r in self.errors:
            kinds[str(r.status)] = kinds.get(str(r.status), 0) + 1
        p50, p95, p99 = (round(float(x), 1) for x in np.percentile(lat, [50, 95, 99]))
        return {"requests": len(self.records), "ok": len(self.ok), "errors": len(self.errors), "error_kinds": kinds,
                "degraded": sum(1 for r in self.records if r.degraded),
                "stale_connection_retries": sum(1 for r in self.records if r.retried),
                "qps": round(len(self.ok) / self.wall_s, 1),
                "p50_ms": p50, "p95_ms": p95, "p99_ms": p99, "max_ms": round(float(np.max(lat)), 1),
                "wall_s": round(self.wall_s, 2),
                "client_cpu_ms_per_request": round(1000 * self.client_cpu_s / max(1, len(self.records)), 3),
                "client_cpu_cores": round(self.client_cpu_s / self.wall_s, 3)}


class Conn:
    """One keep-alive HTTP/1.1 connection. request() -> (status, body)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, data: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(data)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
                break
        body = await self.reader.readexactly(length) if length else b""
        if b"connection: close" in head.lower():
            self.close()
        return status, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def search_requests(host: str, port: int, queries: list[str], rerank: str | None, index: str | None,
                    k: int = 10) -> list[bytes]:
    """The raw requests, built once (the generator then only writes bytes)."""
    out = []
    for q in queries:
        body = {"query": q, "k": k}
        if rerank:
            body["rerank"] = rerank
        if index:
            body["index"] = index
        b = json.dumps(body).encode()
        out.append(b"POST /v1/search HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (host.encode(), port, len(b), b))
    return out


# clip-retrieval's front-end's own /knn-service body (front/src/clip-service.js), with what needs models of its own
# off and the result counts of a page of results
KNN_BODY = {"image": None, "image_url": None, "embedding_input": None, "modality": "image", "num_images": 10,
            "num_result_ids": 100, "use_mclip": False, "deduplicate": True, "use_safety_model": False,
            "use_violence_detector": False, "aesthetic_score": "", "aesthetic_weight": "0.5"}


def knn_requests(host: str, port: int, queries: list[str], indice: str) -> list[bytes]:
    """POST /knn-service requests (clip-retrieval's API, served by clip back and by crossprobe alike)."""
    out = []
    for q in queries:
        b = json.dumps({"text": q, "indice_name": indice, **KNN_BODY}).encode()
        out.append(b"POST /knn-service HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (host.encode(), port, len(b), b))
    return out


class Generator:
    def __init__(self, host: str, port: int, requests: list[bytes], timeout_s: float = 10.0):
        self.host, self.port, self.requests, self.timeout_s = host, port, requests, timeout_s
        self._idle: deque[Conn] = deque()
        self.n = 0  # requests sent so far (picks the next body round-robin)

    async def _send(self, conn: Conn, data: bytes) -> tuple[int, bytes, bool]:
        """-> (status, body, retried). A kept-alive connection that the server closed while it sat idle (uvicorn's
        keep-alive timeout) fails before any byte of an answer: sent once more on a new connection, as HTTP
        clients do with idempotent requests, and counted (Record.retried). Any other failure is the answer."""
        reused = conn.writer is not None
        try:
            return (*await conn.request(data), False)
        except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as e:
            if not reused or getattr(e, "partial", b""):
                raise
            conn.close()
            return (*await conn.request(data), True)

    async def _one(self, due: float, sink: list[Record]) -> None:
        # first in, first out: every idle connection is used in turn, so none idles past the server's keep-alive
        conn = self._idle.popleft() if self._idle else Conn(self.host, self.port)
        data = self.requests[self.n % len(self.requests)]
        self.n += 1
        loop = asyncio.get_running_loop()
        degraded, retried = None, False
        try:
            status, body, retried = await asyncio.wait_for(self._send(conn, data), self.timeout_s)
            if status == 200:
                degraded = b'"degraded":true' in body
        except asyncio.TimeoutError:
            status = "timeout"
            conn.close()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            status = type(e).__name__
            conn.close()
        sink.append(Record(due, loop.time(), status, degraded, retried))
        if conn.writer is not None:
            self._idle.append(conn)

    async def open_loop(self, rate: float, seconds: float, max_in_flight: int = 256,
                        sink: list[Record] | None = None, until: Callable[[], bool] | None = None) -> Run:
        """Requests due at i / rate for `seconds` seconds (or until until() says so); waits for the last ones
        (each bounded by timeout_s)."""
        loop = asyncio.get_running_loop()
        run = Run(records=sink if sink is not None else [])
        cpu0, t0 = time.process_time(), loop.time()
        tasks: set[asyncio.Task] = set()
        i, count = 0, math.ceil(rate * seconds - 1e-9)  # due at 0, 1/rate, ... < seconds
        while i < count:
            due = t0 + i / rate
            if until is not None and until():
                break
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(tasks) >= max_in_flight:
                run.records.append(Record(due, due, "client_backlog"))
            else:
                t = asyncio.create_task(self._one(due, run.records))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            i += 1
        if tasks:
            await asyncio.wait(tasks, timeout=self.timeout_s + 1)
        run.wall_s = loop.time() - t0  # the schedule plus the last answers
        run.client_cpu_s = time.process_time() - cpu0
        self.close()  # connections belong to this event loop
        return run

    async def closed_loop(self, clients: int, n: int, max_seconds: float = 600.0) -> Run:
        """`clients` connections send n requests in all, each the next when its last one answered."""
        loop = asyncio.get_running_loop()
        run = Run()
        cpu0, t0 = time.process_time(), loop.time()
        left = [n]

        async def client() -> None:
            while left[0] > 0 and loop.time() - t0 < max_seconds:
                left[0] -= 1
                await self._one(loop.time(), run.records)

        await asyncio.gather(*(client() for _ in range(clients)))
        run.wall_s = loop.time() - t0
        run.client_cpu_s = time.process_time() - cpu0
        self.close()  # connections belong to this event loop
        return run

    def close(self) -> None:
        for c in self._idle:
            c.close()
        self._idle.clear()
