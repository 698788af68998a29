"""Access control (service/security.py): search / admin / metrics keys, the rate limit, CORS, the page with keys
(keys limited to some indexes: test_scope.py).

In process (TestClient) over conftest's real index (12 generated images, real Redis), except the log test,
which runs a real uvicorn (its access log is uvicorn's, not TestClient's), and the browser test (e2e marker).
"""
from __future__ import annotations

import hmac
import json
import logging
import math
import re
import time

import pytest

from crossprobe.service import security
from crossprobe.service.scope import EVERY
from crossprobe.service.security import Access, RateLimiter
from crossprobe.service.settings import Settings
from tests.service.conftest import _client, service_settings

SEARCH_KEYS = ("search-key-0123456789abcdef", "second-search-key-fedcba987654")
ADMIN = "admin-key-5555555555555555"
METRICS = "metrics-key-7777777777777777"
WRONG = "not-a-key-of-this-service-000"
ORIGIN = "https://front.example.org"


@pytest.fixture(scope="module")
def keyed(built, svc_ckpt, artifacts):
    """An app with two search keys, an admin key, a metrics key and one allowed CORS origin."""
    yield from _client(built, svc_ckpt, artifacts, api_keys=" , ".join(SEARCH_KEYS), admin_key=ADMIN,
                       metrics_key=METRICS, cors_origins=f"{ORIGIN}, https://other.example.org", warmup=False,
                       auth_failures_burst=100_000)  # these tests send wrong keys on purpose: the limit has its own


def _routes(built) -> list[tuple[str, str, dict | None]]:
    """Every search-group route, with a request that succeeds given a valid key (or no keys configured)."""
    item = built.ids[0]
    return [("POST", "/v1/search", {"query": "a red square", "k": 2, "rerank": "none"}),
            ("POST", "/v1/explain", {"query": "a red square", "ids": [item]}),
            ("GET", "/v1/indexes", None),
            ("GET", f"/v1/items/{item}", None),
            ("GET", f"/v1/items/{item}/image?size=32", None),
            ("POST", "/knn-service", {"text": "a red square", "num_images": 2}),
            ("GET", "/indices-list", None),
            ("POST", "/metadata", {"ids": built.ids[:2]})]


def _call(c, method: str, path: str, body: dict | None, headers: dict | None = None):
    return c.request(method, path, content=None if body is None else json.dumps(body).encode(),
                     headers={"Content-Type": "application/json", **(headers or {})})


def _error(r, status: int, code: str) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body  # errors.py's shape
    return body["error"]


# ---- keys off (the default) ------------------------------------------------------------------------------
def test_keys_off_every_route_is_open(client, built):
    assert Settings().api_keys is None and Settings().api_keys_file is None
    for method, path, body in _routes(built):
        for headers in ({}, {"X-API-Key": WRONG}):  # a header the server does not use is ignored
            r = _call(client, method, path, body, headers)
            assert r.status_code == 200, (path, r.text)
    r = client.get(f"/v1/items/{built.ids[0]}/image")
    assert r.headers["cache-control"] == "public, max-age=300"  # no key: shared caches may keep it
    assert client.get("/metrics").status_code == 200


# ---- search keys -------------------------------------------------------------------------------------------
def test_search_routes_need_a_search_key(keyed, built):
    for method, path, body in _routes(built):
        err = _error(_call(keyed, method, path, body), 401, "unauthorized")
        assert "X-API-Key" in err["message"]
        r = _call(keyed, method, path, body, {"X-API-Key": ""})
        _error(r, 401, "unauthorized")
        assert r.headers["www-authenticate"] == "APIKey"
        for other in (WRONG, ADMIN, METRICS, SEARCH_KEYS[0][:-1], SEARCH_KEYS[0] + "x", SEARCH_KEYS[0].upper()):
            r = _call(keyed, method, path, body, {"X-API-Key": other})
            err = _error(r, 403, "forbidden")
            assert other not in r.text and other not in str(r.headers)  # never echoed
        for key in SEARCH_KEYS:
            r = _call(keyed, method, path, body, {"X-API-Key": key})
            assert r.status_code == 200, (path, r.text)
            assert key not in r.text
    # with a key, images are private to the browser: a shared cache would hand them to callers without one
    r = keyed.get(f"/v1/items/{built.ids[0]}/image", headers={"X-API-Key": SEARCH_KEYS[1]})
    assert r.headers["cache-control"] == "private, max-age=300"
    # the key opens only the served version's ids (test_api.py::test_only_indexed_items_can_be_read, keys off)
    r = keyed.get("/v1/items/..%2F..%2Fetc%2Fpasswd/image", headers={"X-API-Key": SEARCH_KEYS[0]})
    assert r.status_code == 404


def test_health_page_docs_and_static_files_stay_open(keyed):
    from crossprobe.service.routes.page import PAGE_CSP

    assert keyed.get("/healthz").json() == {"status": "ok"}
    assert keyed.get("/readyz").status_code == 200
    page = keyed.get("/")
    assert page.status_code == 200 and page.headers["content-security-policy"] == PAGE_CSP  # still strict
    for path in ("/static/app.js", "/static/app.css", "/openapi.json", "/docs"):
        assert keyed.get(path).status_code == 200, path


def test_admin_and_search_keys_are_separate(keyed):
    _error(keyed.post("/admin/reload"), 401, "unauthorized")
    _error(keyed.post("/admin/reload", headers={"X-API-Key": SEARCH_KEYS[0]}), 401, "unauthorized")
    for other in (*SEARCH_KEYS, METRICS, WRONG):
        _error(keyed.post("/admin/reload", headers={"X-Admin-Key": other}), 403, "forbidden")
    assert keyed.post("/admin/reload", headers={"X-Admin-Key": ADMIN}).status_code == 200
    # and the admin key opens no search route, in either header
    search = {"query": "a photo", "k": 1}
    _error(keyed.post("/v1/search", json=search, headers={"X-API-Key": ADMIN}), 403, "forbidden")
    _error(keyed.post("/v1/search", json=search, headers={"X-Admin-Key": ADMIN}), 401, "unauthorized")


def _app_routes(routes):
    for r in routes:  # FastAPI keeps an included router as one entry (_IncludedRouter): its own routes inside
        inner = getattr(r, "original_router", None)
        yield from _app_routes(inner.routes) if inner is not None else [r]


GROUPS = {  # route -> the access checks it runs (README "Security"): every API route is decided here
    "/v1/search": ["search_client", "rate_limit"], "/v1/explain": ["search_client", "rate_limit"],
    "/v1/search/image": ["search_client", "rate_limit"],
    "/knn-service": ["search_client", "rate_limit"],
    "/v1/indexes": ["search_client"], "/v1/items/{item_id:path}": ["search_client"],
    "/v1/items/{item_id:path}/image": ["search_client"], "/indices-list": ["search_client"],
    "/metadata": ["search_client"],
    "/admin/reload": ["admin_client"],
    "/metrics": ["metrics_client"],
    "/healthz": [], "/readyz": [], "/": [],
}


def test_every_route_is_in_a_decided_group(keyed):
    """A new route fails this until it is put in a group; every /admin/* route runs admin_client."""
    seen = {}
    for r in _app_routes(keyed.app.routes):
        if getattr(r, "dependant", None) is not None:  # the access checks (routes' own inputs are dependencies too)
            seen[r.path] = [d.call.__name__ for d in r.dependant.dependencies if d.call.__module__ == security.__name__]
    assert seen == GROUPS
    assert all(deps == ["admin_client"] for path, deps in seen.items() if path.startswith("/admin"))


def test_metrics_key(keyed, client):
    assert client.get("/metrics").status_code == 200  # no metrics key set: open
    r = keyed.get("/metrics")
    _error(r, 401, "unauthorized")
    assert r.headers["www-authenticate"] == "Bearer"
    _error(keyed.get("/metrics", headers={"X-API-Key": SEARCH_KEYS[0]}), 401, "unauthorized")
    for other in (*SEARCH_KEYS, ADMIN, WRONG):
        _error(keyed.get("/metrics", headers={"Authorization": f"Bearer {other}"}), 403, "forbidden")
    r = keyed.get("/metrics", headers={"Authorization": f"Bearer {METRICS}"})
    assert r.status_code == 200 and "crossprobe_requests_total" in r.text


def test_keys_are_compared_in_constant_time(keyed, monkeypatch):
    """hmac.compare_digest over equal-length digests, once per configured key whichever key (if any) matches."""
    calls: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def counted(a, b):
        assert isinstance(a, bytes) and isinstance(b, bytes)
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counted)
    for given in (*SEARCH_KEYS, WRONG, "x", "y" * 500):
        calls.clear()
        keyed.get("/v1/indexes", headers={"X-API-Key": given})
        assert calls == [(32, 32)] * len(SEARCH_KEYS), given  # no early exit, no length difference
    calls.clear()
    keyed.post("/admin/reload", headers={"X-Admin-Key": "short"})
    assert calls == [(32, 32)]
    assert security.matching(SEARCH_KEYS[1], [security._digest(k) for k in SEARCH_KEYS]) == 1


# ---- configuration ------------------------------------------------------------------------------------------
def test_keys_from_the_environment_and_a_file(tmp_path):
    f = tmp_path / "keys"
    f.write_text("# search keys\n\n  file-key-aaaaaaaaaaaaaaaa  \nfile-key-bbbbbbbbbbbbbbbb\n", encoding="utf-8")
    s = Settings(api_keys="env-key-cccccccccccccccc,, file-key-aaaaaaaaaaaaaaaa", api_keys_file=f)
    assert security.load_search_keys(s) == {"env-key-cccccccccccccccc": EVERY, "file-key-aaaaaaaaaaaaaaaa": EVERY,
                                            "file-key-bbbbbbbbbbbbbbbb": EVERY}
    assert "file-key" not in repr(s) and "env-key" not in repr(s)  # SecretStr: settings print no key
    assert not Access(Settings(api_keys="")).search_keys_on  # an empty variable (compose's ${X:-}) is unset
    assert security._secret(Settings(admin_key=" ").admin_key) is None  # blank admin key: admin stays off


@pytest.mark.parametrize("over, says", [
    (dict(api_keys="same-key-111111111111", admin_key="same-key-111111111111"), "CROSSPROBE_ADMIN_KEY"),
    (dict(api_keys="same-key-111111111111", metrics_key="same-key-111111111111"), "CROSSPROBE_METRICS_KEY"),
    (dict(admin_key="same-key-111111111111", metrics_key="same-key-111111111111"), "CROSSPROBE_METRICS_KEY"),
    (dict(api_keys="good-key-111111111111,bad-key-22222222\u00a0photos"), "key 2"),  # only ASCII blanks split
    (dict(api_keys="good-key-111111111111,bad-key-22222222 photos pasted/key+3333"), "key 2: index name 2"),
    (dict(api_keys="good-key-111111111111 photos,good-key-111111111111 other"), "repeats the key of"),
    (dict(api_keys="caf\u00e9-key-3333333333"), "key 1"),
    (dict(admin_key="bad\tadmin-key-4444"), "CROSSPROBE_ADMIN_KEY"),
    (dict(api_keys_file="MISSING"), "cannot read"),
    (dict(api_keys_file="EMPTY"), "holds no keys"),
    (dict(api_keys=" , ,"), "holds no key"),  # set, yet nothing: never open routes
    (dict(api_keys="short-key-123"), "key 1: shorter than 16"),
    (dict(admin_key="tiny"), "CROSSPROBE_ADMIN_KEY: shorter than 16"),
    (dict(metrics_key="metrics-123"), "CROSSPROBE_METRICS_KEY: shorter than 16"),
    (dict(host="0.0.0.0"), "CROSSPROBE_ALLOW_OPEN_NETWORK"),  # no keys on the network: say so explicitly
    (dict(host="192.168.1.20"), "CROSSPROBE_API_KEYS"),
])
def test_start_up_refuses_keys_that_cannot_work(over, says, tmp_path, built, svc_ckpt, artifacts):
    if over.get("api_keys_file") == "MISSING":
        over = {**over, "api_keys_file": tmp_path / "nope"}
    elif over.get("api_keys_file") == "EMPTY":
        (tmp_path / "empty").write_text("# keys go here\n\n")
        over = {**over, "api_keys_file": tmp_path / "empty"}
    from crossprobe.service.app import create_app

    with pytest.raises(ValueError) as e:
        create_app(service_settings(built, svc_ckpt, artifacts, **over))  # fails before the server starts
    msg = str(e.value)
    assert says in msg
    for key in ("same-key", "good-key", "bad-key", "pasted", "caf", "admin-key", "short-key", "tiny", "metrics-123"):
        assert key not in msg, msg  # keys are named by their place, never shown


# ---- logs ---------------------------------------------------------------------------------------------------
class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()} {record.exc_text or ''}")


def test_keys_never_appear_in_logs(built, svc_ckpt, artifacts, caplog):
    """A real uvicorn with its access log on at the most verbose level the settings allow (debug; uvicorn's
    `trace`, which logs headers, is not a CROSSPROBE_LOG_LEVEL): no key, right or wrong, in any log line."""
    import httpx

    from crossprobe.service.server import running, wait_ready

    caplog.set_level(logging.DEBUG)
    s = service_settings(built, svc_ckpt, artifacts, api_keys=",".join(SEARCH_KEYS), admin_key=ADMIN,
                         metrics_key=METRICS, access_log=True, log_level="debug", warmup=False, port=0,
                         rate_limit_rps=0.01, rate_limit_burst=2)
    levels = Settings.model_fields["log_level"].annotation.__args__
    assert "debug" in levels and "trace" not in levels
    collect = _Collect()
    with running(s) as url:
        names = ("", "uvicorn", "uvicorn.error", "uvicorn.access", "crossprobe")
        for name in names:  # after uvicorn configured its loggers (its access logger does not propagate)
            logging.getLogger(name).addHandler(collect)
        try:
            with httpx.Client(base_url=url, timeout=30) as http:
                wait_ready(http)
                answers = []
                for key in (*SEARCH_KEYS, WRONG, ADMIN):
                    answers.append(http.post("/v1/search", json={"query": "a red square", "k": 2},
                                             headers={"X-API-Key": key}))
                    answers.append(http.get(f"/v1/items/{built.ids[1]}/image?size=32", headers={"X-API-Key": key}))
                for _ in range(3):  # the third is over the burst: 429
                    answers.append(http.post("/knn-service", json={"text": "a cat", "num_images": 1},
                                             headers={"X-API-Key": SEARCH_KEYS[0]}))
                answers.append(http.post("/v1/search", content=b"{not json", headers={"X-API-Key": SEARCH_KEYS[0]}))
                for key in (ADMIN, WRONG):
                    answers.append(http.post("/admin/reload", headers={"X-Admin-Key": key}))
                for key in (METRICS, WRONG):
                    answers.append(http.get("/metrics", headers={"Authorization": f"Bearer {key}"}))
        finally:
            for name in names:
                logging.getLogger(name).removeHandler(collect)
    assert [a.status_code for a in answers][:8] == [200, 200, 200, 200, 403, 403, 403, 403]
    assert 429 in [a.status_code for a in answers]
    text = "\n".join(collect.lines + [caplog.text])
    # the access log did run (else this test would pass on an empty log)
    assert re.search(r'"POST /v1/search HTTP/1.1" 200', text) and re.search(r'"POST /admin/reload HTTP/1.1" 403', text)
    assert re.search(r'"GET /metrics HTTP/1.1" 200', text)
    for key in (*SEARCH_KEYS, ADMIN, METRICS, WRONG):
        assert key not in text
        for a in answers:
            assert key not in a.text and key not in str(a.headers)


# ---- rate limit ---------------------------------------------------------------------------------------------
class _Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_token_bucket_and_retry_after():
    clock = _Clock()
    rl = RateLimiter(rate=0.5, burst=2, max_clients=10, clock=clock)
    assert rl.take("a") == 0 and rl.take("a") == 0
    assert rl.take("a") == pytest.approx(2.0)  # empty: one token in 1 / 0.5 s
    assert rl.take("b") == 0  # buckets are per client
    clock.t += 1.5
    assert rl.take("a") == pytest.approx(0.5)  # 0.75 token back; a refusal takes nothing
    clock.t += 0.5
    assert rl.take("a") == 0
    clock.t += 100
    assert [rl.take("a") for _ in range(3)][:2] == [0, 0]  # refilled to the burst, never beyond


def test_bucket_memory_is_bounded():
    clock = _Clock()
    rl = RateLimiter(rate=1.0, burst=5, max_clients=100, clock=clock)
    for i in range(10_000):  # many keys / addresses at once: the least recently used are forgotten
        rl.take(("address", f"10.0.{i // 256}.{i % 256}"))
        assert len(rl) <= 100
    assert len(rl) == 100
    clock.t += 5.0  # burst / rate: every bucket is full again, the same as none: swept on the next request
    rl.take("someone")
    assert len(rl) == 1
    # a bucket forgotten under pressure comes back full (the cap forgets, it never refuses)
    small = RateLimiter(rate=1.0, burst=1, max_clients=1, clock=clock)
    assert small.take("a") == 0 and small.take("a") > 0
    assert small.take("b") == 0 and small.take("a") == 0


def _limit(c, monkeypatch, rate: float, burst: int, clock=time.monotonic) -> RateLimiter:
    rl = RateLimiter(rate, burst, 100, clock=clock)
    monkeypatch.setattr(c.app.state.access, "limiter", rl)
    return rl


def _limited_total(c, headers=None) -> float:
    text = c.get("/metrics", headers=headers).text
    m = re.search(r'^crossprobe_rate_limited_total\{endpoint="/v1/search"\} ([0-9.]+)$', text, re.M)
    return float(m.group(1))


def test_rate_limit_per_key_answers_429_with_retry_after(keyed, built, monkeypatch):
    clock = _Clock()
    _limit(keyed, monkeypatch, rate=0.25, burst=2, clock=clock)
    key0, key1 = ({"X-API-Key": k} for k in SEARCH_KEYS)
    bearer = {"Authorization": f"Bearer {METRICS}"}
    before = _limited_total(keyed, bearer)
    search = {"query": "a red square", "k": 1, "rerank": "none"}
    # a refused key spends no tokens: authentication comes first
    for _ in range(5):
        _error(keyed.post("/v1/search", json=search, headers={"X-API-Key": WRONG}), 403, "forbidden")
    assert keyed.post("/v1/search", json=search, headers=key0).status_code == 200
    assert keyed.post("/knn-service", json={"text": "a cat", "num_images": 1}, headers=key0).status_code == 200
    r = keyed.post("/v1/search", json=search, headers=key0)
    err = _error(r, 429, "rate_limited")
    assert r.headers["retry-after"] == "4"  # ceil((1 - 0 tokens) / 0.25 per s)
    assert "search key" in err["message"] and SEARCH_KEYS[0] not in r.text
    assert keyed.post("/v1/explain", json={"query": "a", "ids": built.ids[:1]}, headers=key0).status_code == 429
    clock.t += 1.0
    assert keyed.post("/v1/search", json=search, headers=key0).headers["retry-after"] == "3"
    # the other key has its own bucket; items and index routes take no tokens
    assert keyed.post("/v1/search", json=search, headers=key1).status_code == 200
    assert keyed.get(f"/v1/items/{built.ids[0]}", headers=key0).status_code == 200
    assert keyed.get("/v1/indexes", headers=key0).status_code == 200
    assert _limited_total(keyed, bearer) == before + 2
    clock.t += 3.0
    assert keyed.post("/v1/search", json=search, headers=key0).status_code == 200


def test_rate_limit_recovers_after_retry_after(keyed, monkeypatch):
    """The real clock: 1 request/s, burst 1. The second request is refused with Retry-After 1; after it, one passes."""
    _limit(keyed, monkeypatch, rate=1.0, burst=1)
    key = {"X-API-Key": SEARCH_KEYS[0]}
    bad = {"query": "a photo", "k": 0}  # invalid (422), yet it passed the key and the rate limit first: cheap
    assert keyed.post("/v1/search", json=bad, headers=key).status_code == 422
    r = keyed.post("/v1/search", json=bad, headers=key)
    _error(r, 429, "rate_limited")
    wait = int(r.headers["retry-after"])
    assert wait == 1
    time.sleep(wait)
    assert keyed.post("/v1/search", json={"query": "a photo", "k": 1, "rerank": "none"}, headers=key).status_code == 200


def test_rate_limit_per_client_address_without_keys(client, monkeypatch):
    _limit(client, monkeypatch, rate=0.5, burst=1, clock=_Clock())
    search = {"query": "a red square", "k": 1, "rerank": "none"}
    assert client.post("/v1/search", json=search).status_code == 200
    r = client.post("/knn-service", json={"text": "a cat", "num_images": 1})
    err = _error(r, 429, "rate_limited")
    assert r.headers["retry-after"] == "2" and "client address" in err["message"]
    # another address, another bucket. The same TestClient (a second one would run the app on another event
    # loop, where the batcher's futures never complete), sending from another address
    assert client._transport.client == ("testclient", 50000)
    monkeypatch.setattr(client._transport, "client", ("192.0.2.7", 40000))
    assert client.post("/v1/search", json=search).status_code == 200
    assert client.post("/v1/search", json=search).status_code == 429


def test_overload_and_rate_limit_share_the_error_shape(client, monkeypatch):
    """429 overloaded (the admission queue) and 429 rate_limited differ only in their code and message."""
    from crossprobe.service.errors import STATUS
    from crossprobe.service.exceptions import Overloaded
    from crossprobe.service.batcher import Limiter

    _limit(client, monkeypatch, rate=1.0, burst=1, clock=_Clock())
    client.post("/v1/search", json={"query": "x", "k": 0})
    r = client.post("/v1/search", json={"query": "x", "k": 0})
    with pytest.raises(Overloaded) as over:  # what the admission queue raises when it is full
        with Limiter(0).admit():
            pass
    assert STATUS[over.value.code] == r.status_code == 429 and over.value.retry_after_s == 1
    assert set(r.json()["error"]) == {"code", "message"} and r.json()["error"]["code"] != over.value.code


# ---- CORS ---------------------------------------------------------------------------------------------------
def test_cors_is_off_by_default(client):
    assert Settings().cors_origins == "" and Settings().cors_list == []
    r = client.get("/v1/indexes", headers={"Origin": ORIGIN})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    pre = client.options("/v1/search", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                                                 "Access-Control-Request-Headers": "content-type"})
    assert pre.status_code == 405 and not [h for h in pre.headers if h.startswith("access-control-")]


def test_cors_for_configured_origins(keyed):
    pre = keyed.options("/v1/search", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                                                "Access-Control-Request-Headers": "content-type, x-api-key"})
    assert pre.status_code == 200, pre.text  # a preflight needs no key: browsers never send one with it
    assert pre.headers["access-control-allow-origin"] == ORIGIN
    assert "x-api-key" in pre.headers["access-control-allow-headers"].lower()
    assert "x-admin-key" not in pre.headers["access-control-allow-headers"].lower()
    pre = keyed.options("/admin/reload", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                                                   "Access-Control-Request-Headers": "x-admin-key"})
    assert pre.status_code == 400  # admin calls come from scripts, never from another origin's page
    r = keyed.get("/v1/indexes", headers={"Origin": ORIGIN, "X-API-Key": SEARCH_KEYS[0]})
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert "retry-after" in r.headers["access-control-expose-headers"].lower()
    r = keyed.get("/v1/indexes", headers={"Origin": ORIGIN})  # a 401 is readable by the allowed page too
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == ORIGIN
    r = keyed.get("/v1/indexes", headers={"Origin": "https://evil.example.net", "X-API-Key": SEARCH_KEYS[0]})
    assert "access-control-allow-origin" not in r.headers


# ---- OpenAPI ------------------------------------------------------------------------------------------------
def test_openapi_declares_the_keys(keyed, client):
    doc = keyed.get("/openapi.json").json()
    schemes = doc["components"]["securitySchemes"]
    assert schemes["SearchKey"] == {**schemes["SearchKey"], "type": "apiKey", "in": "header", "name": "X-API-Key"}
    assert schemes["AdminKey"] == {**schemes["AdminKey"], "type": "apiKey", "in": "header", "name": "X-Admin-Key"}
    assert schemes["MetricsKey"] == {**schemes["MetricsKey"], "type": "http", "scheme": "bearer"}
    paths = doc["paths"]
    queries = [("/v1/search", "post"), ("/v1/explain", "post"), ("/knn-service", "post")]
    reads = [("/v1/indexes", "get"), ("/v1/items/{item_id}", "get"), ("/v1/items/{item_id}/image", "get"),
             ("/indices-list", "get"), ("/metadata", "post")]
    for path, method in queries + reads:
        op = paths[path][method]
        assert op["security"] == [{"SearchKey": []}], path
        assert {"401", "403"} <= set(op["responses"]), path
    for path, method in queries:
        assert "429" in paths[path][method]["responses"], path
    assert paths["/admin/reload"]["post"]["security"] == [{"AdminKey": []}]
    assert paths["/metrics"]["get"]["security"] == [{"MetricsKey": []}]
    for path in ("/healthz", "/readyz"):
        assert "security" not in paths[path]["get"], path
    # no keys configured: the same routes say the header is optional ({} = no requirement)
    open_doc = client.get("/openapi.json").json()["paths"]
    assert open_doc["/v1/search"]["post"]["security"] == [{}, {"SearchKey": []}]
    assert open_doc["/metrics"]["get"]["security"] == [{}, {"MetricsKey": []}]
    assert open_doc["/admin/reload"]["post"]["security"] == [{"AdminKey": []}]  # admin always needs its key


# ---- the page -----------------------------------------------------------------------------------------------
def test_page_has_a_key_field_kept_for_the_tab_only(keyed):
    from tests.service.test_page import STATIC

    html = keyed.get("/").text
    assert '<label for="api-key">' in html and re.search(r'<input id="api-key" name="api-key" type="password"', html)
    assert 'id="key-field"' in html
    js = "".join(p.read_text() for p in STATIC.glob("*.js"))  # the page's modules (the key lives in api.js)
    assert '"X-API-Key"' in js and "sessionStorage" in js and "localStorage" not in js
    assert "URL.createObjectURL" in js  # images fetched with the header (an <img src> cannot send one)


@pytest.mark.e2e
def test_page_works_with_keys_in_a_browser(built, svc_ckpt, artifacts):
    """Debian's chromium (make test-e2e) on the page of a server with search keys: it asks for a key, searches
    with it, shows the thumbnails (fetched with the header), explains, keeps the key in sessionStorage only."""
    from playwright.sync_api import sync_playwright

    from tests.service.browser import CHROMIUM, CHROMIUM_ARGS, wait_js

    from crossprobe.service.server import running

    s = service_settings(built, svc_ckpt, artifacts, api_keys=SEARCH_KEYS[0], warmup=False, port=0)
    with running(s) as url, sync_playwright() as p:
        import httpx

        from crossprobe.service.server import wait_ready

        with httpx.Client(base_url=url) as http:
            wait_ready(http)
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        ctx = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=url)
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        # the first /v1/indexes answers 401 (that is how the page learns a key is needed): the browser logs it
        page.on("console", lambda m: m.type == "error" and "401" not in m.text and "403" not in m.text
                and errors.append(m.text))
        page.goto("/")
        wait_js(page, "() => !document.getElementById('key-field').hidden")
        assert "search key" in page.locator("#status").inner_text()
        page.get_by_label("API key").fill(WRONG)
        page.get_by_label("Describe the image you want").fill("a red square")
        page.keyboard.press("Enter")
        wait_js(page, "() => document.getElementById('status').textContent.includes('refused')")
        page.get_by_label("API key").fill(SEARCH_KEYS[0])
        with page.expect_response(lambda r: r.url.endswith("/v1/search") and r.status == 200):
            page.get_by_label("Describe the image you want").press("Enter")
        wait_js(page, "() => document.querySelectorAll('#results li.card').length > 0")
        wait_js(page, "() => [...document.querySelectorAll('#results img')].every("
                      "i => i.complete && i.naturalWidth > 0 && i.src.startsWith('blob:'))")
        assert page.locator("#index option").first.inner_text().startswith("photos")
        assert page.evaluate("() => sessionStorage.getItem('crossprobe.apiKey')") == SEARCH_KEYS[0]
        assert page.evaluate("() => localStorage.length") == 0 and SEARCH_KEYS[0] not in page.url
        page.get_by_role("button", name="Details", exact=True).click()  # explain waits behind "Details"
        with page.expect_response(lambda r: r.url.endswith("/v1/explain") and r.status == 200):
            page.get_by_label("Explain: show where the model looked").check()
        wait_js(page, "() => [...document.querySelectorAll('canvas.heat')].some(c => !c.hidden)")
        with ctx.expect_page() as tab:  # the full-size image opens in a new tab, fetched with the key
            page.locator("#results a.thumb").first.click()
        wait_js(tab.value, "() => location.protocol === 'blob:'")
        browser.close()
    assert not errors, errors


def test_a_network_address_serves_with_keys_or_when_told(built, svc_ckpt, artifacts):
    from crossprobe.service.app import create_app

    create_app(service_settings(built, svc_ckpt, artifacts, host="0.0.0.0", api_keys=SEARCH_KEYS[0]))
    create_app(service_settings(built, svc_ckpt, artifacts, host="0.0.0.0", allow_open_network=True))
    create_app(service_settings(built, svc_ckpt, artifacts, host="::1"))  # loopback: no keys needed


def test_wrong_keys_are_limited_per_address(built, svc_ckpt, artifacts):
    """After auth_failures_burst wrong keys the address gets 429 before its key is compared, even with the right
    key, until the bucket refills; a missing key (401) is no guess and does not count."""
    for c in _client(built, svc_ckpt, artifacts, api_keys=SEARCH_KEYS[0], admin_key=ADMIN, auth_failures_burst=3,
                     auth_failures_per_minute=0.01, warmup=False):
        for _ in range(5):
            assert c.get("/v1/indexes").status_code == 401
        codes = [c.get("/v1/indexes", headers={"X-API-Key": f"wrong-key-{i:010d}"}).status_code for i in range(3)]
        assert codes == [403, 403, 403]
        r = c.get("/v1/indexes", headers={"X-API-Key": SEARCH_KEYS[0]})
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited" and "failed key" in r.text
        assert int(r.headers["retry-after"]) >= 1
        r = c.post("/admin/reload", headers={"X-Admin-Key": ADMIN})  # every group: the same address
        assert r.status_code == 429
