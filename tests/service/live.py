"""`crossprobe serve` as a real uvicorn process on a loopback port, for tests that need real sockets (slow
clients, the schemathesis run): the same process and protocol a deployment runs, not the in-process TestClient."""
from __future__ import annotations

import os
import subprocess
import sys
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
    port = free_port()
    full = {**os.environ, "REDIS_URL": built.ixs.redis_url, "CROSSPROBE_INDEX_ROOT": str(built.ixs.index_root),
            "CROSSPROBE_CKPT": str(ckpt), "CROSSPROBE_ARTIFACTS_DIR": str(artifacts),
            "CROSSPROBE_RELOAD_INTERVAL_S": "0", "CROSSPROBE_THREADS": "1", "CROSSPROBE_WORKERS": "2",
            "CROSSPROBE_LOG_LEVEL": "info", "CROSSPROBE_ACCESS_LOG": "false", "HF_HUB_OFFLINE": "1", **env}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "crossprobe.service.cli", "serve", "--host", "127.0.0.1",
                                 "--port", str(port)], env=full, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, log.read_text()
                try:
                    status = http.get("/readyz").status_code
                    if status == 200 or not ready:
                        break
                except httpx.TransportError:
                    pass  # not listening yet
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        yield base
    finally:
        stop(proc)


def stop(proc: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM (the graceful shutdown a deployment sends), then SIGKILL if it has not ended within `timeout`."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
