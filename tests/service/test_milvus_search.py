"""/v1/search over an index version held by Milvus answers exactly what the same gallery's FAISS Flat version
answers: the service finds the backend in the version's manifest, and filters go to Milvus as its own
expressions (the FAISS path's metadata columns are never read). On milvus-lite (`make test`) and on a Milvus
2.3.5 server (marked milvus_server: `make test-milvus`; the server's faults: test_milvus_server.py)."""
from __future__ import annotations

import pytest

from tests.service.conftest import _client, build_index


@pytest.fixture(scope="module", params=["lite", pytest.param("server", marks=pytest.mark.milvus_server)])
def milvus_uri(request, built, tmp_path_factory):
    from crossprobe.storage.ann import milvus_backend

    if request.param == "lite":
        uri = str(tmp_path_factory.mktemp("svc-milvus") / "milvus.db")
    else:
        uri = request.getfixturevalue("milvus_server").uri
    yield uri
    milvus_backend.close_clients()


@pytest.fixture(scope="module")
def mbuilt(built, milvus_uri, svc_ckpt, bert):
    """The module's gallery again, as index "photos-m" built with the Milvus backend (FLAT: 12 items)."""
    ixs = built.ixs.model_copy(update={"ann_backend": "milvus", "milvus_uri": milvus_uri})
    return build_index(ixs, built.gallery, svc_ckpt, bert, name="photos-m")


@pytest.fixture(scope="module")
def mclient(built, mbuilt, milvus_uri, svc_ckpt, artifacts):
    yield from _client(built, svc_ckpt, artifacts, milvus_uri=milvus_uri)


def _search(c, **body):
    r = c.post("/v1/search", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _ranked(res: dict) -> list[tuple[str, float]]:
    return [(h["id"], round(h["score"], 4)) for h in res["results"]]


@pytest.mark.parametrize("rerank", ["none", "cp", "temde"])
def test_milvus_version_answers_like_faiss_flat(mclient, rerank):
    info = {i["name"]: i for i in mclient.get("/v1/indexes").json()["indexes"]}
    assert info["photos"]["factory"] == "Flat" and info["photos-m"]["factory"] == "milvus:FLAT"
    for q in ("a red square", "dark blue picture", "green"):
        a = _search(mclient, query=q, k=8, rerank=rerank, index="photos")
        b = _search(mclient, query=q, k=8, rerank=rerank, index="photos-m")
        assert _ranked(a) == _ranked(b) and len(a["results"]) == 8
        assert not b.get("degraded")


def test_filters_and_like_through_milvus(mclient, built):
    metas = {i: mclient.get(f"/v1/items/{i}", params={"index": "photos"}).json()["metadata"] for i in built.ids[:12]}
    fmt = next(iter(metas.values()))["format"]
    flt = {"or": [{"field": "format", "eq": fmt.lower()}, {"field": "width", "gte": 100}]}
    a = _search(mclient, query="a red square", k=12, rerank="none", index="photos", filter=flt)
    b = _search(mclient, query="a red square", k=12, rerank="none", index="photos-m", filter=flt)
    assert _ranked(a) == _ranked(b) and a["filtered"]["matching"] == b["filtered"]["matching"] > 0
    assert b["filtered"]["method"] == "milvus-expr" and b["filtered"]["exact"] is True
    like = built.ids[3]
    a = _search(mclient, like=[like], k=5, index="photos", filter=flt)
    b = _search(mclient, like=[like], k=5, index="photos-m", filter=flt)
    assert _ranked(a) == _ranked(b) and like not in [h["id"] for h in b["results"]]


def test_milvus_unreachable_is_a_503_not_a_500(mclient, monkeypatch):
    from crossprobe.storage.ann import AnnUnavailable, milvus_backend

    def down(self, *a, **k):
        raise AnnUnavailable("Milvus search: connection refused")

    monkeypatch.setattr(milvus_backend.MilvusIndex, "_search", down)
    r = mclient.post("/v1/search", json={"query": "a red square", "index": "photos-m"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "ann_unavailable" and r.headers["Retry-After"]
    assert _search(mclient, query="a red square", index="photos")["results"]  # FAISS versions: unaffected


def test_a_field_milvus_does_not_hold_is_a_422(mclient):
    """camera, taken and manifest fields live in Redis metadata only: a Milvus-held version says so (422)."""
    for flt in ({"field": "camera", "eq": "x"}, {"field": "taken", "gte": "2020-01-01"}, {"field": "album", "eq": "a"}):
        r = mclient.post("/v1/search", json={"query": "a red square", "index": "photos-m", "filter": flt})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
        assert "held by Milvus" in r.json()["error"]["message"]


def test_keyword_and_hybrid_search_over_a_milvus_version(mclient, built):
    """Milvus 2.3.5 has no full-text search (docs/research/text_search.md): a Milvus version's keyword index is
    the same keyword index beside it, and a filter reaches its keyword side through the metadata columns."""
    name = built.ids[4].rsplit("/", 1)[-1].rsplit(".", 1)[0]  # a file name's stem: every item has its name indexed
    for index in ("photos", "photos-m"):
        body = _search(mclient, query=name, mode="keyword", index=index)
        assert [h["id"] for h in body["results"]] == [built.ids[4]], (index, body["results"])
        fmt = body["results"][0]["metadata"]["format"]
        other = {"field": "format", "in": [f for f in ("PNG", "JPEG", "GIF", "BMP", "TIFF", "WEBP") if f != fmt]}
        assert _search(mclient, query=name, mode="keyword", index=index, filter=other)["results"] == []
    a = _search(mclient, query=f"{name} a red square", k=8, index="photos")
    b = _search(mclient, query=f"{name} a red square", k=8, index="photos-m")
    assert a["mode"] == b["mode"] == "hybrid" and _ranked(a) == _ranked(b)
