"""The OpenAPI document (/openapi.json) against what the routes answer.

Every route is driven into every answer it can give, in process over conftest's real index, with three apps:
the ready one (`client`), one that is not ready (no index), and one with search / admin / metrics keys and a
rate limit. Each answer's status must be declared for its operation, with the media type it came with, and every
non-2xx JSON body must be the error model. The other way round, every declared status must have been seen,
except 408, which only a real socket can produce (tests/service/test_slow_clients.py). The schemathesis run
(tests/service/test_fuzz.py, `make test-fuzz`) checks the same document with generated requests.
"""
from __future__ import annotations

import base64
import io
import json
import time

import pytest
from PIL import Image
from fastapi.testclient import TestClient

from crossprobe.service.app import create_app
from pydantic import TypeAdapter

from crossprobe.service.schemas import VISIBLE_TEXT_HELP, ErrorResponse, QueryText
from crossprobe.service.server import wait_ready
from tests.service.conftest import service_settings

SEARCH_KEY, ADMIN_KEY, METRICS_KEY = "spec-search-key-0123456789", "spec-admin-key-0123456789", "spec-metrics-0123"
BIG = b'{"pad": "' + b"x" * (1 << 20) + b'"}'  # over the default CROSSPROBE_MAX_BODY_BYTES (1 MiB)
DEEP = b"[" * 40 + b"]" * 40  # nested deeper than MAX_JSON_DEPTH (32)
# declared but not producible in process: the body deadline needs a real, stalled socket
ONLY_OVER_SOCKETS = {408: "tests/service/test_slow_clients.py::test_half_a_body_then_silence_gets_408"}


def _json(body) -> dict:
    return {"content": json.dumps(body).encode(), "headers": {"Content-Type": "application/json"}}


def _requests(ids: list[str]) -> list[tuple[str, str, str, dict]]:
    """(operation path as in the document, method, URL, httpx arguments): the ready app's cases."""
    item = ids[0]
    search, explain, upload = "/v1/search", "/v1/explain", "/v1/search/image"
    knn = {"text": "a red square", "num_images": 2}
    png = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 30, 30)).save(png, "PNG")
    image = base64.b64encode(png.getvalue()).decode()
    cases = [
        (search, "POST", search, _json({"query": "a red square", "k": 2, "rerank": "none"})),  # 200
        (search, "POST", search, _json({"image": image, "k": 2})),  # 200: query by image
        (search, "POST", search, _json({"query": "a red square", "image": image, "k": 2, "weight": 0.3})),  # 200
        (search, "POST", search, _json({"like": [item], "k": 2, "dedup": 0.9})),  # 200: more like this
        (search, "POST", search, _json({"like": "nope"})),  # 404 item_not_found
        (search, "POST", search, _json({"image": "bm90IGFuIGltYWdl"})),  # 422 invalid_image
        (search, "POST", search, _json({"image": image, "like": item})),  # 422: not both
        (search, "POST", search, _json({"query": "a dog", "filter": {"and": [{"field": "width", "gte": 50},  # 200
                                                                            {"field": "tags", "in": ["x"]}]}})),
        (search, "POST", search, _json({"query": "a dog", "filter": {"field": "width", "gte": "big"}})),  # 422
        (upload, "POST", upload + "?k=2", {"content": png.getvalue(), "headers": {"Content-Type": "image/png"}}),
        (upload, "POST", upload + "?index=nope", {"content": png.getvalue()}),  # 404
        (upload, "POST", upload, {"content": b"not an image"}),  # 422 invalid_image
        (search, "POST", search, _json({"query": "a dog", "index": "nope"})),  # 404
        (search, "POST", search, _json({"query": "a dog", "k": 0})),  # 422
        (search, "POST", search, _json({"query": "a dog", "k": 20, "shortlist": 10})),  # 422: shortlist < k
        (search, "POST", search, {"content": b'{"query": "\xff"}',  # 422: not UTF-8 (FastAPI alone: 400)
                                  "headers": {"Content-Type": "application/json"}}),
        (explain, "POST", explain, _json({"query": "a red square", "ids": [item]})),  # 200
        (explain, "POST", explain, _json({"query": "a red square", "ids": ["nope"]})),  # 404
        (explain, "POST", explain, _json({"query": "a red square", "ids": []})),  # 422
        ("/v1/indexes", "GET", "/v1/indexes", {}),
        ("/v1/items/{item_id}", "GET", f"/v1/items/{item}", {}),
        ("/v1/items/{item_id}", "GET", "/v1/items/nope", {}),
        ("/v1/items/{item_id}", "GET", f"/v1/items/{item}?index=" + "x" * 65, {}),
        ("/v1/items/{item_id}/image", "GET", f"/v1/items/{item}/image?size=32", {}),
        ("/v1/items/{item_id}/image", "GET", "/v1/items/nope/image", {}),
        ("/v1/items/{item_id}/image", "GET", f"/v1/items/{item}/image?size=1", {}),
        ("/healthz", "GET", "/healthz", {}),
        ("/readyz", "GET", "/readyz", {}),
        ("/metrics", "GET", "/metrics", {}),
        ("/admin/reload", "POST", "/admin/reload", {"headers": {"X-Admin-Key": "s3cret-admin-key-0123"}}),  # 200
        ("/knn-service", "POST", "/knn-service", _json(knn)),
        ("/knn-service", "POST", "/knn-service", _json({**knn, "indice_name": "nope"})),
        ("/knn-service", "POST", "/knn-service", _json({**knn, "modality": "text"})),  # 422 unsupported
        ("/knn-service", "POST", "/knn-service", _json({"image": image, "num_images": 2})),  # 200: by image
        ("/knn-service", "POST", "/knn-service", _json({"embedding_input": [0.5, 0.5]})),  # 422: not the index's d
        ("/knn-service", "POST", "/knn-service", _json({"image": "bm90IGFuIGltYWdl"})),  # 422 invalid_image
        ("/knn-service", "POST", "/knn-service", {"content": b"\x80 not utf-8"}),
        ("/indices-list", "GET", "/indices-list", {}),
        ("/metadata", "POST", "/metadata", _json({"ids": ids[:2]})),
        ("/metadata", "POST", "/metadata", _json({"ids": ids[:2], "indice_name": "nope"})),
        ("/metadata", "POST", "/metadata", _json({"ids": "not a list"})),
    ]
    operations = {(p, m) for p, m, _, _ in cases}
    for path, method in sorted(operations):  # BodyGuard's answers, on every route
        url = next(u for p, m, u, _ in cases if (p, m) == (path, method))
        cases.append((path, method, url, {"content": BIG, "headers": {"Content-Type": "application/json",
                                                                        "X-Admin-Key": "s3cret-admin-key-0123"}}))  # 413
        if method == "POST":
            cases.append((path, method, url, {"content": DEEP, "headers": {"Content-Type": "application/json",
                                                                             "X-Admin-Key": "s3cret-admin-key-0123"}}))  # 422
    return cases


def _observe(c: TestClient, cases, seen: dict) -> None:
    for path, method, url, kwargs in cases:
        r = c.request(method, url, **kwargs)
        ctype = r.headers.get("content-type", "").split(";")[0].strip()
        seen.setdefault((path, method.lower()), {}).setdefault(r.status_code, set()).add(ctype)
        if r.status_code >= 400:
            assert ctype == "application/json", (method, url, r.status_code, r.text[:200])
            ErrorResponse.model_validate(r.json())  # the error model, as declared
        assert r.status_code != 500, (method, url, r.text[:300])  # internal: a bug, never an answer


@pytest.fixture(scope="module")
def observed(client, built, svc_ckpt, artifacts, tmp_path_factory) -> dict:
    """(document path, method) -> {status: {media types}} over the three apps."""
    seen: dict = {}
    _observe(client, _requests(built.ids), seen)

    # not ready (no index): every route that needs the models or an index answers 503
    empty = tmp_path_factory.mktemp("no-index")
    with TestClient(create_app(service_settings(built, svc_ckpt, artifacts, index_root=empty))) as c:
        assert c.get("/readyz").status_code == 503
        item = built.ids[0]
        _observe(c, [("/v1/search", "POST", "/v1/search", _json({"query": "a dog"})),
                     ("/v1/search/image", "POST", "/v1/search/image", {"content": b"an image"}),
                     ("/v1/explain", "POST", "/v1/explain", _json({"query": "a dog", "ids": [item]})),
                     ("/v1/items/{item_id}", "GET", f"/v1/items/{item}", {}),
                     ("/v1/items/{item_id}/image", "GET", f"/v1/items/{item}/image", {}),
                     ("/readyz", "GET", "/readyz", {}),
                     ("/admin/reload", "POST", "/admin/reload", {"headers": {"X-Admin-Key": "s3cret-admin-key-0123"}}),
                     ("/knn-service", "POST", "/knn-service", _json({"text": "a dog"})),
                     ("/metadata", "POST", "/metadata", _json({"ids": [item]}))], seen)

    # a failed start-up (no checkpoint where the settings point): /healthz, the image's health check, says 503
    broken = service_settings(built, tmp_path_factory.mktemp("no-ckpt") / "missing", artifacts)
    with TestClient(create_app(broken)) as c:
        for _ in range(200):
            if c.get("/healthz").status_code == 503:
                break
            time.sleep(0.05)
        _observe(c, [("/healthz", "GET", "/healthz", {})], seen)
        assert c.get("/healthz").json()["error"]["code"] == "startup_failed"
        assert "no checkpoint" in c.get("/readyz").json()["error"]["message"]

    # keys and a rate limit (security.py): 401 without the header, 403 with a wrong key, 429 past the burst
    keyed = service_settings(built, svc_ckpt, artifacts, api_keys=SEARCH_KEY, admin_key=ADMIN_KEY,
                             metrics_key=METRICS_KEY, rate_limit_rps=0.001, rate_limit_burst=1, warmup=False,
                             auth_failures_burst=100_000)  # wrong keys on purpose: their limit is test_security's
    with TestClient(create_app(keyed)) as c:
        wait_ready(c)
        cases = []
        for path, method, url, kwargs in _requests(built.ids):
            if path in ("/healthz", "/readyz"):
                continue  # open routes
            header = {"/admin/reload": "X-Admin-Key", "/metrics": "Authorization"}.get(path, "X-API-Key")
            good = {"/admin/reload": ADMIN_KEY, "/metrics": f"Bearer {METRICS_KEY}"}.get(path, SEARCH_KEY)
            base = {k: v for k, v in (kwargs.get("headers") or {}).items() if k != "X-Admin-Key"}
            for value in (None, "Bearer wrong-key-000000" if header == "Authorization" else "wrong-key-0000000",
                          good, good):  # the second good one spends the rate limit's burst of 1
                headers = {**base, **({header: value} if value else {})}
                cases.append((path, method, url, {**kwargs, "headers": headers}))
        _observe(c, cases, seen)
    return seen


def test_every_answer_is_declared_with_its_media_type(client, observed):
    spec = client.get("/openapi.json").json()
    problems = []
    for (path, method), statuses in sorted(observed.items()):
        responses = spec["paths"][path][method]["responses"]
        for status, ctypes in statuses.items():
            declared = responses.get(str(status))
            if declared is None:
                problems.append(f"{method.upper()} {path}: answered {status}, not declared")
                continue
            if not ctypes <= set(declared.get("content", {})):
                problems.append(f"{method.upper()} {path} {status}: sent {ctypes}, declared "
                                f"{sorted(declared.get('content', {}))}")
            if status >= 400:
                schema = declared.get("content", {}).get("application/json", {}).get("schema")
                if schema != {"$ref": "#/components/schemas/ErrorResponse"}:
                    problems.append(f"{method.upper()} {path} {status}: declared {declared}, not the JSON error")
    assert not problems, "\n".join(problems)


def test_every_declared_status_is_answered(client, observed):
    spec = client.get("/openapi.json").json()
    missing = []
    for path, item in spec["paths"].items():
        for method, op in item.items():
            seen = observed.get((path, method), {})
            for status in op["responses"]:
                if int(status) not in seen and int(status) not in ONLY_OVER_SOCKETS:
                    missing.append(f"{method.upper()} {path}: declares {status}, never answered it here")
            if method == "post":  # every body route reads its body under the deadline
                assert "408" in op["responses"], (path, ONLY_OVER_SOCKETS[408])
    assert not missing, "\n".join(missing)


def test_the_document_says_what_json_schema_cannot(client):
    spec = client.get("/openapi.json").json()
    search = spec["components"]["schemas"]["SearchRequest"]
    assert search["x-constraints"] == ["shortlist >= k", "at least one of query, image, like",
                                       "not both image and like",
                                       "min_relevance only with a query alone (no image, no like)",
                                       "image is a base64-encoded image file",
                                       "each filter condition: exactly one of eq, in or a range, with values of its "
                                       "field's type"]
    assert "shortlist >= k" in search["description"]
    assert {"type": "string", "format": "visible-text"}.items() <= search["properties"]["query"]["anyOf"][0].items()
    for path in ("/knn-service", "/metadata"):  # they parse raw bytes; the body is declared by hand
        body = spec["paths"][path]["post"]["requestBody"]
        assert body["required"] and "schema" in body["content"]["application/json"]
    knn = spec["paths"]["/knn-service"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "required" not in knn and knn["properties"]["modality"]["enum"] == ["image"]
    assert knn["x-constraints"] == ["at least one of text, image, embedding_input",
                                    "embedding_input has the index's dimension and is not all zeros",
                                    "image is a base64-encoded image file"]
    upload = spec["paths"]["/v1/search/image"]["post"]
    assert upload["x-constraints"] == ["the body (or the form's image) is an image file"]
    assert "multipart/form-data" in upload["requestBody"]["content"]
    flt = next(p for p in upload["parameters"] if p["name"] == "filter")
    assert '"contentMediaType": "application/json"' in json.dumps(flt), flt
    assert {"image", "embedding_input", "text"} <= set(knn["properties"])
    assert list(spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    assert list(spec["paths"]["/v1/items/{item_id}/image"]["get"]["responses"]["200"]["content"]) == ["image/jpeg"]
    # bounds are JSON Schema's words: a "ge" / "le" here would be invisible to every client and generator
    text = json.dumps(spec)
    assert '"ge":' not in text and '"le":' not in text


def _query_texts(spec: dict) -> dict[tuple[str, str, str], dict]:
    """Every query text the document declares, wherever it is: (path, "parameter" | "body", name) -> its schema
    (a parameter's or body property's, anyOf with null included). A query text is a field or parameter named
    query or text."""
    def resolve(schema: dict) -> dict:
        ref = schema.get("$ref", "")
        return spec["components"]["schemas"][ref.rsplit("/", 1)[-1]] if ref else schema
    found = {}
    for path, item in spec["paths"].items():
        for op in item.values():
            for prm in op.get("parameters", []):
                if prm["name"] in ("query", "text"):
                    found[(path, "parameter", prm["name"])] = {**prm["schema"], "description": prm["description"]}
            for media in (op.get("requestBody") or {}).get("content", {}).values():
                for name, prop in resolve(media.get("schema", {})).get("properties", {}).items():
                    if name in ("query", "text"):
                        found[(path, "body", name)] = prop
    return found


def test_every_query_text_declares_the_same_rule(client):
    """The parameter form (/v1/search/image?query=) declares what the JSON bodies do: QueryText's schema (1 to
    512 characters, format visible-text) and what visible means, in its description (issue 36)."""
    texts = _query_texts(client.get("/openapi.json").json())
    assert set(texts) == {("/v1/search", "body", "query"), ("/v1/explain", "body", "query"),
                          ("/knn-service", "body", "text"), ("/v1/search/image", "parameter", "query")}, set(texts)
    rule = TypeAdapter(QueryText).json_schema()
    assert rule == {"type": "string", "minLength": 1, "maxLength": 512, "format": "visible-text"}
    for where, schema in texts.items():
        strings = [s for s in schema.get("anyOf", [schema]) if s.get("type") != "null"]
        assert len(strings) == 1 and {k: v for k, v in strings[0].items() if k in rule} == rule, (where, schema)
        assert VISIBLE_TEXT_HELP in schema["description"], where
    assert "Co" in VISIBLE_TEXT_HELP and "private use" in VISIBLE_TEXT_HELP  # the decision, in the document


@pytest.mark.parametrize("path", ["/v1/search", "/v1/explain", "/knn-service", "/metadata"])
def test_a_body_that_is_not_utf8_is_422_on_every_route(client, path):
    r = client.post(path, content=b'{"query": "caf\xe9"}', headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
    assert "not valid JSON" in r.json()["error"]["message"]


@pytest.mark.parametrize("value", [10.0, 100.0])
def test_integral_numbers_are_integers(client, value):
    """JSON Schema's "integer" includes 10.0; "10", 10.5 and true stay 422."""
    r = client.post("/v1/search", json={"query": "a photo", "k": 2.0, "shortlist": value, "rerank": "none"})
    assert r.status_code == 200 and len(r.json()["results"]) == 2, r.text
    for bad in ("10", 10.5, True):
        assert client.post("/v1/search", json={"query": "a photo", "k": bad}).status_code == 422
        assert client.post("/knn-service", json={"text": "a photo", "num_images": bad}).status_code == 422
    r = client.post("/knn-service", json={"text": "a photo", "num_images": 2.0, "use_mclip": False})
    assert r.status_code == 200 and len(r.json()) == 2, r.text
    for bad in ("true", 1):  # clip_back's switches are JSON booleans
        assert client.post("/knn-service", json={"text": "a photo", "use_mclip": bad}).status_code == 422
