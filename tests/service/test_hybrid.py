"""Issue 31: keyword and hybrid search through the API (service/hybrid.py), over a real index built by the
indexer with OCR on (rapidocr) and a manifest's captions, tags and fields, in a real Redis."""
from __future__ import annotations

import json

import pytest

from crossprobe.indexer import build
from crossprobe.indexer.jobs.settings import IndexerSettings
from tests.indexer.conftest import make_images
from tests.indexer.jobs.test_ocr import sign
from tests.service.conftest import Built, _client


@pytest.fixture(scope="module")
def hybrid_built(redis_server, redis_url, models_dir, svc_ckpt, bert, tmp_path_factory) -> Built:
    redis_server.flushall()
    root = tmp_path_factory.mktemp("hybrid-index")
    gallery = root / "gallery"
    files = make_images(gallery, 10)
    lines = [{"id": p.stem, "uri": str(p), "caption": f"a generated picture number {i}", "tags": ["noise"]}
             for i, p in enumerate(files)]
    lines[3].update(caption="a dog running on the beach", tags=["holiday"], album="Lisbon trip")
    receipt = sign(gallery / "receipt.jpg", "K7-2291")
    lines.append({"id": "receipt", "uri": str(receipt), "tags": ["paper"]})
    (root / "m.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    ixs = IndexerSettings(redis_url=redis_url, index_root=root / "indexes", models_dir=models_dir, batch_size=8,
                          threads=2, progress=False, ocr=True)
    version = build("photos", manifest=root / "m.jsonl", settings=ixs, ckpt=svc_ckpt, bert=bert,
                    log=lambda *_: None).version
    return Built(ixs, gallery, version, [x["id"] for x in lines])


@pytest.fixture(scope="module")
def client(hybrid_built, svc_ckpt, artifacts):
    yield from _client(hybrid_built, svc_ckpt, artifacts)


def _search(client, **body):
    r = client.post("/v1/search", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_word_read_in_an_image_finds_it_by_keyword_alone(client):
    body = _search(client, query='"K7-2291"', mode="keyword")
    assert body["mode"] == "keyword" and body["rerank"] == "none"
    assert [h["id"] for h in body["results"]] == ["receipt"]
    hit = body["results"][0]
    assert "K7-2291" in hit["metadata"]["text"]  # the OCR words are in the answer's metadata
    (h,) = [h for h in hit["highlights"] if h["field"] == "text"]
    assert h["text"][slice(*h["spans"][0])].upper().startswith("K7")
    assert hit["scores"]["keyword"] > 0 and body["keyword"]["phrases"] == ["K7-2291"]
    assert hit["scores"]["keyword_coverage"] == 1.0


def test_hybrid_is_the_default_and_puts_the_keyword_match_first(client):
    body = _search(client, query="receipt K7-2291", k=3, shortlist=3)
    assert body["mode"] == "hybrid" and body["keyword"]["hits"] >= 1
    assert body["results"][0]["id"] == "receipt"
    assert body["results"][0]["scores"]["rerank"] is not None  # a keyword candidate is reranked like the others
    assert "keyword" in body["timings_ms"]


def test_vector_mode_has_no_keyword_side(client):
    body = _search(client, query="receipt K7-2291", mode="vector")
    assert body["mode"] == "vector" and body["keyword"] is None
    assert all(h["highlights"] is None and h["scores"]["keyword"] is None for h in body["results"])


def test_captions_tags_file_names_and_fields_are_searched(client, hybrid_built):
    beach = hybrid_built.ids[3]
    for text in ("beach", "holiday", "lisbon", beach):
        body = _search(client, query=text, mode="keyword")
        assert body["results"][0]["id"] == beach, (text, body["results"])


def test_filters_apply_to_the_keyword_side(client):
    flt = {"field": "tags", "eq": "noise"}
    assert _search(client, query="K7-2291", mode="keyword", filter=flt)["results"] == []
    body = _search(client, query="K7-2291", filter=flt)
    assert "receipt" not in [h["id"] for h in body["results"]]


def test_a_query_of_stop_words_or_punctuation(client):
    for text in ("the of and", "?!...", "a"):
        r = client.post("/v1/search", json={"query": text, "mode": "keyword"})
        assert r.status_code == 422 and "no word to look up" in r.json()["error"]["message"], r.text
        body = _search(client, query=text)  # hybrid: the vector side answers alone
        assert body["mode"] == "hybrid" and body["keyword"]["words"] == [] and body["results"]


def test_a_single_512_character_word(client):
    for mode in ("keyword", "hybrid", "vector"):
        body = _search(client, query="x" * 512, mode=mode)
        assert body["mode"] == mode
    assert _search(client, query="x" * 512, mode="keyword")["results"] == []


def test_keyword_mode_without_a_text_is_422(client, hybrid_built):
    r = client.post("/v1/search", json={"like": hybrid_built.ids[0], "mode": "keyword"})
    assert r.status_code == 422 and "needs a query text" in r.text


def test_a_score_cutoff_keeps_keyword_matches(client):
    # (min_relevance takes the same path: pipeline/stages.py's cutoffs exempt keyword hits from both cutoffs)
    body = _search(client, query='"K7-2291"', min_score=1e9)
    assert [h["id"] for h in body["results"]] == ["receipt"] and body["total"] == 1


def test_clip_retrieval_route_stays_a_vector_search(client):
    r = client.post("/knn-service", json={"text": "receipt K7-2291", "num_images": 5, "deduplicate": False})
    assert r.status_code == 200, r.text
    vec = _search(client, query="receipt K7-2291", mode="vector", k=5)
    assert [x["id"] for x in r.json()] == [h["id"] for h in vec["results"]]


def test_a_keyword_index_that_fails_degrades_to_the_vector_side(client, monkeypatch):
    from crossprobe.storage import keyword

    def broken(self, *a, **k):
        raise ValueError("An error occurred in a thread: 'An IO error occurred: ...'")
    monkeypatch.setattr(keyword.KeywordIndex, "search", broken)
    body = _search(client, query="receipt K7-2291")
    assert body["degraded"] and "keyword_failed" in body["degraded_reason"] and body["results"]


def test_a_version_without_a_keyword_index_is_served_by_vectors(hybrid_built, svc_ckpt, artifacts, tmp_path):
    import shutil

    from crossprobe.storage import keyword

    vdir = hybrid_built.ixs.index_root / "photos" / hybrid_built.version
    shutil.move(vdir / keyword.DIR, tmp_path / keyword.DIR)  # as a version built before keyword indexes
    try:
        for c in _client(hybrid_built, svc_ckpt, artifacts):
            body = _search(c, query="receipt")
            assert body["mode"] == "vector" and body["mode_note"] is None and body["keyword"] is None
            body = _search(c, query="receipt", mode="hybrid")
            assert body["mode"] == "vector" and "no usable keyword index" in body["mode_note"]
            r = c.post("/v1/search", json={"query": "receipt", "mode": "keyword"})
            assert r.status_code == 422 and "no usable keyword index" in r.text
    finally:
        shutil.move(tmp_path / keyword.DIR, vdir / keyword.DIR)


# ---- the fusion and the mode rules, alone (service/hybrid.py) ---------------------------------------------------
def test_fuse_puts_a_full_keyword_match_first_and_weighs_partial_ones_down():
    import numpy as np

    from crossprobe.storage.keyword import parse
    from crossprobe.service.hybrid import KeywordOutcome, fuse

    ids = ["a", "b", "c", "d"]
    final = np.asarray([4.0, 3.0, 2.0, 1.0])  # the reranker's order: a b c d
    ranked = np.argsort(-final)
    full = KeywordOutcome(parse("zebra"), [("d", 5.0)], {"d": 1.0})
    order, is_kw = fuse(final, ranked, ids, full, k=20, weight=1.0, power=2.0)
    assert [ids[i] for i in order] == ["d", "a", "b", "c"] and is_kw.tolist() == [False, False, False, True]
    # the same match holding a third of the query's words: (1/3)^2 of the weight, a nudge (past the next two,
    # 1/24 + 1/189 > 1/22), not the top
    part = KeywordOutcome(parse("zebra crossing sign"), [("d", 5.0)], {"d": 1 / 3})
    order, _ = fuse(final, ranked, ids, part, k=20, weight=1.0, power=2.0)
    assert [ids[i] for i in order] == ["a", "d", "b", "c"]
    # ... while a second-ranked vector candidate holding it all passes the first
    order, _ = fuse(final, ranked, ids, KeywordOutcome(parse("x"), [("b", 1.0)], {"b": 1.0}), 20, 1.0, 2.0)
    assert [ids[i] for i in order][:2] == ["b", "a"]


def test_resolve_says_which_mode_runs():
    from crossprobe.service.exceptions import InvalidRequest
    from crossprobe.service.hybrid import resolve

    assert resolve(None, True, True) == ("hybrid", None)
    assert resolve(None, False, True) == ("vector", None)  # an image query: nothing to look up
    assert resolve(None, True, False) == ("vector", None)  # a version from before keyword indexes
    assert resolve("vector", True, True) == ("vector", None)
    mode, why = resolve("hybrid", True, False)
    assert mode == "vector" and "no usable keyword index" in why
    for has_text, has_index in ((False, True), (True, False)):
        with pytest.raises(InvalidRequest):
            resolve("keyword", has_text, has_index)
