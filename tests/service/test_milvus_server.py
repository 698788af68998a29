"""The service over an index version held by a real Milvus server (2.3.5, tests/conftest.py's milvus_server)
while that server fails: paused (SIGSTOP: every call runs into the service's 1 s Milvus timeout) and killed
(SIGKILL: connection refused) in the middle of a stream of searches, then resumed / restarted on the same port
and data. Every answer is a 200 or a 503 ann_unavailable with Retry-After (never a 500, never a hang), the FAISS
index beside it keeps answering, and the Milvus index answers again, with the same results, once the server is
back (a restarted server reloads its collections by itself; the service's client reconnects)."""
from __future__ import annotations

import threading
import time

import pytest

from tests.service.conftest import _client, build_index

pytestmark = pytest.mark.milvus_server

QUERY = {"query": "a red square", "k": 8, "rerank": "cp", "index": "photos-s"}
FILTERED = {**QUERY, "filter": {"or": [{"field": "width", "gte": 1}, {"field": "tags", "eq": "none"}]}}


@pytest.fixture(scope="module")
def served(built, milvus_server, svc_ckpt, bert, artifacts):
    """Index "photos-s" (the module's gallery, HNSW on the server) beside the FAISS "photos", in one service."""
    from crossprobe.storage.ann import milvus_backend

    ixs = built.ixs.model_copy(update={"ann_backend": "milvus", "milvus_uri": milvus_server.uri,
                                       "milvus_index": "HNSW"})
    build_index(ixs, built.gallery, svc_ckpt, bert, name="photos-s")
    gen = _client(built, svc_ckpt, artifacts, milvus_uri=milvus_server.uri)
    yield next(gen), milvus_server
    gen.close()
    milvus_backend.close_clients()


def _post(c, body: dict) -> tuple[int, dict, dict]:
    t = time.monotonic()
    r = c.post("/v1/search", json=body)
    return r.status_code, r.json(), {"elapsed_s": time.monotonic() - t, "retry_after": r.headers.get("Retry-After")}


def _ids(body: dict) -> list[str]:
    return [h["id"] for h in body["results"]]


def _stream(c, seconds: float, until_ok: bool = False, bodies=(QUERY, FILTERED)) -> list[tuple[int, dict, dict]]:
    """Searches back to back for `seconds` (or, until_ok, until a 200 after at least `seconds`)."""
    out = []
    t0 = time.monotonic()
    i = 0
    while True:
        out.append(_post(c, bodies[i % len(bodies)]))
        i += 1
        elapsed = time.monotonic() - t0
        if elapsed > seconds and (not until_ok or out[-1][0] == 200):
            return out
        if elapsed > 180:
            raise AssertionError(f"no 200 within 180 s: {[s for s, _, _ in out[-5:]]} {out[-1][1]}")


def _check(answers: list[tuple[int, dict, dict]]) -> dict[int, int]:
    """Every answer a 200 (not degraded by Milvus) or a clear 503 ann_unavailable -> status counts."""
    counts: dict[int, int] = {}
    for status, body, meta in answers:
        counts[status] = counts.get(status, 0) + 1
        assert status in (200, 503), (status, body)
        if status == 503:
            assert body["error"]["code"] == "ann_unavailable", body
            assert meta["retry_after"] == "1"
        assert meta["elapsed_s"] < 10, meta  # the 1 s Milvus timeout bounds a search, whatever the server does
    return counts


def test_search_and_filters_on_the_server(served):
    c, _ = served
    info = {i["name"]: i for i in c.get("/v1/indexes").json()["indexes"]}
    assert info["photos-s"]["factory"].startswith("milvus:HNSW(M=32")
    s, a, _ = _post(c, QUERY)
    s2, b, _ = _post(c, {**QUERY, "index": "photos"})
    assert s == s2 == 200 and _ids(a) == _ids(b) and not a["degraded"]  # 12 items: HNSW finds them all
    s, f, _ = _post(c, FILTERED)
    assert s == 200 and f["filtered"]["method"] == "milvus-expr" and f["filtered"]["matching"] == 12


def test_server_paused_mid_search_is_503_then_recovers(served):
    c, server = served
    before = _ids(_post(c, QUERY)[1])
    threading.Timer(0.5, server.pause).start()
    try:
        during = _stream(c, 4.0)
        # the FAISS index of the same service is untouched by Milvus' trouble
        s, faiss_answer, meta = _post(c, {**QUERY, "index": "photos"})
        assert s == 200 and faiss_answer["results"] and meta["elapsed_s"] < 5
    finally:
        server.resume()
    counts = _check(during)
    assert counts.get(503, 0) >= 2, counts  # the pause was seen, as 503s
    after = _stream(c, 0.5, until_ok=True)
    _check(after)
    assert _ids(_post(c, QUERY)[1]) == before


def test_server_killed_mid_search_is_503_then_recovers_after_restart(served):
    c, server = served
    before = _ids(_post(c, QUERY)[1])
    threading.Timer(0.5, server.kill).start()
    down = _stream(c, 3.0)
    counts = _check(down)
    assert counts.get(503, 0) >= 2 and down[-1][0] == 503, counts
    restarted: dict = {}
    t = threading.Thread(target=lambda: restarted.update(s=server.restart()))
    t.start()
    try:
        back = _stream(c, 1.0, until_ok=True)  # searches all through the restart, until the first 200
    finally:
        t.join(timeout=200)
    _check(back)
    assert restarted.get("s") is not None, "the server did not come back"
    assert back[-1][0] == 200
    for body in (QUERY, FILTERED):
        s, ans, _ = _post(c, body)
        assert s == 200 and not ans["degraded"]
    assert _ids(_post(c, QUERY)[1]) == before
    print(f"\nkilled: {counts}; restart: server ready in {restarted['s']:.1f} s, first 200 after "
          f"{sum(m['elapsed_s'] for _, _, m in back):.1f} s of searching ({_check(back)})")
