"""Reranker heads on another model's backbone, end to end: an index built with `crossprobe:<heads dir>` stores the
heads' item features, and the service reranks its searches with them (issue 47, "the heads export and serve")."""
from __future__ import annotations

import pytest

from crossprobe.indexer import build, open_index
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.models.data.captioned import CaptionedFolder
from crossprobe.core.inference import FeatureDims, ItemDims
from crossprobe.service.server import wait_ready


@pytest.fixture(scope="module")
def heads_client(tiny_heads, redis_server, redis_url, tmp_path_factory):  # noqa: F811
    from fastapi.testclient import TestClient

    from crossprobe.service.app import create_app
    from crossprobe.service.settings import Settings

    redis_server.flushall()
    root = tmp_path_factory.mktemp("heads-index")
    ixs = IndexerSettings(redis_url=redis_url, index_root=root / "indexes", models_dir=tiny_heads.graphs, batch_size=16,
                          threads=1, progress=False)
    build("photos", images=tiny_heads.data / "images", settings=ixs, ckpt=tiny_heads.spec, log=lambda *_: None)
    settings = Settings(redis_url=redis_url, index_root=ixs.index_root, ckpt=tiny_heads.heads,
                        models_dir=tiny_heads.graphs, threads=1, workers=2, reload_interval_s=0, access_log=False,
                        batch_wait_ms=1.0)
    with TestClient(create_app(settings)) as c:
        wait_ready(c)
        yield c, ixs


def test_the_index_stores_the_heads_features(tiny_heads, heads_client):
    _, ixs = heads_client
    index = open_index("photos", None, ixs)
    m = index.manifest
    cfg = tiny_heads.config
    assert m["fingerprint"] == cfg["fingerprint"]  # the heads', which covers the backbone's
    assert FeatureDims.from_manifest(m["dims"]) == index.dims == FeatureDims(cfg["model"]["d"], ItemDims(4, 32, 32 * 8, 0))
    assert index.layout.item == index.dims.item  # the feature store's values hold the heads' p_v, b_bar, s_i
    assert len(index.ids) == 64


def test_searches_rerank_with_the_heads(tiny_heads, heads_client):
    client, _ = heads_client
    folder = CaptionedFolder.load(tiny_heads.data)
    firsts = {}
    for rerank in ("none", "cp"):
        for caption, row in zip(folder.captions, folder.caption_image):
            r = client.post("/v1/search", json={"query": caption, "k": 1, "shortlist": 64, "rerank": rerank})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["rerank"] == rerank and body["model"]["fingerprint"] == tiny_heads.config["fingerprint"]
            firsts.setdefault(rerank, []).append(body["results"][0]["id"] == folder.images[row])
    assert all(firsts["cp"])  # every caption finds its photo first: the trained ranking, through the feature store
    assert sum(firsts["none"]) < 32  # the backbone's own two-tower ranking alone does not
    r = client.post("/v1/search", json={"query": folder.captions[0], "k": 3, "rerank": "temde"})
    assert r.status_code == 200 and r.json()["rerank"] == "temde" and len(r.json()["results"]) == 3
