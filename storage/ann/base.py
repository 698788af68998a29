"""The ANN stage behind one small interface: a backend names, writes, opens and drops index versions.

Why an interface: FAISS in the service's process is the default and stays so (no network hop, ~1 ms at 100K
items), but a collection that outgrows one node needs a vector engine that shards it (Milvus). Everything
else about a version stays the same whichever backend holds its vectors: the version directory (ids,
vectors.npy, manifest.json written last), the Redis values, and the ONE `active` switch in Redis that decides
which version serves. A backend only answers "the k nearest rows of this version".

Rows: every backend speaks in rows of the version (row i = ids[i] = vectors.npy[i]), never in item ids, so
the reader's id mapping, the "like" vectors and the exact-scan fallback work the same for all of them.

Three objects:
  AnnBackend   per configuration: per-version naming, a writer for a new version, open, drop, stored versions
  AnnWriter    one version being built: add / delete / count, then commit (build the index; idempotent)
  AnnIndex     one committed version opened for reading: search, filtered search, count

Metadata filters (storage/filter_columns.py's condition tree) are translated by the backend, never by the
caller:
FAISS turns them into a row bitmap (IDSelectorBitmap) from the service's metadata columns, Milvus into its
boolean expression language over the collection's scalar fields.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np


class AnnUnavailable(RuntimeError):
    """The vector engine cannot be reached (down, timed out): transient, unlike a missing collection."""


@dataclass
class Filtered:
    rows: np.ndarray  # (<=k,) int64 rows of the version, best first
    scores: np.ndarray  # (<=k,) float32 inner products
    matching: int  # rows passing the filter (and not excluded)
    exact: bool  # every matching row was considered (an exact index, or the exact scan)
    how: str  # "faiss-idselector" | "milvus-expr" | "exact-scan" | "none-match"


class AnnIndex(ABC):
    """One committed version, opened for reading. Thread-safe for concurrent searches."""

    backend: str = ""
    d: int = 0

    @abstractmethod
    def count(self) -> int:
        """Vectors held for this version (checked against the manifest when the version is opened)."""

    @abstractmethod
    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """q (B, d) float32 unit norm -> (scores (B, k) float32, rows (B, k) int64; -1 past the end)."""

    @abstractmethod
    def prepare_filter(self, node, exclude_rows: list[int], columns: Callable[[], Any]) -> Any:
        """A filter tree (filter_model.Condition / AllOf / AnyOf) + rows never to return -> what search_filtered
        takes. columns() gives the version's metadata columns (service/filters.Columns): FAISS needs them,
        an engine that filters on its own scalar fields does not call it."""

    @abstractmethod
    def search_filtered(
        self, q: np.ndarray, k: int, prepared: Any, vectors_at: Callable[[np.ndarray], np.ndarray], exact_max: int
    ) -> Filtered:
        """The k best rows among those passing the prepared filter; q (d,). When an approximate index returns
        fewer than it could have while at most exact_max rows match, the matching rows are scanned exactly
        (vectors_at: rows -> their stored vectors)."""

    def describe(self) -> str:
        return self.backend

    def close(self) -> None:  # noqa: B027 - an optional hook: an in-process index holds nothing to close
        """Release what the index holds (nothing for FAISS: the index is garbage collected)."""


class AnnWriter(ABC):
    """One version being built. Rows are assigned in add order (row = number of vectors added before)."""

    wants_metadata: bool = False  # commit-time scalar fields: the caller passes each item's metadata dict

    @abstractmethod
    def add(self, vectors: np.ndarray, ids: list[str], metas: list[dict | None] | None = None) -> None:
        """Append vectors (n, d) for ids (and, when wants_metadata, their metadata dicts)."""

    @abstractmethod
    def delete(self, ids: list[str]) -> int:
        """Remove these ids from the version being built -> how many were there."""

    @abstractmethod
    def count(self) -> int:
        """Vectors in the version so far."""

    @abstractmethod
    def commit(self) -> str:
        """Build the index (a rerun after a kill builds it again from scratch) -> its description for the
        manifest's "factory" (a faiss.index_factory string, or e.g. "milvus:HNSW(M=32,efConstruction=40)")."""

    def manifest_entry(self) -> dict:
        """Written into the version's manifest.json as "ann": how a reader finds this version's index."""
        return {"backend": "faiss"}


class AnnBackend(ABC):
    name: str = ""

    @abstractmethod
    def location(self, name: str, version: str) -> str:
        """Where this version's index lives: a path, or a collection named from <prefix>_<name>_<version>."""

    @abstractmethod
    def writer(self, name: str, version: str, d: int, vdir: Path) -> AnnWriter: ...

    @abstractmethod
    def open(self, name: str, version: str, manifest: dict, vdir: Path) -> AnnIndex: ...

    @abstractmethod
    def drop(self, name: str, version: str) -> bool:
        """Delete this version's index (True when there was one). Idempotent."""

    @abstractmethod
    def stored_versions(self, name: str) -> list[str]:
        """Versions of `name` whose index exists in this backend (to find orphans for gc)."""


class UnsupportedFilter(ValueError):
    """A filter this backend cannot express (the service answers 422, naming what it can filter on)."""


def exact_scan(
    cand: np.ndarray, vectors_at: Callable[[np.ndarray], np.ndarray], q: np.ndarray, want: int, matching: int
) -> Filtered:
    """The `want` best of the candidate rows by exact inner product with their stored vectors."""
    s = vectors_at(cand) @ np.asarray(q, np.float32).reshape(-1)
    top = np.argpartition(-s, want - 1)[:want] if 0 < want < len(s) else np.arange(len(s))
    top = top[np.argsort(-s[top], kind="stable")][:want]
    return Filtered(np.asarray(cand, np.int64)[top], s[top].astype(np.float32), matching, True, "exact-scan")
