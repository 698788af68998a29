"""`crossprobe index backup` / `index restore`: one index version, its files and its Redis values, as one archive.

A version is two halves, useful only together: its folder (storage/layout.py) and its Redis values (store.py's
KeyLayout). A copy of the index root and a Redis snapshot taken at two moments may hold two different versions
while `index watch` switches them; this module copies exactly one. A complete version is immutable, so a copy taken
at any moment is the same copy; what could break it is its removal half-way (gc, a watcher dropping the version it
replaced). So backup reads `active` once and holds that version's Store.lock until the archive is written: every
remover (Store.gc, Store.drop_index, the watcher's collection) takes that lock first and skips a version it cannot
lock, while a watcher keeps building and activating new versions.

The archive: one uncompressed tar (the vectors, FAISS index and quantized features barely compress), FORMAT 1:

    files/<path>        every file of the version folder (ids, vectors.npy, index.faiss, text/..., report.json,
                        manifest.json), less its .lock and any journal (build/)
    redis/values.bin    per item, in the order of the ids file: its feature value, then its metadata value, each
                        a little-endian u32 length and the bytes (NONE: no value; a two-tower-only model's items
                        have no feature value). Plain values read with MGET, not DUMP: DUMP's payload is tied to
                        the Redis release, and keys are not stored (restore derives them from the ids and the
                        target's prefix and name, so --name and another key prefix just work)
    backup.json         the header, last: format, the crossprobe release, index name and version, the manifest,
                        counts, and the size and sha256 of every member above
    backup.json.sha256  the header's own sha256 (a flipped byte in the header is caught too)

Written to a temporary name beside the destination, fsynced, then renamed (core.atomic): a backup killed half-way
leaves no archive that looks whole. restore() reads the whole archive and checks every checksum before it writes
anything; then, under the version's lock, it adds the version to the index's versions set (gc finds the keys of a
killed restore), writes the Redis values, the files, manifest.json last (the indexer's own rule: a version without
it is incomplete, readers and `activate` refuse it), and sets `active` LAST: a reader sees the version before the
restore or the restored one whole. A failure on the way removes what it wrote; `active` is left as it was.

Only FAISS versions: a Milvus version's vectors live in its Milvus collection, which is Milvus's to back up.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import struct
import tarfile
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import IO, Callable

from tqdm import tqdm

from crossprobe.core import release
from crossprobe.core.atomic import atomic_path, durable_write, sync_dir, sync_tree
from crossprobe.storage import layout
from crossprobe.storage.codec import Layout
from crossprobe.storage.store import KeyLayout, Store, check_name, check_version

FORMAT = 1  # the archive's layout (this docstring); a later one is refused by name
KIND = "crossprobe-index-backup"
HEADER = "backup.json"
HEADER_SUM = "backup.json.sha256"
VALUES = "redis/values.bin"
FILES = "files/"
NONE = 0xFFFFFFFF  # the length that marks "no value"
CHUNK = 1 << 20
SKIPPED = (".lock", "build", "build.removed")  # the version's flock and a journal: a job's state, not the version's


log = logging.getLogger("crossprobe.storage")


class BackupError(RuntimeError):
    """A backup or restore that cannot be done; the message says why and what to do. Nothing was written."""


@dataclass(frozen=True)
class BackupSummary:
    name: str
    version: str
    path: Path
    items: int
    files: int
    bytes: int  # the archive's size
    seconds: float

    def line(self) -> str:
        return (
            f"backed up {self.name}/{self.version}: {self.items} items, {self.files} files -> {self.path} "
            f"({self.bytes / 1e6:.1f} MB) in {self.seconds:.1f}s"
        )


@dataclass(frozen=True)
class RestoreSummary:
    name: str
    version: str
    source: str  # the index name the archive was taken from
    items: int
    files: int
    seconds: float
    active: bool  # set as the index's active version
    previous: str | None  # the version that was active before (kept; `crossprobe index gc` removes it)

    def line(self) -> str:
        what = f"{self.name}/{self.version}" + (f" (from {self.source})" if self.source != self.name else "")
        state = "now active" if self.active else "not activated"
        before = f"; {self.previous} was active and is kept until `crossprobe index gc`" if self.previous else ""
        return f"restored {what}: {self.items} items, {self.files} files in {self.seconds:.1f}s, {state}{before}"


class _Hashing:
    """A file object that hashes what is read through it (tarfile.addfile reads a member's data with read(n))."""

    def __init__(self, f: IO[bytes], bar: tqdm | None = None):
        self.f, self.h, self.bar = f, hashlib.sha256(), bar

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n)
        self.h.update(b)
        if self.bar is not None:
            self.bar.update(len(b))
        return b


def _bar(total: int, desc: str, enabled: bool, unit: str = "B") -> tqdm:
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", disable=not enabled, dynamic_ncols=True)


# ---- backup ------------------------------------------------------------------------------------------------------


def _hold_active(store: Store, name: str, timeout_s: float) -> tuple[str, ExitStack]:
    """The active version, with its lock held (the ExitStack releases it). The lock of a complete version is held
    for a moment by the job that activated it (it removes its journal under it) and by a remover dropping it after
    another version went live; so wait for it, reading `active` again each time: once it is held here, nothing
    removes the version until the backup is done."""
    deadline = time.monotonic() + timeout_s
    while True:
        version = store.active(name)
        if version is None:
            raise BackupError(f"index {name!r} has no active version (nothing in Redis at {store.active_key(name)})")
        held = ExitStack()
        try:
            held.enter_context(store.lock(name, version))
        except RuntimeError:
            if time.monotonic() > deadline:
                raise BackupError(
                    f"{name}/{version} stayed locked by another process for {timeout_s:.0f}s (a job or a gc "
                    "removing it?); try again once it is done"
                ) from None
            time.sleep(0.05)
            continue
        if store.read_manifest(name, version) is not None:
            return version, held
        # removed between the read of `active` and the lock (Store.lock made its folder again, empty): tidy up
        vdir = store.version_dir(name, version)
        if [p.name for p in vdir.iterdir()] == [".lock"]:
            shutil.rmtree(vdir, ignore_errors=True)
        held.close()
        if store.active(name) == version:
            raise BackupError(f"{name}/{version} is active but has no manifest.json under {vdir}: its folder is gone")


def _files(vdir: Path) -> list[tuple[str, Path]]:
    """The version's files, relative POSIX paths sorted (links are not followed: a version holds none)."""
    out = []
    for p in sorted(vdir.rglob("*")):
        rel = p.relative_to(vdir)
        if rel.parts[0] in SKIPPED or p.is_symlink() or not p.is_file():
            continue
        out.append((rel.as_posix(), p))
    return out


def _record(out: IO[bytes], value: bytes | None) -> None:
    if value is None:
        out.write(struct.pack("<I", NONE))
    else:
        out.write(struct.pack("<I", len(value)))
        out.write(value)


def backup(
    store: Store,
    name: str,
    dest: Path,
    *,
    progress: bool = False,
    lock_timeout_s: float = 60.0,
    after_member: Callable[[str], None] | None = None,
) -> BackupSummary:
    """Write the active version of `name` (its files and Redis values) into the archive `dest`, atomically.
    after_member(member name) is called after each member is written while the version is held (the tests run a
    watcher there, so that versions really are activated and collected in the middle of a backup)."""
    t0 = time.perf_counter()
    check_name(name)
    dest = Path(dest)
    if dest.is_dir():
        raise BackupError(f"{dest} is a folder; give the archive's file name (e.g. {dest / (name + '.tar')})")
    if not dest.parent.is_dir():
        raise BackupError(f"{dest.parent} does not exist: make it first, or write the archive elsewhere")
    version, held = _hold_active(store, name, lock_timeout_s)
    with held:
        vdir = store.version_dir(name, version)
        manifest_bytes = (vdir / layout.MANIFEST).read_bytes()
        manifest = json.loads(manifest_bytes)
        backend = (manifest.get("ann") or {}).get("backend", "faiss")
        if backend != "faiss":
            raise BackupError(
                f"{name}/{version} keeps its vectors in {backend} (its manifest's ann backend): `index backup` covers "
                f"FAISS versions; back up the {backend} collection with {backend}'s own tools, or reindex it with "
                "CROSSPROBE_ANN_BACKEND=faiss to back it up here"
            )
        ids = store.read_ids(name, version)
        if len(ids) != manifest["count"]:
            raise BackupError(
                f"{name}/{version}: its ids file holds {len(ids)} items, its manifest {manifest['count']}"
            )
        keys = KeyLayout.of(store.prefix, manifest)
        features = not Layout.from_header(manifest["layout"]).empty
        files = _files(vdir)
        members: dict[str, dict] = {}
        with atomic_path(dest, fsync=True) as tmp, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            with _bar(sum(p.stat().st_size for _, p in files), f"backup {name}: files", progress) as bar:
                for rel, p in files:
                    member = FILES + rel
                    with open(p, "rb") as f:
                        src = _Hashing(f, bar)
                        size = os.fstat(f.fileno()).st_size
                        _add(tar, member, size, src)
                    members[member] = {"size": size, "sha256": src.h.hexdigest()}
                    if after_member:
                        after_member(member)
            counts = _add_values(store, tar, keys, ids, features, members, dest.parent, progress, f"backup {name}")
            if after_member:
                after_member(VALUES)
            header = {
                "kind": KIND,
                "format": FORMAT,
                "crossprobe": release.version(),
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "name": name,
                "version": version,
                "key_prefix": store.prefix,  # where the values were read (informational: restore uses its own)
                "manifest": manifest,
                "counts": {"items": len(ids), "files": len(files), **counts},
                "members": members,
            }
            data = json.dumps(header, indent=1, ensure_ascii=False).encode()
            for member, blob in ((HEADER, data), (HEADER_SUM, hashlib.sha256(data).hexdigest().encode())):
                _add(tar, member, len(blob), io.BytesIO(blob))
        sync_dir(dest.parent)
    return BackupSummary(name, version, dest, len(ids), len(files), dest.stat().st_size, time.perf_counter() - t0)


def _add(tar: tarfile.TarFile, member: str, size: int, src) -> None:
    info = tarfile.TarInfo(member)
    info.size, info.mode, info.mtime = size, 0o644, int(time.time())
    tar.addfile(info, src)


def _add_values(
    store: Store,
    tar: tarfile.TarFile,
    keys: KeyLayout,
    ids: list[str],
    features: bool,
    members: dict[str, dict],
    spill: Path,
    progress: bool,
    desc: str,
) -> dict[str, int]:
    """The version's Redis values -> VALUES (through an unnamed temporary file: a tar member's size comes first).
    One MGET per redis_batch items (on a cluster one per slot, pipelined per node: Store.mget). MGET answers
    nil for a key that is missing or is not a plain string value: either way, not a value of this version.
    spill: the folder of that temporary file (the archive's: the space the archive needs is there anyway)."""
    batch = store.settings.redis_batch
    n_feat = n_meta = 0
    with tempfile.TemporaryFile(dir=spill) as out, _bar(len(ids), f"{desc}: Redis", progress, "item") as bar:
        for i in range(0, len(ids), batch):
            part = ids[i : i + batch]
            vals = store.mget(([keys.feat(it) for it in part] if features else []) + [keys.meta(it) for it in part])
            feats, metas = (vals[: len(part)], vals[len(part) :]) if features else ([None] * len(part), vals)
            missing = [it for it, f, m in zip(part, feats, metas) if m is None or (features and f is None)]
            if missing:
                raise BackupError(
                    f"{keys.name}/{keys.version}: the Redis values of {len(missing)} items are missing (e.g. "
                    f"{missing[0]!r}): is this the Redis the index was built in?"
                )
            for f, m in zip(feats, metas):
                _record(out, f)
                _record(out, m)
            n_feat += sum(f is not None for f in feats)
            n_meta += len(metas)
            bar.update(len(part))
        size = out.tell()
        out.seek(0)
        src = _Hashing(out)
        _add(tar, VALUES, size, src)
    members[VALUES] = {"size": size, "sha256": src.h.hexdigest()}
    return {"features": n_feat, "metadata": n_meta}


# ---- restore -----------------------------------------------------------------------------------------------------


def _damaged(archive: Path, why: str) -> BackupError:
    return BackupError(f"{archive} is not a whole crossprobe backup ({why}); nothing was restored")


def verify(archive: Path, progress: bool = False) -> dict:
    """Read the whole archive and check it: its header's own checksum, then the size and sha256 of every member
    it lists, and that it holds nothing else -> the header. A truncated or corrupt archive: BackupError."""
    archive = Path(archive)
    if not archive.is_file():
        raise BackupError(f"no archive at {archive}")
    try:
        with tarfile.open(archive, "r:") as tar:
            found = {m.name: m for m in tar.getmembers()}
            if HEADER not in found or HEADER_SUM not in found:
                raise _damaged(archive, f"no {HEADER}: truncated, or not a backup")
            data = _member(tar, found[HEADER]).read()
            if hashlib.sha256(data).hexdigest().encode() != _member(tar, found[HEADER_SUM]).read().strip():
                raise _damaged(archive, f"{HEADER} does not match its checksum")
            header = json.loads(data)
            if header.get("kind") != KIND:
                raise _damaged(archive, "not a crossprobe index backup")
            if not isinstance(header.get("format"), int) or header["format"] > FORMAT:
                raise BackupError(
                    f"{archive} is backup format {header.get('format')!r} (crossprobe {header.get('crossprobe')}); "
                    f"crossprobe {release.version()} reads format {FORMAT}: restore it with that release or a later one"
                )
            listed = header["members"]
            manifest = header["manifest"]
            if (header["name"], header["version"]) != (manifest["name"], manifest["version"]):
                raise _damaged(archive, "its header and its manifest name different versions")
            extra = set(found) - set(listed) - {HEADER, HEADER_SUM}
            if extra:
                raise _damaged(archive, f"members the header does not list: {sorted(extra)[:3]}")
            with _bar(sum(m["size"] for m in listed.values()), f"verify {archive.name}", progress) as bar:
                for name, want in listed.items():
                    if name not in found:
                        raise _damaged(archive, f"{name} is missing: truncated?")
                    src = _Hashing(_member(tar, found[name]), bar)
                    size = _drain(src)
                    if size != want["size"] or src.h.hexdigest() != want["sha256"]:
                        raise _damaged(archive, f"{name} does not match its checksum")
            # the halves agree: the folder's manifest is the header's, its ids file holds the manifest's count
            if FILES + layout.MANIFEST not in listed or FILES + layout.IDS not in listed or VALUES not in listed:
                raise _damaged(archive, "it lacks the version's manifest.json, ids or Redis values")
            if json.loads(_member(tar, found[FILES + layout.MANIFEST]).read()) != manifest:
                raise _damaged(archive, "its header and its manifest.json differ")
            if len(json.loads(_member(tar, found[FILES + layout.IDS]).read())) != manifest["count"]:
                raise _damaged(archive, "its ids file and its manifest count different items")
    except (tarfile.TarError, EOFError) as e:
        raise _damaged(archive, f"{type(e).__name__}: {e}") from None
    except (ValueError, KeyError, TypeError) as e:  # a header that parses but lacks what it must hold
        raise _damaged(archive, f"its header cannot be read: {type(e).__name__}: {e}") from None
    return header


def _drain(src: _Hashing) -> int:
    """Read (and so hash) a member to its end -> its size."""
    size = 0
    while b := src.read(CHUNK):
        size += len(b)
    return size


def _target_path(vdir: Path, rel: str) -> Path:
    """A member's path inside the version folder; an archive naming a path out of it is refused (never written)."""
    p = PurePosixPath(rel)
    if p.is_absolute() or not p.parts or any(part in ("", ".", "..") for part in p.parts) or p.parts[0] in SKIPPED:
        raise BackupError(f"the archive names a file {rel!r} outside a version folder; nothing was restored")
    return vdir.joinpath(*p.parts)


def restore(
    store: Store,
    archive: Path,
    name: str | None = None,
    *,
    force: bool = False,
    activate: bool = True,
    progress: bool = False,
) -> RestoreSummary:
    """Restore the archive's version into `store` as index `name` (default: the name it was backed up from) and,
    with `activate`, make it the active version. The index's other versions stay (gc removes them). Refused
    before anything is written: a damaged archive, a target that already has the version active or being written,
    or complete unless `force` (which replaces that inactive copy)."""
    t0 = time.perf_counter()
    archive = Path(archive)
    header = verify(archive, progress)
    source, version = check_name(header["name"]), check_version(header["version"])
    target = check_name(name or source)
    manifest = dict(header["manifest"])
    layout.check_format(manifest)  # a later release's version: this one could not serve it
    keys = KeyLayout(store.prefix, target, version, int(manifest.get("keys", {}).get("buckets", 0)))
    manifest["name"] = target
    manifest["keys"] = keys.manifest(store.active_key(target))  # the target's prefix and name
    files = [m for m in header["members"] if m.startswith(FILES)]
    vdir = store.version_dir(target, version)
    for member in files:
        _target_path(vdir, member[len(FILES) :])
    previous = store.active(target)
    there = next((v for v in store.versions(target) if v.version == version), None)
    if there is not None:
        if there.state == "active":
            raise BackupError(
                f"{target}/{version} is already the active version of {target}; nothing was restored (to have a "
                "second copy, restore it under another --name)"
            )
        if there.state == "building":
            raise BackupError(f"{target}/{version} is being written by another process; nothing was restored")
        if there.state == "complete" and not force:
            raise BackupError(
                f"{target} already has version {version} (inactive); `crossprobe index activate {target} {version}` "
                "serves it, or --force replaces it with the archive's"
            )
        try:  # abandoned (a killed restore or job), or complete and --force: removed under its lock first
            with store.lock(target, version):
                store.drop(target, version)
        except RuntimeError as e:
            raise BackupError(f"{target}/{version}: {e}; nothing was restored") from None
    features = not Layout.from_header(manifest["layout"]).empty
    with store.lock(target, version):
        try:
            store.r.sadd(store.versions_key(target), version)  # before any key: gc finds a killed restore's keys
            _restore_values(store, archive, keys, header, features, progress)
            _restore_files(archive, vdir, files, header, progress)
            sync_tree(vdir)
            durable_write(vdir / layout.MANIFEST, json.dumps(manifest, indent=2))  # last: the version is complete
            if activate:
                store.activate(target, version)
        except BaseException:
            _undo(store, target, version, vdir)
            raise
    took, before = time.perf_counter() - t0, previous if activate else None
    return RestoreSummary(target, version, source, manifest["count"], len(files), took, activate, before)


def _undo(store: Store, name: str, version: str, vdir: Path) -> None:
    """A restore that failed half-way: its values and folder removed (under its lock, still held), so nothing
    of it is left; where that fails too (Redis gone) the version is left incomplete: `index gc` removes it."""
    (vdir / layout.MANIFEST).unlink(missing_ok=True)
    try:
        store.drop(name, version)
    except Exception as e:  # noqa: BLE001 - the restore's own error is the one to report; this one is logged
        log.warning(
            "%s/%s: the failed restore's leftovers were not removed (%s); `crossprobe index gc %s` removes them",
            name,
            version,
            e,
            name,
        )


def _member(tar: tarfile.TarFile, m: str | tarfile.TarInfo) -> IO[bytes]:
    f = tar.extractfile(m)
    if f is None:  # a link or a folder where a file must be: read as damage (verify catches TarError)
        raise tarfile.ReadError(f"{m if isinstance(m, str) else m.name} is not a file")
    return f


def _check(archive: Path, member: str, src: _Hashing, header: dict) -> None:
    """The archive was read again to write it: it must still be what verify() checked."""
    if src.h.hexdigest() != header["members"][member]["sha256"]:
        raise _damaged(archive, f"{member} changed while it was restored")


def _restore_values(store: Store, archive: Path, keys: KeyLayout, header: dict, features: bool, progress: bool) -> None:
    """VALUES -> SETs under the target's key names, pipelined redis_batch items at a time."""
    with tarfile.open(archive, "r:") as tar:
        ids = json.loads(_member(tar, FILES + layout.IDS).read())
        src = _Hashing(_member(tar, VALUES))

        def value() -> bytes | None:
            head = src.read(4)
            n = struct.unpack("<I", head)[0] if len(head) == 4 else None
            data = b"" if n in (None, NONE) else src.read(n)
            if n is None or (n != NONE and len(data) != n):
                raise _damaged(archive, f"{VALUES} ends before the ids file's last item")
            return None if n == NONE else data

        batch = store.settings.redis_batch
        with _bar(len(ids), "restore: Redis", progress, "item") as bar:
            for i in range(0, len(ids), batch):
                part = ids[i : i + batch]
                with store.r.pipeline(transaction=False) as p:
                    for it in part:
                        f, m = value(), value()
                        if features and f is not None:
                            p.set(keys.feat(it), f)
                        if m is None:
                            raise _damaged(archive, f"item {it!r} has no metadata value")
                        p.set(keys.meta(it), m)
                    p.execute()
                bar.update(len(part))
        if src.read(1):
            raise _damaged(archive, f"{VALUES} holds more values than the ids file has items")
        _check(archive, VALUES, src, header)


def _restore_files(archive: Path, vdir: Path, files: list[str], header: dict, progress: bool) -> None:
    """files/* -> the version folder, less manifest.json (restore() writes it last)."""
    total = sum(header["members"][m]["size"] for m in files)
    with tarfile.open(archive, "r:") as tar, _bar(total, "restore: files", progress) as bar:
        for member in files:
            rel = member[len(FILES) :]
            if rel == layout.MANIFEST:
                continue
            path = _target_path(vdir, rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            src = _Hashing(_member(tar, member), bar)
            with open(path, "wb") as out:
                shutil.copyfileobj(src, out, CHUNK)  # type: ignore[arg-type]
            _check(archive, member, src, header)
