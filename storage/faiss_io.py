"""Write FAISS stage: committed vectors -> faiss.index_factory index (inner product), files of a version.

Factory by size (vectors are unit norm, so inner product = cosine):
  n < flat_max (20k)    "Flat"               exact; 1 KB/item at d=256, ~ms to scan
  n < hnsw_max (2M)     "HNSW32"             graph over the full vectors, no training
  beyond                "IVF{nlist},PQ{d/8}" trained on a sample; 32 B/item at d=256
StorageSettings.factory / --factory overrides (any faiss.index_factory string).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol

import faiss
import numpy as np

from crossprobe.core.atomic import atomic_path
from crossprobe.core.atomic import durable_write as atomic_write  # fsynced: an index survives a power cut


class FactorySettings(Protocol):
    """What choose_factory reads: the indexer's settings (indexer/jobs/settings.py, IndexerSettings)."""

    @property
    def factory(self) -> str | None: ...
    @property
    def flat_max(self) -> int: ...
    @property
    def hnsw_max(self) -> int: ...


def choose_factory(n: int, d: int, settings: FactorySettings) -> str:
    if settings.factory:
        return settings.factory
    if n < settings.flat_max:
        return "Flat"
    if n < settings.hnsw_max:
        return "HNSW32"
    nlist = 1 << round(math.log2(4 * math.sqrt(n)))  # the usual 4*sqrt(n) lists, a power of two
    m = max(k for k in range(1, d // 8 + 1) if d % k == 0)  # PQ sub-quantizers must divide d
    return f"IVF{nlist},PQ{m}"


def build_faiss(vectors: np.ndarray, factory: str, seed: int = 0) -> faiss.Index:
    """vectors (N, d) float32 -> trained, filled index; row i of the index is vectors[i]."""
    n, d = vectors.shape
    index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        if n == 0:
            raise ValueError(f"factory {factory!r} needs training vectors and the index is empty")
        # a fixed-seed sample: k-means cost grows with the sample, not with n; 256 per list is plenty
        k = min(n, max(256 * getattr(index, "nlist", 1), 65_536))
        sample = vectors[np.sort(np.random.default_rng(seed).choice(n, k, replace=False))]
        index.train(sample)
    if n:
        index.add(vectors)
    return index


def write_index(index: faiss.Index, path: Path) -> None:
    with atomic_path(path) as tmp:
        faiss.write_index(index, str(tmp))


def write_vectors(vectors: np.ndarray, path: Path) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:  # a file object: np.save adds no ".npy"
        np.save(f, vectors)


def write_ids(ids: list[str], path: Path) -> None:
    import json

    atomic_write(path, json.dumps(ids, ensure_ascii=False))
