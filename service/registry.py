"""The served index versions: name -> IndexHandle (one pinned version: its ANN index (FAISS, or a Milvus
collection), ids, Redis keys).

A new version is loaded completely beside the old one, then the dict is replaced by a new dict in one
assignment: a request that already took a handle finishes on its version; the next request sees the new one.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
from redis.exceptions import RedisError

from crossprobe.core.release import checkpoint_release
from crossprobe.service import metrics
from crossprobe.service.exceptions import IndexNotFound, IndexUnavailable, NotReady
from crossprobe.service.scope import EVERY, Scope
from crossprobe.service.settings import Settings
from crossprobe.storage import filter_columns, keyword
from crossprobe.storage.ann import AnnUnavailable
from crossprobe.storage.layout import UnsupportedFormat
from crossprobe.storage.reader import FingerprintMismatch, IndexReader, open_index
from crossprobe.storage.redis_conn import connect
from crossprobe.storage.store import NAME_RE, Store, image_roots, within_roots

log = logging.getLogger("crossprobe.service")


class IndexHandle:
    """One loaded, immutable version of an index."""

    def __init__(self, reader: IndexReader):
        self.reader = reader
        self.name, self.version = reader.name, reader.version
        self.ids = frozenset(reader.ids)  # membership test for /v1/items: only indexed ids are readable
        self.loaded_at = time.time()
        self.columns = filter_columns.ColumnCache()  # metadata columns for filters, read on the first filtered search
        # the version's keyword index (storage/keyword.py); None for a version built before them: served vector-only
        self.keywords = keyword.open_for(reader.store.version_dir(reader.name, reader.version))
        # the folders its files lie under: no file is opened outside them (thumbnails, explain maps)
        self.image_roots = image_roots(reader.manifest)

    def file_allowed(self, path: str) -> bool:
        return within_roots(path, self.image_roots)

    def __len__(self) -> int:
        return len(self.reader)

    def info(self) -> dict:
        m = self.reader.manifest
        return {
            "name": self.name,
            "version": self.version,
            "count": len(self),
            "fingerprint": m["fingerprint"],
            "model": m.get("model_spec"),
            "factory": m.get("factory"),
            "created": m.get("created"),
        }


def other_model(name: str, version: str, manifest: dict, spec: str, fingerprint: str) -> str:
    """Why a version built with another model is not served, and the two ways out."""
    built, fp = manifest.get("model_spec"), manifest["fingerprint"]
    shipped, ships = checkpoint_release(fp), checkpoint_release(fingerprint)
    its = (
        f"model {built} (fingerprint {fp})"
        if built
        else f"the checkpoint crossprobe {shipped} shipped (fingerprint {fp})"
        if shipped
        else f"model fingerprint {fp} (a crossprobe checkpoint: built before versions recorded their model spec)"
    )
    runs = (
        f"{spec} (the checkpoint crossprobe {ships} ships, fingerprint {fingerprint})"
        if ships and str(spec) == "crossprobe:"
        else f"{spec} (fingerprint {fingerprint})"
    )
    serve = (
        f"CROSSPROBE_MODEL={built}"
        if built
        else f"CROSSPROBE_MODEL=crossprobe:<crossprobe {shipped}'s models/checkpoints/default>"
        if shipped
        else f"CROSSPROBE_MODEL=crossprobe:<the checkpoint of {fp}>"
    )
    return (
        f"index {name!r} version {version} was built with {its}, but this service runs model {runs}; vectors of "
        f"two models are not comparable. Either serve the index's model ({serve}), or move the index to this "
        f"service's model: crossprobe index reindex {name} --model {spec} (it re-encodes the index's photos into a "
        f"new version while this one keeps serving, then switches)"
    )


class Registry:
    def __init__(self, settings: Settings, fingerprint: str, spec: str):
        """fingerprint, spec: the served model's (an index built with another fingerprint is refused)."""
        self.settings = settings
        self.store = Store(settings, connect(settings))
        self.fingerprint, self.spec = fingerprint, spec
        self.handles: dict[str, IndexHandle] = {}  # replaced, never mutated: readers may hold the old dict
        self.problems: dict[str, str] = {}  # name -> why its active version is not served (old one may be)
        self._refused: dict[str, str] = {}  # name -> active version that failed to load
        self._lock = threading.Lock()  # one refresh at a time (poller and /admin/reload)
        import faiss

        # process-wide, one thread: a search is one query, and FAISS spreads the queries of a batch over its
        # threads, not one query's work, so more would only spin after each search (OpenMP's workers do) on the
        # cores the query tower needs (service/profiles.py)
        faiss.omp_set_num_threads(1)

    # ---- lookups (request path) ------------------------------------------------
    def default_name(self, scope: Scope = EVERY) -> str | None:
        """The index of a request that names none: the server's default (CROSSPROBE_DEFAULT_INDEX, else the first
        served name), or for a key scoped to other indexes its own first one served (else its first): never the
        server's default, which it may not read and must not learn the name of."""
        default = self.settings.default_index or (min(self.handles) if self.handles else None)
        if scope.names is None or (default is not None and scope.allows(default)):
            return default
        return next((n for n in scope.names if n in self.handles), scope.names[0])

    def get(self, name: str | None, *, scope: Scope) -> IndexHandle:
        """The served version of `name` (None: the default) for a caller that may read `scope` (every lookup on
        the request path says whose it is: scope.py). Outside the scope: the same 404 as an index that does not
        exist, the same message, listing the served indexes the scope holds."""
        name = name or self.default_name(scope)
        if name is None:
            raise NotReady("no index is being served yet")
        if scope.allows(name):
            h = self.handles.get(name)
            if h is not None:
                return h
            if name in self.problems:
                raise IndexUnavailable(f"index {name!r} cannot be served: {self.problems[name]}")
        raise IndexNotFound(f"no index {name!r} here; served: {sorted(scope.visible(self.handles))}")

    def current(self, name: str) -> IndexHandle | None:
        return self.handles.get(name)

    # ---- loading (background) --------------------------------------------------
    def wanted(self) -> list[str]:
        if self.settings.index_names:
            return self.settings.index_names
        return [n for n in self.store.names() if NAME_RE.match(n) and self.store.active(n)]

    def load(self, name: str, version: str) -> IndexHandle:
        reader = open_index(name, self.fingerprint, self.settings, version=version, store=self.store)
        h = IndexHandle(reader)
        if len(h):  # touch what a query touches (pages of the FAISS index, one MGET) before going live
            reader.search(np.zeros((1, reader.d), np.float32), 1)
            reader.features(reader.ids[:1])
            if self.settings.filter_preload:
                t = time.perf_counter()
                try:
                    h.columns.get(lambda: filter_columns.all_metadata(reader))
                    log.info(
                        "%s/%s: filter columns of %d items read in %.2f s",
                        name,
                        version,
                        len(h),
                        time.perf_counter() - t,
                    )
                except RedisError as e:  # not fatal: the first filtered search reads them (or answers 503)
                    metrics.error("filter_preload")
                    log.warning(
                        "%s/%s: filter columns not preloaded (%s); read on the first filtered search", name, version, e
                    )
        return h

    def refresh(self, force: bool = False) -> dict[str, dict]:
        """Serve each wanted index's active version; load changed ones fully, then swap. -> per-name outcome.
        A version that failed to load is not retried on every poll (a big index is costly to read), only
        when `active` moves again or with force (POST /admin/reload)."""
        with self._lock:
            out: dict[str, dict] = {}
            try:
                names = self.wanted()
            except Exception as e:  # noqa: BLE001 - Redis down: keep serving what is loaded, retry next poll
                metrics.error("reload_redis")
                log.warning("cannot list indexes: %s", e)
                return {n: {"version": h.version, "changed": False, "error": str(e)} for n, h in self.handles.items()}
            # a served index gone from the list may have been dropped (`crossprobe index drop`): looked at too
            for name in [*names, *(n for n in self.handles if n not in names)]:
                cur = self.handles.get(name)
                try:
                    active = self.store.active(name)
                except Exception as e:  # noqa: BLE001 - Redis down: keep serving what is loaded
                    out[name] = self._failed(name, cur, None, f"cannot read the active version: {e}", "redis")
                    continue
                if active is None and cur is not None and self.store.read_manifest(name, cur.version) is None:
                    out[name] = self._unload(name, cur)
                    continue
                if active is None:
                    out[name] = self._failed(
                        name, cur, None, "no active version (never built, or its key was deleted)", "no_active"
                    )
                    continue
                if cur is not None and cur.version == active:
                    self.problems.pop(name, None)  # e.g. a refused version was rolled back
                    out[name] = {"version": active, "changed": False}
                    continue
                if not force and self._refused.get(name) == active:
                    out[name] = {
                        "version": cur.version if cur else None,
                        "changed": False,
                        "error": self.problems.get(name),
                    }
                    continue
                try:
                    h = self.load(name, active)
                except FingerprintMismatch:
                    manifest = self.store.read_manifest(name, active)
                    assert manifest is not None, "open_index read this manifest to find the mismatch"
                    why = other_model(name, active, manifest, self.spec, self.fingerprint)
                    out[name] = self._failed(name, cur, active, why, "fingerprint_mismatch")
                    continue
                except UnsupportedFormat as e:  # written by a later release: its message says which, and what to do
                    out[name] = self._failed(name, cur, active, str(e), "storage_format")
                    continue
                except AnnUnavailable as e:  # the vector engine is down or starting: retried at the next poll
                    out[name] = self._failed(name, cur, None, f"{type(e).__name__}: {e}", "ann_unavailable")
                    continue
                except Exception as e:  # noqa: BLE001 - a bad version never takes down the served one
                    out[name] = self._failed(name, cur, active, f"{type(e).__name__}: {e}", "load_failed")
                    continue
                self.handles = {**self.handles, name: h}  # the swap: one reference assignment
                self.problems.pop(name, None)
                self._refused.pop(name, None)
                metrics.index_served(name, h.version, h.reader.fingerprint, len(h))
                metrics.RELOADS.labels(name, "switched" if cur else "loaded").inc()
                log.info(
                    "index %s: serving version %s (%d items)%s",
                    name,
                    h.version,
                    len(h),
                    f", was {cur.version}" if cur else "",
                )
                out[name] = {"version": h.version, "changed": True, "previous": cur.version if cur else None}
            return out

    def _unload(self, name: str, cur: IndexHandle) -> dict:
        """Its active key AND the served version's files are gone: the index was dropped, not merely unreadable
        for a while. Serving on would answer from values that are gone; it answers index_not_found instead."""
        self.handles = {n: h for n, h in self.handles.items() if n != name}  # the swap: one reference assignment
        self.problems.pop(name, None)
        self._refused.pop(name, None)
        metrics.index_dropped(name)
        metrics.RELOADS.labels(name, "dropped").inc()
        log.info(
            "index %s: dropped (no active version, version %s gone from disk); no longer served", name, cur.version
        )
        return {"version": None, "changed": True, "previous": cur.version}

    def _failed(self, name: str, cur: IndexHandle | None, version: str | None, why: str, kind: str) -> dict:
        """Record why `name` could not be (re)loaded; the served version, if any, stays."""
        if self.problems.get(name) != why:  # count and log a problem once, not once per poll
            metrics.RELOADS.labels(name, kind).inc()
            metrics.error(f"reload_{kind}")
            log.warning("index %s: %s%s", name, why, f" (still serving {cur.version})" if cur else "")
        self.problems[name] = why
        if version is not None:
            self._refused[name] = version
        return {"version": cur.version if cur else None, "changed": False, "error": why}
