"""The HTTP API in process (TestClient) against a real Redis and a real index built by the indexer."""
from __future__ import annotations

import io
import json
import re
import threading
import urllib.parse

import numpy as np
import pytest
from PIL import Image

from crossprobe.models import checkpoint


def _search(client, **body):
    return client.post("/v1/search", json=body)


# ---- validation: 422 with a stable code, never a 5xx -----------------------------------
@pytest.mark.parametrize("body, field", [
    ({"query": "a dog", "k": 5, "bogus": 1}, "bogus"),
    ({"query": "a dog", "k": 0}, "k"),
    ({"query": "a dog", "k": 201}, "k"),
    ({"query": ""}, "query"),
    ({"query": "   "}, "query"),
    ({"query": "x" * 513}, "query"),
    ({"query": "a dog", "k": 20, "shortlist": 10}, "shortlist"),
    ({"query": "a dog", "shortlist": 1001}, "shortlist"),
    ({"query": "a dog", "rerank": "bert"}, "rerank"),
    ({"query": "a dog", "k": "ten"}, "k"),
    ({"k": 3}, "query"),
])
def test_invalid_requests_are_422_with_a_clear_message(client, body, field):
    r = _search(client, **body)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_request"
    assert field in err["message"]
    assert any(field in d["field"] or field in d["message"] for d in err["details"])


@pytest.mark.parametrize("content, ctype", [(b"{not json", "application/json"), (b'{"query": "a"}', "text/plain"),
                                            (b"[1, 2]", "application/json")])
def test_malformed_bodies_are_422(client, content, ctype):
    r = client.post("/v1/search", content=content, headers={"Content-Type": ctype})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"


def test_unknown_index_and_route(client):
    r = _search(client, query="a dog", index="nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "index_not_found"
    assert client.get("/v1/items/img_000.jpg", params={"index": "nope"}).json()["error"]["code"] == "index_not_found"
    r = client.get("/v2/whatever")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert client.get("/v1/search").json()["error"]["code"] == "method_not_allowed"


# ---- search ---------------------------------------------------------------------------------
@pytest.mark.parametrize("rerank", ["cp", "temde", "none"])
def test_each_rerank_mode_returns_ranked_results_with_stage_timings(client, built, svc_ckpt, rerank):
    r = _search(client, query="a red square", k=5, rerank=rerank, shortlist=12)
    assert r.status_code == 200, r.text
    body = r.json()
    res = body["results"]
    assert len(res) == 5 and len({h["id"] for h in res}) == 5 and {h["id"] for h in res} <= set(built.ids)
    scores = [h["score"] for h in res]
    assert scores == sorted(scores, reverse=True)
    for h in res:
        assert h["score"] == (h["scores"]["ann"] if rerank == "none" else h["scores"]["rerank"])
        assert (h["scores"]["rerank"] is None) == (rerank == "none")
        assert h["metadata"]["id"] == h["id"] and h["metadata"]["width"] > 0 and "uri" not in h["metadata"]
    # "keyword": hybrid is the default mode, the index having a keyword index (tests/service/test_hybrid.py)
    stages = {"queue", "encode", "ann", "keyword", "metadata", "total"} | ({"fetch", "rerank"} if rerank != "none" else set())
    assert set(body["timings_ms"]) == stages and all(v >= 0 for v in body["timings_ms"].values())
    assert all(f"{s};dur=" in r.headers["server-timing"] for s in stages)
    assert body["index"] == {"name": "photos", "version": built.version}
    assert body["model"]["fingerprint"] == checkpoint.read_config(svc_ckpt)["fingerprint"]
    assert body["rerank"] == rerank and body["degraded"] is False


@pytest.mark.parametrize("rerank", ["cp", "temde"])
def test_rerank_scores_are_the_models_own(client_fp32, built, svc_ckpt, bert, rerank):
    """The service's ann and rerank scores equal the PyTorch model on the indexed features (fp32 query graph)."""
    import torch

    from crossprobe.models.graphs import CPScorer, QueryGraph, TemdeScorer
    from crossprobe.indexer import open_index
    from crossprobe.core import inputs

    q = "a small bright photo"
    res = _search(client_fp32, query=q, k=8, rerank=rerank, shortlist=12).json()["results"]
    ids = [h["id"] for h in res]
    rd = open_index("photos", None, built.ixs)
    feats = rd.features(ids)
    vecs = rd.store.read_vectors("photos", rd.version)[[rd.ids.index(i) for i in ids]]
    model, _ = checkpoint.load(svc_ckpt, bert)
    tid, mask = inputs.tokenize(inputs.load_tokenizer(), [q])
    with torch.inference_mode():
        g_q, p_t, w_bar, s_q, q_cls = QueryGraph(model)(torch.from_numpy(tid), torch.from_numpy(mask))
        s_tt = (g_q @ torch.from_numpy(vecs).T)[0]
        labels = torch.from_numpy(feats["labels"])  # region labels: the term the scorer graphs add
        if rerank == "cp":
            ref = CPScorer(model)(p_t, w_bar, torch.from_numpy(feats["p_v"]), torch.from_numpy(feats["b_bar"]), s_tt,
                                  q_cls, labels)
        else:
            ref = TemdeScorer(model)(s_q, torch.from_numpy(feats["s_i"]), s_tt, q_cls, labels)
    assert np.allclose([h["scores"]["ann"] for h in res], s_tt.numpy(), atol=1e-4)
    assert np.allclose([h["scores"]["rerank"] for h in res], ref.numpy(), atol=2e-3)


def test_int8_query_tower_stays_close_to_fp32(client, client_int8, built, svc_ckpt, artifacts):
    """The opt-in int8 query graph is quantized once beside the fp32 one (the default), says so in
    every response, and ranks like fp32 (scores within quantization noise)."""
    from crossprobe.service.state import load_model
    from tests.service.conftest import service_settings

    from crossprobe.core import int8

    fp = checkpoint.read_config(svc_ckpt)["fingerprint"]
    # the weights this host's int8 kernels need: query_tower.int8.onnx with VNNI, .int8-u8.onnx on AVX2 without it
    assert int8.graph_name(artifacts / fp / "query_tower.onnx", int8.weight_format()).exists()
    q = "a small bright photo"
    a = _search(client_int8, query=q, k=8, rerank="none", shortlist=12).json()
    b = _search(client, query=q, k=8, rerank="none", shortlist=12).json()
    assert a["model"]["query_precision"] == "int8" and b["model"]["query_precision"] == "fp32"
    sa = {h["id"]: h["score"] for h in a["results"]}
    sb = {h["id"]: h["score"] for h in b["results"]}
    common = sa.keys() & sb.keys()
    assert len(common) >= 6
    assert max(abs(sa[i] - sb[i]) for i in common) < 0.05
    g = [load_model(service_settings(built, svc_ckpt, artifacts, query_precision=p, int8_min_cosine=0.98))
         .encode_texts([q, "two dogs"]) for p in ("int8", "fp32")]
    for x, y in zip(*g):
        assert float(x.g_q @ y.g_q) / float(np.linalg.norm(x.g_q) * np.linalg.norm(y.g_q)) > 0.98
    info = client_int8.get("/readyz").json()["int8"]  # what the load-time check measured, and where
    assert info["required"] == 0.98 and 0.98 <= info["min_cosine"] < 1.0 and info["kernel"] and info["weights"]


def test_int8_below_the_stated_cosine_is_refused_with_the_kernel_path(built, svc_ckpt, artifacts):
    """A host whose int8 kernels cannot hold the stated cosine refuses int8 at load, never serves below it."""
    from crossprobe.core import int8
    from crossprobe.service.state import load_model
    from tests.service.conftest import service_settings

    with pytest.raises(int8.Int8Refused, match="cosine to fp32 is 0.9") as e:
        load_model(service_settings(built, svc_ckpt, artifacts, query_precision="int8", int8_min_cosine=0.99999))
    assert int8.kernel_path() in str(e.value) and "CROSSPROBE_QUERY_PRECISION=fp32" in str(e.value)


def test_defaults_and_min_score(client):
    body = _search(client, query="a photo").json()
    assert len(body["results"]) == 10 and body["rerank"] == "temde"  # k=10, the server's default reranker
    top = body["results"][0]["score"]
    kept = _search(client, query="a photo", min_score=top).json()["results"]
    assert [h["id"] for h in kept] == [body["results"][0]["id"]]
    assert _search(client, query="a photo", min_score=top + 1e6).json()["results"] == []


def test_concurrent_queries_are_batched_without_changing_results(client, monkeypatch):
    svc = client.app.state.svc
    queries = ["a cat", "a very long query about a red house next to a green tree", "snow", "two dogs playing"]
    alone = {q: _search(client, query=q, k=5).json()["results"] for q in queries}
    monkeypatch.setattr(svc.searcher.cache, "max_bytes", 0)  # the second round through the tower, not the cache
    monkeypatch.setattr(svc.batcher, "batch_wait", 0.5)  # long enough for all four to meet
    monkeypatch.setattr(svc.batcher, "busy", lambda n: True)  # wait even if the others are not admitted yet
    monkeypatch.setattr(svc.batcher, "largest_batch", 0)
    go, out = threading.Barrier(len(queries)), {}

    def one(q):
        go.wait()
        out[q] = _search(client, query=q, k=5)

    threads = [threading.Thread(target=one, args=(q,)) for q in queries]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    assert svc.batcher.largest_batch >= 2
    for q in queries:
        got = out[q].json()["results"]
        assert [h["id"] for h in got] == [h["id"] for h in alone[q]]
        assert np.allclose([h["score"] for h in got], [h["score"] for h in alone[q]], atol=1e-4)


def test_full_queue_answers_429_at_once(client, monkeypatch):
    svc = client.app.state.svc
    monkeypatch.setattr(svc.limiter, "size", 1)
    entered, release, first = threading.Event(), threading.Event(), []
    real = svc.models.encode_texts

    def held(texts):
        entered.set()
        release.wait(20)
        return real(texts)

    monkeypatch.setattr(svc.models, "encode_texts", held)
    t = threading.Thread(target=lambda: first.append(_search(client, query="first")))
    t.start()
    try:
        assert entered.wait(20)
        r = _search(client, query="second")
        assert r.status_code == 429 and r.json()["error"]["code"] == "overloaded" and r.headers["retry-after"]
        r = client.post("/knn-service", json={"text": "third", "num_images": 2})
        assert r.status_code == 429
    finally:
        release.set()
        t.join(20)
    assert first[0].status_code == 200


# ---- items, indexes ------------------------------------------------------------------
def test_items_and_their_images(client, built):
    item = "sub/img_004.tiff"
    body = client.get(f"/v1/items/{item}").json()
    assert body["id"] == item and body["metadata"]["format"] == "TIFF" and "uri" not in body["metadata"]
    r = client.get(f"/v1/items/{item}/image")
    assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
    img = Image.open(io.BytesIO(r.content))
    assert img.format == "JPEG" and max(img.size) <= 512
    assert max(Image.open(io.BytesIO(client.get(f"/v1/items/{item}/image", params={"size": 24}).content)).size) <= 24


@pytest.mark.parametrize("path", ["/v1/items/extra.png/image", "/v1/items/..%2F..%2Fetc%2Fpasswd/image",
                                  "/v1/items/%2Fetc%2Fpasswd/image", "/v1/items//etc/hostname/image",
                                  "/v1/items/nope"])
def test_only_indexed_items_can_be_read(client, built, path):
    Image.new("RGB", (8, 8)).save(built.gallery / "extra.png")  # on disk beside the indexed files, never indexed
    r = client.get(path)
    assert r.status_code == 404 and r.json()["error"]["code"] in ("item_not_found", "not_found")
    assert r.headers["content-type"].startswith("application/json")


def test_indexes_health_and_ready(client, built):
    idx = client.get("/v1/indexes").json()
    assert idx["default"] == "photos" and idx["unavailable"] == {}
    (info,) = idx["indexes"]
    assert info["name"] == "photos" and info["version"] == built.version and info["count"] == 12 and info["default"]
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json()["indexes"] == {"photos": built.version}


def test_not_ready_without_an_index(built, svc_ckpt, artifacts, tmp_path):
    from fastapi.testclient import TestClient

    from crossprobe.service.app import create_app
    from tests.service.conftest import service_settings

    s = service_settings(built, svc_ckpt, artifacts, index_root=tmp_path / "empty")
    with TestClient(create_app(s)) as c:
        assert c.get("/healthz").status_code == 200  # alive, waiting for an index: the HEALTHCHECK passes
        r = c.get("/readyz")
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
        r = _search(c, query="a dog")
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
        assert _search(c, query="a dog", k=0).status_code == 422  # bad input is still a 422
        assert c.get("/indices-list").json() == []


# ---- metrics -----------------------------------------------------------------------------
def test_metrics_expose_stages_requests_index_and_errors(client, built):
    _search(client, query="a dog", k=3, rerank="cp")
    _search(client, query="a dog", k=0)
    text = client.get("/metrics").text
    for stage in ("queue", "encode", "ann", "fetch", "rerank", "metadata"):
        assert re.search(rf'^crossprobe_stage_seconds_count{{stage="{stage}"}} [1-9]', text, re.M), stage
    assert re.search(r'^crossprobe_stage_seconds_bucket\{.*le="0.005".*\} ', text, re.M)
    assert re.search(r'^crossprobe_request_seconds_count\{endpoint="/v1/search",status="200"\} [1-9]', text, re.M)
    assert re.search(r'^crossprobe_requests_total\{endpoint="/v1/search",status="422"\} [1-9]', text, re.M)
    assert re.search(r'^crossprobe_errors_total\{kind="invalid_request"\} [1-9]', text, re.M)
    assert re.search(r'^crossprobe_index_items\{index="photos"\} 12\.0', text, re.M)
    # label order is the library's; other tests' indexes may share the process-wide registry: take photos' line
    infos = [m for m in re.findall(r'^crossprobe_index_version_info\{([^}]*)\} 1\.0$', text, re.M) if 'index="photos"' in m]
    assert len(infos) == 1 and f'version="{built.version}"' in infos[0]


# ---- clip-retrieval compatibility -------------------------------------------------------
KNN = {"text": "a red square", "image": None, "image_url": None, "modality": "image", "num_images": 3,
       "indice_name": "photos", "num_result_ids": 7, "use_mclip": False, "deduplicate": True,
       "use_safety_model": False, "use_violence_detector": False, "aesthetic_score": "", "aesthetic_weight": ""}


@pytest.mark.parametrize("headers", [{"Content-Type": "text/plain;charset=UTF-8"}, {"Content-Type": "application/json"},
                                     {}])
def test_clip_knn_service_accepts_any_content_type(client, built, headers):
    r = client.post("/knn-service", content=json.dumps(KNN).encode(), headers=headers)
    assert r.status_code == 200, r.text
    res = r.json()
    assert len(res) == 7 and len({x["id"] for x in res}) == 7 and {x["id"] for x in res} <= set(built.ids)
    sims = [x["similarity"] for x in res]
    assert sims == sorted(sims, reverse=True)
    for x in res[:3]:
        assert x["url"].endswith("/image?index=photos") and "caption" in x and x["width"] > 0
        assert client.get(x["url"]).headers["content-type"] == "image/jpeg"
    assert all(set(x) == {"id", "similarity"} for x in res[3:])  # ids only past num_images, as clip_back


def test_clip_lists_metadata_and_refusals(client, built):
    assert client.get("/indices-list").json() == ["photos"]
    ids = built.ids[:2] + ["not-there"]
    r = client.post("/metadata", content=json.dumps({"ids": ids, "indice_name": "photos"}),
                    headers={"Content-Type": "text/plain"})
    assert r.status_code == 200
    got = r.json()
    assert [x["id"] for x in got] == ids and got[2]["metadata"] is None
    assert got[0]["metadata"]["url"].endswith("/image?index=photos") and "uri" not in got[0]["metadata"]
    for bad, code in [({**KNN, "image": "aGVsbG8=", "text": None}, "invalid_image"),
                      ({**KNN, "image_url": "http://x/y.jpg"}, "unsupported"),
                      ({**KNN, "modality": "text"}, "unsupported"), ({**KNN, "text": None}, "invalid_request"),
                      ({**KNN, "num_images": 0}, "invalid_request")]:
        for ctype in ("application/json", None):  # JSON clients, and ClipClient (no Content-Type)
            r = client.post("/knn-service", content=json.dumps(bad), headers={"Content-Type": ctype} if ctype else {})
            assert r.status_code == 422 and r.json()["error"]["code"] == code, (bad, r.text)
        r = client.post("/knn-service", content=json.dumps(bad), headers={"Content-Type": "text/plain"})
        assert r.status_code == 422 and _notice(r)["error"]["code"] == code, (bad, r.text)  # the front's form
    r = client.post("/knn-service", content=b"text=cat", headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    r = client.post("/knn-service", content=json.dumps({**KNN, "indice_name": "nope"}))
    assert r.status_code == 404 and r.json()["error"]["code"] == "index_not_found"


def _notice(r) -> dict:
    """An error answer in clip-retrieval's front-end's form: clip_back's list, one result the front draws (a
    caption and a picture of the message) -> that result."""
    (notice,) = r.json()
    err = notice["error"]
    assert notice["id"] == f"crossprobe:{err['code']}" and notice["similarity"] == 0
    assert notice["caption"] == f"crossprobe: {err['message']}"
    assert notice["url"].startswith("data:image/svg+xml,")
    svg = urllib.parse.unquote(notice["url"].split(",", 1)[1])
    assert svg.startswith("<svg") and f"{err['code']} ({r.status_code})" in svg
    return notice


def test_errors_reach_clip_retrievals_front_end_as_a_notice(built, svc_ckpt, artifacts):
    """clip-retrieval's front-end posts text/plain and reads any answer as a list of results (an error object
    broke its drawing, silently): its errors come as one drawable result, with the status and headers kept,
    whether a route, a dependency (rate limit) or the body guard (413) answers. Other routes keep the object."""
    from fastapi.testclient import TestClient

    from crossprobe.service.app import create_app
    from crossprobe.service.server import wait_ready
    from tests.service.conftest import service_settings

    front = {"Content-Type": "text/plain;charset=UTF-8"}
    s = service_settings(built, svc_ckpt, artifacts, max_body_bytes=4096, warmup=False, rate_limit_rps=0.001,
                         rate_limit_burst=2)
    with TestClient(create_app(s)) as c:
        wait_ready(c)
        r = c.post("/knn-service", content=json.dumps({**KNN, "modality": "text"}), headers=front)
        assert r.status_code == 422 and "no text index" in _notice(r)["caption"]
        r = c.post("/knn-service", content=json.dumps({**KNN, "image": "A" * 8000}), headers=front)
        assert r.status_code == 413 and _notice(r)["error"]["code"] == "too_large"  # BodyGuard's answer
        assert c.post("/knn-service", content=json.dumps(KNN), headers=front).status_code == 200  # the 2nd token
        r = c.post("/knn-service", content=json.dumps(KNN), headers=front)
        assert r.status_code == 429 and _notice(r)["error"]["code"] == "rate_limited" and r.headers["Retry-After"]
        r = c.post("/metadata", content=json.dumps({"ids": "x"}), headers=front)  # not /knn-service: the object
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"


def test_options_not_applied_are_named(client, built):
    """safety, violence, aesthetic and mclip are accepted and not applied: nothing is dropped for them (the same
    answer as without), and the X-Crossprobe-Ignored header names the ones asked for."""
    plain = client.post("/knn-service", content=json.dumps(KNN))
    assert plain.status_code == 200 and "x-crossprobe-ignored" not in plain.headers
    asked = {**KNN, "use_safety_model": True, "use_violence_detector": True, "aesthetic_score": "9",
             "aesthetic_weight": "0.5", "use_mclip": True}
    r = client.post("/knn-service", content=json.dumps(asked), headers={"Content-Type": "text/plain"})
    assert r.status_code == 200 and r.json() == plain.json()
    assert r.headers["x-crossprobe-ignored"] == "use_safety_model,use_violence_detector,aesthetic_score,use_mclip"


# ---- input limits (issue 16, item 3) ------------------------------------------------------
@pytest.mark.parametrize("value", [False, True, "1e2", "0.5", [1], {"v": 1}])
def test_min_score_is_a_strict_number(client, value):
    r = _search(client, query="a photo", min_score=value)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
    assert "min_score" in r.json()["error"]["message"]


def test_min_score_accepts_json_numbers(client):
    for value in (0, -1, 0.25):
        assert _search(client, query="a photo", k=2, min_score=value).status_code == 200


@pytest.mark.parametrize("text", ["\x00", "\x00\x00\x00", "\u200b\u200c\u200d\ufeff", "\u2060\u00ad ", "\u3164\u115f",
                                  " \t\u3000\u2028", "\u202e\u202d"])
def test_invisible_queries_are_blank(client, text):
    r = _search(client, query=text)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
    assert "blank" in r.json()["error"]["message"]
    r = client.post("/knn-service", content=json.dumps({**KNN, "text": text}))
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text


def test_visible_text_with_invisible_characters_is_searched(client):
    assert _search(client, query="a\u200bdog\x00", k=2).status_code == 200


# ---- what "visible" means, on every route that takes a query text (schemas.QueryText; issue 36) -------------
# Invisible: categories Cc Cf Cn Co Cs Zs Zl Zp and the blank fillers; private use (Co) included, in the BMP and in
# planes 15-16. Cs (a lone surrogate) cannot travel as UTF-8: tests/service/test_schemas.py checks it.
INVISIBLE = {"Cc": "\x00\x1f\x7f", "Cf": "\u200b\u2060\U000e0041", "Cn": "\U000bb8ac\u0378",
             "Co": "\ue000\uf8ff", "Co planes 15-16": "\U000fedee\U0010fffd", "Zs": " \u00a0\u3000",
             "Zl": "\u2028", "Zp": "\u2029", "blank fillers": "\u115f\u1160\u3164\uffa0\u2800",
             "issue 36": "\U000fedee\U000bb8ac", "mixed": "\ue000 \u200b\x00\u2029"}
# Visible: letters, marks, numbers, punctuation, symbols (a private-use character beside one does no harm)
VISIBLE = {"Lu": "A", "Ll": "a", "Lo": "\u72ac", "Mn": "\u0301", "Nd": "7", "Po": "?", "Sm": "+", "Sc": "$",
           "So": "\U0001f415", "with private use": "\ue000dog\U000fedee"}


def _tiny_webp() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(buf, "WEBP")
    return buf.getvalue()


def _blank(r, field: str) -> None:
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_request" and "blank" in err["message"], err
    assert [d["field"] for d in err["details"]] == [field] and err["details"][0]["type"] == "value_error", err


@pytest.mark.parametrize("kind", list(INVISIBLE))
def test_an_invisible_query_is_blank_on_every_route(client, built, kind):
    text = INVISIBLE[kind]
    _blank(_search(client, query=text), "query")
    _blank(client.post("/v1/explain", json={"query": text, "ids": built.ids[:1]}), "query")
    _blank(client.post("/v1/search/image", params={"query": text, "k": 2}, content=_tiny_webp(),
                       headers={"Content-Type": "image/webp"}), "query.query")
    r = client.post("/knn-service", content=json.dumps({**KNN, "text": text}))
    assert r.status_code == 422 and "non-blank" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("kind", list(VISIBLE))
def test_a_visible_query_is_searched_on_every_route(client, kind):
    text = VISIBLE[kind]
    assert _search(client, query=text, k=2).status_code == 200
    r = client.post("/v1/search/image", params={"query": text, "k": 2}, content=_tiny_webp(),
                    headers={"Content-Type": "image/webp"})
    assert r.status_code == 200 and r.json()["query_kind"] == "text+image", r.text
    assert client.post("/knn-service", content=json.dumps({**KNN, "text": text})).status_code == 200


def test_the_issue_36_request_gets_the_documented_422(client):
    """The request schemathesis called "schema-valid, rejected" (ST202): its query is a private-use and an
    unassigned character. It is still 422 (private use is invisible), and the document now says so for the
    parameter too (test_openapi.py::test_every_query_text_declares_the_same_rule); the fuzz hook recognises this
    answer as the documented one."""
    params = {"index": "photos", "query": "\U000fedee\U000bb8ac", "rerank": "temde", "k": 132,
              "weight": 0.30322265625, "dedup": 0.9999999999999999}
    r = client.post("/v1/search/image", params=params, content=_tiny_webp(), headers={"Content-Type": "image/webp"})
    _blank(r, "query.query")
    hooks = pytest.importorskip("tests.service.fuzz_hooks")  # needs schemathesis (the fuzz extra)
    assert hooks._explained_422("/v1/search/image", _tiny_webp(), r.json()["error"], params)
    assert not hooks._explained_422("/v1/search/image", _tiny_webp(), r.json()["error"], {**params, "query": "a"})


def test_the_fuzz_hook_knows_the_body_limit_413(client):
    """A generated body over CROSSPROBE_MAX_BODY_BYTES (a 3.6 MB filter, seed 2114795725) gets BodyGuard's 413
    before any validation: the documented answer, which schemathesis's ST201 list lacks (fuzz_hooks)."""
    big = json.dumps({"query": "a dog", "filter": {"field": "tags", "in": ["x" * 100] * 12_000}}).encode()
    r = client.post("/v1/search", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large", r.text
    hooks = pytest.importorskip("tests.service.fuzz_hooks")  # needs schemathesis (the fuzz extra)
    assert hooks.over_body_limit(r.status_code, r.content, big)
    assert not hooks.over_body_limit(r.status_code, r.content, big[:1000])  # a 413 a small body cannot have had
    assert not hooks.over_body_limit(422, r.content, big)


@pytest.mark.parametrize("path", ["/knn-service", "/metadata", "/v1/search"])
@pytest.mark.parametrize("depth", [33, 1000, 100_000])
def test_deeply_nested_json_is_a_4xx_never_a_500(client, path, depth):
    for raw in ("[" * depth + "]" * depth, '{"ids":' + "[" * depth + "]" * depth + "}", "[" * depth):
        r = client.post(path, content=raw.encode(), headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", (path, depth, r.text[:200])
        assert "nested deeper" in r.json()["error"]["message"]


def test_an_uploaded_image_is_not_checked_as_json(client):
    """An image's bytes hold '[' and '{' at random: an upload with more of them than MAX_JSON_DEPTH is searched,
    as a file body and as a multipart form (it was refused as "JSON nested deeper than 32 levels")."""
    import io

    import numpy as np
    from PIL import Image

    px = np.full((64, 64, 3), ord("["), np.uint8)  # raw '[' bytes: a BMP stores its pixels as they are
    buf = io.BytesIO()
    Image.fromarray(px).save(buf, "BMP")
    data = buf.getvalue()
    assert data.count(b"[") > 100
    for kwargs in ({"content": data, "headers": {"Content-Type": "image/bmp"}},
                   {"content": data, "headers": {"Content-Type": "application/octet-stream"}},
                   {"files": {"image": ("x.bmp", data, "image/bmp")}}):
        r = client.post("/v1/search/image", params={"k": 2}, **kwargs)
        assert r.status_code == 200, r.text


def test_brackets_inside_strings_do_not_count_as_nesting(client):
    r = client.post("/knn-service", content=json.dumps({**KNN, "text": "[" * 400 + "a red square"}))
    assert r.status_code == 200, r.text


def test_body_limit_and_public_urls(built, svc_ckpt, artifacts):
    """CROSSPROBE_MAX_BODY_BYTES on every route (413 too_large); /knn-service and /metadata image URLs come
    from CROSSPROBE_PUBLIC_URL, never from the request's headers (FORGED: test_no_url_is_steered_by_a_header)."""
    from fastapi.testclient import TestClient

    from crossprobe.service.app import create_app
    from crossprobe.service.server import wait_ready
    from tests.service.conftest import service_settings

    s = service_settings(built, svc_ckpt, artifacts, max_body_bytes=2048, warmup=False,
                         public_base_url="https://search.example.com/cp/")
    with TestClient(create_app(s)) as c:
        wait_ready(c)
        big = json.dumps({"query": "a" * 10, "pad": "x" * 4000})
        for path in ("/v1/search", "/knn-service", "/metadata", "/admin/reload", "/v1/indexes"):
            r = c.request("GET" if path == "/v1/indexes" else "POST", path, content=big.encode(),
                          headers={"Content-Type": "application/json", "X-Admin-Key": "s3cret-admin-key-0123"})
            assert r.status_code == 413 and r.json()["error"]["code"] == "too_large", (path, r.text)

        def chunks():  # no Content-Length: counted while it arrives
            for _ in range(10):
                yield b" " * 500

        r = c.post("/knn-service", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large", r.text

        r = c.post("/knn-service", content=json.dumps(KNN), headers=FORGED)
        assert r.status_code == 200, r.text
        urls = [x["url"] for x in r.json() if "url" in x]
        assert urls and all(u.startswith("https://search.example.com/cp/v1/items/") for u in urls), urls
        r = c.post("/metadata", content=json.dumps({"ids": built.ids[:1], "indice_name": "photos"}), headers=FORGED)
        assert r.json()[0]["metadata"]["url"].startswith("https://search.example.com/cp/v1/items/")
        assert_no_header_steers_a_url(c, built, "https://search.example.com/cp")


def test_urls_never_come_from_the_host_header_by_default(client, built):
    r = client.post("/knn-service", content=json.dumps(KNN), headers=FORGED)
    urls = [x["url"] for x in r.json() if "url" in x]
    assert urls and all(u.startswith("/v1/items/") for u in urls), urls  # root-relative
    assert_no_header_steers_a_url(client, built, "")


# what a client (or a cache poisoner) may claim about the address it reached
# (a forged Host itself is refused before any route: tests/service/test_host_guard.py)
FORGED = {"X-Forwarded-Host": "evil2.example.net", "X-Forwarded-Proto": "gopher",
          "X-Forwarded-Prefix": "/evil3", "Forwarded": "host=evil4.example.net;proto=gopher"}


def assert_no_header_steers_a_url(c, built, base: str) -> None:
    """Every answer, asked with FORGED headers and without them, is the same and names no forged host: the image
    URLs of the clip-retrieval routes (under `base`), the /v1 answers (ids only; the page builds same-origin
    URLs), the page and its script, the OpenAPI document, and what once was a redirect (/v1/indexes/ -> its
    Location was http://<Host>/v1/indexes)."""
    item = built.ids[0]
    asks = [("POST", "/knn-service", json.dumps(KNN)), ("POST", "/metadata", json.dumps({"ids": built.ids[:3]})),
            ("POST", "/v1/search", json.dumps({"query": "a red square", "k": 3, "rerank": "none"})),
            ("GET", f"/v1/items/{item}", None), ("GET", "/v1/indexes", None), ("GET", "/", None),
            ("GET", "/static/app.js", None), ("GET", "/openapi.json", None), ("GET", "/v1/indexes/", None),
            ("POST", "/v1/search/", json.dumps({"query": "a"})), ("GET", "/static", None), ("GET", "/docs", None)]
    ctype = {"Content-Type": "application/json"}
    for method, path, body in asks:
        honest = c.request(method, path, content=body, headers=ctype if body else {})
        forged = c.request(method, path, content=body, headers={**FORGED, **(ctype if body else {})})
        assert forged.status_code == honest.status_code, (path, forged.status_code, honest.status_code)
        assert forged.status_code == (404 if path in ("/v1/indexes/", "/v1/search/", "/static") else 200), (path, forged.text)
        assert "location" not in forged.headers, (path, forged.headers)
        for text in (forged.text, json.dumps(dict(forged.headers))):
            assert "evil" not in text and "gopher" not in text, (path, text[:300])
        if path in ("/knn-service", "/metadata"):
            assert forged.json() == honest.json()
            found = re.findall(r'"url": "([^"]*)"', json.dumps(forged.json()))
            assert found and all(u.startswith(f"{base}/v1/items/") for u in found), found
