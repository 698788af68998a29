"""Where index versions live: FAISS directories on disk, keys in Redis, the active switch.

Disk:   <root>/<name>/<version>/  index.faiss, ids (JSON list: row -> item id),
        vectors.npy (N, d) float32 (the source for incremental rebuilds: IVF-PQ
        cannot give exact vectors back), manifest.json (written last: a version
        without it is incomplete), report.json, build/ (the journal while building),
        .lock (flock held by the process building it).
Redis:  <prefix>:<name>:active                 -> version (the ONE switch: a single SET)
        <prefix>:<name>:versions               -> set of versions ever started (for gc)
        <prefix>:<name>:<version>:f:{<name>:<bucket>}:<item id>  -> codec value (P_v, b_bar, s_I)
        <prefix>:<name>:<version>:m:{<name>:<bucket>}:<item id>  -> metadata JSON
A reader resolves `active` once and then only touches its version's keys, so it
keeps working through an activation until that version is gc'ed.

The {<name>:<bucket>} part is a Redis Cluster hash tag (bucket = crc32(item id) % buckets, the
version's manifest records `buckets`): a shortlist of 100 items touches at most `buckets` slots, so
it is at most that many MGETs, pipelined as one round trip per master (storage/cluster.py), and the
index still spreads over every master. The tag leaves the version out on purpose: an item's keys in
two versions share a slot, so add / delete COPY them server-side on a cluster too (COPY needs both
keys in one slot), and an item's two keys share a slot, so one UNLINK removes both. Versions built
before the tag (manifest without `buckets`) keep their untagged keys <...>:f:<item id> and stay
readable; add / delete derive new versions in their base's layout, build / reindex use the current one.
On one Redis the tag is just part of the name.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import time
import zlib
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import redis

from crossprobe.storage import cluster as redis_cluster
from crossprobe.storage import layout
from crossprobe.storage.settings import StorageSettings

if TYPE_CHECKING:
    from crossprobe.storage.redis_conn import RedisClient

log = logging.getLogger("crossprobe.storage")


def _values(vals: list[Any]) -> list[bytes | None]:
    """Replies of MGET: bytes (None where missing). redis-py types a reply bytes | str (decode_responses would
    make it str); the store's clients never decode (redis_conn.connect)."""
    return cast("list[bytes | None]", vals)


NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # no glob characters: key patterns stay exact


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise ValueError(f"index name {name!r}: use letters, digits, '_', '.', '-' (max 64, starting alnum)")
    return name


# what a version's name may be wherever it is read (Redis, a manifest, a folder): new_version's names and the like;
# never a path (no "/", not "." or ".."): a name read from a Redis anyone on its network could write must not turn
# gc or drop into an rmtree outside the index root (issue 55)
VERSION_RE = re.compile(r"^v[A-Za-z0-9_.-]{1,63}$")


def check_version(version: str) -> str:
    if not VERSION_RE.match(version):
        raise ValueError(f"{version[:80]!r} is not a version name (v followed by letters, digits, '_', '.', '-')")
    return version


def image_roots(manifest: dict | None) -> list[str] | None:
    """The folders a version's files lie under (its manifest's "image_roots"; a version from before them that was
    built from a folder: that folder). None: not known (a manifest-built version from before them)."""
    if not manifest:
        return None
    if manifest.get("image_roots") is not None:
        return [str(r) for r in manifest["image_roots"]]
    folder = (manifest.get("source") or {}).get("images")
    return [os.path.realpath(folder)] if folder else None


def within_roots(path: str, roots: list[str] | None) -> bool:
    """Whether a file recorded for an item (a path read from Redis) lies under one of its version's image roots,
    symbolic links resolved: a path written into Redis by someone else, or a link made in the folder since it was
    indexed, must not let the service read and show any file its user can. roots None (not known): True."""
    if roots is None:
        return True
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def new_version() -> str:
    """Sortable by creation time, unique enough for one writer per index."""
    t = time.time()
    return time.strftime("v%Y%m%dT%H%M%S", time.gmtime(t)) + f"{int(t * 1e6) % 1_000_000:06d}"


@dataclass(frozen=True)
class KeyLayout:
    """The Redis key names of one version's values (see the module docstring)."""

    prefix: str
    name: str
    version: str
    buckets: int  # 0: untagged keys (versions built before the hash tag)

    @classmethod
    def of(cls, prefix: str, manifest: dict) -> "KeyLayout":
        """A complete version's layout, from its manifest (no `buckets` there: built before the tag)."""
        return cls(prefix, manifest["name"], manifest["version"], int(manifest.get("keys", {}).get("buckets", 0)))

    @property
    def base(self) -> str:
        """Every value key of the version starts with this (SCAN MATCH base*)."""
        return f"{self.prefix}:{self.name}:{self.version}:"

    def bucket(self, item_id: str) -> int:
        """crc32 of the UTF-8 id (stable across processes and languages, unlike Python's hash())."""
        return zlib.crc32(item_id.encode()) % self.buckets

    def tag(self, item_id: str) -> str:
        return "{%s:%d}:" % (self.name, self.bucket(item_id)) if self.buckets else ""

    def feat(self, item_id: str) -> str:
        return f"{self.base}f:{self.tag(item_id)}{item_id}"

    def meta(self, item_id: str) -> str:
        return f"{self.base}m:{self.tag(item_id)}{item_id}"

    def parse(self, key: str | bytes) -> tuple[str, str]:
        """A value key of this version -> ("f" | "m", item id): the inverse of feat / meta."""
        key = key.decode() if isinstance(key, bytes) else key
        if not key.startswith(self.base):
            raise ValueError(f"{key!r} is not a key of {self.name}/{self.version}")
        kind, rest = key[len(self.base) :].split(":", 1)
        if self.buckets:  # strip the tag "{<name>:<bucket>}:"
            rest = rest.split("}:", 1)[1]
        return kind, rest

    def manifest(self, active_key: str) -> dict:
        """manifest.json "keys": how a reader in any language finds a value."""
        if not self.buckets:
            return {"active": active_key, "features": self.feat("{id}"), "metadata": self.meta("{id}")}
        tag = "{%s:<bucket>}:" % self.name
        return {
            "active": active_key,
            "features": f"{self.base}f:{tag}<id>",
            "metadata": f"{self.base}m:{tag}<id>",
            "buckets": self.buckets,
            "bucket": "crc32(utf-8 id) % buckets",
        }


@dataclass
class VersionInfo:
    name: str
    version: str
    state: str  # active | complete | building | abandoned
    count: int | None
    fingerprint: str | None
    factory: str | None
    created: str | None
    words: str | None = None  # the keyword index: "words" (names, captions, tags), "words+ocr", or None (none)


class Store:
    def __init__(self, settings: StorageSettings, r: RedisClient):
        self.settings, self.r = settings, r
        self.root = Path(settings.index_root)
        self.prefix = settings.index_key_prefix

    # ---- keys -------------------------------------------------------------
    def active_key(self, name: str) -> str:
        return f"{self.prefix}:{name}:active"

    def versions_key(self, name: str) -> str:
        return f"{self.prefix}:{name}:versions"

    def key_base(self, name: str, version: str) -> str:
        return f"{self.prefix}:{name}:{version}:"

    def layout(self, name: str, version: str, buckets: int | None = None) -> KeyLayout:
        """A version's key names: `buckets` given (a job writing a version), else its manifest's; a version
        without a manifest (being built) uses its journal's spec, else the current setting."""
        if buckets is None:
            m = self.read_manifest(name, version)
            if m is not None:
                return KeyLayout.of(self.prefix, m)
            else:
                spec = self.version_dir(name, version) / "build" / "spec.json"
                try:
                    buckets = int(json.loads(spec.read_text())["key_buckets"])
                except (OSError, ValueError, KeyError):
                    buckets = self.settings.key_buckets
        return KeyLayout(self.prefix, name, version, buckets)

    def feat_key(self, name: str, version: str, item_id: str) -> str:
        return self.layout(name, version).feat(item_id)

    def meta_key(self, name: str, version: str, item_id: str) -> str:
        return self.layout(name, version).meta(item_id)

    # ---- reads that differ on a cluster: batch MGET, request-path fetch, health check ----
    @property
    def cluster(self) -> bool:
        return redis_cluster.is_cluster(self.r)

    def mget(self, keys: list[str]) -> list[bytes | None]:
        """MGET for batch jobs: on a cluster redis-py's mget_nonatomic (one MGET per slot, pipelined per
        node; it rides through a failover by re-sending)."""
        if not keys:
            return []
        return _values(self.r.mget_nonatomic(keys) if redis_cluster.is_cluster(self.r) else self.r.mget(keys))

    def fetch(self, keys: list[str]) -> list[bytes | None]:
        """MGET for the request path: on a cluster one round trip per master that fails fast when a master
        does not answer (storage/cluster.py says why it is not mget_nonatomic)."""
        if not keys:
            return []
        if redis_cluster.is_cluster(self.r):
            return redis_cluster.fetch(self.r, keys)
        return _values(self.r.mget(keys))

    def ping(self) -> bool:
        """The service's health check: PING the Redis, or every master of the cluster."""
        if redis_cluster.is_cluster(self.r):
            return redis_cluster.ping(self.r)
        return bool(self.r.ping())

    # ---- disk -------------------------------------------------------------
    def version_dir(self, name: str, version: str) -> Path:
        """<root>/<name>/<version>, both names checked (never a path out of the index root)."""
        return self.root / check_name(name) / check_version(version)

    def read_manifest(self, name: str, version: str) -> dict | None:
        p = self.version_dir(name, version) / layout.MANIFEST
        return json.loads(p.read_text()) if p.exists() else None

    def read_ids(self, name: str, version: str) -> list[str]:
        return json.loads((self.version_dir(name, version) / layout.IDS).read_text())

    def read_vectors(self, name: str, version: str) -> np.ndarray:
        return np.load(self.version_dir(name, version) / layout.VECTORS)

    def metadata(self, name: str, version: str, ids: list[str]) -> list[bytes | None]:
        """The metadata values of `ids` in one version (None where missing), MGET in chunks of redis_batch."""
        out: list[bytes | None] = []
        keys = self.layout(name, version)
        for i in range(0, len(ids), self.settings.redis_batch):
            out += self.mget([keys.meta(it) for it in ids[i : i + self.settings.redis_batch]])
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

    @contextmanager
    def job_lock(self, name: str, what: str):
        """One job per index at a time (build, add, delete, reindex, each batch of `index watch`): a second one is
        refused with the holder's description (`what`, its pid, since when) instead of writing a second version and
        activating it over the first. A flock on <root>/.jobs/<name>.lock (beside the indexes, not in one: an index's
        folder holds its versions only): the kernel releases it even on SIGKILL."""
        d = self.root / ".jobs"
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / f"{check_name(name)}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held = os.pread(fd, 500, 0).decode(errors="replace").strip() or "another process"
                raise RuntimeError(
                    f"index {name!r} is being written by another job ({held}); wait for it to finish or stop it, "
                    "then run this again"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(
                fd, f"{what}, pid {os.getpid()}, since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}".encode(), 0
            )
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
        disk = (
            {p.name for p in self.root.iterdir() if p.is_dir() and NAME_RE.match(p.name)}
            if self.root.is_dir()
            else set()
        )
        return sorted(disk)

    def active(self, name: str) -> str | None:
        v = cast("bytes | None", self.r.get(self.active_key(check_name(name))))  # bytes: see _values
        if not v:
            return None
        version = v.decode(errors="replace")
        if not VERSION_RE.match(version):  # written by something else than crossprobe: no version is active
            log.warning("index %s: its active version in Redis, %r, is not a version name: ignored", name, version[:80])
            return None
        return version

    def versions(self, name: str) -> list[VersionInfo]:
        d = self.root / check_name(name)
        on_disk = {p.name for p in d.iterdir() if p.is_dir() and p.name.startswith("v")} if d.is_dir() else set()
        in_redis = {v.decode(errors="replace") for v in cast("set[bytes]", self.r.smembers(self.versions_key(name)))}
        bad = {v for v in in_redis if not VERSION_RE.match(v)}
        if bad:  # never a path to read or remove: left alone, and said
            log.warning(
                "index %s: %d entries of its versions set are not version names, ignored: %s",
                name,
                len(bad),
                sorted(v[:80] for v in bad)[:5],
            )
            in_redis -= bad
        on_disk = {v for v in on_disk if VERSION_RE.match(v)}
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
            words = None if not (m and m.get("text")) else "words+ocr" if m.get("ocr") else "words"
            out.append(
                VersionInfo(
                    name,
                    v,
                    state,
                    m["count"] if m else None,
                    m["fingerprint"] if m else None,
                    m["factory"] if m else None,
                    m["created"] if m else None,
                    words,
                )
            )
        return out

    def activate(self, name: str, version: str, expect: str | None = None, check_expect: bool = False) -> None:
        """Point `active` at a complete version with one SET. With check_expect, only if
        `active` still equals `expect` (WATCH/MULTI): an add/delete built on an old
        version must not silently undo a change that was activated meanwhile."""
        m = self.read_manifest(name, version)
        if m is None:
            raise ValueError(f"{name}/{version} is not a complete version (no manifest.json)")
        layout.check_format(m)  # a later release's version: this release's services would refuse it
        ids = self.read_ids(name, version)
        keys = self.layout(name, version)
        # metadata: every item has it (a two-tower-only model's items have no feature value). On a cluster: one EXISTS
        # per slot
        if ids and self.r.exists(keys.meta(ids[0]), keys.meta(ids[-1])) != 2:
            raise ValueError(f"{name}/{version}: its Redis values are missing (gc'ed or another Redis?)")
        key = self.active_key(name)
        if not check_expect:
            self.r.set(key, version)
            return
        with self.r.pipeline(transaction=True) as p:
            try:
                p.watch(key)
                got = cast("bytes | None", p.get(key))  # watching: run at once, a reply (bytes: see _values)
                cur = got.decode() if got else None
                if cur != expect:
                    raise RuntimeError(
                        f"{name}: active version changed from {expect} to {cur} during this job; run it again"
                    )
                p.multi()
                p.set(key, version)
                p.execute()
            except redis.WatchError:
                raise RuntimeError(f"{name}: active version changed during this job; run it again") from None

    def drop(self, name: str, version: str, by_ids: bool = False) -> int:
        """Delete one version's Redis keys (SCAN + UNLINK, pipelined) and its directory. On a cluster redis-py
        SCANs every master and splits each UNLINK by slot. by_ids: a complete version's keys are exactly its items'
        two keys, so UNLINK those without a SCAN (`index watch` drops a version per batch: a SCAN walks every
        version's keys, seconds once a few dozen versions share the Redis)."""
        n = 0
        if by_ids and self.read_manifest(name, version) is not None:
            keys = self.layout(name, version)
            ids = self.read_ids(name, version)
            for i in range(0, len(ids), self.settings.redis_batch):
                with self.r.pipeline(transaction=False) as p:
                    for it in ids[i : i + self.settings.redis_batch]:
                        p.unlink(keys.feat(it), keys.meta(it))  # one slot: an item's two keys share its tag
                    n += sum(p.execute())
        else:
            n = self._unlink_matching(self.key_base(name, version) + "*")
        from crossprobe.storage import (
            ann,
        )  # a version's Milvus collection, if any, goes with it (before its manifest)

        ann.drop_version(self.settings, name, version, self.read_manifest(name, version))
        self.r.srem(self.versions_key(name), version)
        shutil.rmtree(self.version_dir(name, version), ignore_errors=True)
        return n

    def drop_index(self, name: str) -> tuple[list[tuple[str, int]], int]:
        """Remove index `name` whole: its `active` key first (a service stops serving it at its next poll, and add /
        delete refuse it), then every version (its Redis values, its directory with FAISS files, ids, vectors and
        keyword index; its Milvus collection), then whatever key is left under <prefix>:<name>: (the versions set,
        values of versions known neither to the disk nor to that set) and the index's directory.
        -> ([(version, Redis keys removed)], other keys removed). Refused (RuntimeError) before anything is removed
        while a process holds the lock of one of its versions: a job or `index watch` writing it."""
        check_name(name)
        infos = self.versions(name)
        with ExitStack() as held:
            for info in infos:
                try:
                    held.enter_context(self.lock(name, info.version))
                except RuntimeError:
                    raise RuntimeError(
                        f"{name}/{info.version} is being written by another process (a build, add, "
                        f"delete, reindex or `crossprobe index watch`); stop it or let it finish, "
                        f"then drop {name} again"
                    ) from None
            self.r.delete(self.active_key(name))
            # by ids: one SCAN of the whole keyspace per version was V + 1 scans; the one below catches what is left
            dropped = [(info.version, self.drop(name, info.version, by_ids=True)) for info in infos]
        late = [info.version for info in self.versions(name)]
        if late:  # a job started while the versions above were dropped: its version stays whole
            raise RuntimeError(
                f"a job started writing {name}/{late[0]} during the drop; {len(dropped)} version(s) "
                f"were removed. Stop that job, then drop {name} again"
            )
        rest = self._unlink_matching(f"{self.prefix}:{name}:*")
        from crossprobe.storage import ann  # collections of versions the store no longer knows (Milvus only)

        ann.gc_orphans(self.settings, name, set())
        shutil.rmtree(self.root / name, ignore_errors=True)
        return dropped, rest

    def snapshot_embedded(self, timeout_s: float = 300.0) -> bool:
        """The embedded Redis (REDIS_URL unset) writes its rdb file (<root>/redis.db) again, a BGSAVE waited for,
        so that values just removed (gc, drop) leave the disk too; until then the last snapshot holds them.
        -> False for an external Redis: its files (RDB, AOF, replicas, backups) are its operator's."""
        if self.settings.redis_url or self.settings.redis_cluster:
            return False
        deadline = time.monotonic() + timeout_s

        def wait_idle() -> None:
            while self.r.info("persistence")["rdb_bgsave_in_progress"]:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the embedded Redis was still saving after {timeout_s:.0f} s")
                time.sleep(0.05)

        wait_idle()  # a save that began before the removal may still hold the removed values
        try:
            self.r.bgsave()
        except redis.ResponseError:  # one started meanwhile (the save rules): it began after the removal
            pass
        wait_idle()
        status = self.r.info("persistence")["rdb_last_bgsave_status"]
        if status != "ok":
            raise redis.RedisError(f"the embedded Redis could not write {self.settings.rdb}: BGSAVE {status}")
        return True

    def _unlink_matching(self, pattern: str) -> int:
        """UNLINK every key matching a SCAN pattern, redis_batch at a time (on a cluster: every master)."""
        n, batch = 0, []
        for k in self.r.scan_iter(match=pattern, count=self.settings.redis_batch):
            batch.append(k)
            if len(batch) >= self.settings.redis_batch:
                n += self.r.unlink(*batch)
                batch = []
        return n + (self.r.unlink(*batch) if batch else 0)

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
        from crossprobe.storage import ann  # collections whose version the store no longer knows (Milvus only)

        ann.gc_orphans(self.settings, name, {info.version for info in self.versions(name)})
        return removed
