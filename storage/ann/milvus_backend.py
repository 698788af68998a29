"""Milvus through pymilvus' MilvusClient: one collection per index version.

Collection <prefix>_<name>_<version> (characters Milvus refuses become '_', plus a hash of the exact name
when anything had to change, so "a-b" and "a_b" never share a collection). Fields:
  row      INT64 primary key: the row of the version (ids[row] in its directory)
  item_id  VARCHAR                     the item id (readable in the engine's own tools; deletes go by row)
  vec      FLOAT_VECTOR(d)             g_I, unit norm; metric IP (= cosine)
  tags, format, caption, width, height the filterable metadata (milvus_filter.py), never null: each of the
                                       last four has a BOOL has_<field> (False: the item has none) (SCHEMA 2)
The version's directory still holds ids, vectors.npy and manifest.json (written last); the manifest's "ann"
entry names the collection, its index and its schema. Redis' `active` key still decides which version serves: a
collection is only ever read through a version that `active` named, and dropping a version (gc) drops it.

Index: CROSSPROBE_INDEX_MILVUS_INDEX = FLAT | HNSW | IVF_FLAT | AUTO (FLAT below flat_max vectors, HNSW above,
as the FAISS factory chooses); HNSW M / efConstruction and IVF nlist from the same Settings. Search: ef =
max(milvus_ef, k) (Milvus refuses ef < k), nprobe = milvus_nprobe.

URI: CROSSPROBE_MILVUS_URI, http://host:19530 for a Milvus server, or a path ending in .db for milvus-lite
(an engine inside this process; one process per file: fine for tests and one-box use, not for an indexer and
a service at once). Unset: <index root>/milvus.db. Every call carries a timeout (milvus_timeout_s); an
unreachable engine, or a server still loading a collection after a restart, raises AnnUnavailable.

Engines tested (tests/storage/ann, tests/service/test_milvus_server.py): milvus-lite 3.2 and a Milvus
2.3.5 standalone server (local_milvus.py), both through pymilvus 3.0. Schema 2 (flags, no nullable fields) is what
lets one collection layout serve both and every server from 2.3 (ARRAY fields) on; 0.1.0's schema 1 collections
(nullable fields: Milvus 2.5+, milvus-lite) are still read, with null-based filters.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np

from crossprobe.storage.ann import milvus_filter
from crossprobe.storage.ann.base import AnnBackend, AnnIndex, AnnUnavailable, AnnWriter, Filtered, exact_scan

INSERT_BATCH = 4000  # rows per insert: ~4 MB of vectors at d=256, far below gRPC's 64 MB message limit
MAX_TAGS, MAX_TAG_CHARS = 1024, 1024
MAX_ID_CHARS, MAX_FORMAT_CHARS, MAX_CAPTION_CHARS = 4096, 64, 65_535
SCHEMA = 2  # 1: nullable scalar fields (0.1.0); 2: plain fields + has_<field> flags (any server from 2.3)
_VERSION_RE = re.compile(r"_(v\d{8}T\d{12})(?:_[0-9a-f]{8})?$")

_clients: dict[tuple, Any] = {}
_clients_lock = threading.Lock()


def _uri(settings) -> str:
    return settings.milvus_uri or str(Path(settings.index_root).resolve() / "milvus.db")


def client(settings):
    """One MilvusClient per (uri, token) in this process (a milvus-lite file allows one engine per process)."""
    from pymilvus import MilvusClient

    uri = _uri(settings)
    token = settings.milvus_token.get_secret_value() if settings.milvus_token else ""
    key = (uri, token)
    with _clients_lock:
        c = _clients.get(key)
        if c is None:
            if uri.endswith(".db"):
                Path(uri).parent.mkdir(parents=True, exist_ok=True)
            try:
                c = MilvusClient(uri=uri, token=token, timeout=settings.milvus_timeout_s)
            except Exception as e:  # noqa: BLE001 - pymilvus raises its own MilvusException or grpc errors
                raise AnnUnavailable(f"Milvus at {uri} cannot be reached: {type(e).__name__}: {e}") from e
            _clients[key] = c
        return c


def close_clients() -> None:
    """Close every client (and with it a milvus-lite engine this process started)."""
    with _clients_lock:
        items = list(_clients.items())
        _clients.clear()
    for (uri, _), c in items:
        try:
            c.close()
        finally:
            if uri.endswith(".db"):
                try:
                    from milvus_lite.server_manager import server_manager_instance

                    server_manager_instance.release_server(uri)
                except Exception:  # noqa: BLE001 - older milvus-lite: released at exit instead
                    pass


def collection_name(prefix: str, name: str, version: str) -> str:
    raw = f"{prefix}_{name}_{version}"
    safe = re.sub(r"[^A-Za-z0-9_]", "_", raw)
    if not (safe[0].isalpha() or safe[0] == "_"):
        safe = "c_" + safe
    if safe != raw or len(safe) > 200:
        safe = f"{safe[:180]}_{hashlib.sha1(raw.encode()).hexdigest()[:8]}"
    return safe


# Server answers that mean "not now" rather than "never" (Milvus' merr codes): a server restarting or still
# loading a collection after a restart (101 collection not loaded, 103 / 106 / 108 shard leaders and channels
# not ready, 503 / 65535 with "not ready" / "not healthy" / "stopping" in the message: 2.3 still sends some
# with the generic code), and a query node or proxy not yet registered (901 node not found, 902 / 904).
_TRANSIENT_CODES = {1, 2, 4, 101, 103, 106, 108, 503, 901, 902, 904}
_TRANSIENT_WORDS = (
    "timeout",
    "unavailable",
    "not ready",
    "not healthy",
    "not loaded",
    "stopping",
    "no available",
    "initializing",
    "abnormal",
    "connection",
    "deadline",
    "channel checker not ready",
)


def _call(what: str, fn: Callable, *a, **kw):
    """A pymilvus call; connection trouble or a server not ready -> AnnUnavailable (transient), anything else
    (a bad expression, a missing field) as it is."""
    try:
        return fn(*a, **kw)
    except Exception as e:  # noqa: BLE001
        from pymilvus.exceptions import MilvusException

        code = getattr(e, "code", None)
        transient = not isinstance(e, MilvusException) or code in _TRANSIENT_CODES  # grpc errors: connect / deadline
        if transient or any(w in str(e).lower() for w in _TRANSIENT_WORDS):
            raise AnnUnavailable(f"Milvus {what}: {type(e).__name__}: {e}") from e
        raise


def _scalars(meta: dict | None) -> dict:
    """An item's metadata -> the collection's scalar fields (SCHEMA 2: a value not recorded is "" / 0.0 with its
    has_<field> False)."""
    m = meta if isinstance(meta, dict) else {}
    tags = [str(t) for t in (m.get("tags") or [])]
    if len(tags) > MAX_TAGS or any(len(t) > MAX_TAG_CHARS for t in tags):
        raise ValueError(f"item {m.get('id')!r}: more than {MAX_TAGS} tags or a tag longer than {MAX_TAG_CHARS}")
    out: dict[str, Any] = {"tags": tags}
    for f, cap in (("format", MAX_FORMAT_CHARS), ("caption", MAX_CAPTION_CHARS)):
        v = m.get(f)
        v = (v.lower() if f == "format" else v) if isinstance(v, str) else None
        if v is not None and len(v) > cap:
            raise ValueError(f"item {m.get('id')!r}: {f} longer than {cap} characters")
        out[f], out[f"has_{f}"] = ("" if v is None else v), v is not None
    for f in milvus_filter.NUMERIC:
        v = m.get(f)
        num = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None
        out[f], out[f"has_{f}"] = (0.0 if num is None else num), num is not None
    return out


class MilvusIndex(AnnIndex):
    backend = "milvus"

    def __init__(self, backend: "MilvusBackend", collection: str, d: int, index_type: str, schema: int = SCHEMA):
        self.b, self.collection, self.d, self.index_type, self.schema = backend, collection, d, index_type, schema
        self.c = backend.client()
        s = backend.settings
        self._t = s.milvus_timeout_s
        _call("load", self.c.load_collection, collection, timeout=self._t)  # idempotent; a restart left it released

    def _params(self, k: int) -> dict:
        s = self.b.settings
        p = {"HNSW": {"ef": max(s.milvus_ef, k)}, "IVF_FLAT": {"nprobe": s.milvus_nprobe}}.get(self.index_type, {})
        return {"metric_type": "IP", "params": p}

    def count(self, expr: str = "") -> int:
        # a committed version never changes (flushed, indexed and loaded before its manifest exists), so the
        # read path needs no "Strong" consistency: on a server that waits for the next time tick (up to ~200 ms)
        res = _call(
            "count",
            self.c.query,
            self.collection,
            filter=expr,
            output_fields=["count(*)"],
            timeout=self._t,
            consistency_level="Eventually",
        )
        return int(res[0]["count(*)"])

    def _search(self, q: np.ndarray, k: int, expr: str = "") -> tuple[np.ndarray, np.ndarray]:
        q = np.ascontiguousarray(np.atleast_2d(q), np.float32)
        res = _call(
            "search",
            self.c.search,
            self.collection,
            data=[v for v in q],
            limit=k,
            anns_field="vec",
            filter=expr,
            search_params=self._params(k),
            output_fields=["row"],
            timeout=self._t,
        )
        scores = np.full((len(q), k), -np.inf, np.float32)
        rows = np.full((len(q), k), -1, np.int64)
        for b, hits in enumerate(res):
            for j, h in enumerate(hits[:k]):
                rows[b, j], scores[b, j] = h.id, h.distance
        return scores, rows

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self._search(q, k)

    def prepare_filter(self, node, exclude_rows: list[int], columns: Callable[[], Any]) -> str:
        expr = milvus_filter.expression(node, flags=self.schema >= 2)  # columns: not needed
        return milvus_filter.exclude(expr, exclude_rows)

    def search_filtered(
        self, q: np.ndarray, k: int, prepared: str, vectors_at: Callable[[np.ndarray], np.ndarray], exact_max: int
    ) -> Filtered:
        matching = self.count(prepared)
        if matching == 0:
            return Filtered(np.zeros(0, np.int64), np.zeros(0, np.float32), 0, True, "none-match")
        want = min(k, matching)
        scores, rows = self._search(np.asarray(q).reshape(1, -1), want, prepared)
        keep = rows[0] >= 0
        rows, scores = rows[0][keep], scores[0][keep]
        flat = self.index_type == "FLAT"
        if len(rows) >= want or flat:
            return Filtered(rows, scores, matching, flat or matching <= len(rows), "milvus-expr")
        if matching > exact_max:
            return Filtered(rows, scores, matching, False, "milvus-expr")
        found = _call(
            "query",
            self.c.query,
            self.collection,
            filter=prepared,
            output_fields=["row"],
            limit=matching,
            timeout=self._t,
            consistency_level="Eventually",
        )
        return exact_scan(np.sort(np.asarray([r["row"] for r in found], np.int64)), vectors_at, q, want, matching)

    def describe(self) -> str:
        return f"milvus:{self.index_type}:{self.collection}"


class MilvusWriter(AnnWriter):
    """Inserts as it goes (the engine holds the rows); commit flushes, builds the index and loads it.

    The writer keeps its own account of the rows it wrote (ids and which are deleted): a Milvus server answers
    no query on a collection that is not loaded, and a version's collection is loaded only once it is indexed
    (commit). milvus-lite queries unloaded collections, which is how counting through the engine went unnoticed
    until the backend met a server. commit checks the engine's count(*) against this account once loaded."""

    wants_metadata = True

    def __init__(self, backend: "MilvusBackend", collection: str, d: int):
        self.b, self.collection, self.d = backend, collection, d
        self.c = backend.client()
        self._t = backend.settings.milvus_build_timeout_s
        self._next_row = 0
        self._ids: list[str] = []  # row -> item id, for the rows this writer inserted
        self._alive = np.zeros(0, bool)  # row -> not deleted
        self.index: dict | None = None
        self._create()

    def _create(self) -> None:
        """A fresh collection (a rerun after a kill starts this version's collection again)."""
        from pymilvus import DataType, MilvusClient

        if _call("has_collection", self.c.has_collection, self.collection, timeout=self._t):
            _call("drop_collection", self.c.drop_collection, self.collection, timeout=self._t)
        s = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        s.add_field("row", DataType.INT64, is_primary=True)
        s.add_field("item_id", DataType.VARCHAR, max_length=MAX_ID_CHARS)
        s.add_field("vec", DataType.FLOAT_VECTOR, dim=self.d)
        s.add_field(
            "tags", DataType.ARRAY, element_type=DataType.VARCHAR, max_capacity=MAX_TAGS, max_length=MAX_TAG_CHARS
        )
        s.add_field("format", DataType.VARCHAR, max_length=MAX_FORMAT_CHARS)
        s.add_field("caption", DataType.VARCHAR, max_length=MAX_CAPTION_CHARS)
        for f in milvus_filter.NUMERIC:
            s.add_field(f, DataType.DOUBLE)
        for f in milvus_filter.OPTIONAL:  # no nullable fields: a Milvus server before 2.5 has none (SCHEMA)
            s.add_field(f"has_{f}", DataType.BOOL)
        _call(
            "create_collection",
            self.c.create_collection,
            self.collection,
            schema=s,
            timeout=self._t,
            consistency_level="Bounded",
        )

    def add(self, vectors: np.ndarray, ids: list[str], metas: list[dict | None] | None = None) -> None:
        vectors = np.asarray(vectors, np.float32).reshape(-1, self.d)
        if len(vectors) != len(ids) or (metas is not None and len(metas) != len(ids)):
            raise ValueError(f"{len(vectors)} vectors, {len(ids)} ids, {len(metas or ids)} metadata values")
        for i in range(0, len(ids), INSERT_BATCH):
            rows = []
            for j in range(i, min(i + INSERT_BATCH, len(ids))):
                if len(ids[j]) > MAX_ID_CHARS:
                    raise ValueError(f"item id longer than {MAX_ID_CHARS} characters: {ids[j][:80]!r}...")
                rows.append(
                    {
                        "row": self._next_row + j,
                        "item_id": ids[j],
                        "vec": vectors[j],
                        **_scalars(metas[j] if metas is not None else None),
                    }
                )
            _call("insert", self.c.insert, self.collection, rows, timeout=self._t)
        self._next_row += len(ids)
        self._ids.extend(ids)
        self._alive = np.concatenate([self._alive, np.ones(len(ids), bool)])

    def delete(self, ids: list[str]) -> int:
        want = set(ids)
        rows = [r for r, i in enumerate(self._ids) if i in want and self._alive[r]] if want else []
        for i in range(0, len(rows), INSERT_BATCH):  # by primary key: what every Milvus deletes by
            chunk = rows[i : i + INSERT_BATCH]
            _call(
                "delete",
                self.c.delete,
                self.collection,
                filter=f"row in [{', '.join(map(str, chunk))}]",
                timeout=self._t,
            )
            self._alive[chunk] = False
        return len(rows)

    def count(self) -> int:
        return int(self._alive.sum())

    def commit(self) -> str:
        s = self.b.settings
        _call("flush", self.c.flush, self.collection, timeout=self._t)
        n = self.count()
        kind = s.milvus_index if s.milvus_index != "AUTO" else ("FLAT" if n < s.flat_max else "HNSW")
        params: dict = {}
        if kind == "HNSW":
            params = {"M": s.milvus_hnsw_m, "efConstruction": s.milvus_hnsw_ef_construction}
        elif kind == "IVF_FLAT":
            params = {"nlist": s.milvus_ivf_nlist or 1 << max(0, round(math.log2(4 * math.sqrt(max(n, 1)))))}
        ip = self.c.prepare_index_params()
        # pymilvus 3 sends each build parameter as a key of its own; milvus-lite 3.2 reads only the older form,
        # one "params" key holding them as JSON (and used its defaults, M=16 / efConstruction=200, without it).
        # A Milvus server merges both forms (its proxy parses a "params" key too), so both are sent.
        ip.add_index("vec", index_type=kind, metric_type="IP", params={**params, "params": params} if params else {})
        _call("create_index", self.c.create_index, self.collection, ip, timeout=self._t)
        # a server builds the index in the background (its index nodes); a segment loaded before its index is
        # built would be searched brute force, so wait for every row to be indexed (milvus-lite builds on load)
        _wait_indexed(self.c, self.collection, n, self._t)
        # loading builds (lite) or loads (a server) the index of every segment: searchable when this returns
        _call("load", self.c.load_collection, self.collection, timeout=self._t)
        held = _count(self.c, self.collection, self._t)
        if held != n:
            raise RuntimeError(
                f"Milvus collection {self.collection} holds {held} rows after the build, not the {n} "
                "this writer inserted and kept"
            )
        self.index = {"type": kind, "params": params, "count": n}
        return f"milvus:{kind}" + (f"({','.join(f'{k}={v}' for k, v in params.items())})" if params else "")

    def manifest_entry(self) -> dict:
        return {"backend": "milvus", "collection": self.collection, "index": self.index, "schema": SCHEMA}


def _wait_indexed(c, collection: str, n: int, timeout: float) -> None:
    """Until describe_index says every row is indexed (a server; milvus-lite reports no progress: returns)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        info = _call("describe_index", c.describe_index, collection, "vec", timeout=timeout) or {}
        if (
            "indexed_rows" not in info
            or str(info.get("state", "")).lower() == "finished"
            or int(info["indexed_rows"]) >= n
        ):
            return
        if str(info.get("state", "")).lower() == "failed":
            raise RuntimeError(
                f"Milvus index build of {collection} failed: {info.get('index_state_fail_reason', info)}"
            )
        if time.monotonic() > deadline:
            raise AnnUnavailable(
                f"Milvus index build of {collection}: {info.get('indexed_rows')} of {n} rows "
                f"indexed after {timeout:.0f} s"
            )
        time.sleep(0.5)


def _count(c, collection: str, timeout: float) -> int:
    res = _call(
        "count", c.query, collection, filter="", output_fields=["count(*)"], timeout=timeout, consistency_level="Strong"
    )
    return int(res[0]["count(*)"])


class MilvusBackend(AnnBackend):
    name = "milvus"

    def __init__(self, settings):
        self.settings = settings

    def client(self):
        return client(self.settings)

    def location(self, name: str, version: str) -> str:
        return collection_name(self.settings.index_key_prefix, name, version)

    def writer(self, name: str, version: str, d: int, vdir: Path) -> MilvusWriter:
        return MilvusWriter(self, self.location(name, version), d)

    def open(self, name: str, version: str, manifest: dict, vdir: Path) -> MilvusIndex:
        ann = manifest.get("ann") or {}
        coll = ann.get("collection") or self.location(name, version)
        if not _call("has_collection", self.client().has_collection, coll, timeout=self.settings.milvus_timeout_s):
            raise LookupError(f"{name}/{version}: Milvus collection {coll} is missing (dropped, or another Milvus?)")
        return MilvusIndex(
            self, coll, manifest["dims"]["g"], (ann.get("index") or {}).get("type", "FLAT"), int(ann.get("schema", 1))
        )  # no "schema": a 0.1.0 collection (nullable fields)

    def drop(self, name: str, version: str) -> bool:
        c, coll, t = self.client(), self.location(name, version), self.settings.milvus_timeout_s
        if not _call("has_collection", c.has_collection, coll, timeout=t):
            return False
        _call("drop_collection", c.drop_collection, coll, timeout=t)
        return True

    def stored_versions(self, name: str) -> list[str]:
        out = []
        for coll in _call("list_collections", self.client().list_collections, timeout=self.settings.milvus_timeout_s):
            m = _VERSION_RE.search(coll)
            if m and collection_name(self.settings.index_key_prefix, name, m.group(1)) == coll:
                out.append(m.group(1))
        return sorted(out)
