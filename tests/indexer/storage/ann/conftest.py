"""ANN backend fixtures: one embedded Milvus (milvus-lite, MilvusClient on a .db file) per test module, and
the indexer IndexerSettings that point the Milvus backend at it."""
from __future__ import annotations

import pytest

from crossprobe.indexer.jobs.settings import IndexerSettings


@pytest.fixture(scope="module")
def milvus_settings(tmp_path_factory):
    """IndexerSettings with ann_backend=milvus on a fresh milvus-lite file; the engine stops with the module."""
    from crossprobe.indexer.storage.ann import milvus_backend

    root = tmp_path_factory.mktemp("ann")
    s = IndexerSettings(index_root=root / "indexes", ann_backend="milvus", milvus_uri=str(root / "milvus.db"), progress=False)
    yield s
    milvus_backend.close_clients()
