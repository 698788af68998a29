"""`crossprobe serve` as a real uvicorn process on a loopback port, for tests that need real sockets (slow
clients, the schemathesis run): the same process and protocol a deployment runs, not the in-process TestClient."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from crossprobe.service.server import free_port


@contextmanager
def serve(built, ckpt: Path, artifacts: Path, log: Path, ready: bool = True, **env: str) -> Iterator[str]:
    """Serve `built` (tests/service/conftest.py's index) -> the base URL, until the block ends (SIGTERM).
    env: CROSSPROBE_* overrides, e.g. CROSSPROBE_HEADER_TIMEOUT_S="1". ready: wait for /readyz 200 first."""
    proc, base = start({"REDIS_URL": built.ixs.redis_url, "CROSSPROBE_INDEX_ROOT": str(built.ixs.index_root),
                        "CROSSPROBE_CKPT": str(ckpt), "CROSSPROBE_MODELS_DIR": str(artifacts),
                        "CROSSPROBE_RELOAD_INTERVAL_S": "0", "CROSSPROBE_WORKERS": "2", **env}, log, ready)
    try:
        yield base
    finally:
        stop(proc)


def start(env: dict[str, str], log: Path, ready: bool = True, timeout_s: float = 120,
          drop: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    """`crossprobe serve` on a free loopback port with `env` over this process' environment (whose CROSSPROBE_MODEL
    and CROSSPROBE_CKPT are left out: `env` names the model; and `drop`, e.g. REDIS_URL for the embedded Redis) ->
    (the process, its base URL), once /readyz answers 200 (ready=False: once it listens). Its output goes to `log`;
    stop() ends it."""
    port = free_port()
    left_out = ("CROSSPROBE_MODEL", "CROSSPROBE_CKPT", *drop)
    full = {**{k: v for k, v in os.environ.items() if k not in left_out},
            "CROSSPROBE_THREADS": "1", "CROSSPROBE_LOG_LEVEL": "info", "CROSSPROBE_ACCESS_LOG": "false",
            "HF_HUB_OFFLINE": "1", **env}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "crossprobe.cli", "serve", "--host", "127.0.0.1",
                                 "--port", str(port)], env=full, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, timeout=30) as http:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise AssertionError(log.read_text())
            try:
                if http.get("/readyz").status_code == 200 or not ready:
                    return proc, base
            except httpx.TransportError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                stop(proc)
                raise AssertionError(log.read_text())
            time.sleep(0.2)


class Traffic:
    """Clients searching a live service without pause, one thread each, while a test changes what it serves: each
    client posts its own /v1/search body over and over and records (status, the answering version, the error text
    of a failed or degraded answer; a dropped connection is status 0). A context manager: the clients stop at its
    end."""

    def __init__(self, url: str, bodies: list[dict]):
        self.url, self.bodies = url, bodies
        self.seen: list[list[tuple[int, str | None, str]]] = [[] for _ in bodies]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(len(bodies))]

    def _loop(self, i: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            while not self._stop.is_set():
                try:
                    r = http.post("/v1/search", json=self.bodies[i])
                    ok = r.status_code == 200 and not r.json()["degraded"]
                    self.seen[i].append((r.status_code, r.json()["index"]["version"] if ok else None,
                                         "" if ok else r.text))
                except Exception as e:  # noqa: BLE001 - a dropped connection is a failed search too
                    self.seen[i].append((0, None, repr(e)))

    def total(self) -> int:
        return sum(len(s) for s in self.seen)

    def failed(self) -> list[str]:
        return [text for s in self.seen for status, _, text in s if status != 200 or text]

    def versions(self, i: int) -> list[str | None]:
        """The versions client i's answers came from, in order."""
        return [v for _, v, _ in self.seen[i]]

    def __enter__(self) -> "Traffic":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def stop(proc: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM (the graceful shutdown a deployment sends), then SIGKILL if it has not ended within `timeout`."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
