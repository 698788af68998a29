"""ray_engine.start when a local Ray's raylet does not register in time (Ray's fixed 30 s; seen on this 2-core
machine): what the failed start left running is killed and a real local instance starts on the second try.
A module of its own: it needs a process without Ray running (test_ray_engine keeps one for its module)."""
import subprocess
import sys

import psutil
import pytest

from crossprobe.indexer.jobs import ray_engine
from crossprobe.indexer.jobs.settings import IndexerSettings

ray = pytest.importorskip("ray")


def test_a_local_start_that_times_out_is_retried_once(monkeypatch, tmp_path, caplog):
    real_init, calls, left = ray.init, [], []

    def flaky_init(*args, **kwargs):
        calls.append(kwargs)
        if len(calls) == 1:  # what a half-started node leaves: a child process of Ray's, then Ray's own error
            left.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "/ray/_private/gcs"]))
            raise Exception("The current node timed out during startup. This could happen because some of the "
                            "raylet failed to startup or the GCS has become overloaded.")
        return real_init(*args, **kwargs)

    monkeypatch.setattr(ray, "init", flaky_init)
    ray_tmp = tmp_path.parent / "rs"  # short: Ray's unix socket paths must stay under 107 bytes
    assert not ray.is_initialized()
    try:
        assert ray_engine.start(IndexerSettings(ray_num_cpus=1, ray_temp_dir=ray_tmp, ray_address=None)) is True
        assert ray.is_initialized() and ray.cluster_resources()["CPU"] == 1
    finally:
        ray.shutdown()
    assert len(calls) == 2 and calls[0] == calls[1]
    assert left[0].wait(timeout=5) is not None and not psutil.pid_exists(left[0].pid)
    assert "local Ray did not start" in caplog.text and "killed 1 of its processes" in caplog.text


def test_other_start_errors_are_not_retried(monkeypatch):
    calls = []

    def broken_init(*args, **kwargs):
        calls.append(1)
        raise ValueError("object_store_memory is too large")

    monkeypatch.setattr(ray, "init", broken_init)
    with pytest.raises(ValueError, match="too large"):
        ray_engine.start(IndexerSettings(ray_num_cpus=1, ray_address=None))
    assert calls == [1] and not ray.is_initialized()
