"""Issue 34: what a photo library expects of a search. Pages (offset, total, next_offset), sort by date taken /
date added, and the library's formats (HEIC, AVIF, camera RAW as DNG) served and searched with.

Against real indexes built by the indexer into a real Redis (conftest's "photos", 12 images, and "library"
below), searched in process through the service (TestClient).
"""
from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from benchmarks import library_files
from crossprobe.indexer import open_index

ADMIN = {"X-Admin-Key": "s3cret-admin-key-0123"}


def _search(client, **body):
    return client.post("/v1/search", json=body)


def _ok(r) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def _ids(body: dict) -> list[str]:
    return [h["id"] for h in body["results"]]


# ---- pages ---------------------------------------------------------------------------------------------------
def test_pages_cover_the_ranked_answer_once(client):
    whole = _ok(_search(client, query="a red square", k=12, rerank="cp"))
    assert whole["total"] == 12 and whole["offset"] == 0 and whole["next_offset"] is None  # 12 items, shortlist 100
    assert whole["sort"] == "relevance"
    pages, offset = [], 0
    while offset is not None:
        body = _ok(_search(client, query="a red square", k=5, rerank="cp", offset=offset))
        assert body["total"] == 12 and body["offset"] == offset
        pages.append(_ids(body))
        offset = body["next_offset"]
    assert [len(p) for p in pages] == [5, 5, 2]
    assert sum(pages, []) == _ids(whole)  # the same ranking on every page: nothing twice, nothing lost
    assert all(h["metadata"] for h in body["results"])  # metadata for the page's own results


@pytest.mark.parametrize("offset", [12, 13, 100, 1000])
def test_a_page_past_the_end_is_empty_with_the_total(client, offset):
    body = _ok(_search(client, query="a dog", k=5, offset=offset))
    assert body["results"] == [] and body["total"] == 12 and body["next_offset"] is None


def test_a_page_beyond_an_explicit_shortlist_is_empty(client):
    body = _ok(_search(client, query="a dog", k=5, shortlist=8, offset=5, rerank="none"))
    assert body["total"] == 8 and len(body["results"]) == 3 and body["next_offset"] is None
    body = _ok(_search(client, query="a dog", k=5, shortlist=8, offset=8, rerank="none"))
    assert body["results"] == [] and body["total"] == 8


@pytest.mark.parametrize("offset, why", [(-1, "greater than or equal to 0"), (1001, "less than or equal to 1000"),
                                         (10 ** 12, "less than or equal to 1000"), ("5", "integer"), (2.5, "integer"),
                                         (True, "integer")])
def test_bad_offsets_are_422(client, offset, why):
    r = _search(client, query="a dog", offset=offset)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
    assert "offset" in r.text and why in r.text, r.text


def test_offset_2_0_counts_as_2(client):
    assert _ok(_search(client, query="a dog", k=2, offset=2.0))["offset"] == 2


def test_total_counts_what_filter_min_score_and_dedup_leave(client, built):
    reader = open_index("photos", None, built.ixs)
    pngs = [i for i, m in zip(reader.ids, reader.metadata(reader.ids)) if m["format"] == "PNG"]
    body = _ok(_search(client, query="a dog", k=1, filter={"field": "format", "eq": "png"}))
    assert body["total"] == len(pngs) == body["filtered"]["matching"] and body["next_offset"] == (1 if len(pngs) > 1 else None)
    scores = [h["score"] for h in _ok(_search(client, query="a dog", k=12, rerank="none"))["results"]]
    cut = scores[4]
    body = _ok(_search(client, query="a dog", k=2, rerank="none", min_score=cut))
    assert body["total"] == sum(s >= cut for s in scores) and body["next_offset"] == 2
    body = _ok(_search(client, query="a dog", k=2, rerank="none", dedup=0.01))  # almost everything is a duplicate
    assert body["total"] == 12 - body["deduplicated"] and body["total"] < 12


def test_upload_pages(client, built):
    path = Path(open_index("photos", None, built.ixs).metadata(["img_000.jpg"])[0]["uri"])
    url = "/v1/search/image?k=4&offset=4"
    body = _ok(client.post(url, content=path.read_bytes(), headers={"Content-Type": "image/jpeg"}))
    first = _ok(client.post("/v1/search/image?k=8", content=path.read_bytes()))
    assert body["total"] == 12 and body["offset"] == 4 and _ids(body) == _ids(first)[4:8]
    r = client.post("/v1/search/image?offset=-1", content=path.read_bytes())
    assert r.status_code == 422 and "offset" in r.text


# ---- an index of the library's formats, with dates -------------------------------------------------------------
# (kind, EXIF date taken or None, the manifest's "added" or None: the indexer's own time)
LIBRARY = [("jpeg", "2019:05:01 10:00:00", "2020-01-05T00:00:00"), ("heic", "2021:07:04 10:11:12", None),
           ("avif", "2018:01:01 08:00:00", "2020-01-03T00:00:00"), ("dng", "2020:02:29 12:00:00", None),
           ("png", None, "2020-01-04T00:00:00"), ("jpeg", None, None), ("heic", "2017:03:03 03:03:03", None)]


@pytest.fixture(scope="module")
def library(built, client, svc_ckpt, bert, tmp_path_factory) -> dict[str, dict]:
    """Index "library": JPEG, HEIC (one with the thumbnail phones write), AVIF, DNG (with its JPEG preview)
    and PNG files made here, some with EXIF dates, some with a manifest "added" date; -> id -> what it holds."""
    from crossprobe.indexer import build

    folder = tmp_path_factory.mktemp("library")
    lines, expect = [], {}
    for n, (kind, taken, added) in enumerate(LIBRARY):
        ext = {"jpeg": "jpg"}.get(kind, kind)
        opts = {"thumbnails": [320]} if kind == "heic" and n == 1 else {}
        p = library_files.write(folder / f"l{n}.{ext}", kind, 480 + 32 * n, 360, seed=100 + n, taken=taken, **opts)
        line = {"id": f"l{n}.{ext}", "uri": str(p)}
        if added:
            line["added"] = added
        lines.append(line)
        expect[line["id"]] = {"kind": kind, "taken": taken and taken.replace(":", "-", 2).replace(" ", "T"),
                              "added": added, "path": p}
    manifest = folder / "library.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = build("library", manifest=manifest, settings=built.ixs, ckpt=svc_ckpt, bert=bert, log=lambda *_: None)
    assert res.count == len(LIBRARY) and res.skipped == {}, res.skipped
    assert client.post("/admin/reload", headers=ADMIN).status_code == 200
    return expect


def test_every_format_is_indexed_with_its_facts(library, built):
    reader = open_index("library", None, built.ixs)
    metas = dict(zip(reader.ids, reader.metadata(reader.ids)))
    fmt = {"jpeg": "JPEG", "heic": "HEIF", "avif": "AVIF", "dng": "DNG", "png": "PNG"}
    for item_id, want in library.items():
        m = metas[item_id]
        assert m["format"] == fmt[want["kind"]], m
        assert m.get("taken") == want["taken"], m  # EXIF DateTimeOriginal: from HEIC, AVIF and the DNG's TIFF too
        assert m["added"] == want["added"] if want["added"] else m["added"] > "2025", m  # else: the build's time
    assert metas["l3.dng"]["width"] == 480 + 32 * 3 and metas["l3.dng"]["camera"] == "Crossprobe TestCam DNG"


def test_each_format_as_a_query_image_finds_itself(client, library):
    """The upload path reads what the indexer read: the same pixels, so the very vector stored (cosine 1)."""
    for item_id, want in library.items():
        data = want["path"].read_bytes()
        body = _ok(_search(client, image=base64.b64encode(data).decode(), k=1, index="library"))
        assert _ids(body) == [item_id] and body["results"][0]["scores"]["ann"] == pytest.approx(1.0, abs=1e-4)
        body = _ok(client.post("/v1/search/image?k=1&index=library", files={"image": (want["path"].name, data)}))
        assert _ids(body) == [item_id]


def test_each_format_has_a_thumbnail(client, library):
    for item_id in library:
        r = client.get(f"/v1/items/{item_id}/image?index=library&size=64")
        assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg", (item_id, r.text[:200])
        assert max(Image.open(io.BytesIO(r.content)).size) == 64


def _dated(library: dict, key: str, newest_first: bool) -> list[str]:
    dated = sorted((v[key], i) for i, v in library.items() if v[key])
    return [i for _, i in (dated[::-1] if newest_first else dated)]


@pytest.mark.parametrize("sort", ["date_taken", "-date_taken"])
def test_sort_by_date_taken_puts_the_undated_last_in_relevance_order(client, library, sort):
    relevance = _ids(_ok(_search(client, query="a photo", k=7, index="library", rerank="none")))
    body = _ok(_search(client, query="a photo", k=7, index="library", rerank="none", sort=sort))
    assert body["sort"] == sort and body["total"] == 7 and "sort" in body["timings_ms"]
    dated = _dated(library, "taken", sort.startswith("-"))
    assert _ids(body)[:len(dated)] == dated
    assert _ids(body)[len(dated):] == [i for i in relevance if not library[i]["taken"]]
    pages = _ids(_ok(_search(client, query="a photo", k=3, index="library", rerank="none", sort=sort))) + \
        _ids(_ok(_search(client, query="a photo", k=3, offset=3, index="library", rerank="none", sort=sort))) + \
        _ids(_ok(_search(client, query="a photo", k=3, offset=6, index="library", rerank="none", sort=sort)))
    assert pages == _ids(body)  # pages of a sorted answer: the same order


def test_sort_by_date_added(client, library, built):
    body = _ok(_search(client, query="a photo", k=7, index="library", rerank="cp", sort="date_added"))
    listed = [i for i in _ids(body) if library[i]["added"]]
    assert listed == _dated(library, "added", False) and _ids(body)[:3] == listed  # 2020 dates, then the build's
    newest = _ok(_search(client, query="a photo", k=7, index="library", sort="-date_added"))
    assert _ids(newest)[-3:] == listed[::-1]


def test_sort_applies_above_the_cutoff(client, library):
    ranked = _ok(_search(client, query="a photo", k=7, index="library", rerank="none"))["results"]
    cut = ranked[3]["score"]
    body = _ok(_search(client, query="a photo", k=7, index="library", rerank="none", min_score=cut,
                       sort="-date_taken"))
    above = {h["id"] for h in ranked if h["score"] >= cut}
    assert set(_ids(body)) == above and body["total"] == len(above)


def test_bad_sorts_are_422(client):
    for sort in ("date", "taken", "", "+date_taken", None):
        r = _search(client, query="a dog", sort=sort)
        assert r.status_code == 422 and "sort" in r.text, (sort, r.text)
    assert client.post("/v1/search/image?sort=newest", content=b"x").status_code == 422


def test_added_is_a_date_filter_too(client, library):
    body = _ok(_search(client, query="a photo", k=7, index="library",
                       filter={"field": "added", "lt": "2020-01-04T12:00:00"}))
    assert set(_ids(body)) == {i for i, v in library.items() if v["added"] and v["added"] < "2020-01-04T12"}
    r = _search(client, query="a photo", index="library", filter={"field": "added", "eq": "x"})
    assert r.status_code == 422 and "ISO dates" in r.text
