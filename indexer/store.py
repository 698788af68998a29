"""Where index versions live: FAISS directories on disk, keys in Redis, the active switch.

Disk:   <root>/<name>/<version>/  index.faiss, ids (JSON list: row -> item id),
        vectors.npy (N, d) float32 (the source for incremental rebuilds: IVF-PQ
        cannot give exact vectors back), manifest.json (written last: a version
        without it is incomplete), report.json, build/ (the journal while building),
        .lock (flock held by the process building it).
Redis:  <prefix>:<name>:active                 -> version (the ONE switch: a single SET)
        <prefix>:<name>:versions               -> set of versions ever started (for gc)
        <prefix>:<name>:<version>:f:<item id>  -> codec value (P_v, b_bar, s_I)
        <prefix>:<name>:<version>:m:<item id>  -> metadata JSON
A reader resolves `active` once and then only touches its version's keys, so it
keeps working through an activation until that version is gc'ed.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import redis

from crossprobe.indexer.redis_conn import Settings

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # no glob characters: key patterns stay exact


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise ValueError(f"index name {name!r}: use letters, digits, '_', '.', '-' (max 64, starting alnum)")
    return name


def new_version() -> str:
    """Sortable by creation time, unique enough for one writer per index."""
    t = time.time()
    return time.strftime("v%Y%m%dT%H%M%S", time.gmtime(t)) + f"{int(t * 1e6) % 1_000_000:06d}"


def atomic_write(path: Path, data: bytes | str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass
class VersionInfo:
    name: str
    version: str
    state: str  # active | complete | building | abandoned
    count: int | None
    fingerprint: str | None
    factory: str | None
    created: str | None


class Store:
    def __init__(self, settings: Settings, r: redis.Redis):
        self.s, self.r = settings, r
        self.root = Path(settings.root)
        self.prefix = settings.key_prefix

    # ---- keys -------------------------------------------------------------
    def active_key(self, name: str) -> str:
        return f"{self.prefix}:{name}:active"

    def versions_key(self, name: str) -> str:
        return f"{self.prefix}:{name}:versions"

    def key_base(self, name: str, version: str) -> str:
        return f"{self.prefix}:{name}:{version}:"

    def feat_key(self, name: str, version: str, item_id: str) -> str:
        return f"{self.prefix}:{name}:{version}:f:{item_id}"

    def meta_key(self, name: str, version: str, item_id: str) -> str:
        return f"{self.prefix}:{name}:{version}:m:{item_id}"

    # ---- disk -------------------------------------------------------------
    def version_dir(self, name: str, version: str) -> Path:
        return self.root / check_name(name) / version

    def read_manifest(self, name: str, version: str) -> dict | None:
        p = self.version_dir(name, version) / "manifest.json"
        return json.loads(p.read_text()) if p.exists() else None

    def read_ids(self, name: str, version: str) -> list[str]:
        return json.loads((self.version_dir(name, version) / "ids").read_text())

    def read_vectors(self, name: str, version: str) -> np.ndarray:
        return np.load(self.version_dir(name, version) / "vectors.npy")

    def metadata(self, name: str, version: str, ids: list[str]) -> list[bytes | None]:
        """The metadata values of `ids` in one version (None where missing), MGET in chunks of redis_batch."""
        out: list[bytes | None] = []
        for i in range(0, len(ids), self.s.redis_batch):
            out += self.r.mget([self.meta_key(name, version, it) for it in ids[i:i + self.s.redis_batch]])
        return out

    @contextmanager
    def lock(self, name: str, version: str, wait: bool = False):
        """Held by the process building a version; released by the kernel even on SIGKILL."""
        d = self.version_dir(name, version)
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                raise RuntimeError(f"{name}/{version} is being built by another process") from None
            yield
        finally:
            os.close(fd)

    def _locked(self, name: str, version: str) -> bool:
        try:
            with self.lock(name, version):
                return False
        except RuntimeError:
            return True

    # ---- versions ---------------------------------------------------------
    def names(self) -> list[str]:
        disk = {p.name for p in self.root.iterdir() if p.is_dir() and NAME_RE.match(p.name)} if self.root.is_dir() else set()
        return sorted(disk)

    def active(self, name: str) -> str | None:
        v = self.r.get(self.active_key(check_name(name)))
        return v.decode() if v else None

    def versions(self, name: str) -> list[VersionInfo]:
        d = self.root / check_name(name)
        on_disk = {p.name for p in d.iterdir() if p.is_dir() and p.name.startswith("v")} if d.is_dir() else set()
        in_redis = {v.decode() for v in self.r.smembers(self.versions_key(name))}
        active = self.active(name)
        out = []
        for v in sorted(on_disk | in_redis):
            m = self.read_manifest(name, v) if v in on_disk else None
            if v == active:
                state = "active"
            elif m is not None:
                state = "complete"
            else:
                state = "building" if v in on_disk and self._locked(name, v) else "abandoned"
            out.append(VersionInfo(name, v, state, m and m["count"], m and m["fingerprint"], m and m["factory"],
                                   m and m["created"]))
        return out

    def activate(self, name: str, version: str, expect: str | None = None, check_expect: bool = False) -> None:
        """Point `active` at a complete version with one SET. With check_expect, only if
        `active` still equals `expect` (WATCH/MULTI): an add/delete built on an old
        version must not silently undo a change that was activated meanwhile."""
        m = self.read_manifest(name, version)
        if m is None:
            raise ValueError(f"{name}/{version} is not a complete version (no manifest.json)")
        ids = self.read_ids(name, version)
        if ids and self.r.exists(self.feat_key(name, version, ids[0]), self.feat_key(name, version, ids[-1])) != 2:
            raise ValueError(f"{name}/{version}: its Redis values are missing (gc'ed or another Redis?)")
        key = self.active_key(name)
        if not check_expect:
            self.r.set(key, version)
            return
        with self.r.pipeline(transaction=True) as p:
            try:
                p.watch(key)
                cur = p.get(key)
                cur = cur.decode() if cur else None
                if cur != expect:
                    raise RuntimeError(f"{name}: active version changed from {expect} to {cur} during this job; run it again")
                p.multi()
                p.set(key, version)
                p.execute()
            except redis.WatchError:
                raise RuntimeError(f"{name}: active version changed during this job; run it again") from None

    def drop(self, name: str, version: str) -> int:
        """Delete one version's Redis keys (SCAN + UNLINK, pipelined) and its directory."""
        n = 0
        batch: list[bytes] = []
        for k in self.r.scan_iter(match=self.key_base(name, version) + "*", count=self.s.redis_batch):
            batch.append(k)
            if len(batch) >= self.s.redis_batch:
                n += self.r.unlink(*batch)
                batch = []
        if batch:
            n += self.r.unlink(*batch)
        from crossprobe.indexer import ann  # a version's Milvus collection, if any, goes with it (before its manifest)

        ann.drop_version(self.s, name, version, self.read_manifest(name, version))
        self.r.srem(self.versions_key(name), version)
        shutil.rmtree(self.version_dir(name, version), ignore_errors=True)
        return n

    def gc(self, name: str) -> list[tuple[str, int]]:
        """Remove every version except the active one and builds still running."""
        active = self.active(name)
        removed = []
        for info in self.versions(name):
            if info.version == active or info.state == "building":
                # a journal whose removal a kill cut short (journal.py: Journal.remove) is garbage even here
                shutil.rmtree(self.version_dir(name, info.version) / "build.removed", ignore_errors=True)
                continue
            try:
                with self.lock(name, info.version):  # a build resumed since versions() was read keeps its version
                    removed.append((info.version, self.drop(name, info.version)))
            except RuntimeError:
                continue
        from crossprobe.indexer import ann  # collections whose version the store no longer knows (Milvus only)

        ann.gc_orphans(self.s, name, {info.version for info in self.versions(name)})
        return removed
