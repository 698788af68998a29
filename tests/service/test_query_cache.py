"""The query-vector cache (service/query_cache.py): a repeated text skips the query tower and gets the very vectors
the tower gave; bounded by bytes, least recently used out first; keyed by model, precision and text; counted."""
from __future__ import annotations

import numpy as np
import pytest

from crossprobe.core.inference import QueryVectors
from crossprobe.service import metrics
from crossprobe.service.query_cache import QueryCache, nbytes
from tests.service.conftest import _client


def _q(seed: int, d: int = 64) -> QueryVectors:
    rng = np.random.default_rng(seed)
    return QueryVectors(rng.normal(size=d).astype(np.float32), rng.normal(size=(4, d)).astype(np.float32), None, None)


def _count(result: str) -> float:
    return metrics.QUERY_CACHE.labels(result)._value.get()


def test_hits_return_the_stored_vectors_and_are_counted():
    c = QueryCache(1 << 20)
    hits, misses = _count("hit"), _count("miss")
    assert c.get(("fp", "fp32", "a dog")) is None
    q = _q(0)
    c.put(("fp", "fp32", "a dog"), q)
    got = c.get(("fp", "fp32", "a dog"))
    assert got is q and not got.g_q.flags.writeable  # shared by every later hit: read-only
    assert c.get(("fp", "int8", "a dog")) is None and c.get(("other", "fp32", "a dog")) is None
    assert c.get(("fp", "fp32", "a dog ")) is None  # the text as the tower gets it: another text, another key
    assert _count("hit") - hits == 1 and _count("miss") - misses == 4


def test_bounded_by_bytes_least_recently_used_out_first():
    size = nbytes(_q(0))
    c = QueryCache(3 * size)
    for i in range(3):
        c.put(("fp", "fp32", str(i)), _q(i))
    c.get(("fp", "fp32", "0"))  # 0 is now the most recently used
    c.put(("fp", "fp32", "3"), _q(3))
    assert len(c) == 3 and c.get(("fp", "fp32", "1")) is None
    assert all(c.get(("fp", "fp32", k)) is not None for k in ("0", "2", "3"))
    assert metrics.QUERY_CACHE_BYTES._value.get() <= 3 * size


def test_off_at_zero():
    c = QueryCache(0)
    c.put(("fp", "fp32", "a"), _q(0))
    assert c.get(("fp", "fp32", "a")) is None and len(c) == 0


@pytest.fixture(scope="module")
def cached_client(built, svc_ckpt, artifacts):
    yield from _client(built, svc_ckpt, artifacts, query_cache_mb=8)


def test_a_repeated_search_skips_the_query_tower_with_the_same_answer(cached_client, monkeypatch):
    state = cached_client.app.state.svc
    body = {"query": "a red square on a white wall", "k": 5}
    first = cached_client.post("/v1/search", json=body).json()
    calls = []
    real = state.models.encode_texts
    monkeypatch.setattr(state.models, "encode_texts", lambda texts: calls.append(texts) or real(texts))
    hits = _count("hit")
    again = cached_client.post("/v1/search", json=body).json()
    assert calls == [] and _count("hit") - hits == 1
    assert [(h["id"], h["score"]) for h in again["results"]] == [(h["id"], h["score"]) for h in first["results"]]
    cached_client.post("/v1/search", json={**body, "query": "a blue circle"})
    assert calls == [["a blue circle"]]  # another text: the tower


def test_the_cache_is_on_metrics(cached_client):
    text = cached_client.get("/metrics").text
    assert 'crossprobe_query_cache_total{result="hit"}' in text and "crossprobe_query_cache_bytes" in text
