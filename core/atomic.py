"""The one atomic write: a file or a folder is written under a temporary name in the same folder and renamed into
place (os.replace), so a reader, or the next run after a kill, sees the old one or the new one whole, never half.

    atomic_write(path, "text" | b"bytes")        a file from a value
    durable_write(path, data)                   the same, fsynced before the rename (what the indexer writes)
    sync_tree(folder)                           every file and folder below it fsynced (before a version's manifest)
    with atomic_path(path) as tmp: write(tmp)   a file written by a library that takes a file name (torch.save,
                                                faiss.write_index, torch.onnx.export, safetensors...)
    with atomic_dir(path) as tmp: fill(tmp)     a folder, renamed whole (an existing one is swapped out)

The temporary name is hidden (.<name>.tmp) and fixed, so a run killed mid-write leaves one file that its next run
overwrites; unique=True adds a random part where several processes may write the same file at once (the ONNX
export of a checkpoint's graphs). A failed write removes its temporary file. The lowest layer (models) holds it:
the indexer and the service import it from here.
"""

from __future__ import annotations

import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def _temporary(path: Path, unique: bool) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp" if unique else f".{path.name}.tmp")


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


@contextmanager
def atomic_path(path: Path, *, fsync: bool = False, mode: int | None = None, unique: bool = False) -> Iterator[Path]:
    """Yield a temporary file name beside `path`; once the block has written it: fsync it (fsync), chmod it
    (mode), rename it to `path`. On an error the temporary file is removed and `path` is left as it was."""
    path = Path(path)
    tmp = _temporary(path, unique)
    try:
        yield tmp
        if fsync:
            _fsync(tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):  # lexists: a temporary symlink (a linked image) counts too
            tmp.unlink()


def atomic_write(path: Path, data: str | bytes, *, fsync: bool = False) -> None:
    """Write text (UTF-8) or bytes to `path` atomically."""
    with atomic_path(path, fsync=fsync) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)


def durable_write(path: Path, data: str | bytes) -> None:
    """atomic_write, fsynced before the rename, and the folder after it: after a power cut the file is the old one
    or the new one whole."""
    atomic_write(path, data, fsync=True)
    sync_dir(Path(path).parent)


def sync_dir(folder: Path) -> None:
    """fsync a folder: the names it holds (a rename into it, a new file) reach the disk, not only their data."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(folder: Path) -> None:
    """Every regular file below `folder` fsynced, then every folder, deepest first: what must be on the disk before
    a marker that says the tree is complete (a version's manifest) is written. Links are not followed."""
    folder = Path(folder)
    dirs = [folder]
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            continue
        if p.is_dir():
            dirs.append(p)
        elif p.is_file():
            _fsync(p)
    for d in sorted(dirs, key=lambda d: len(d.parts), reverse=True):
        sync_dir(d)


@contextmanager
def atomic_dir(path: Path, *, mode: int | None = None, unique: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder beside `path` (a leftover of a killed run is removed first); once the block
    has filled it: chmod it (mode) and rename it to `path`. An existing `path` is first renamed to <path>.old
    and removed after the swap, so `path` is never missing for longer than between two renames. On an error the
    temporary folder is removed and `path` is left as it was."""
    path = Path(path)
    tmp = _temporary(path, unique)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if mode is not None:
            os.chmod(tmp, mode)
        if path.exists():
            old = path.with_name(path.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
