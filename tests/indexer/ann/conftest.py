"""ANN backend fixtures: one embedded Milvus (milvus-lite, MilvusClient on a .db file) per test module, and
the indexer Settings that point the Milvus backend at it."""
from __future__ import annotations

import pytest

from crossprobe.indexer.redis_conn import Settings


@pytest.fixture(scope="module")
def milvus_settings(tmp_path_factory):
    """Settings with ann_backend=milvus on a fresh milvus-lite file; the engine stops with the module."""
    from crossprobe.indexer.ann import milvus_backend

    root = tmp_path_factory.mktemp("ann")
    s = Settings(root=root / "indexes", ann_backend="milvus", milvus_uri=str(root / "milvus.db"), progress=False)
    yield s
    milvus_backend.close_clients()
