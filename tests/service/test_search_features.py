"""Issue 17: query by image, text + image, more like this, dedup, /knn-service image and embedding queries.

In process (TestClient) over conftest's real index (built by the indexer into a real Redis): the gallery's own
files are the query images, so "an indexed image finds itself first" is checked against the vectors the
indexer stored, not against a second computation of them.
"""
from __future__ import annotations

import base64
import io
import json
import zlib
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from crossprobe.indexer import open_index


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _files(built) -> dict[str, Path]:
    """item id -> its file in the gallery (the indexer records the file as metadata "uri")."""
    reader = open_index("photos", None, built.ixs)
    return {i: Path(m["uri"]) for i, m in zip(reader.ids, reader.metadata(reader.ids))}


def _stored(built, ids: list[str]) -> np.ndarray:
    return open_index("photos", None, built.ixs).vectors(ids)


def _search(client, **body):
    return client.post("/v1/search", json=body)


# ---- query by image ----------------------------------------------------------------------------
def test_an_indexed_image_finds_itself_first(client, built):
    files = _files(built)
    for item_id, path in files.items():
        r = _search(client, image=_b64(path.read_bytes()), k=3, rerank="cp")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["results"][0]["id"] == item_id, (item_id, [h["id"] for h in body["results"]])
        assert body["results"][0]["scores"]["ann"] == pytest.approx(1.0, abs=1e-4)  # the very vector stored
        assert body["query_kind"] == "image" and body["rerank"] == "none"
        assert "needs a text query" in body["rerank_skipped"]  # asked for cp: said why it did not run
        assert body["results"][0]["scores"]["rerank"] is None
        assert {"decode_image", "encode_image", "ann"} <= set(body["timings_ms"]) and "encode" not in body["timings_ms"]


def test_image_query_vector_is_the_stored_g_i(client, built):
    """The service's image encoder (the model's image parts, as the indexer runs them) gives the stored vector."""
    from crossprobe.service.query_image import pixels

    item_id, path = next(iter(_files(built).items()))
    state = client.app.state.svc
    g = state.models.encode_images(pixels(path.read_bytes(), 10**8)[None]).g[0]
    np.testing.assert_allclose(g, _stored(built, [item_id])[0], atol=1e-5)


def test_a_data_url_and_urlsafe_base64_are_accepted(client, built):
    item_id, path = next(iter(_files(built).items()))
    data = path.read_bytes()
    for text in (f"data:image/png;base64,{_b64(data)}", base64.urlsafe_b64encode(data).decode().rstrip("=")):
        r = _search(client, image=text, k=1)
        assert r.status_code == 200 and r.json()["results"][0]["id"] == item_id, r.text


def test_text_and_image_together(client, built):
    item_id, path = next(iter(_files(built).items()))
    image = _b64(path.read_bytes())
    r = _search(client, query="a red square", image=image, k=4, rerank="cp")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["query_kind"] == "text+image" and body["rerank"] == "cp" and body["rerank_skipped"] is None
    assert all(h["scores"]["rerank"] is not None for h in body["results"])
    assert {"encode", "encode_image", "rerank"} <= set(body["timings_ms"])
    # weight 1: the text's vector counts for nothing, so the ANN order is the image's (and it is first)
    r = _search(client, query="a red square", image=image, k=3, rerank="none", weight=1)
    assert r.json()["results"][0]["id"] == item_id
    assert r.json()["results"][0]["scores"]["ann"] == pytest.approx(1.0, abs=1e-4)
    # weight 0: the text alone
    text_only = _search(client, query="a red square", k=5, rerank="none").json()["results"]
    mixed0 = _search(client, query="a red square", image=image, k=5, rerank="none", weight=0).json()["results"]
    assert [h["id"] for h in mixed0] == [h["id"] for h in text_only]
    # 0.5: the ANN score is the cosine with the renormalised sum of the two unit vectors
    half = _search(client, query="a red square", image=image, k=12, rerank="none").json()["results"]
    by_id = {h["id"]: h["scores"]["ann"] for h in half}
    assert sorted(by_id.values(), reverse=True) == [h["scores"]["ann"] for h in half]


@pytest.mark.parametrize("image, status, code", [
    ("not base64 at all!", 422, "invalid_image"),
    (_b64(b"hello, not an image"), 422, "invalid_image"),
    (_b64(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64), 422, "invalid_image"),  # a PNG signature, then garbage
    (_b64(b"\xff\xd8\xff\xe0" + b"\x00" * 16), 422, "invalid_image"),  # a truncated JPEG
])
def test_invalid_images_are_422(client, image, status, code):
    r = _search(client, image=image)
    assert r.status_code == status and r.json()["error"]["code"] == code, r.text
    r = client.post("/knn-service", content=json.dumps({"image": image}))
    assert r.status_code == status and r.json()["error"]["code"] == code, r.text


def _png_header_only(w: int, h: int) -> bytes:
    """A PNG that claims w x h pixels: a decompression bomb's header (its data is never reached)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


def test_size_and_pixel_limits_are_413(built, svc_ckpt, artifacts):
    from fastapi.testclient import TestClient

    from crossprobe.service.app import create_app
    from crossprobe.service.server import wait_ready
    from tests.service.conftest import service_settings

    settings = service_settings(built, svc_ckpt, artifacts, query_image_max_bytes=2048,
                                query_image_max_pixels=100 * 100, warmup=False)
    with TestClient(create_app(settings)) as c:
        wait_ready(c)
        big = io.BytesIO()
        Image.fromarray((np.random.default_rng(0).random((90, 90, 3)) * 255).astype(np.uint8)).save(big, "PNG")
        assert len(big.getvalue()) > 2048
        r = c.post("/v1/search", json={"image": _b64(big.getvalue())})
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large", r.text
        for bomb in (_png_header_only(101, 100), _png_header_only(100_000, 100_000)):
            r = c.post("/v1/search", json={"image": _b64(bomb)})
            assert r.status_code == 413 and r.json()["error"]["code"] == "too_large", r.text
            assert "pixels" in r.json()["error"]["message"]
        small = io.BytesIO()
        Image.new("RGB", (100, 100), (10, 200, 30)).save(small, "PNG")
        assert c.post("/v1/search", json={"image": _b64(small.getvalue()), "k": 2}).status_code == 200


@pytest.mark.parametrize("body", [
    {"k": 3},  # nothing to search for
    {"image": "aGVsbG8=", "like": "x"},  # both
    {"query": "a dog", "image": ""},
    {"like": []},
    {"like": ["a"] * 33},
    {"query": "a dog", "weight": 1.5},
    {"query": "a dog", "weight": True},
    {"query": "a dog", "dedup": 0},
    {"query": "a dog", "dedup": 1.01},
])
def test_invalid_combinations_are_422(client, body):
    r = _search(client, **body)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text


# ---- more like this -----------------------------------------------------------------------------
def test_like_excludes_the_items_and_ranks_by_their_stored_vectors(client, built):
    ids = built.ids
    r = _search(client, like=ids[0], k=20)
    assert r.status_code == 200, r.text
    body = r.json()
    got = [h["id"] for h in body["results"]]
    assert ids[0] not in got and len(got) == len(ids) - 1  # everything else, the item itself never
    assert body["query_kind"] == "like" and body["rerank"] == "none" and "like" in body["timings_ms"]
    vecs = _stored(built, ids)
    cos = {i: float(vecs[ids.index(i)] @ vecs[0]) for i in got}
    assert got == sorted(got, key=lambda i: -cos[i])  # exact (Flat) order by the stored vectors' cosine
    for h in body["results"]:
        assert h["scores"]["ann"] == pytest.approx(cos[h["id"]], abs=1e-5)

    two = _search(client, like=ids[:2], k=20).json()["results"]
    assert not {ids[0], ids[1]} & {h["id"] for h in two} and len(two) == len(ids) - 2
    mean = vecs[:2].mean(axis=0)
    mean /= np.linalg.norm(mean)
    assert [h["id"] for h in two] == sorted((h["id"] for h in two), key=lambda i: -float(vecs[ids.index(i)] @ mean))

    # like + a text: reranked with the text, the items still excluded
    r = _search(client, like=ids[0], query="a red square", k=5, rerank="cp")
    assert r.status_code == 200 and r.json()["query_kind"] == "text+like" and r.json()["rerank"] == "cp"
    assert ids[0] not in {h["id"] for h in r.json()["results"]}


def test_like_unknown_ids_are_404_item_not_found(client, built):
    r = _search(client, like=[built.ids[0], "no-such-item", "nor-this"])
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert err["code"] == "item_not_found" and err["details"] == {"ids": ["no-such-item", "nor-this"]}
    assert _search(client, like="x", index="nope").json()["error"]["code"] == "index_not_found"


# ---- dedup ----------------------------------------------------------------------------------------
def test_dedup_drops_results_too_close_to_a_better_one(client, built):
    ids = built.ids
    vecs = _stored(built, ids)
    plain = _search(client, like=ids[0], k=20).json()["results"]
    got = [h["id"] for h in plain]
    sims = vecs @ vecs.T
    pair = [float(sims[ids.index(a), ids.index(b)]) for a in got for b in got if a < b]
    threshold = float(np.median(pair))  # a threshold that some pairs of this gallery are above
    r = _search(client, like=ids[0], k=20, dedup=threshold)
    assert r.status_code == 200, r.text
    kept = [h["id"] for h in r.json()["results"]]
    assert r.json()["deduplicated"] == len(got) - len(kept) > 0
    assert kept == [i for i in got if i in kept]  # the order is kept
    for n, a in enumerate(kept):  # no kept result is within the threshold of one ranked above it
        assert all(sims[ids.index(a), ids.index(b)] < threshold for b in kept[:n])
    for d in set(got) - set(kept):  # each dropped one was within it of a kept one ranked above it
        assert any(sims[ids.index(d), ids.index(b)] >= threshold for b in kept if got.index(b) < got.index(d))
    assert _search(client, like=ids[0], k=20, dedup=1.0).json()["deduplicated"] == 0


# ---- /knn-service ---------------------------------------------------------------------------------
def test_knn_service_image_and_embedding_queries(client, built):
    item_id, path = next(iter(_files(built).items()))
    base = {"num_images": 3, "num_result_ids": 5, "deduplicate": False}
    r = client.post("/knn-service", content=json.dumps({**base, "image": _b64(path.read_bytes())}),
                    headers={"Content-Type": "text/plain"})
    assert r.status_code == 200, r.text
    res = r.json()
    assert res[0]["id"] == item_id and res[0]["similarity"] == pytest.approx(1.0, abs=1e-4)
    assert len(res) == 5 and "url" in res[0] and all(set(x) == {"id", "similarity"} for x in res[3:])

    vec = _stored(built, [item_id])[0]
    r = client.post("/knn-service", json={**base, "embedding_input": (vec * 3).tolist()})  # renormalised
    assert r.status_code == 200, r.text
    assert [x["id"] for x in r.json()] == [x["id"] for x in res]
    # embedding_input first, as clip_back: the text is not used
    r2 = client.post("/knn-service", json={**base, "embedding_input": vec.tolist(), "text": "a red square"})
    assert [x["id"] for x in r2.json()] == [x["id"] for x in res]

    for bad in ([0.1] * (len(vec) + 1), [0.0] * len(vec), ["a"] * len(vec), []):
        r = client.post("/knn-service", json={**base, "embedding_input": bad, "text": "a red square"})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
    r = client.post("/knn-service", json={**base, "image": "", "text": "a red square"})  # "" is no image: 422
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
    r = client.post("/knn-service", content=b'{"embedding_input": [NaN' + b", 0.1" * (len(vec) - 1) + b"]}")
    assert r.status_code == 422, r.text


def test_every_finite_nonzero_embedding_has_a_direction(client, built):
    """Scaled far past float32's range, or far below it, a vector of the index's d is the same query (it was 422
    "must be finite and not all zero" after a float32 cast, or, under norm 1e-6, searched unnormalised)."""
    item_id = built.ids[0]
    vec = _stored(built, [item_id])[0].astype(np.float64)
    base = {"num_images": 3, "num_result_ids": 5, "deduplicate": False}
    want = client.post("/knn-service", json={**base, "embedding_input": vec.tolist()}).json()
    for scale in (1e300, 1e39, 1e-8, 1e-45, 1e-300):
        r = client.post("/knn-service", json={**base, "embedding_input": (vec * scale).tolist()})
        assert r.status_code == 200, (scale, r.text)
        assert [x["id"] for x in r.json()] == [x["id"] for x in want], scale
        assert [x["similarity"] for x in r.json()] == pytest.approx([x["similarity"] for x in want], abs=1e-5)
    one = [0.0] * len(vec)
    one[3] = 5e-324  # the smallest float: a direction too
    assert client.post("/knn-service", json={**base, "embedding_input": one}).status_code == 200


def test_an_embedding_of_another_length_is_the_documented_422(client, built):
    """6 values for a 64-d index: fuzz_hooks compared "holds vectors of 6" as text, found it in "... of 64" and
    called the server's correct 422 a failed check (4 seeds of 5 at 400 examples, issue 36)."""
    d = len(_stored(built, built.ids[:1])[0])
    for n in (1, 6, d - 1, d + 1, 10 * d):
        body = {"embedding_input": [0.5] * n}
        r = client.post("/knn-service", json=body)
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["message"] == f"invalid request: embedding_input has {n} values; index photos holds vectors of {d}"
        hooks = pytest.importorskip("tests.service.fuzz_hooks")  # needs schemathesis (the fuzz extra)
        assert hooks._explained_422("/knn-service", body, err), n
        assert not hooks._explained_422("/knn-service", {"embedding_input": [0.5] * d}, err), n


def test_knn_service_deduplicates_like_clip_back(client, built):
    """deduplicate (clip_back's default true) never returns two results with cosine >= 0.94; false returns all."""
    from crossprobe.service.routes.clip import DEDUP_COSINE

    item_id, path = next(iter(_files(built).items()))
    body = {"image": _b64(path.read_bytes()), "num_images": 12}
    everything = client.post("/knn-service", json={**body, "deduplicate": False}).json()
    assert len(everything) == len(built.ids)
    deduped = client.post("/knn-service", json=body).json()
    kept = [x["id"] for x in deduped]
    vecs = _stored(built, kept)
    sims = vecs @ vecs.T
    assert (sims[np.triu_indices(len(kept), 1)] < DEDUP_COSINE).all()


# ---- metadata filters -------------------------------------------------------------------------------
def _metas(built) -> dict[str, dict]:
    reader = open_index("photos", None, built.ixs)
    return dict(zip(reader.ids, reader.metadata(reader.ids)))


def test_filters_on_recorded_fields_return_k_matching_items(client, built):
    metas = _metas(built)
    widths = sorted(m["width"] for m in metas.values())
    cut = widths[len(widths) // 2]  # about half the gallery passes
    expect = {i for i, m in metas.items() if m["width"] >= cut}
    r = _search(client, query="a red square", k=len(expect), filter={"field": "width", "gte": cut})
    assert r.status_code == 200, r.text
    body = r.json()
    assert {h["id"] for h in body["results"]} == expect  # all of them: k results when k items match
    assert body["filtered"] == {"matching": len(expect), "exact": True, "method": "faiss-idselector"}
    assert "filter" in body["timings_ms"]

    # AND / OR, case-insensitive format, and the unfiltered order kept among the survivors
    flt = {"and": [{"field": "width", "gte": cut}, {"or": [{"field": "format", "in": ["png", "jpeg"]},
                                                           {"field": "height", "lt": 60}]}]}
    expect2 = {i for i in expect if metas[i]["format"].lower() in ("png", "jpeg") or metas[i]["height"] < 60}
    r = _search(client, query="a red square", k=12, rerank="none", filter=flt)
    got = [h["id"] for h in r.json()["results"]]
    assert set(got) == expect2 and r.json()["filtered"]["matching"] == len(expect2)
    everything = [h["id"] for h in _search(client, query="a red square", k=12, rerank="none").json()["results"]]
    assert got == [i for i in everything if i in expect2]

    # nothing matches: no results, said so
    r = _search(client, query="a red square", filter={"field": "width", "gt": 10_000})
    assert r.status_code == 200 and r.json()["results"] == []
    assert r.json()["filtered"] == {"matching": 0, "exact": True, "method": "none-match"}


def test_filters_with_like_and_image(client, built):
    metas = _metas(built)
    item = built.ids[0]
    fmt = metas[item]["format"]
    same = {i for i, m in metas.items() if m["format"] == fmt}
    r = _search(client, like=item, k=12, filter={"field": "format", "eq": fmt})
    assert r.status_code == 200, r.text
    assert {h["id"] for h in r.json()["results"]} == same - {item}
    assert r.json()["filtered"]["matching"] == len(same) - 1  # the like item is excluded before counting
    path = _files(built)[item]
    r = _search(client, image=_b64(path.read_bytes()), k=3, filter={"field": "format", "eq": fmt.lower()})
    assert r.json()["results"][0]["id"] == item


@pytest.mark.parametrize("flt", [
    {"field": "exif_date", "eq": "2020"},  # not recorded by the indexer
    {"field": "width", "eq": "wide"},
    {"field": "tags", "gte": 3},
    {"field": "tags"},
    {"field": "width", "gte": 1, "eq": 3},
    {"and": []},
    {"or": [{"field": "tags", "eq": "a"}], "and": [{"field": "tags", "eq": "b"}]},
    {"and": [{"field": "tags", "eq": str(i)} for i in range(65)]},
    "tags=dog",
])
def test_invalid_filters_are_422(client, flt):
    r = _search(client, query="a dog", filter=flt)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
    assert "filter" in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def tagged(built, client, svc_ckpt, bert, tmp_path_factory):
    """Index "tagged": the gallery again, from a manifest with tags and captions, as an HNSW index."""
    from crossprobe.indexer import build

    files = _files(built)
    lines = [{"id": f"t/{i}", "uri": str(p), "caption": f"photo {n}", "tags": ["even" if n % 2 == 0 else "odd"]
              + (["third"] if n % 3 == 0 else [])} for n, (i, p) in enumerate(sorted(files.items()))]
    manifest = tmp_path_factory.mktemp("tagged") / "tagged.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    ixs = built.ixs.model_copy(update={"factory": "HNSW32"})
    build("tagged", manifest=manifest, settings=ixs, ckpt=svc_ckpt, bert=bert, log=lambda *_: None)
    assert client.post("/admin/reload", headers={"X-Admin-Key": "s3cret-admin-key-0123"}).status_code == 200
    return lines


def test_tag_and_caption_filters_on_an_hnsw_index(client, tagged):
    odd = {x["id"] for x in tagged if "odd" in x["tags"]}
    r = _search(client, query="a red square", index="tagged", k=12, filter={"field": "tags", "eq": "odd"})
    assert r.status_code == 200, r.text
    assert {h["id"] for h in r.json()["results"]} == odd and r.json()["filtered"]["matching"] == len(odd)
    assert r.json()["filtered"]["exact"] is True
    either = {x["id"] for x in tagged if {"odd", "third"} & set(x["tags"])}
    r = _search(client, query="a red square", index="tagged", k=12, filter={"field": "tags", "in": ["odd", "third"]})
    assert {h["id"] for h in r.json()["results"]} == either
    r = _search(client, query="a red square", index="tagged", k=5,
                filter={"or": [{"field": "caption", "eq": "photo 3"}, {"field": "tags", "eq": "no-such-tag"}]})
    assert [h["id"] for h in r.json()["results"]] == [tagged[3]["id"]]


def test_a_selective_filter_on_hnsw_is_an_exact_scan():
    """filter_columns.search on an approximate index: at most exact_max matching rows -> an exact scan of them (never
    HNSW's starved walk); more -> FAISS with the bitmap, whose short answer stands, marked not exact."""
    import faiss

    from crossprobe.storage import filter_columns

    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((50, 8)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    index = faiss.index_factory(8, "HNSW8", faiss.METRIC_INNER_PRODUCT)
    index.add(vecs)

    class ShortHNSW:  # an HNSW index whose walk found only one matching row
        hnsw = index.hnsw

        def search(self, q, k, params=None):
            s, r = index.search(q, k, params=params)
            s[:, 1:], r[:, 1:] = -np.inf, -1
            return s, r

    mask = np.zeros(50, bool)
    mask[[3, 17, 29, 41]] = True
    q = vecs[17]
    f = filter_columns.search(ShortHNSW(), lambda rows: vecs[rows], q, 3, mask, exact_max=100)
    assert f.how == "exact-scan" and f.exact and f.matching == 4 and len(f.rows) == 3
    best = sorted([3, 17, 29, 41], key=lambda r: -float(vecs[r] @ q))[:3]
    assert list(f.rows) == best
    f = filter_columns.search(ShortHNSW(), lambda rows: vecs[rows], q, 3, mask, exact_max=2)  # too many to scan
    assert f.how == "faiss-idselector" and not f.exact and len(f.rows) == 1
    f = filter_columns.search(index, lambda rows: vecs[rows], q, 3, mask, exact_max=100)  # the real HNSW: all found
    assert list(f.rows) == best


# ---- upload: POST /v1/search/image with the file as the body ----------------------------------------------
def test_upload_an_image_file_as_the_body(client, built):
    item_id, path = next(iter(_files(built).items()))
    r = client.post("/v1/search/image", params={"k": 3}, content=path.read_bytes(),
                    headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 200, r.text
    assert r.json()["results"][0]["id"] == item_id and r.json()["query_kind"] == "image"
    r = client.post("/v1/search/image", params={"k": 3, "query": "a red square", "weight": 1, "rerank": "none"},
                    content=path.read_bytes(), headers={"Content-Type": "image/png"})
    assert r.json()["query_kind"] == "text+image" and r.json()["results"][0]["id"] == item_id
    for params, body, status, code in [({}, b"not an image", 422, "invalid_image"), ({}, b"", 422, "invalid_image"),
                                       ({"k": 0}, path.read_bytes(), 422, "invalid_request"),
                                       ({"query": "\u200b"}, path.read_bytes(), 422, "invalid_request"),
                                       ({"index": "nope"}, path.read_bytes(), 404, "index_not_found")]:
        r = client.post("/v1/search/image", params=params, content=body)
        assert r.status_code == status and r.json()["error"]["code"] == code, (params, r.text)


def test_a_progressive_jpeg_is_bounded_by_its_full_size_not_its_draft(built, svc_ckpt, artifacts):
    """A progressive JPEG's decode holds coefficients for the full picture whatever scale it is drafted to (issue
    55: a 767 KB one of 14000 x 14000 took 388 MB), so the pixel limit counts them: one whose full size is over it
    is 413 before any pixel is decoded, where the same picture as a baseline JPEG (drafted to 1/8) is answered."""
    from fastapi.testclient import TestClient

    from crossprobe.service.app import create_app
    from crossprobe.service.server import wait_ready
    from tests.service.conftest import service_settings

    settings = service_settings(built, svc_ckpt, artifacts, query_image_max_pixels=1_000_000, warmup=False)
    pic = Image.new("RGB", (1200, 1200), (120, 130, 140))
    files = {}
    for kind, progressive in (("progressive", True), ("baseline", False)):
        buf = io.BytesIO()
        pic.save(buf, "JPEG", quality=30, progressive=progressive)
        files[kind] = buf.getvalue()
    with TestClient(create_app(settings)) as c:
        wait_ready(c)
        r = c.post("/v1/search", json={"image": _b64(files["progressive"]), "k": 2})
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large", r.text
        assert "progressive JPEG decodes through its full-size coefficients" in r.json()["error"]["message"]
        assert c.post("/v1/search", json={"image": _b64(files["baseline"]), "k": 2}).status_code == 200
