"""Metadata filters (POST /v1/search "filter"): a typed condition tree -> a row bitmap -> FAISS IDSelector
(for an index version held by Milvus, the backend turns the same tree into a Milvus filter expression over
the collection's scalar fields instead: indexer/ann/milvus_filter.py; these columns are then never read).

Fields are what the indexer records for every item (its metadata value in Redis, indexer/jobs.py):
  tags    list of strings (manifest "tags")       eq: has this tag; in: has any of these
  format  string (the file's format: JPEG, PNG...)  eq / in (case-insensitive)
  width, height  integers (pixels of the original)  eq / in / gt / gte / lt / lte
  caption string (manifest "caption")              eq / in (exact text)
EXIF dates and cameras are not recorded by the indexer, so they are not offered (an unknown field is 422).

How: the first filtered search of an index version reads every item's metadata once (MGET in chunks) into
columns (numpy arrays; tags as an inverted list tag -> rows) kept with the version's handle, so later filters
cost a few vectorised numpy operations. The tree becomes a boolean mask over the version's rows, packed into
the bitmap of a faiss.IDSelectorBitmap, and FAISS searches only those rows (SearchParameters.sel): with the
exact Flat index (below 20,000 items) that is exact, k results whenever k items match. HNSW can stop short of
k when few rows pass (its graph walk meets too few of them), so when it returns fewer than asked while more
match, the matching rows' stored vectors are scanned exactly (at most Settings.filter_exact_max rows; more
matching rows than that and HNSW's answer stands, marked by "exact": false). Chosen over over-fetching
(search k x m, then filter): over-fetch has no bound that guarantees k for a selective filter, while the
bitmap costs n / 8 bytes per query and skips the non-matching rows inside FAISS.
"""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from crossprobe.indexer.ann.base import Filtered  # noqa: F401 (re-exported: the result of a filtered search)
from crossprobe.indexer.ann.faiss_backend import bitmap_search

NUMERIC = ("width", "height")
STRINGS = ("format", "caption")
FIELDS = ("tags",) + STRINGS + NUMERIC


class Columns:
    """One index version's filterable metadata as columns (rows in the version's FAISS order)."""

    def __init__(self, metas: list[dict | None]):
        n = len(metas)
        self.n = n
        self.numeric = {f: np.full(n, np.nan) for f in NUMERIC}
        self.strings: dict[str, np.ndarray] = {}
        self.tags: dict[str, np.ndarray] = {}
        tag_rows: dict[str, list[int]] = {}
        strings = {f: [None] * n for f in STRINGS}
        for row, m in enumerate(metas):
            if not isinstance(m, dict):
                continue
            for f in NUMERIC:
                v = m.get(f)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.numeric[f][row] = v
            for f in STRINGS:
                v = m.get(f)
                if isinstance(v, str):
                    strings[f][row] = v.lower() if f == "format" else v
            for t in m.get("tags") or []:
                tag_rows.setdefault(str(t), []).append(row)
        self.strings = {f: np.array(v, dtype=object) for f, v in strings.items()}
        self.tags = {t: np.asarray(rows, np.int64) for t, rows in tag_rows.items()}

    def mask(self, node) -> np.ndarray:
        """A filter tree (schemas.Condition / AllOf / AnyOf) -> bool (n,)."""
        if hasattr(node, "and_"):
            out = np.ones(self.n, bool)
            for child in node.and_:
                out &= self.mask(child)
            return out
        if hasattr(node, "or_"):
            out = np.zeros(self.n, bool)
            for child in node.or_:
                out |= self.mask(child)
            return out
        return self._condition(node)

    def _condition(self, c) -> np.ndarray:
        f = c.field
        if f == "tags":
            out = np.zeros(self.n, bool)
            for t in ([c.eq] if c.eq is not None else c.in_):
                rows = self.tags.get(str(t))
                if rows is not None:
                    out[rows] = True
            return out
        if f in STRINGS:
            col = self.strings[f]
            want = [c.eq] if c.eq is not None else list(c.in_)
            want = {w.lower() if f == "format" else w for w in want}
            return np.fromiter((v in want for v in col), bool, count=self.n)
        col = self.numeric[f]
        with np.errstate(invalid="ignore"):  # NaN (no value recorded) matches nothing
            if c.eq is not None:
                return col == c.eq
            if c.in_ is not None:
                return np.isin(col, np.asarray(c.in_, float))
            out = np.ones(self.n, bool)
            for bound, op in ((c.gt, np.greater), (c.gte, np.greater_equal), (c.lt, np.less),
                              (c.lte, np.less_equal)):
                if bound is not None:
                    out &= op(col, bound)
            return out


class ColumnCache:
    """Columns per IndexHandle, built on first use (one at a time per handle)."""

    def __init__(self) -> None:
        self._cols: Columns | None = None
        self._lock = threading.Lock()

    def get(self, load: Callable[[], list[dict | None]]) -> Columns:
        with self._lock:
            if self._cols is None:
                self._cols = Columns(load())
            return self._cols


# FAISS's bitmap search (kept under its old name: indexer/ann/faiss_backend.py holds it now, beside the other
# backends; Milvus turns the same tree into its own filter expression instead: indexer/ann/milvus_filter.py)
search = bitmap_search
