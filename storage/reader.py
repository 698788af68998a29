"""Reading an index version: ANN search (FAISS or Milvus: storage/ann/), one-MGET feature fetch, metadata.

`open_index(name, fingerprint)` pins the version that is active *now* and checks
that it was built with the caller's model: scores computed from a query tower
and image features of two different models are meaningless, so a mismatch is an
error, never a warning. The reader keeps using its pinned version (and its
keys) after another version is activated, until it reopens.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from crossprobe.core.inference.layout import FeatureDims
from crossprobe.storage import ann, layout
from crossprobe.storage.codec import Layout, decode
from crossprobe.storage.redis_conn import connect
from crossprobe.storage.settings import StorageSettings
from crossprobe.storage.store import KeyLayout, Store


class FingerprintMismatch(ValueError):
    """The index was built with another model than the one loaded."""


class IndexReader:
    def __init__(self, store: Store, name: str, version: str, manifest: dict):
        self.store, self.name, self.version, self.manifest = store, name, version, manifest
        vdir = store.version_dir(name, version)
        # the backend the version was built with (its manifest says; FAISS for versions older than the field)
        self.ann: ann.AnnIndex = ann.backend_for(store.settings, manifest).open(name, version, manifest, vdir)
        self.index = getattr(self.ann, "index", None)  # the faiss.Index of a FAISS version (tools, tests)
        self.dims = FeatureDims.from_manifest(manifest["dims"])
        self.d: int = self.dims.d
        self.ids: list[str] = json.loads((vdir / layout.IDS).read_text())
        self.layout = Layout.from_header(manifest["layout"])
        self.keys = KeyLayout.of(store.prefix, manifest)  # the version's own key names (tagged or not)
        held = self.ann.count()
        if held != len(self.ids) or len(self.ids) != manifest["count"]:
            raise ValueError(
                f"{name}/{version}: the ANN index ({self.ann.describe()}: {held}), ids ({len(self.ids)}) "
                f"and manifest ({manifest['count']}) disagree"
            )
        self._vdir = vdir
        self._rows: dict[str, int] | None = None  # id -> row, made on the first rows() call
        self._vectors: np.ndarray | None = None  # vectors.npy, memory-mapped on the first vectors() call

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]

    def __len__(self) -> int:
        return len(self.ids)

    def search(self, q: np.ndarray, k: int) -> tuple[list[list[str]], np.ndarray]:
        """q (B, d) unit-norm query vectors -> ids [B][<=k], scores (B, k) inner products (-inf past the end)."""
        q = np.ascontiguousarray(np.atleast_2d(q), np.float32)
        scores, rows = self.ann.search(q, min(k, max(len(self.ids), 1)))
        ids = [[self.ids[j] for j in row if j >= 0] for row in rows]
        return ids, np.where(rows >= 0, scores, -np.inf)

    def rows(self, ids: list[str]) -> list[int]:
        """The rows of these ids (KeyError for an id that is not in this version)."""
        if self._rows is None:  # id -> row, made once per version on first use
            self._rows = {item_id: row for row, item_id in enumerate(self.ids)}
        return [self._rows[i] for i in ids]

    def vectors(self, ids: list[str]) -> np.ndarray:
        """(len(ids), d) float32: the stored g_I of these ids (KeyError for an id not in this version)."""
        return self.vectors_at(self.rows(ids))

    def vectors_at(self, rows) -> np.ndarray:
        """(len(rows), d) float32: the stored g_I of these FAISS rows, exactly what FAISS was built from (the
        version's vectors.npy, memory-mapped: no re-encoding, no copy of the file in memory)."""
        if self._vectors is None:
            self._vectors = np.load(self._vdir / layout.VECTORS, mmap_mode="r")
        rows = np.asarray(rows, np.int64)
        return np.asarray(self._vectors[rows], np.float32).reshape(len(rows), self.d)

    def features(self, ids: list[str]) -> dict[str, np.ndarray]:
        """One MGET (a cluster: one round trip per master) -> {"p_v": (K, n, dc), "b_bar": (K, dc),
        "s_i": (K, nk)} float32 [+ "labels" (K, 49)]. A two-tower-only model's version stores none: empty arrays,
        without a round trip."""
        if self.layout.empty:
            return decode(self.layout, [b""] * len(ids))
        vals = self.store.fetch([self.keys.feat(i) for i in ids])
        missing = [i for i, v in zip(ids, vals) if v is None]
        if missing:
            raise KeyError(f"{self.name}/{self.version}: no features for {missing[:5]} (version gc'ed?)")
        return decode(self.layout, vals)

    def metadata(self, ids: list[str]) -> list[dict | None]:
        vals = self.store.fetch([self.keys.meta(i) for i in ids])
        return [json.loads(v) if v is not None else None for v in vals]


def open_index(
    name: str,
    fingerprint: str | None,
    settings: StorageSettings | None = None,
    version: str | None = None,
    store: Store | None = None,
) -> IndexReader:
    """Open the active (or a given) version of `name`; refuse it if built with another model.

    fingerprint: the loaded model's (checkpoint meta["fingerprint"]); None skips the check
    (inspection tools only).
    """
    settings = settings or StorageSettings()
    store = store or Store(settings, connect(settings))
    version = version or store.active(name)
    if version is None:
        raise LookupError(f"index {name!r} has no active version (Redis {store.active_key(name)} is unset)")
    manifest = store.read_manifest(name, version)
    if manifest is None:
        raise LookupError(
            f"index {name!r} version {version}: no manifest.json under {Path(settings.index_root) / name / version}"
        )
    layout.check_format(manifest)  # a later release's layout: refused before anything of it is read
    if fingerprint is not None and manifest["fingerprint"] != fingerprint:
        built = manifest.get("model_spec") or "a crossprobe checkpoint"
        raise FingerprintMismatch(
            f"index {name!r} version {version} was built with model {built} ({manifest['fingerprint']}), but the "
            f"loaded model is {fingerprint}; its vectors and probes are not comparable. Either load the index's model, "
            f"or move the index to this one: crossprobe index reindex {name} --model <this model's spec> (re-encodes "
            f"its items from their recorded sources into a new version and activates it)"
        )
    return IndexReader(store, name, version, manifest)
