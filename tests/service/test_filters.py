"""Issue 17: filters over every recorded field (EXIF date taken and camera, the manifest's own fields), the
multipart upload, and a 1%-selective filter over a 100K-item HNSW index.

Against real indexes built by the indexer (and, for 100K items, grown by benchmarks/support/synthetic.py through the
store's own layout) in a real Redis, searched in process through the service (TestClient).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from crossprobe.indexer import open_index
from crossprobe.service.scope import EVERY

ADMIN = {"X-Admin-Key": "s3cret-admin-key-0123"}
CAMERAS = [("Canon", "Canon EOS 80D"), ("NIKON CORPORATION", "NIKON D750"), ("Apple", "iPhone 12"), None]


def _search(client, **body):
    return client.post("/v1/search", json=body)


def _reload(client) -> None:
    assert client.post("/admin/reload", headers=ADMIN).status_code == 200


@pytest.fixture(scope="module")
def described(built, client, svc_ckpt, bert, tmp_path_factory):
    """Index "described": 8 gallery images re-saved as JPEG with EXIF (4 cameras, dates 2018-2021, one with
    none), from a manifest with fields of its own (album, year, favourite, shot), one line overriding the
    EXIF date, and one bad line (a nested field)."""
    from crossprobe.indexer import build

    reader = open_index("photos", None, built.ixs)
    files = [Path(m["uri"]) for m in reader.metadata(reader.ids)][:8]
    folder = tmp_path_factory.mktemp("described")
    lines, expect = [], {}
    for n, src in enumerate(files):
        p = folder / f"d{n}.jpg"
        exif = Image.Exif()
        cam = CAMERAS[n % len(CAMERAS)]
        if cam is not None:
            exif[0x010F], exif[0x0110] = cam
            exif.get_ifd(0x8769)[0x9003] = f"{2018 + n % 4}:0{1 + n % 9}:15 12:30:00"
        with Image.open(src) as im:
            im.convert("RGB").save(p, "JPEG", exif=exif)
        line = {"id": f"d/{n}", "uri": str(p), "album": "holiday" if n < 4 else "home", "year": 2018 + n % 4,
                "favourite": n % 3 == 0, "shot": f"2020-0{1 + n}-01"}
        if n == 7:
            line["taken"] = "1999-12-31T23:59:00"  # the manifest's own date beats (here: absent) EXIF
        lines.append(line)
        expect[line["id"]] = line
    lines.append({"id": "d/bad", "uri": str(folder / "d0.jpg"), "album": {"nested": "no"}})
    manifest = folder / "described.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = build("described", manifest=manifest, settings=built.ixs, ckpt=svc_ckpt, bert=bert, log=lambda *_: None)
    assert res.skipped.get("bad_manifest_line") == 1, res.skipped  # counted, not silently dropped
    _reload(client)
    return expect


def _ids(r) -> set[str]:
    assert r.status_code == 200, r.text
    return {h["id"] for h in r.json()["results"]}


def test_filter_columns_are_read_before_a_version_goes_live(described, client):
    handle = client.app.state.svc.registry.get("described", scope=EVERY)
    assert handle.columns.loaded  # Settings.filter_preload: the first filtered search pays nothing extra
    assert {"album", "year", "favourite", "shot"} <= set(handle.columns.get(lambda: []).fields)


def test_exif_and_manifest_fields_are_recorded(described, built):
    reader = open_index("described", None, built.ixs)
    metas = dict(zip(reader.ids, reader.metadata(reader.ids)))
    assert metas["d/0"]["camera"] == "Canon EOS 80D" and metas["d/0"]["taken"] == "2018-01-15T12:30:00"
    assert metas["d/1"]["camera"] == "NIKON D750"  # the make is not repeated
    assert metas["d/2"]["camera"] == "Apple iPhone 12"
    assert "camera" not in metas["d/3"] and "taken" not in metas["d/3"]  # no EXIF: no field, not an empty one
    assert metas["d/7"]["taken"] == "1999-12-31T23:59:00"
    assert metas["d/5"]["fields"] == {k: v for k, v in described["d/5"].items() if k not in ("id", "uri")}
    assert metas["d/0"]["format"] == "JPEG"


def test_filters_on_camera_dates_and_manifest_fields(described, client):
    def search(flt):
        return _ids(_search(client, query="a photo", index="described", k=20, rerank="none", filter=flt))

    by = lambda pred: {i for i, x in described.items() if pred(x)}  # noqa: E731
    n = lambda i: int(i.split("/")[1])  # noqa: E731
    assert search({"field": "camera", "eq": "canon eos 80d"}) == {i for i in described if n(i) % 4 == 0}
    assert search({"field": "camera", "in": ["NIKON D750", "Apple iPhone 12"]}) == {
        i for i in described if n(i) % 4 in (1, 2)}
    # EXIF dates d0 2018-01-15, d1 2019-02-15, d2 2020-03-15, d4 2018-05-15, d5 2019-06-15, d6 2020-07-15
    assert search({"field": "taken", "gte": "2019-01-01", "lt": "2020-06-01"}) == {"d/1", "d/2", "d/5"}
    assert search({"field": "taken", "lt": "2000-01-01"}) == {"d/7"}
    assert search({"field": "year", "gte": 2020}) == by(lambda x: x["year"] >= 2020)
    assert search({"field": "album", "eq": "holiday"}) == by(lambda x: x["album"] == "holiday")
    assert search({"field": "favourite", "eq": True}) == by(lambda x: x["favourite"])
    assert search({"field": "favourite", "eq": "true"}) == set()  # a string is not the boolean
    assert search({"field": "shot", "gte": "2020-03-01", "lte": "2020-05-01"}) == {"d/2", "d/3", "d/4"}
    assert search({"and": [{"field": "album", "eq": "home"}, {"or": [{"field": "year", "eq": 2018},
                                                                      {"field": "favourite", "eq": True}]}]}) == \
        by(lambda x: x["album"] == "home" and (x["year"] == 2018 or x["favourite"]))
    r = _search(client, query="a photo", index="described", k=3, filter={"field": "camera", "eq": "Canon EOS 80D"})
    assert all(h["metadata"]["camera"] == "Canon EOS 80D" for h in r.json()["results"])


@pytest.mark.parametrize("flt, why", [
    ({"field": "albun", "eq": "holiday"}, "not recorded"),  # misspelt: 422, not an empty answer
    ({"field": "taken", "eq": "2019-01-01"}, "taken"),
    ({"field": "taken", "gte": 2019}, "taken"),
    ({"field": "taken", "gte": "last tuesday"}, "ISO 8601"),
    ({"field": "year", "gte": 2019, "lt": "2020-01-01"}, "all numbers or all ISO dates"),
    ({"field": "camera", "gte": "2019-01-01"}, "ranges"),
    ({"field": "width", "eq": True}, "numbers"),
    ({"field": "bad name", "eq": 1}, "filter"),
])
def test_invalid_field_filters_are_422(described, client, flt, why):
    r = _search(client, query="a photo", index="described", filter=flt)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
    assert why in r.json()["error"]["message"] and "filter" in r.json()["error"]["message"]


# ---- multipart upload and the upload route's filter ----------------------------------------------------
def test_multipart_upload_with_a_filter(described, client, built):
    reader = open_index("described", None, built.ixs)
    uri = Path(reader.metadata(["d/5"])[0]["uri"])
    r = client.post("/v1/search/image", params={"k": 3, "index": "described"},
                    files={"image": ("photo.jpg", uri.read_bytes(), "image/jpeg")})
    assert r.status_code == 200, r.text
    assert r.json()["results"][0]["id"] == "d/5" and r.json()["query_kind"] == "image"
    flt = json.dumps({"field": "album", "eq": "holiday"})  # d/5 is in "home": the filter must keep it out
    r = client.post("/v1/search/image", params={"k": 3, "index": "described", "filter": flt},
                    files={"image": ("photo.jpg", uri.read_bytes(), "image/jpeg")})
    assert r.status_code == 200 and _ids(r) <= {i for i in described if int(i[2:]) < 4}
    assert r.json()["filtered"]["matching"] == 4
    for kwargs, status, code in [
        ({"files": {"other": ("x.jpg", uri.read_bytes(), "image/jpeg")}}, 422, "invalid_request"),
        ({"files": {"image": ("x.jpg", b"not an image", "image/jpeg")}}, 422, "invalid_image"),
        ({"files": {"image": ("x.jpg", uri.read_bytes(), "image/jpeg")}, "params": {"filter": "{"}}, 422,
         "invalid_request"),
        ({"files": {"image": ("x.jpg", uri.read_bytes(), "image/jpeg")},
          "params": {"filter": json.dumps({"field": "tags", "gte": 1})}}, 422, "invalid_request"),
        ({"content": b"--xyz\r\nContent-Disposition: form-data; name=\"image\"\r\n\r\nabc",
          "headers": {"Content-Type": "multipart/form-data; boundary=xyz"}}, 422, None),
    ]:
        r = client.post("/v1/search/image", **kwargs)
        assert r.status_code == status, (kwargs.get("params"), r.text)
        assert code is None or r.json()["error"]["code"] == code, r.text


# ---- 1% of a 100K-item index -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def big(built, client):
    """Index "big": the 12 gallery items grown to 100,000 (benchmarks/support/synthetic.py): HNSW32, as the indexer
    chooses at this size, with the selectivity tags sel-0.01 (1,000 items) / sel-0.1 / sel-1.0."""
    from benchmarks.support import synthetic

    synthetic.grow(built.ixs, "photos", "big", 100_000, seed=3, log=lambda *_: None)
    _reload(client)
    reader = open_index("big", None, built.ixs)
    assert reader.manifest["factory"] == "HNSW32" and len(reader) == 100_000
    return reader


def test_a_one_percent_filter_over_100k_items_returns_k_matching_items(big, client):
    vecs = np.load(big.store.version_dir("big", big.version) / "vectors.npy", mmap_mode="r")
    tagged = np.array(["sel-0.01" in (m or {}).get("tags", []) for m in _all_meta(big)])
    assert tagged.sum() == 1000
    for k, rerank in [(10, "none"), (50, "cp")]:
        r = _search(client, query="a red square", index="big", k=k, rerank=rerank,
                    filter={"field": "tags", "eq": "sel-0.01"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["filtered"]["matching"] == 1000 and body["filtered"]["exact"] is True
        assert len(body["results"]) == k and not body["degraded"]
        rows = big.rows([h["id"] for h in body["results"]])
        assert tagged[rows].all()  # only matching items
    # the exact top 10 among the 1,000 by the stored vectors: what an exhaustive filtered search gives
    r = _search(client, like=big.ids[5], index="big", k=10, filter={"field": "tags", "eq": "sel-0.01"})
    got = big.rows([h["id"] for h in r.json()["results"]])
    cand = np.flatnonzero(tagged & (np.arange(len(tagged)) != 5))
    s = vecs[cand] @ vecs[5]
    assert set(got) == set(cand[np.argsort(-s)[:10]].tolist())
    # 10% and 100%: k results, all matching
    for tag, matching in [("sel-0.1", 10_000), ("sel-1.0", 100_000)]:
        r = _search(client, query="a red square", index="big", k=20, rerank="cp", filter={"field": "tags", "eq": tag})
        assert r.json()["filtered"]["matching"] == matching and len(r.json()["results"]) == 20


def _all_meta(reader) -> list[dict | None]:
    out: list[dict | None] = []
    for i in range(0, len(reader.ids), 5000):
        out += reader.metadata(reader.ids[i:i + 5000])
    return out


def test_tag_facets_count_the_matching_items(big, client):
    """facets: items per tag among all the items passing the filter (not only the k returned)."""
    r = _search(client, query="a red square", index="big", k=5, rerank="none", facets=True)
    assert r.status_code == 200, r.text
    tags = r.json()["facets"]["tags"]
    assert tags["sel-1.0"] == 100_000 and tags["sel-0.1"] == 10_000 and tags["sel-0.01"] == 1_000
    assert list(tags) == sorted(tags, key=lambda t: (-tags[t], t))  # most frequent first
    r = _search(client, query="a red square", index="big", k=5, rerank="none", facets=True,
                filter={"field": "tags", "eq": "sel-0.1"})
    tags = r.json()["facets"]["tags"]
    assert tags["sel-0.1"] == tags["sel-1.0"] == 10_000 and tags["sel-0.01"] == 1_000  # sel-0.01 is inside sel-0.1
    assert _search(client, query="a red square", index="big", k=5).json()["facets"] is None  # off by default
