"""benchmarks/sizing.py and sizing_stack.py: a job's peak RSS is its own, and the 1M column is a labelled projection."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from benchmarks.sizing import slopes
from benchmarks.sizing_stack import LAUNCHER


def test_the_launcher_reports_the_jobs_own_peak_not_the_benchmarks(tmp_path):
    """Linux carries a process's high-water mark through fork and exec: a job spawned straight from a benchmark
    holding 300 MB reports >= 300 MB. Through the launcher it reports what it used itself."""
    held = np.ones(300_000_000 // 8)  # the benchmark's own memory (a grown library's vectors)
    held[::512] = 2.0  # touched: resident
    record = tmp_path / "job.rusage.json"
    job = "import numpy as np; a = np.ones(60_000_000 // 8); a[::512] = 2.0"
    subprocess.run([sys.executable, "-c", LAUNCHER, str(record), sys.executable, "-c", job], check=True, timeout=120)
    peak = json.loads(record.read_text())["maxrss_kb"] * 1024
    assert 60e6 <= peak < 250e6, peak
    direct = subprocess.Popen([sys.executable, "-c", job])
    _, _, ru = os.wait4(direct.pid, 0)
    assert ru.ru_maxrss * 1024 >= 300e6  # why the launcher exists: the direct child inherits the parent's mark
    del held


def _record(scale: float) -> dict:
    """A size's record as one_size writes it, every figure `scale` x a fixed amount."""
    v = int(scale * 1000)
    peak = {"redis_used_memory": v, "redis_process_rss": v, "redis_fork_cow_bytes": v, "redis_rss_plus_cow": v,
            "disk_bytes": v}
    return {"service": {"rss_bytes": v, "peak_rss_bytes_at_end": v},
            "steady": {"redis_used_memory": v, "redis_process_rss": v, "version_files": {"total": v},
                       "redis_files": {"after_save": v}},
            "add": {"peak": peak, "job": {"peak_rss_bytes": v}},
            "watch": {"one_batch": {"peak": peak}, "stream": {"peak": peak}, "watcher": {"peak_rss_bytes": v}}}


def test_slopes_per_item_and_a_labelled_projection():
    out = slopes({"100000": _record(100_000), "300000": _record(300_000)})
    assert out["between"] == [100000, 300000]
    assert all(v == 1000.0 for v in out["per_item_bytes"].values())
    proj = out["projected_1000000"]
    assert "projection, not a measurement" in proj["how"]
    assert proj["redis_used_memory"] == 1_000_000 * 1000


def test_no_projection_once_1m_is_measured():
    out = slopes({"300000": _record(300_000), "1000000": _record(1_000_000)})
    assert out["projected_1000000"] is None and out["per_item_bytes"]["service_rss"] == 1000.0
    assert slopes({"100000": _record(100_000)}) == {}
