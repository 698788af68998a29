"""The stages after encode (service/pipeline/stages.py), each over a Run made by hand: the cutoffs, the page, and
what a failed feature fetch leaves (the ANN order, said as degraded; a deleted version: the newer one)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from redis.exceptions import ResponseError

from crossprobe.core.runtime import StageTimer
from crossprobe.service.breaker import FeatureStoreUnavailable
from crossprobe.service.pipeline import Plan, stages
from crossprobe.service.pipeline.run import Run


def _run(handle=None, **plan) -> Run:
    return Run(Plan(**{"query": "a dog", "k": 2, "rerank": "cp", "shortlist": 10, **plan}), handle, None, StageTimer())


def test_cutoffs_drop_what_is_below_them_but_never_a_keyword_hit():
    r = _run(min_score=0.5, min_relevance=0.3)
    r.final = np.array([0.9, 0.1, 0.2, 0.8, 0.7], np.float32)
    r.relevance = np.array([0.9, 0.9, 0.1, 0.2, 0.6], np.float32)
    r.order, r.is_kw = np.array([0, 3, 4, 2, 1]), np.array([False, False, True, False, False])
    stages.cutoffs(None, r)
    assert r.order.tolist() == [0, 4, 2]  # 3: relevance 0.2; 1: score 0.1; 2: a keyword hit, kept


def test_the_page_is_a_slice_of_the_whole_ranked_answer():
    r = _run(offset=1, tail=2)
    r.ids, r.order = list("abcdef"), np.array([5, 4, 3, 2, 1, 0])
    r.ann = r.final = np.arange(6, dtype=np.float32) / 10
    stages.page(None, r)
    assert r.total == 6 and [h.id for h in r.hits] == ["e", "d"] and [h.id for h in r.tail] == ["c", "b"]
    assert r.hits[0].score == pytest.approx(0.4) and r.hits[0].rerank is None and r.hits[0].relevance is None


class _Failing:
    def __init__(self, error: Exception):
        self.error = error

    def call(self, op, fn, *args):
        raise self.error


@pytest.mark.parametrize("error, code", [(FeatureStoreUnavailable("breaker open"), "feature_store_unavailable"),
                                         (ResponseError("WRONGTYPE"), "fetch_failed"),
                                         (KeyError("photos:v1:img_000"), "features_missing")])
def test_a_failed_fetch_keeps_the_ann_order_and_says_why(error, code):
    handle = SimpleNamespace(name="photos", reader=SimpleNamespace(features=None))
    sr = SimpleNamespace(settings=SimpleNamespace(redis_down_search="degrade"), fs=_Failing(error),
                         registry=SimpleNamespace(current=lambda name: handle))  # no newer version
    r = _run(handle)
    r.ids, r.ann = ["img_000", "img_001"], np.array([0.2, 0.5], np.float32)
    for stage in (stages.fetch, stages.rerank, stages.order):
        stage(sr, r)
    assert r.logits is None and [code for code, _ in r.degraded] == [code]
    assert r.order.tolist() == [0, 1]  # the ANN order as the ANN stage gave it


def test_a_version_deleted_under_the_request_is_answered_from_the_newer_one_once():
    old, new = (SimpleNamespace(name="photos", version=v, reader=SimpleNamespace(features=None)) for v in ("v1", "v2"))
    sr = SimpleNamespace(settings=None, fs=_Failing(KeyError("gone")), registry=SimpleNamespace(current=lambda n: new))
    r = _run(old)
    r.ids = ["img_000"]
    with pytest.raises(stages.VersionGone) as gone:
        stages.fetch(sr, r)
    assert gone.value.newer is new
    r = _run(new)
    r.ids, r.retried = ["img_000"], True
    sr.registry = SimpleNamespace(current=lambda n: SimpleNamespace())  # newer still: no second retry
    stages.fetch(sr, r)
    assert [code for code, _ in r.degraded] == ["features_missing"]


def test_redis_down_fails_the_search_when_configured():
    handle = SimpleNamespace(name="photos", reader=SimpleNamespace(features=None))
    sr = SimpleNamespace(settings=SimpleNamespace(redis_down_search="fail"), fs=_Failing(FeatureStoreUnavailable("x")))
    r = _run(handle)
    r.ids = ["img_000"]
    with pytest.raises(FeatureStoreUnavailable):
        stages.fetch(sr, r)
