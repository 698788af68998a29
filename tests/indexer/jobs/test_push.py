"""Batch-job metrics: `index build` and `index reindex` push their progress to a real Pushgateway while they
run and at the end; a Pushgateway that is down or hung neither fails nor stalls the job."""
from __future__ import annotations

import logging
import socket
import threading
import time

import httpx
import pytest

from crossprobe.indexer import TooManyLost, build, reindex
from crossprobe.indexer.jobs.push import JobMetrics
from crossprobe.service.server import free_port
from tests.indexer.conftest import gateway_values

quiet = dict(log=lambda *_: None)
BUILD, REINDEX = "crossprobe-index-build", "crossprobe-reindex"


def _watch(url: str, job: str, index: str, stop: threading.Event, seen: list[dict]) -> None:
    """Read the gateway every 20 ms while a job runs (what Prometheus would scrape)."""
    with httpx.Client(timeout=5) as http:
        while not stop.is_set():
            try:
                http.get(f"{url}/-/ready")
                seen.append(gateway_values(url, job, index))
            except httpx.TransportError:
                pass
            time.sleep(0.02)


def test_build_and_reindex_push_their_progress(settings, pushgateway, gallery, ckpt, bert):
    (gallery / "broken.jpg").write_bytes(b"\xff\xd8\xff garbage")  # 13 files, one skipped
    s = settings.model_copy(update={"pushgateway_url": pushgateway, "pushgateway_interval_s": 0.1,
                                    "throttle_s": 0.1})
    t0 = time.time()
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=_watch, args=(pushgateway, BUILD, "pb", stop, seen), daemon=True)
    watcher.start()
    try:
        res = build("pb", images=gallery, settings=s, ckpt=ckpt, bert=bert, **quiet)
    finally:
        stop.set()
        watcher.join(10)
    assert res.extra["push_failures"] == 0 and res.extra["pushes"] >= 2  # progress while running + the end
    m = gateway_values(pushgateway, BUILD, "pb")
    assert m["crossprobe_batch_items_total"] == 13
    assert m["crossprobe_batch_items_done"] == m["crossprobe_batch_items_total"]
    assert m["crossprobe_batch_skipped"] == 1
    assert m["crossprobe_batch_running"] == 0 and m["crossprobe_batch_failed"] == 0
    assert t0 <= m["crossprobe_batch_last_success_timestamp_seconds"] <= time.time()
    assert m["crossprobe_batch_duration_seconds"] > 0 and m["crossprobe_batch_images_per_second"] > 0
    # while it ran, the gateway said so (every sample a scrape would have seen)
    running = [v for v in seen if v.get("crossprobe_batch_running") == 1]
    assert running, seen[-3:]
    assert all(v["crossprobe_batch_items_done"] <= v["crossprobe_batch_items_total"] == 13 for v in running)
    assert "crossprobe_batch_last_success_timestamp_seconds" not in running[0]  # only a success sets it

    res = reindex("pb", settings=s, ckpt=ckpt, bert=bert, **quiet)
    assert res.extra["push_failures"] == 0 and res.extra["pushes"] >= 2
    m = gateway_values(pushgateway, REINDEX, "pb")
    assert m["crossprobe_batch_items_total"] == 12  # the old version's items (broken.jpg was never in it)
    assert m["crossprobe_batch_items_done"] == m["crossprobe_batch_items_total"]
    assert m["crossprobe_batch_skipped"] == 0
    assert m["crossprobe_batch_running"] == 0 and m["crossprobe_batch_failed"] == 0
    success = m["crossprobe_batch_last_success_timestamp_seconds"]
    assert success >= t0
    assert gateway_values(pushgateway, BUILD, "pb")["crossprobe_batch_items_done"] == 13  # groups are separate

    # a reindex refused for lost items is a failed run; the last success stays what it was (alerts use it)
    for p in sorted(gallery.glob("img_*"))[:4]:
        p.unlink()
    with pytest.raises(TooManyLost):
        reindex("pb", settings=s, ckpt=ckpt, bert=bert, **quiet)
    m = gateway_values(pushgateway, REINDEX, "pb")
    assert m["crossprobe_batch_failed"] == 1 and m["crossprobe_batch_running"] == 0
    assert m["crossprobe_batch_items_done"] == 12 and m["crossprobe_batch_skipped"] == 4
    assert m["crossprobe_batch_last_success_timestamp_seconds"] == success


@pytest.fixture()
def hung_gateway():
    """A TCP port that accepts connections and never answers: a hung Pushgateway."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # the kernel completes the handshakes; nobody ever reads or replies
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_a_down_or_hung_pushgateway_neither_fails_nor_stalls_the_job(settings, gallery, ckpt, bert, hung_gateway,
                                                                     caplog):
    caplog.set_level(logging.WARNING, logger="crossprobe.indexer.jobs.push")
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused
    lines: list[str] = []
    s = settings.model_copy(update={"pushgateway_url": down, "pushgateway_interval_s": 0.1,
                                    "pushgateway_timeout_s": 0.5})
    res = build("down", images=gallery, settings=s, ckpt=ckpt, bert=bert, log=lines.append)
    assert res.count == 12  # the job did its work
    assert res.extra["push_failures"] == res.extra["pushes"] >= 1  # every push failed, and was counted
    assert any(f"pushgateway {down}: {res.extra['pushes']} of {res.extra['pushes']} pushes failed" in x
               for x in lines), lines
    assert "push failed" in caplog.text and "Connection refused" in caplog.text

    caplog.clear()
    lines.clear()
    s = s.model_copy(update={"pushgateway_url": hung_gateway})
    res = reindex("down", settings=s, ckpt=ckpt, bert=bert, log=lines.append)
    assert res.count == 12 and res.extra["push_failures"] >= 1
    assert any("pushes failed" in x for x in lines) and "push failed" in caplog.text

    # the job's end waits for its final push about one timeout at most, even with a push in flight
    # to the hung gateway at that moment
    m = JobMetrics(s, "reindex", "down", say=lines.append)
    m.start(total=1, done=0, skipped=0)
    time.sleep(0.1)  # the first push is now waiting on the hung gateway
    t = time.monotonic()
    m.finish(ok=True)
    waited = time.monotonic() - t
    assert waited <= s.pushgateway_timeout_s + 0.5, waited
    assert m.failures >= 1 and "pushes failed" in lines[-1]  # counted, and said at the end
