"""Progress of a batch job (`index build`, `index reindex`) pushed to a Prometheus Pushgateway.

Prometheus cannot scrape a job that ends, so the job pushes (DESIGN.md "Service"): once at the start,
every IndexerSettings.pushgateway_interval_s while it runs, and once at the end. Group: job="crossprobe-index-build"
or "crossprobe-reindex", {index: NAME}. The gauges (deploy/'s dashboard and alert rules use these names):

    crossprobe_batch_items_total                     items to encode (the job's item list)
    crossprobe_batch_items_done                      of those, encoded or skipped (a resumed run starts at
                                                     what its interrupted run committed)
    crossprobe_batch_skipped                         items reported as skipped (as in report.json)
    crossprobe_batch_images_per_second               images encoded by this run / seconds since it started
    crossprobe_batch_running                         1 while running, 0 at the end
    crossprobe_batch_failed                          1 if the run failed (error, or a reindex refused), else 0
    crossprobe_batch_last_success_timestamp_seconds  unix time of the last successful run
    crossprobe_batch_duration_seconds                seconds since this run started

Pushes use POST (pushadd_to_gateway: replace the metrics of the same names in the group), not PUT
(push_to_gateway: replace the whole group): the last-success gauge is only in the final push of a run that
succeeded, so a running or failed run leaves the previous success time in place for the "no success for a
day" alert, instead of deleting it.

A Pushgateway that is down or slow never fails or stalls the job: every push runs in a thread of its own
with IndexerSettings.pushgateway_timeout_s, a failure is counted and logged and the next interval tries again, and
the job's end waits for its final push at most about that timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from prometheus_client import CollectorRegistry, Gauge, pushadd_to_gateway

from crossprobe.indexer.jobs.settings import IndexerSettings

log = logging.getLogger("crossprobe.indexer.jobs.push")

JOB_NAMES = {"build": "crossprobe-index-build", "reindex": "crossprobe-reindex"}
LOG_EVERY = 12  # after the first failed push, log every 12th (a minute at the default interval), not each one


class JobMetrics:
    """The gauges of one run and the thread that pushes them. Without a configured URL every method is a
    no-op, so the job calls them unconditionally."""

    def __init__(self, settings: IndexerSettings, kind: str, index: str, say: Callable[[str], None] = print):
        self.url = settings.pushgateway_url
        self.job = JOB_NAMES[kind]
        self.grouping = {"index": index}
        self.timeout = settings.pushgateway_timeout_s
        self.interval = settings.pushgateway_interval_s
        self.say = say  # the job's own log (what the user reads); failures also go to `logging`
        self.pushes = 0  # attempts, for the end-of-run line and the tests
        self.failures = 0
        self.last_error: str | None = None
        self._t0 = time.monotonic()
        self._encoded = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registry = CollectorRegistry()
        g = self._gauge
        self.items_total = g("crossprobe_batch_items_total", "Items this batch job encodes")
        self.items_done = g("crossprobe_batch_items_done", "Items encoded or skipped so far")
        self.skipped = g("crossprobe_batch_skipped", "Items skipped so far (reasons in the version's report.json)")
        self.rate = g("crossprobe_batch_images_per_second", "Images encoded by this run per second since it started")
        self.running = g("crossprobe_batch_running", "1 while the job runs, 0 once it ended")
        self.failed = g("crossprobe_batch_failed", "1 if the last run failed, else 0")
        self.duration = g("crossprobe_batch_duration_seconds", "Seconds since this run started (total at the end)")

    def _gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(name, doc, registry=self.registry)

    @property
    def enabled(self) -> bool:
        return bool(self.url)

    # ---- called by the job ---------------------------------------------------
    def start(self, total: int, done: int, skipped: int) -> None:
        """Known totals (a resumed run: what is already committed); pushes at once, then every interval."""
        self.items_total.set(total)
        self.items_done.set(done)
        self.skipped.set(skipped)
        self.running.set(1)
        self.failed.set(0)
        if self.enabled:
            self._thread = threading.Thread(target=self._loop, name="pushgateway", daemon=True)
            self._thread.start()

    def advance(self, done: int, skipped: int, encoded: int) -> None:
        """One more batch: `done` items (encoded + skipped), of which `skipped` were skipped."""
        self.items_done.inc(done)
        self.skipped.inc(skipped)
        with self._lock:
            self._encoded += encoded

    def finish(self, ok: bool) -> None:
        """Final values, the final push, and a line saying how the pushes went."""
        self.running.set(0)
        self.failed.set(0 if ok else 1)
        if ok:  # registered only now: see the module docstring (POST keeps the previous value otherwise)
            self._gauge(
                "crossprobe_batch_last_success_timestamp_seconds", "Unix time at which the last successful run ended"
            ).set(time.time())
        self._refresh()
        if self._thread is None:
            return
        self._stop.set()  # the thread makes the final push and ends
        # if a push is in flight to a hung gateway, wait for it, not for a second timeout after it
        self._thread.join(self.timeout + 0.25)
        if self._thread.is_alive():
            with self._lock:
                self.failures += 1
                self.last_error = f"final push not done within {self.timeout}s"
            log.warning(
                "pushgateway %s: final push not done within %ss; the job goes on without it", self.url, self.timeout
            )
        if self.failures:
            self.say(
                f"pushgateway {self.url}: {self.failures} of {self.pushes} pushes failed "
                f"(last error: {self.last_error}); the job itself is unaffected"
            )

    # ---- the pushing thread --------------------------------------------------
    def _refresh(self) -> None:
        elapsed = time.monotonic() - self._t0
        self.duration.set(elapsed)
        with self._lock:
            self.rate.set(self._encoded / elapsed if elapsed > 0 else 0.0)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._push()
            self._stop.wait(self.interval)
        self._push()  # the final values set by finish()

    def _push(self) -> None:
        url = self.url
        assert url, "pushes only when enabled"  # the thread runs only then (start)
        self._refresh()
        with self._lock:
            self.pushes += 1
        try:
            pushadd_to_gateway(
                url, job=self.job, registry=self.registry, grouping_key=self.grouping, timeout=self.timeout
            )
        except Exception as e:  # noqa: BLE001 - refused, timed out, HTTP 4xx/5xx: never the job's problem
            with self._lock:
                self.failures += 1
                self.last_error = f"{type(e).__name__}: {e}"[:300]
                n = self.failures
            if n == 1 or n % LOG_EVERY == 0:
                log.warning("pushgateway %s: push failed (%d so far): %s", self.url, n, self.last_error)
