"""`crossprobe index watch` (indexer/jobs/watch.py): the scan -> plan -> one version per batch loop.

plan() is checked on its own (settling, retries, protected folders, the mass-delete guard, the batch bound);
Watcher.step() against a real folder, Redis and model: a first build, then new, changed, moved and deleted
files, each batch one version that FAISS and Redis agree on, a half-written JPEG skipped and retried, a
vanished folder deleting nothing; and the CLI in a subprocess, SIGKILLed mid-batch and started again.
"""
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from PIL import Image

from crossprobe.indexer import open_index
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.indexer.jobs.watch import Watcher, changed, plan
from crossprobe.storage.store import Store
from crossprobe.service.server import free_port
from tests.indexer.conftest import make_images
from tests.indexer.jobs.test_incremental import _consistent

S = 1_000_000_000  # ns


def _plan(files, indexed, failed=None, protected=(), now=100 * S, **kw):
    s = IndexerSettings(watch_settle_s=1.0, **kw)
    return plan({i: (f"/x/{i}", sig) for i, sig in files.items()}, indexed, failed or {}, list(protected), now, s)


def test_plan_finds_new_changed_and_deleted_files_once_settled():
    indexed = {"a.jpg": (10, 50 * S), "b.jpg": (10, 50 * S), "c.jpg": (10, 50 * S)}
    ch = _plan({"a.jpg": (10, 50 * S), "b.jpg": (11, 60 * S), "d.jpg": (5, 70 * S), "e.jpg": (5, int(99.5 * S))},
               indexed)
    assert [it.id for it in ch.add] == ["b.jpg", "d.jpg"] and ch.modified == 1  # e.jpg: written 0.5 s ago
    assert ch.delete == ["c.jpg"] and ch.waiting == 1 and 0.4 < ch.settle_in <= 0.5
    assert ch.add[0].uri == "/x/b.jpg"


def test_plan_retries_a_skipped_file_only_when_it_changes_and_protects_unlisted_folders():
    failed = {"p.jpg": (3, 10 * S)}
    assert not _plan({"p.jpg": (3, 10 * S)}, {}, failed).add
    assert [it.id for it in _plan({"p.jpg": (9, 12 * S)}, {}, failed).add] == ["p.jpg"]
    indexed = {"locked/x.jpg": (1, S), "y.jpg": (1, S), "z.jpg": (1, S), "w.jpg": (1, S)}
    ch = _plan({"y.jpg": (1, S), "w.jpg": (1, S)}, indexed, protected=["locked/"])
    assert ch.delete == ["z.jpg"]  # locked/x.jpg's folder could not be listed: not known to be gone


def test_plan_holds_a_mass_delete_and_bounds_a_batch():
    indexed = {f"{i}.jpg": (1, S) for i in range(40)}
    ch = _plan({f"{i}.jpg": (1, S) for i in range(19)}, indexed, watch_max_delete=0.5)
    assert ch.held == 21 and not ch.delete  # 21 of 40 files gone: an unmounted disk, not a tidy-up
    ch = _plan({f"{i}.jpg": (1, S) for i in range(21)}, indexed, watch_max_delete=0.5)
    assert not ch.held and len(ch.delete) == 19
    assert _plan({}, {"a.jpg": (1, S)}).delete == ["a.jpg"]  # a small library may lose all of its few photos
    ch = _plan({f"n{i}.jpg": (1, S) for i in range(7)}, {"old.jpg": (1, S)}, watch_batch_max=5)
    assert len(ch.add) == 5 and not ch.delete and ch.waiting == 3  # 2 files + the deletion wait for the next batch


def test_changed_against_items_indexed_before_sizes_were_recorded():
    assert not changed((10, 5 * S), 6 * S) and changed((10, 7 * S), 6 * S) and changed((1, 1), None)


def _ids(settings, name) -> set[str]:
    rd = open_index(name, None, settings)
    return _consistent(rd)


def _served(settings, name) -> set[str]:
    """The active version's ids (checked consistent), or none before the watcher's first build."""
    try:
        return _ids(settings, name)
    except (ValueError, LookupError, FileNotFoundError):
        return set()


def _until(cond, alive, why=lambda: "", timeout: float = 120.0) -> None:
    """Wait for cond() while alive() holds; fail with why() when it stops holding or time runs out."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert alive() and time.monotonic() < deadline, why()
        time.sleep(0.1)


def test_watcher_follows_a_folder_one_version_per_batch(settings, ckpt, bert, tmp_path):
    folder = tmp_path / "photos"
    make_images(folder, 6)
    s = settings.model_copy(update={"watch_settle_s": 0.0, "watch_metrics_port": 0, "watch_gc_grace_s": 0.0})
    w = Watcher("w", folder, s, ckpt=ckpt, bert=bert, say=lambda *_: None)
    assert w.step() is not None  # no active version: the first step builds it
    first = _ids(s, "w")
    assert first == {p.relative_to(folder).as_posix() for p in folder.rglob("*.*")} and len(first) == 6
    assert w.step() is None  # nothing changed: no new version
    store = Store(s, open_index("w", None, s).store.r)
    v1 = store.active("w")

    new = make_images(tmp_path / "more", 3, seed=5, prefix="new")
    for p in new:
        os.replace(p, folder / p.name)
    (folder / "sub" / "img_004.tiff").rename(folder / "moved.tiff")  # a move: delete + add
    os.remove(folder / "img_002.webp")
    changed_file = folder / "img_000.jpg"
    Image.new("RGB", (64, 48), (200, 10, 10)).save(changed_file)
    os.utime(changed_file, ns=(time.time_ns(), time.time_ns()))
    ch = w.step()
    assert ch is not None and len(ch.add) == 5 and sorted(ch.delete) == ["img_002.webp", "sub/img_004.tiff"]
    assert ch.modified == 1
    now = _ids(s, "w")
    assert now == (first - {"img_002.webp", "sub/img_004.tiff"}) | {p.name for p in new} | {"moved.tiff"}
    v2 = store.active("w")
    assert v2 != v1 and w.step() is None
    meta = open_index("w", None, s).metadata(["img_000.jpg"])[0]
    st = changed_file.stat()
    assert (meta["width"], meta["bytes"], meta["mtime_ns"]) == (64, st.st_size, st.st_mtime_ns)
    # the version the batch replaced is gone after the grace period (0 here); the live one stays
    assert [v.version for v in store.versions("w")] == [v2]
    assert not list(store.r.scan_iter(match=store.key_base("w", v1) + "*"))  # dropped by its ids: no key left

    # a JPEG still being written: a truncated skip, counted; its old entry (none) unchanged; retried when complete
    whole = (tmp_path / "more" / "big.jpg")
    Image.new("RGB", (300, 200), (10, 200, 10)).save(whole, quality=95)
    data = whole.read_bytes()
    part = folder / "copying.jpg"
    part.write_bytes(data[: len(data) // 2])
    os.utime(part, ns=(time.time_ns() - S, time.time_ns() - S))
    ch = w.step()
    assert [it.id for it in ch.add] == ["copying.jpg"] and "copying.jpg" not in _ids(s, "w")
    assert w.metrics.skipped.labels("w", "truncated")._value.get() == 1
    assert w.step() is None  # not retried while it stays the same
    part.write_bytes(data)
    ch = w.step()
    assert [it.id for it in ch.add] == ["copying.jpg"] and "copying.jpg" in _ids(s, "w")
    assert w.metrics.changes.labels("w", "added")._value.get() == 5
    assert w.metrics.changes.labels("w", "modified")._value.get() == 1
    assert w.metrics.changes.labels("w", "deleted")._value.get() == 2

    # a version made by another job goes live (a reindex to move models, a delete): the watcher carries on from it
    from crossprobe.indexer import reindex

    res = reindex("w", settings=s, ckpt=ckpt, bert=bert, log=lambda *_: None)
    assert store.active("w") == res.version and w.step() is None and w.version == res.version
    os.remove(folder / "moved.tiff")
    assert w.step().delete == ["moved.tiff"] and "moved.tiff" not in _ids(s, "w")

    # the folder vanishes (an unmounted disk): nothing is deleted; back again: nothing changed
    before = _ids(s, "w")
    folder.rename(tmp_path / "away")
    assert w.step() is None and _ids(s, "w") == before
    assert w.metrics.folder_missing.labels("w")._value.get() == 1
    (tmp_path / "away").rename(folder)
    assert w.step() is None and _ids(s, "w") == before


def test_watch_refuses_an_index_built_from_another_source(settings, ckpt, bert, tmp_path, gallery):
    from crossprobe.indexer import build

    build("other", images=gallery, settings=settings, ckpt=ckpt, bert=bert, log=lambda *_: None)
    (tmp_path / "elsewhere").mkdir()
    w = Watcher("other", tmp_path / "elsewhere", settings, ckpt=ckpt, bert=bert, say=lambda *_: None)
    with pytest.raises(ValueError, match="was built from"):
        w.step()


def _metric(port: int, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_watch_cli_killed_mid_batch_resumes_with_nothing_lost_or_doubled(settings, env, ckpt, tmp_path):
    """The real command in a subprocess: new files, SIGKILL while it encodes them (a throttle makes the batch
    slow), start it again: every file once, FAISS and Redis in agreement, metrics served."""
    folder = tmp_path / "photos"
    make_images(folder, 4)
    port = free_port()
    e = dict(env, CROSSPROBE_CKPT=str(ckpt), CROSSPROBE_INDEX_WATCH_SETTLE_S="0.2", CROSSPROBE_INDEX_BATCH_SIZE="2",
             CROSSPROBE_INDEX_THROTTLE_S="0.5", CROSSPROBE_INDEX_WATCH_METRICS_PORT=str(port))
    cmd = [sys.executable, "-m", "crossprobe.cli", "index", "watch", "--name", "k", "--images", str(folder)]
    log = open(tmp_path / "watch.log", "ab")

    def start():
        return subprocess.Popen(cmd, env=e, stdout=log, stderr=subprocess.STDOUT)

    def wait_for(cond, proc, timeout=120):
        _until(cond, lambda: proc.poll() is None, lambda: (tmp_path / "watch.log").read_text()[-3000:], timeout)

    def ids():
        return _served(settings, "k")

    p = start()
    try:
        wait_for(lambda: len(ids()) == 4, p)
        make_images(tmp_path / "more", 8, seed=9, prefix="late")
        for f in (tmp_path / "more").rglob("*.*"):
            os.replace(f, folder / f.name)
        store = Store(settings, open_index("k", None, settings).store.r)
        wait_for(lambda: any(v.state == "building" for v in store.versions("k")), p)
        time.sleep(1.0)  # a batch or two committed, the rest not
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert len(ids()) == 4  # the half-done batch is not live
        p = start()
        want = {f.name for f in folder.glob("*.*")} | {f"sub/{f.name}" for f in (folder / "sub").glob("*.*")}
        wait_for(lambda: ids() == want, p)
        wait_for(lambda: _metric(port, "crossprobe_watch_changes_total") == 8, p, timeout=30)
        assert _metric(port, "crossprobe_watch_indexed_items") == 12
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    rd = open_index("k", None, settings)
    assert len(rd.ids) == len(set(rd.ids)) == 12


def test_the_loop_without_file_events_polls_and_stops_on_request(settings, ckpt, bert, tmp_path):
    """watch_events off (as where inotify's limits are reached): scans every watch_poll_s find a new photo and a
    deletion; setting `stop` ends run() between batches."""
    import threading

    folder = tmp_path / "photos"
    make_images(folder, 3)
    s = settings.model_copy(update={"watch_settle_s": 0.0, "watch_metrics_port": 0, "watch_events": False,
                                    "watch_poll_s": 0.2})
    w = Watcher("p", folder, s, ckpt=ckpt, bert=bert, say=lambda *_: None)
    stop = threading.Event()
    t = threading.Thread(target=w.run, args=(stop,), daemon=True)
    t.start()

    def until(cond):
        _until(cond, t.is_alive)

    def ids():
        return _served(s, "p")

    until(lambda: len(ids()) == 3)
    assert not w.events and w.metrics.events.labels("p")._value.get() == 0
    new = make_images(tmp_path / "more", 1, seed=4, prefix="late")[0]
    os.replace(new, folder / new.name)
    until(lambda: new.name in ids())
    os.remove(folder / "img_000.jpg")
    until(lambda: "img_000.jpg" not in ids())
    stop.set()
    t.join(timeout=30)
    assert not t.is_alive()
