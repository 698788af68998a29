"""ANN backend fixtures: the Milvus backend against both engines it is tested on, one per test module each:
  lite    milvus-lite (MilvusClient on a .db file): an engine inside this process, in `make test`
  server  a Milvus 2.3.5 standalone server (the `milvus` wheel, started by the session's `milvus_server`
          fixture: tests/conftest.py), marked milvus_server: `make test-milvus`
and the indexer IndexerSettings that point the Milvus backend at it."""
from __future__ import annotations

import pytest

from crossprobe.indexer.jobs.settings import IndexerSettings


@pytest.fixture(scope="module", params=["lite", pytest.param("server", marks=pytest.mark.milvus_server)])
def milvus_settings(request, tmp_path_factory):
    """IndexerSettings with ann_backend=milvus on a fresh milvus-lite file (the engine stops with the module), or
    on the session's Milvus server (emptied of collections first)."""
    from crossprobe.storage.ann import milvus_backend

    root = tmp_path_factory.mktemp("ann")
    if request.param == "lite":
        uri = str(root / "milvus.db")
    else:
        uri = request.getfixturevalue("milvus_server").uri
    s = IndexerSettings(index_root=root / "indexes", ann_backend="milvus", milvus_uri=uri, progress=False)
    if request.param == "server":
        c = milvus_backend.client(s)
        for coll in c.list_collections():
            c.drop_collection(coll)
    yield s
    milvus_backend.close_clients()
