"""Metadata filters (POST /v1/search "filter"): a typed condition tree -> a row bitmap -> FAISS IDSelector
(for an index version held by Milvus, the backend turns the same tree into a Milvus filter expression over
the collection's scalar fields instead: storage/ann/milvus_filter.py; these columns are then never read).

Fields are what the indexer records for every item (its metadata value in Redis, indexer/jobs/sources.py
item_metadata):
  tags    list of strings (manifest "tags")                 eq: has this tag; in: has any of these
  format  string (the file's format: JPEG, PNG...)          eq / in, case-insensitive
  camera  string (EXIF Make + Model, or the manifest's)     eq / in, case-insensitive
  caption string (manifest "caption")                       eq / in (exact text)
  width, height  integers (pixels of the original)          eq / in / gt / gte / lt / lte
  taken   date taken (EXIF DateTimeOriginal, or the manifest's "taken"), ISO 8601
                                                            gt / gte / lt / lte with ISO dates ("2019-05-01",
                                                            "2019-05-01T14:00:00"); wall-clock time, zones ignored
  added   when the item entered the index (UTC), ISO 8601   as taken
  <name>  any other scalar key of the manifest line (an album, a year, a rating, a flag)
                                                            eq / in (strings exact, numbers, true / false);
                                                            ranges with numbers, or with ISO dates where the
                                                            values are ISO dates
A field no item of the version has is 422 (a misspelt "albun" must not quietly match nothing).

How: while an index version loads (Settings.filter_preload; else on its first filtered search) every item's
metadata is read once (MGET in chunks) into
columns (numpy arrays for numbers and dates; an inverted list value -> rows for tags and strings) kept with
the version's handle, so later filters cost a few vectorised numpy operations. The tree becomes a boolean
mask over the version's rows, packed into the bitmap of a faiss.IDSelectorBitmap, and FAISS searches only
those rows (SearchParameters.sel): with the exact Flat index (below 20,000 items) that is exact, k results
whenever k items match. With an approximate index (HNSW, IVF) a selective filter starves the graph walk (it
meets too few passing rows and returns fewer than asked, or poor ones), so when at most
Settings.filter_exact_max rows match, their stored vectors are scanned exactly instead (exact, k whenever k
match); with more matching rows the filter prunes little and FAISS with the bitmap keeps HNSW's own recall
("exact": false). Measured over 100K items in docs/research/latency.md. Chosen over over-fetching (search k x m, then
filter): over-fetch has no bound that guarantees k for a selective filter, while the bitmap costs n / 8 bytes
per query and skips the non-matching rows inside FAISS.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable

import numpy as np

from crossprobe.storage.ann.faiss_backend import bitmap_search
from crossprobe.storage.filter_model import parse_date

NUMERIC = ("width", "height")
FOLDED = ("format", "camera")  # compared case-insensitively
STRINGS = FOLDED + ("caption",)
DATES = ("taken", "added")
BUILTIN = ("tags",) + STRINGS + NUMERIC + DATES


class UnknownField(ValueError):
    """A filter names a field that no item of the index version has (the service answers 422)."""


def _number(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else math.nan


class Column:
    """One field over the version's rows: raw values, an inverted list value -> rows (strings, booleans,
    tags), and numbers / dates as float arrays (NaN where a row has none: NaN matches no comparison)."""

    def __init__(self, n: int, values: list, fold: bool = False, multi: bool = False):
        self.n = n
        self.fold = fold
        inverted: dict[Any, list[int]] = {}
        numbers = np.full(n, np.nan)
        dates = np.full(n, np.nan)
        for row, v in enumerate(values):
            if v is None:
                continue
            for x in v if multi else [v]:
                if isinstance(x, (str, bool)):
                    inverted.setdefault(self._key(x), []).append(row)
            if not multi:
                numbers[row] = _number(v)
                dates[row] = np.nan if (t := parse_date(v)) is None else t
        self.inverted = {key: np.asarray(rows, np.int64) for key, rows in inverted.items()}
        self.numbers, self.dates = numbers, dates

    def _key(self, x: Any) -> Any:
        # bools keyed apart from strings ("true" is not true); case folded where the field says so
        return ("b", x) if isinstance(x, bool) else x.lower() if self.fold else x

    def equal(self, want: list) -> np.ndarray:
        out = np.zeros(self.n, bool)
        for w in want:
            if isinstance(w, (str, bool)):
                rows = self.inverted.get(self._key(w))
                if rows is not None:
                    out[rows] = True
            else:
                with np.errstate(invalid="ignore"):
                    out |= self.numbers == w
        return out

    def between(self, bounds: dict[str, float | str]) -> np.ndarray:
        """bounds {"gt"|"gte"|"lt"|"lte": number, or ISO date (then the row's value read as a date)}."""
        dated = any(isinstance(b, str) for b in bounds.values())
        col = self.dates if dated else self.numbers
        out = np.ones(self.n, bool)
        with np.errstate(invalid="ignore"):
            for op, b in bounds.items():
                x = parse_date(b) if dated else b
                assert x is not None, f"{op}: {b!r} is not an ISO date"  # Condition's validator refuses those
                out &= {"gt": np.greater, "gte": np.greater_equal, "lt": np.less, "lte": np.less_equal}[op](col, x)
        return out


class Columns:
    """One index version's filterable metadata as columns (rows in the version's FAISS order)."""

    def __init__(self, metas: list[dict | None]):
        n = len(metas)
        self.n = n
        ms = [m if isinstance(m, dict) else {} for m in metas]
        self.cols: dict[str, Column] = {
            "tags": Column(n, [[str(t) for t in (m.get("tags") or [])] for m in ms], multi=True)
        }
        for f in STRINGS + NUMERIC + DATES:
            self.cols[f] = Column(n, [m.get(f) for m in ms], fold=f in FOLDED)
        names = sorted({k for m in ms for k in (m.get("fields") or {}) if k not in BUILTIN})
        for f in names:
            self.cols[f] = Column(n, [(m.get("fields") or {}).get(f) for m in ms])

    def tag_counts(self, mask: np.ndarray | None, top: int) -> dict[str, int]:
        """Items per tag among mask's rows (all rows without one): the `top` most frequent, most frequent first
        (ties by tag). One vectorised count per distinct tag."""
        inv = self.cols["tags"].inverted
        counts = {t: (int(np.count_nonzero(mask[rows])) if mask is not None else len(rows)) for t, rows in inv.items()}
        best = sorted((c, t) for t, c in counts.items() if c)
        best.sort(key=lambda ct: (-ct[0], ct[1]))
        return {t: c for c, t in best[:top]}

    @property
    def fields(self) -> list[str]:
        return list(self.cols)

    def mask(self, node) -> np.ndarray:
        """A filter tree (filter_model.Condition / AllOf / AnyOf) -> bool (n,); UnknownField for a field no item has."""
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
        col = self.cols.get(c.field)
        if col is None:
            extra = [f for f in self.cols if f not in BUILTIN]
            raise UnknownField(
                f"field {c.field!r} is not recorded for any item of this index (its fields: "
                f"{', '.join(BUILTIN)}{'; from its manifest: ' + ', '.join(extra[:20]) if extra else ''})"
            )
        if c.eq is not None or c.in_ is not None:
            return col.equal([c.eq] if c.eq is not None else list(c.in_))
        return col.between({op: getattr(c, op) for op in ("gt", "gte", "lt", "lte") if getattr(c, op) is not None})


class ColumnCache:
    """Columns per IndexHandle, built on first use (one at a time per handle)."""

    def __init__(self) -> None:
        self._cols: Columns | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._cols is not None

    def get(self, load: Callable[[], list[dict | None]]) -> Columns:
        with self._lock:
            if self._cols is None:
                self._cols = Columns(load())
            return self._cols


def all_metadata(reader, chunk: int = 1000) -> list[dict | None]:
    """Every item's metadata value of an index version, in row order (MGETs of `chunk` keys)."""
    out: list[dict | None] = []
    for i in range(0, len(reader.ids), chunk):
        out += reader.metadata(reader.ids[i : i + chunk])
    return out


# FAISS's bitmap search (kept under its old name: storage/ann/faiss_backend.py holds it now, beside the other
# backends; Milvus turns the same tree into its own filter expression instead: storage/ann/milvus_filter.py)
search = bitmap_search
