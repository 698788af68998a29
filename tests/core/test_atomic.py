"""The one atomic write (core/atomic.py): whole or not at all, nothing left behind, the old file kept on an error."""
import os
import stat

import pytest

from crossprobe.core import atomic


def _entries(folder):
    return sorted(p.name for p in folder.iterdir())


def test_a_value_replaces_the_file_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "a.json"
    atomic.atomic_write(p, "one")
    atomic.atomic_write(p, b"two")
    assert p.read_bytes() == b"two"
    assert _entries(tmp_path) == ["a.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    p = tmp_path / "index.faiss"
    p.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic.atomic_path(p) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("killed mid-write")
    assert p.read_bytes() == b"old"
    assert _entries(tmp_path) == ["index.faiss"]


def test_the_temporary_is_hidden_beside_the_file_fixed_or_unique(tmp_path):
    p = tmp_path / "000001.npz"
    seen = []
    for unique in (False, False, True, True):
        with atomic.atomic_path(p, unique=unique) as tmp:
            seen.append(tmp)
            tmp.write_bytes(b"x")
    assert all(t.parent == tmp_path and t.name.startswith(".000001.npz") and t.suffix == ".tmp" for t in seen)
    assert seen[0] == seen[1] and seen[2] != seen[3]  # fixed: a killed run's leftover is overwritten next time


def test_mode_and_fsync_are_applied_before_the_rename(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    p = tmp_path / "query_tower.onnx"
    with atomic.atomic_path(p, mode=0o640, unique=True) as tmp:
        tmp.write_bytes(b"graph")
    assert stat.S_IMODE(p.stat().st_mode) == 0o640 and not synced
    atomic.durable_write(tmp_path / "manifest.json", "{}")
    assert len(synced) == 2  # the file before its rename, then its folder (the new name)


def test_a_tree_is_synced_files_first_then_folders_deepest_first(tmp_path, monkeypatch):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_bytes(b"1")
    (tmp_path / "g").write_bytes(b"2")
    (tmp_path / "link").symlink_to(tmp_path / "g")
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd)))
    atomic.sync_tree(tmp_path)
    want = [tmp_path / "a" / "b" / "f", tmp_path / "g", tmp_path / "a" / "b", tmp_path / "a", tmp_path]
    assert synced == [str(p) for p in want]  # the link is not followed (its target is synced as itself)


def test_a_folder_is_swapped_whole(tmp_path):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "old.txt").write_text("old")
    leftover = tmp_path / ".ckpt.tmp"  # a killed run's
    leftover.mkdir()
    (leftover / "half").write_text("x")
    with atomic.atomic_dir(out, mode=0o755) as tmp:
        assert _entries(tmp) == []
        (tmp / "new.txt").write_text("new")
        assert (out / "old.txt").exists()  # readers still see the old folder
    assert _entries(out) == ["new.txt"] and stat.S_IMODE(out.stat().st_mode) == 0o755
    assert _entries(tmp_path) == ["ckpt"]


def test_a_failed_folder_keeps_the_old_one(tmp_path):
    out = tmp_path / "text"
    out.mkdir()
    (out / "seg").write_text("old")
    with pytest.raises(ValueError):
        with atomic.atomic_dir(out, unique=True) as tmp:
            (tmp / "seg").write_text("half")
            raise ValueError("bad input")
    assert (out / "seg").read_text() == "old" and _entries(tmp_path) == ["text"]
