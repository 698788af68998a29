"""Data that can be erased (docs/indexing.md, "Erasing a photo"): after `index delete` and `index gc` nothing of a
photo is left anywhere the index keeps data; `index drop` removes a whole index; ids with any character can be
deleted from a file or standard input.

The erase test runs on the embedded Redis (REDIS_URL unset), as a user without a Redis server would, so that the
index root holds everything: its redis.db snapshot too. It looks for the photo in every Redis key and value
(SCAN over the whole keyspace), in every file under the root (its id, uri and caption words as bytes, and its
vector's float32 bytes: a FAISS Flat index and vectors.npy store vectors raw), and in the keyword index by
search. The same looks find the photo before the delete: they can fail."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from crossprobe.indexer import add, build, open_index
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.storage import keyword
from crossprobe.storage.redis_conn import close_embedded, connect
from crossprobe.storage.store import Store
from crossprobe.cli import app
from tests.indexer.conftest import make_images

VICTIM = "Zoë, at the beach 2019.jpg"  # a comma, a space, a non-ASCII letter: --ids could not name it
CAPTION = "quetzalcoatlus kite festival"  # words no other item has


def _traces(r, root: Path, needles: list[bytes]) -> list[str]:
    """Where any needle appears: Redis keys and values (every key of the keyspace) and files under root."""
    found = []
    for key in r.scan_iter(count=1000):
        kind = r.type(key).decode()
        vals = [r.get(key)] if kind == "string" else list(r.smembers(key)) if kind == "set" else [b""]
        assert kind in ("string", "set"), f"a key of another type appeared: {key!r} ({kind})"
        found += [f"redis key {key!r}" for n in needles if n in key]
        found += [f"redis value of {key!r}" for n in needles for v in vals if v and n in v]
    for p in sorted(root.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            found += [f"file {p.relative_to(root)}" for n in needles if n in data]
    return found


def stored_docs(vdir: Path) -> int:
    """Documents a version's keyword index stores, deleted ones included (tantivy's meta.json: max_doc per segment;
    a deleted document stays in its segment, words and all, until a merge)."""
    return sum(seg["max_doc"] for seg in json.loads((vdir / keyword.DIR / "meta.json").read_text())["segments"])


def _keyword_hits(root: Path, name: str, words: str) -> list[str]:
    hits = []
    for vdir in (root / name).glob("v*"):
        if (vdir / keyword.DIR).is_dir():
            hits += [i for i, _ in keyword.KeywordIndex(vdir / keyword.DIR).search(keyword.parse(words), 50)]
    return hits


@pytest.fixture()
def embedded(tmp_path, models_dir, monkeypatch):
    """Settings and a CLI environment on the embedded Redis of a fresh index root (stopped at the end)."""
    for var in ("REDIS_URL", "CROSSPROBE_INDEX_ROOT", "CROSSPROBE_INDEX_EMBEDDED_DB", "CROSSPROBE_REDIS_CLUSTER"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "indexes"
    s = IndexerSettings(index_root=root, models_dir=models_dir, batch_size=4, threads=2, progress=False)
    env = {"CROSSPROBE_INDEX_ROOT": str(root), "CROSSPROBE_MODELS_DIR": str(models_dir),
           "CROSSPROBE_INDEX_BATCH_SIZE": "4", "CROSSPROBE_INDEX_THREADS": "2", "CROSSPROBE_INDEX_PROGRESS": "false"}
    yield s, env
    close_embedded()


def _manifest(path: Path, photos: list[Path], ids: list[str], captions: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "uri": str(p), "caption": c}, ensure_ascii=False) + "\n"
                            for i, p, c in zip(ids, photos, captions)), encoding="utf-8")
    return path


def test_delete_then_gc_leaves_nothing_of_a_photo(embedded, ckpt, bert, tmp_path):
    s, env = embedded
    quiet = dict(log=lambda *_: None)
    photos = make_images(tmp_path / "photos", 8, seed=11)
    ids = [f"p{i}.jpg" for i in range(7)] + [VICTIM]
    caps = [f"a photo number {i}" for i in range(7)] + [CAPTION]
    build("lib", manifest=_manifest(tmp_path / "m.jsonl", photos, ids, caps), settings=s, ckpt=ckpt, bert=bert, **quiet)
    more = make_images(tmp_path / "more", 2, seed=12, prefix="more")
    add("lib", manifest=_manifest(tmp_path / "more.jsonl", more, ["m0.jpg", "m1.jpg"], ["more", "more"]),
        settings=s, ckpt=ckpt, bert=bert, **quiet)  # a second version holding the photo: gc has it to remove
    rd = open_index("lib", None, s)
    vec = np.load(rd.store.version_dir("lib", rd.version) / "vectors.npy")[rd.ids.index(VICTIM)]
    victim_uri = str(photos[7])
    needles = [VICTIM.encode(), victim_uri.encode(), b"quetzalcoatlus", vec.astype(np.float32).tobytes()]
    r = connect(s)
    # values in redis.db uncompressed (LZF would hide a needle from the byte search; the server's own default is on)
    r.config_set("rdbcompression", "no")
    assert r.bgsave() and _wait_saved(r)
    before = _traces(r, s.index_root, needles)
    # the looks below can fail: before the delete they find the photo in Redis (both versions), the files (both
    # versions' ids, vectors, FAISS index and keyword index; redis.db) and by keyword search
    assert any(t.startswith("redis key") for t in before) and any(t.startswith("redis value") for t in before)
    assert {t for t in before if t.startswith("file")} >= {f"file lib/{v}/{f}" for v in _versions(s) for f in
                                                           ("ids", "vectors.npy", "index.faiss")} | {"file redis.db"}
    assert any("/text/" in t for t in before) and _keyword_hits(s.index_root, "lib", "quetzalcoatlus") == [VICTIM] * 2

    (tmp_path / "erase.txt").write_text(VICTIM + "\n", encoding="utf-8")
    runner = CliRunner()
    out = runner.invoke(app, ["index", "delete", "--name", "lib", "--ids-from", str(tmp_path / "erase.txt")], env=env)
    assert out.exit_code == 0, out.output
    assert VICTIM not in open_index("lib", None, s).ids and len(open_index("lib", None, s)) == 9
    # deleted, not yet erased: the versions before the delete still hold it (the docs say so)
    assert any(t.startswith("redis") for t in _traces(r, s.index_root, needles))
    out = runner.invoke(app, ["index", "gc", "lib"], env=env)
    assert out.exit_code == 0 and "2 version(s) removed" in out.output, out.output
    assert "embedded Redis snapshot" in out.output

    assert _traces(r, s.index_root, needles) == []
    assert _keyword_hits(s.index_root, "lib", "quetzalcoatlus") == []
    assert _keyword_hits(s.index_root, "lib", "number") != []  # the keyword index still answers for the others
    left = open_index("lib", None, s)
    assert sorted(left.ids) == sorted(ids[:7] + ["m0.jpg", "m1.jpg"])
    assert stored_docs(left.store.version_dir("lib", left.version)) == 9  # no deleted document kept in a segment
    assert not np.isclose(np.load(left.store.version_dir("lib", left.version) / "vectors.npy") @ vec, 1.0,
                          atol=1e-6).any()


def _versions(s) -> list[str]:
    return sorted(p.parent.name for p in (s.index_root / "lib").glob("v*/manifest.json"))


def _wait_saved(r, timeout_s: float = 60.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while r.info("persistence")["rdb_bgsave_in_progress"]:
        assert time.monotonic() < deadline, "BGSAVE did not finish"
        time.sleep(0.05)
    return r.info("persistence")["rdb_last_bgsave_status"] == "ok"


def test_drop_removes_every_key_and_file_and_keeps_the_other_index(settings, env, gallery, ckpt, bert, tmp_path):
    quiet = dict(log=lambda *_: None)
    build("gone", images=gallery, settings=settings, ckpt=ckpt, bert=bert, **quiet)
    v2 = add("gone", images=make_images(tmp_path / "more", 2, seed=3, prefix="more")[0].parent, settings=settings,
             ckpt=ckpt, bert=bert, **quiet).version
    build("kept", images=gallery, settings=settings, ckpt=ckpt, bert=bert, **quiet)
    st = Store(settings, connect(settings))
    prefix = f"{st.prefix}:gone:".encode()
    kept_keys = sorted(k for k in st.r.scan_iter(count=1000) if not k.startswith(prefix))
    assert any(k.startswith(prefix) for k in st.r.scan_iter(count=1000))
    runner = CliRunner()

    out = runner.invoke(app, ["index", "drop", "gone"], env=env, input="n\n")  # asked, and answered no
    assert out.exit_code == 1 and "for good?" in out.output and st.active("gone") == v2
    with st.lock("gone", v2):  # a job writing one of its versions: refused, nothing removed
        out = runner.invoke(app, ["index", "drop", "gone", "--yes"], env=env)
    assert out.exit_code == 1 and "being written by another process" in out.output and st.active("gone") == v2

    out = runner.invoke(app, ["index", "drop", "gone", "--yes"], env=env)
    assert out.exit_code == 0 and "dropped gone: 2 version(s)" in out.output, out.output
    assert [k for k in st.r.scan_iter(count=1000) if k.startswith(prefix)] == []
    assert sorted(st.r.scan_iter(count=1000)) == kept_keys  # the other index's keys, every one, untouched
    assert not (settings.index_root / "gone").exists() and st.names() == ["kept"]
    assert len(open_index("kept", None, settings)) == 12
    out = runner.invoke(app, ["index", "list"], env=env)
    assert "gone" not in out.output and "kept" in out.output
    out = runner.invoke(app, ["index", "drop", "gone", "--yes"], env=env)
    assert out.exit_code == 1 and "no index 'gone'" in out.output
    out = runner.invoke(app, ["index", "drop", "../x", "--yes"], env=env)
    assert out.exit_code == 2


ODD = ["a,b.jpg", " lead space.jpg", "Zoë ☃ 2019.jpg", "line\nbreak.jpg", "tab\there.jpg", "plain.jpg"]


def test_ids_with_any_character_are_deleted_from_a_file_or_stdin(settings, env, ckpt, bert, tmp_path):
    photos = make_images(tmp_path / "odd", len(ODD), seed=4)
    build("odd", manifest=_manifest(tmp_path / "odd.jsonl", photos, ODD, ["x"] * len(ODD)), settings=settings,
          ckpt=ckpt, bert=bert, log=lambda *_: None)
    runner = CliRunner()
    ids = lambda: set(open_index("odd", None, settings).ids)  # noqa: E731
    assert ids() == set(ODD)
    out = runner.invoke(app, ["index", "delete", "--name", "odd", "--ids", "a,b.jpg"], env=env)
    assert out.exit_code == 1 and "none of the 2 ids" in out.output  # --ids splits on commas: "a" and "b.jpg"
    # a file written on Windows (CRLF), with a blank line; one id per line, spaces and commas kept
    (tmp_path / "ids.txt").write_bytes("a,b.jpg\r\n\r\n lead space.jpg\r\nZoë ☃ 2019.jpg\r\nnot-there.jpg\r\n".encode())
    out = runner.invoke(app, ["index", "delete", "--name", "odd", "--ids-from", str(tmp_path / "ids.txt")], env=env)
    assert out.exit_code == 0, out.output
    assert ids() == {"line\nbreak.jpg", "tab\there.jpg", "plain.jpg"} and "'not-there.jpg'" in out.output
    # standard input, NUL-separated: an id holding a newline
    out = runner.invoke(app, ["index", "delete", "--name", "odd", "--ids-from", "-", "--null"], env=env,
                        input=b"line\nbreak.jpg\0tab\there.jpg\0")
    assert out.exit_code == 0, out.output
    assert ids() == {"plain.jpg"}
    out = runner.invoke(app, ["index", "delete", "--name", "odd", "--ids-from", "-"], env=env, input=b"\xff\xfe\n")
    assert out.exit_code == 2 and "not UTF-8" in out.output
    out = runner.invoke(app, ["index", "delete", "--name", "odd", "--ids-from", "-"], env=env, input=b"\n\n")
    assert out.exit_code == 2 and "no ids" in out.output
    out = runner.invoke(app, ["index", "delete", "--name", "odd"], env=env)
    assert out.exit_code == 2 and "--ids-from" in out.output
    assert ids() == {"plain.jpg"}


def test_a_photo_removed_from_a_watched_folder_leaves_no_trace(settings, ckpt, bert, tmp_path):
    """The watcher's part of erasing: the file deleted, its batch's version live, the replaced version dropped
    after the grace period (0 here); then nothing of the photo in Redis, in the index root, or in the watcher's
    own state (what it knows of the index, its failed files, its pending changes)."""
    from crossprobe.indexer.jobs.watch import Watcher

    folder = tmp_path / "photos"
    make_images(folder, 5)
    victim = folder / "Zoë, beach.jpg"
    (folder / "img_000.jpg").rename(victim)
    s = settings.model_copy(update={"watch_settle_s": 0.0, "watch_metrics_port": 0, "watch_gc_grace_s": 0.0})
    w = Watcher("w", folder, s, ckpt=ckpt, bert=bert, say=lambda *_: None)
    assert w.step() is not None and "Zoë, beach.jpg" in w.indexed
    r = connect(s)
    needles = ["Zoë, beach.jpg".encode(), str(victim).encode()]
    assert _traces(r, s.index_root, needles)  # found while indexed
    victim.unlink()
    ch = w.step()
    assert ch is not None and ch.delete == ["Zoë, beach.jpg"]
    assert _traces(r, s.index_root, needles) == []
    state = {**w.indexed, **w.failed, **w.first_seen}
    assert "Zoë, beach.jpg" not in state and len(w.indexed) == 4
