"""FAISS in the process (the default): a version's index is <version dir>/index.faiss.

The factory is chosen by size (faiss_io.choose_factory), the index is built from the version's vectors in one
go at commit, HNSW searches with Settings.hnsw_ef_search (by size when unset: ef_search below) and IVF with
Settings.ivf_nprobe, and a filter is a row bitmap (faiss.IDSelectorBitmap) computed from the service's metadata
columns, or an exact scan of the matching rows when few enough match (bitmap_search says why). With a GPU asked
for (StorageSettings.device cuda), a version is searched on the GPU where it can be: gpu.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import faiss
import numpy as np

from crossprobe.storage import faiss_io, layout
from crossprobe.storage.ann.base import AnnBackend, AnnIndex, AnnWriter, Filtered, exact_scan


class FaissIndex(AnnIndex):
    backend = "faiss"

    def __init__(self, index: faiss.Index, ef: int | None = None, nprobe: int = 16):
        self.index = index
        if hasattr(index, "hnsw"):  # FAISS's default 16 gives a poor shortlist
            index.hnsw.efSearch = ef_search(ef, index.ntotal)
        if hasattr(index, "nprobe"):
            index.nprobe = nprobe
        self.d = index.d

    def count(self) -> int:
        return int(self.index.ntotal)

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        q = np.ascontiguousarray(np.atleast_2d(q), np.float32)
        scores, rows = self.index.search(q, k)
        return scores, rows

    def prepare_filter(self, node, exclude_rows: list[int], columns: Callable[[], Any]) -> np.ndarray:
        return row_mask(node, exclude_rows, columns)

    def search_filtered(
        self,
        q: np.ndarray,
        k: int,
        prepared: np.ndarray,
        vectors_at: Callable[[np.ndarray], np.ndarray],
        exact_max: int,
    ) -> Filtered:
        return bitmap_search(self.index, vectors_at, q, k, prepared, exact_max)

    def describe(self) -> str:
        return f"faiss:{type(self.index).__name__}"


def row_mask(node, exclude_rows: list[int], columns: Callable[[], Any]) -> np.ndarray:
    """(N,) bool: the rows passing the filter tree, less the excluded ones (the CPU and the GPU search take it)."""
    mask = columns().mask(node)
    if exclude_rows:
        mask[np.asarray(exclude_rows, np.int64)] = False
    return mask


def ef_search(configured: int | None, n: int) -> int:
    """HNSW's efSearch for an index of n items: the configured value, else by size, chosen on Flickr8k dev
    captions for recall@100 >= 0.95 against exact search (benchmarks/ann_sweep.py; docs/research/scaling.md): 256 up to
    200K items, 2048 above."""
    if configured:
        return configured
    return 256 if n <= 200_000 else 2048


def bitmap_search(
    index, vectors: Callable[[np.ndarray], np.ndarray], q: np.ndarray, k: int, mask: np.ndarray, exact_max: int
) -> Filtered:
    """The k best rows among mask's True rows. Flat index: FAISS with an IDSelectorBitmap (exact). Approximate
    index (HNSW, IVF) with at most exact_max matching rows: an exact scan of their stored vectors, because a
    selective filter starves HNSW's walk (too few, or poor, results: docs/research/search_features.md) while the
    scan is exact and cheap.
    More matching rows: FAISS with the bitmap (the filter barely prunes, so HNSW's own recall holds)."""
    matching = int(mask.sum())
    if matching == 0:
        return Filtered(np.zeros(0, np.int64), np.zeros(0, np.float32), 0, True, "none-match")
    want = min(k, matching)
    q = np.ascontiguousarray(np.asarray(q).reshape(1, -1), np.float32)
    flat = isinstance(index, faiss.IndexFlat)  # faiss.read_index / index_factory give the concrete class
    if not flat and matching <= exact_max:
        return exact_scan(np.flatnonzero(mask), vectors, q[0], want, matching)
    bits = np.packbits(mask, bitorder="little")
    sel = faiss.IDSelectorBitmap(len(mask), faiss.swig_ptr(bits))
    scores, rows = index.search(q, want, params=_params(index, sel))
    keep = rows[0] >= 0
    rows, scores = rows[0][keep].astype(np.int64), scores[0][keep].astype(np.float32)
    return Filtered(rows, scores, matching, flat or matching <= len(rows), "faiss-idselector")


def _params(index, sel) -> Any:
    # faiss's stubs (faiss/__init__.pyi) lack SearchParametersHNSW and give the SearchParameters classes an
    # __init__ without arguments; faiss's class_wrappers (handle_SearchParameters) take the fields as keywords.
    if hasattr(index, "hnsw"):  # FaissIndex set efSearch (Settings)
        return faiss.SearchParametersHNSW(sel=sel, efSearch=index.hnsw.efSearch)  # type: ignore[attr-defined]
    if hasattr(index, "nprobe"):
        return faiss.SearchParametersIVF(sel=sel, nprobe=index.nprobe)  # type: ignore[call-arg]  # stubs: see above
    return faiss.SearchParameters(sel=sel)  # type: ignore[call-arg]  # stubs: see above


class FaissWriter(AnnWriter):
    """Collects the version's vectors; commit builds the index over all of them (FAISS HNSW cannot delete, and
    IVF-PQ trains on a sample of the whole set: building once at the end is what the indexer always did)."""

    def __init__(self, backend: "FaissBackend", d: int, vdir: Path):
        self.backend, self.d, self.vdir = backend, d, vdir
        self._vectors: list[np.ndarray] = []
        self._ids: list[str] = []
        self.factory: str | None = None

    def add(self, vectors: np.ndarray, ids: list[str], metas: list[dict | None] | None = None) -> None:
        vectors = np.asarray(vectors, np.float32).reshape(-1, self.d)
        if len(vectors) != len(ids):
            raise ValueError(f"{len(vectors)} vectors for {len(ids)} ids")
        self._vectors.append(vectors)
        self._ids += list(ids)

    def delete(self, ids: list[str]) -> int:
        drop = set(ids)
        keep = np.asarray([i not in drop for i in self._ids], bool)
        if keep.all():
            return 0
        allv = self.vectors()
        self._vectors, self._ids = [allv[keep]], [i for i, k in zip(self._ids, keep) if k]
        return int((~keep).sum())

    def count(self) -> int:
        return len(self._ids)

    def vectors(self) -> np.ndarray:
        if not self._vectors:
            return np.zeros((0, self.d), np.float32)
        return np.ascontiguousarray(np.concatenate(self._vectors) if len(self._vectors) > 1 else self._vectors[0])

    def commit(self) -> str:
        vectors = self.vectors()
        self.factory = faiss_io.choose_factory(len(vectors), self.d, self.backend.settings)
        faiss_io.write_index(faiss_io.build_faiss(vectors, self.factory), self.vdir / layout.FAISS_INDEX)
        return self.factory


class FaissBackend(AnnBackend):
    name = "faiss"

    def __init__(self, settings):
        self.settings = settings

    def location(self, name: str, version: str) -> str:
        return str(Path(self.settings.index_root) / name / version / layout.FAISS_INDEX)

    def writer(self, name: str, version: str, d: int, vdir: Path) -> FaissWriter:
        return FaissWriter(self, d, vdir)

    def open(self, name: str, version: str, manifest: dict, vdir: Path) -> AnnIndex:
        """The version's index.faiss searched on the CPU; with a GPU asked for (StorageSettings.device), searched on
        the GPU where it can be (gpu.py says how)."""

        def on_cpu() -> FaissIndex:
            return FaissIndex(
                faiss.read_index(str(vdir / layout.FAISS_INDEX)), self.settings.hnsw_ef_search, self.settings.ivf_nprobe
            )

        from crossprobe.storage.ann import gpu

        device = gpu.wanted_device(self.settings)
        if device is None:
            return on_cpu()
        return gpu.open_on_device(device, vdir, self.settings.device_precision, on_cpu)

    def drop(self, name: str, version: str) -> bool:
        p = Path(self.location(name, version))  # Store.drop removes the whole directory; this is for callers
        if p.exists():  # that want only the index gone
            p.unlink()
            return True
        return False

    def stored_versions(self, name: str) -> list[str]:
        d = Path(self.settings.index_root) / name
        return sorted(p.parent.name for p in d.glob("v*/index.faiss")) if d.is_dir() else []
