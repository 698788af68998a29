"""`crossprobe index watch NAME --images DIR`: keep an index in step with a folder, nothing restarted.

How, and why this way:
- The index is the journal. Every item read from a file records the file's size and mtime as it was opened
  (decode.py: bytes, mtime_ns). A scan of the folder (sources.scan_folder: os.walk + stat) compared with the
  active version's items gives the changes: new files, changed files (another size or mtime), deleted files; a
  move is a delete and a new file. Nothing else keeps state, so a watcher killed at any point starts again by
  scanning: a change that reached the active version is not applied twice, one that did not is found again.
- inotify events (watchdog) only wake the scan early. Where the observer cannot start (fs.inotify.max_user_watches
  reached, a network mount) the watcher scans every watch_poll_s; with events it still scans every watch_rescan_s,
  because a full inotify queue drops events silently. No inotify limit bounds what is watched.
- A batch of changes (at most watch_batch_max files) becomes ONE new version: the active version minus the
  deleted ids plus the new and changed files (kinds.sync), written beside the live one and made live by one
  SET of `active`. A reader sees the version before the batch or the one after it, never half of it; the live
  version is never written in place. A batch killed mid-way resumes from its journal when the restarted watcher
  finds the same changes; otherwise its half-built version is abandoned and removed.
- A file is read once its mtime is watch_settle_s old (a copy in progress is not indexed half-written). One that
  still fails (truncated, corrupt, unreadable) is a counted skip, retried when the file changes again; its old
  entry, if any, stays (as with `index add`).
- The versions the watcher replaced are removed watch_gc_grace_s later: a service polling `active` may still
  be reading one. Other inactive versions (a rollback point) are left to `crossprobe index gc`.
- A scan that would delete more than watch_max_delete of the index holds its deletions (an unmounted disk, a
  folder emptied by mistake) and says so; a folder that vanishes pauses the watcher until it is back.
Progress and lag are Prometheus metrics (WatchMetrics) served on watch_metrics_port.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from redis.exceptions import RedisError

from crossprobe.indexer.jobs import kinds
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.indexer.jobs.sources import Item, scan_folder
from crossprobe.storage.redis_conn import connect
from crossprobe.storage.store import Store

if TYPE_CHECKING:
    from watchdog.observers.api import BaseObserver

log = logging.getLogger("crossprobe.watch")

Sig = tuple[int, int]  # a file's (size in bytes, mtime in ns)
# what the index knows of an item's file: its Sig as read, or (items indexed before sizes were recorded) the
# time it was added, in ns: such a file counts as changed only if modified after that
Known = Sig | int
MASS_DELETE_MIN = 10  # fewer deletions than this are never held by watch_max_delete (a small library's tidy-up)


@dataclass
class Changes:
    add: list[Item] = field(default_factory=list)  # new or changed files, settled, in scan order
    delete: list[str] = field(default_factory=list)  # ids whose file is gone
    modified: int = 0  # how many of `add` replace an id already indexed
    waiting: int = 0  # changed files not settled yet
    held: int = 0  # deletions held back by watch_max_delete
    settle_in: float = 0.0  # seconds until the soonest waiting file settles (0: none waits)
    pending: dict[str, Sig | None] = field(default_factory=dict)  # every change not yet served: id -> Sig (None: gone)


def changed(sig: Sig, known: Known | None) -> bool:
    if known is None:
        return True
    if isinstance(known, int):
        return sig[1] > known
    return tuple(sig) != tuple(known)


def plan(
    files: dict[str, tuple[str, Sig]],
    indexed: Mapping[str, Known | None],
    failed: dict[str, Sig],
    protected: list[str],
    now_ns: int,
    settings: IndexerSettings,
) -> Changes:
    """A scan (id -> (path, Sig)) against the index -> the next batch. `failed`: files skipped at this Sig
    (retried when it changes); `protected`: id prefixes of folders the scan could not list, whose items are
    not deleted (their files are not known to be gone)."""
    out = Changes()
    settle_ns = int(settings.watch_settle_s * 1e9)
    soonest = None
    for fid, (path, sig) in files.items():
        if not changed(sig, indexed.get(fid)) or failed.get(fid) == sig:
            continue
        out.pending[fid] = sig
        age = now_ns - sig[1]
        if age < settle_ns:
            out.waiting += 1
            wait = (settle_ns - age) / 1e9
            soonest = wait if soonest is None else min(soonest, wait)
            continue
        if len(out.add) < settings.watch_batch_max:
            out.add.append(Item(id=fid, uri=path))
            out.modified += fid in indexed
        else:
            out.waiting += 1
    gone = [i for i in indexed if i not in files and not any(i.startswith(p) for p in protected)]
    out.pending.update(dict.fromkeys(gone))
    room = settings.watch_batch_max - len(out.add)
    if len(gone) >= MASS_DELETE_MIN and len(gone) > settings.watch_max_delete * len(indexed):
        out.held = len(gone)
    else:
        out.delete = gone[: max(room, 0)]
        out.waiting += len(gone) - len(out.delete)
    out.settle_in = soonest or 0.0
    return out


class WatchMetrics:
    """The watcher's Prometheus metrics, in a registry of its own (served by serve())."""

    def __init__(self, index: str):
        self.registry = r = CollectorRegistry()
        self.index = index
        self.changes = Counter(
            "crossprobe_watch_changes",
            "files applied to the index (added, modified, deleted)",
            ["index", "change"],
            registry=r,
        )
        self.skipped = Counter(
            "crossprobe_watch_skipped",
            "changed files that could not be indexed, by reason",
            ["index", "reason"],
            registry=r,
        )
        self.pending = Gauge(
            "crossprobe_watch_pending_files", "changes seen by the last scan and not yet served", ["index"], registry=r
        )
        self.oldest = Gauge(
            "crossprobe_watch_oldest_pending_seconds", "age of the oldest change not yet served", ["index"], registry=r
        )
        self.lag = Histogram(
            "crossprobe_watch_lag_seconds",
            "a change's file mtime (or when a scan first saw it, "
            "if later by more than a scan interval) to its version's activation",
            ["index"],
            buckets=(0.5, 1, 2, 3, 5, 8, 13, 21, 34, 60, 120, 300, 900),
            registry=r,
        )
        self.batches = Counter(
            "crossprobe_watch_batches", "batches (versions) by outcome", ["index", "outcome"], registry=r
        )
        self.batch_seconds = Histogram(
            "crossprobe_watch_batch_seconds",
            "one batch: encode, write, activate",
            ["index"],
            buckets=(0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128),
            registry=r,
        )
        self.scan_seconds = Histogram(
            "crossprobe_watch_scan_seconds",
            "one scan of the folder",
            ["index"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.items = Gauge("crossprobe_watch_indexed_items", "items in the active version", ["index"], registry=r)
        self.events = Gauge(
            "crossprobe_watch_events_enabled", "1: inotify events wake the scans; 0: polling", ["index"], registry=r
        )
        self.folder_missing = Gauge(
            "crossprobe_watch_folder_missing", "1 while the watched folder is gone", ["index"], registry=r
        )
        self.held = Gauge(
            "crossprobe_watch_deletes_held", "deletions held back by watch_max_delete", ["index"], registry=r
        )
        self.last_batch = Gauge(
            "crossprobe_watch_last_batch_timestamp_seconds", "when the last batch went live", ["index"], registry=r
        )

    def serve(self, port: int, addr: str) -> None:
        start_http_server(port, addr, registry=self.registry)


class Watcher:
    """One index, one folder. step() is one scan and at most one batch; run() loops until `stop` is set."""

    def __init__(
        self,
        name: str,
        folder: Path,
        settings: IndexerSettings | None = None,
        ckpt: Path | None = None,
        model=None,
        bert=None,
        say: Callable[[str], None] = print,
    ):
        self.name, self.folder = name, Path(folder).resolve()
        self.settings = settings or IndexerSettings()
        self.ckpt, self.model, self.bert, self.say = ckpt, model, bert, say
        self.store = Store(self.settings, connect(self.settings))
        self.metrics = WatchMetrics(name)
        self.indexed: dict[str, Known | None] = {}  # None: a value _known cannot read (re-read when seen)
        self.version: str | None = None  # the active version `indexed` describes
        self.failed: dict[str, Sig] = {}  # id -> the Sig at which its file was skipped
        self.first_seen: dict[str, tuple[Sig | None, float]] = {}  # id -> (Sig, or None for a deletion; when)
        self.replaced: dict[str, float] = {}  # versions this watcher replaced -> when (monotonic)
        self.skips_seen: set[tuple[str, str]] = set()  # (id, reason) of scan skips already counted
        self.wake = threading.Event()
        self.events = False
        self.settle_in = 0.0  # the last plan's: seconds until a file seen changing may be read
        self._missing_said = self._held_said = False

    # ---- state -----------------------------------------------------------------------------------------
    def _load(self, version: str) -> None:
        """What the active version holds, from its items' metadata (one MGET per redis_batch ids)."""
        m = self.store.read_manifest(self.name, version) or {}
        src = m.get("source") or {}
        if src.get("images") != str(self.folder):
            raise ValueError(
                f"index {self.name!r} (version {version}) was built from {src or 'another source'}, not "
                f"from {self.folder}: watch a folder with the index built from it, or give a new name"
            )
        ids = self.store.read_ids(self.name, version)
        self.indexed = {i: k for i, k in zip(ids, map(_known, self.store.metadata(self.name, version, ids)))}
        self.version = version
        self.metrics.items.labels(self.name).set(len(ids))

    def _scan(self) -> tuple[dict[str, tuple[str, Sig]], list[str]] | None:
        t = time.perf_counter()
        if not self.folder.is_dir():
            self.metrics.folder_missing.labels(self.name).set(1)
            if not self._missing_said:
                self.say(f"watch {self.name}: folder {self.folder} is gone; nothing is deleted, waiting for it")
                self._missing_said = True
            return None
        self.metrics.folder_missing.labels(self.name).set(0)
        self._missing_said = False
        try:
            items, skips = scan_folder(self.folder, self.settings.follow_links)
        except FileNotFoundError:  # vanished during the walk
            return None
        files: dict[str, tuple[str, Sig]] = {}
        for it in items:
            try:
                st = Path(it.uri).stat()
            except OSError:  # removed since it was listed, or a dangling link: not there
                continue
            files[it.id] = (it.uri, (st.st_size, st.st_mtime_ns))
        protected = [s.id for s in skips if s.id.endswith("/") and s.reason in ("unreadable", "symlink_loop")]
        protected = ["" if p == "./" else p for p in protected]
        for s in skips:
            if (s.id, s.reason) not in self.skips_seen:
                self.skips_seen.add((s.id, s.reason))
                self.metrics.skipped.labels(self.name, s.reason).inc()
        self.metrics.scan_seconds.labels(self.name).observe(time.perf_counter() - t)
        return files, protected

    # ---- one step ----------------------------------------------------------------------------------------
    def step(self) -> Changes | None:
        """Scan once; apply at most one batch. -> the batch applied (None: nothing to do, or the folder is gone)."""
        active = self.store.active(self.name)
        if active is None:
            return self._first_build()
        if active != self.version:  # first step, or someone else activated a version (a rollback, a reindex)
            self._load(active)
        scanned = self._scan()
        if scanned is None:
            return None
        files, protected = scanned
        now = time.time()
        ch = plan(files, self.indexed, self.failed, protected, time.time_ns(), self.settings)
        self.settle_in = ch.settle_in
        self._note_pending(ch.pending, now)
        if ch.held and not self._held_said:
            self.say(
                f"watch {self.name}: {ch.held} of {len(self.indexed)} items' files are gone, more than "
                f"watch_max_delete {self.settings.watch_max_delete:.0%}; their deletions are held (is the folder "
                f"mounted?). Delete them with `crossprobe index delete`, or raise CROSSPROBE_INDEX_WATCH_MAX_DELETE"
            )
        self.metrics.held.labels(self.name).set(ch.held)
        self._held_said = bool(ch.held)
        if not ch.add and not ch.delete:
            return None
        self._apply(ch, files)
        return ch

    def _first_build(self) -> Changes | None:
        scanned = self._scan()
        if scanned is None or not scanned[0]:
            return None  # nothing to index yet
        self.say(f"watch {self.name}: no active version; building it from {self.folder}")
        res = kinds.build(
            self.name,
            images=self.folder,
            settings=self.settings,
            ckpt=self.ckpt,
            model=self.model,
            bert=self.bert,
            log=self.say,
        )
        self.say(res.summary())
        self._load(res.version)
        self.metrics.batches.labels(self.name, "ok").inc()
        return Changes()

    def _note_pending(self, pending: dict[str, Sig | None], now: float) -> None:
        """When each change not yet served was first seen (kept across scans while its Sig stays): the lag metric."""
        self.first_seen = {
            i: (s, self.first_seen[i][1] if i in self.first_seen and self.first_seen[i][0] == s else now)
            for i, s in pending.items()
        }
        self.metrics.pending.labels(self.name).set(len(pending))
        oldest = min((t for _, t in self.first_seen.values()), default=now)
        self.metrics.oldest.labels(self.name).set(now - oldest)

    def _apply(self, ch: Changes, files: dict[str, tuple[str, Sig]]) -> None:
        t = time.perf_counter()
        base = self.version
        try:
            res = kinds.sync(
                self.name,
                self.folder,
                ch.add,
                ch.delete,
                settings=self.settings,
                ckpt=self.ckpt,
                model=self.model,
                bert=self.bert,
                log=lambda m: log.info(m),
            )
        except Exception:
            self.metrics.batches.labels(self.name, "failed").inc()
            raise
        live = time.time()
        self.metrics.batches.labels(self.name, "ok").inc()
        self.metrics.batch_seconds.labels(self.name).observe(time.perf_counter() - t)
        self.metrics.last_batch.labels(self.name).set(live)
        skipped = {s["id"]: s["reason"] for s in json.loads(res.report.read_text())["skipped"]}
        done = [it.id for it in ch.add if it.id not in skipped]
        for i, reason in skipped.items():
            self.failed[i] = files[i][1]
            self.metrics.skipped.labels(self.name, reason).inc()
        for i, raw in zip(done, self.store.metadata(self.name, res.version, done)):
            self.indexed[i] = _known(raw)
            self.failed.pop(i, None)
        for i in ch.delete:
            self.indexed.pop(i, None)
            self.failed.pop(i, None)
        for i in done + ch.delete:
            sig, seen = self.first_seen.pop(i, (None, live))
            written = sig[1] / 1e9 if sig else seen
            slack = self.settings.watch_poll_s + self.settings.watch_settle_s + 1
            self.metrics.lag.labels(self.name).observe(live - (written if 0 <= seen - written <= slack else seen))
        self.metrics.changes.labels(self.name, "added").inc(len(done) - min(ch.modified, len(done)))
        self.metrics.changes.labels(self.name, "modified").inc(min(ch.modified, len(done)))
        self.metrics.changes.labels(self.name, "deleted").inc(len(ch.delete))
        self.metrics.items.labels(self.name).set(res.count)
        if base and base != res.version:
            self.replaced[base] = time.monotonic()
        self.version = res.version
        self.say(
            f"watch {self.name}: version {res.version} live, {res.count} items (+{len(done)} new or changed, "
            f"-{len(ch.delete)} deleted, {len(skipped)} skipped) in {time.perf_counter() - t:.1f}s"
        )
        self._collect()

    def _collect(self) -> None:
        """Remove the versions this watcher replaced more than watch_gc_grace_s ago, and half-built batches that
        a killed watcher left and this one did not resume."""
        now, active = time.monotonic(), self.store.active(self.name)
        drop = [v for v, t in self.replaced.items() if now - t >= self.settings.watch_gc_grace_s and v != active]
        for info in self.store.versions(self.name):  # complete + journal: killed between its end and its switch
            if (
                info.state in ("abandoned", "complete")
                and info.version != active
                and _spec_kind(self.store.version_dir(self.name, info.version)) == "sync"
            ):
                drop.append(info.version)
        for v in drop:
            try:
                with self.store.lock(self.name, v):
                    self.store.drop(self.name, v, by_ids=True)
            except RuntimeError:  # being built by another process after all
                continue
            self.replaced.pop(v, None)

    # ---- the loop ----------------------------------------------------------------------------------------
    def _observe(self) -> BaseObserver | None:
        """Start a watchdog observer that sets self.wake on any event under the folder; None where it cannot."""
        if not self.settings.watch_events:
            return None
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer

            class Wake(FileSystemEventHandler):
                def on_any_event(_, event) -> None:  # noqa: N805 - the watcher's self is closed over
                    self.wake.set()

            obs = Observer()
            obs.schedule(Wake(), str(self.folder), recursive=True)
            obs.start()
            return obs
        except (OSError, RuntimeError, ImportError) as e:  # inotify watch or instance limit, no inotify at all
            self.say(
                f"watch {self.name}: no file events ({type(e).__name__}: {e}); scanning every "
                f"{self.settings.watch_poll_s:g}s"
            )
            return None

    def run(self, stop: threading.Event | None = None) -> None:
        stop = stop or threading.Event()
        if self.settings.watch_metrics_port:
            self.metrics.serve(self.settings.watch_metrics_port, self.settings.watch_metrics_addr)
        obs = self._observe() if self.folder.is_dir() else None
        self.events = obs is not None
        self.metrics.events.labels(self.name).set(int(self.events))
        self.say(
            f"watching {self.folder} for index {self.name!r} ("
            f"{'inotify events' if self.events else f'a scan every {self.settings.watch_poll_s:g}s'})"
        )
        last_scan = 0.0
        try:
            while not stop.is_set():
                self.wake.clear()
                last_scan = time.monotonic()
                try:
                    ch = self.step()
                except (RuntimeError, OSError, RedisError) as e:  # Redis away, a version switched under a batch
                    self.say(
                        f"watch {self.name}: {type(e).__name__}: {e}; trying again in {self.settings.watch_poll_s:g}s"
                    )
                    stop.wait(self.settings.watch_poll_s)
                    continue
                if ch is not None:
                    continue  # more may have arrived while the batch ran
                if obs is None and self.folder.is_dir() and self.settings.watch_events:
                    obs = self._observe()  # the folder is back
                    self.events = obs is not None
                    self.metrics.events.labels(self.name).set(int(self.events))
                idle = self.settings.watch_rescan_s if self.events else self.settings.watch_poll_s
                timeout = min(idle, max(0.05, self.settle_in)) if self.settle_in else idle
                if self.wake.wait(max(0.0, timeout - (time.monotonic() - last_scan))):
                    stop.wait(0.2)  # let a burst of events (a copy of many files) arrive: one scan for all
        finally:
            if obs is not None:
                obs.stop()
                obs.join(timeout=5)


def _known(raw: bytes | str | None) -> Known | None:
    try:
        m = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    if not isinstance(m, dict):
        return None
    if isinstance(m.get("bytes"), int) and isinstance(m.get("mtime_ns"), int):
        return (m["bytes"], m["mtime_ns"])
    try:  # indexed before sizes were recorded: unchanged unless modified after it was added (UTC, no zone)
        return int(datetime.fromisoformat(m["added"]).replace(tzinfo=timezone.utc).timestamp() * 1e9)
    except (KeyError, TypeError, ValueError):
        return None


def _spec_kind(vdir: Path) -> str | None:
    try:
        return json.loads((vdir / "build" / "spec.json").read_text()).get("kind")
    except (OSError, ValueError):
        return None
