"""Plan.from_request (service/pipeline/plan.py): one plan from any request model, by the fields' names, with the
route's translations and the server's defaults."""
from __future__ import annotations

import base64
import io
from dataclasses import fields
from types import SimpleNamespace

import pytest
from PIL import Image

from crossprobe.service.exceptions import InvalidRequest, NoReranker
from crossprobe.service.pipeline import Plan
from crossprobe.service.schemas import ImageSearchParams, SearchRequest
from crossprobe.service.settings import MAX_SHORTLIST, Settings

# the served model as a plan sees it (a Backend's rerankers, calibration, fingerprint)
CROSSPROBE = SimpleNamespace(rerankers=("cp", "temde"), calibration=None, fingerprint="a38b96920f1adc57")
TWO_TOWER = SimpleNamespace(rerankers=(), calibration=None, fingerprint="0123456789abcdef")


def test_every_request_field_reaches_the_plan():
    # a request field without a plan field of the same name would be dropped without a word
    names = {f.name for f in fields(Plan)}
    assert set(SearchRequest.model_fields) <= names, set(SearchRequest.model_fields) - names
    assert set(ImageSearchParams.model_fields) <= names, set(ImageSearchParams.model_fields) - names


def test_a_search_request_becomes_its_plan_with_the_server_defaults():
    settings = Settings(default_rerank="cp", default_shortlist=50)
    body = SearchRequest(query="a dog", k=7, like=["a", "b", "a"], weight=0.2, dedup=0.9, sort="-date_added",
                         offset=3, min_score=0.1, mode="vector", facets=True)
    plan = Plan.from_request(body, settings, CROSSPROBE)
    assert (plan.query, plan.k, plan.rerank, plan.shortlist, plan.rerank_skipped) == ("a dog", 7, "cp", 50, None)
    assert plan.like == ["a", "b"] and plan.kind == "text+like"  # repeats count once
    assert (plan.weight, plan.dedup, plan.sort, plan.offset, plan.min_score, plan.mode, plan.facets) == (
        0.2, 0.9, "-date_added", 3, 0.1, "vector", True)
    assert Plan.from_request(SearchRequest(query="a dog", k=80, rerank="none"), settings, CROSSPROBE).shortlist == 80


def test_without_a_text_nothing_reranks_and_an_image_arrives_as_bytes():
    plan = Plan.from_request(SearchRequest(like="x"), Settings(default_rerank="temde"), CROSSPROBE)
    assert plan.like == ["x"] and plan.rerank == "none" and "rerank temde needs a text query" in plan.rerank_skipped
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buf, "PNG")
    plan = Plan.from_request(SearchRequest(image=base64.b64encode(buf.getvalue()).decode()), Settings(), CROSSPROBE)
    assert plan.image == buf.getvalue() and plan.kind == "image"


def test_the_route_translations_win_and_the_shortlist_covers_the_tail():
    params = ImageSearchParams(k=5, query="a cat", filter='{"field": "tags", "eq": "x"}', sort="date_taken")
    plan = Plan.from_request(params, Settings(), CROSSPROBE, filter="the parsed tree", image=b"jpeg bytes")
    assert (plan.filter, plan.image, plan.k, plan.query, plan.sort) == ("the parsed tree", b"jpeg bytes", 5, "a cat",
                                                                        "date_taken")
    assert plan.kind == "text+image"
    plan = Plan.from_request(None, Settings(default_shortlist=10), CROSSPROBE, k=40, tail=30, image=b"x")
    assert plan.query is None and plan.shortlist == 70 and plan.tail == 30
    assert Plan.from_request(None, Settings(), CROSSPROBE, k=40, tail=5000, image=b"x").shortlist == MAX_SHORTLIST


def test_min_relevance_needs_the_checkpoints_calibration():
    body = SearchRequest(query="a dog", min_relevance=0.2)
    with pytest.raises(InvalidRequest, match="has no relevance calibration"):
        Plan.from_request(body, Settings(), CROSSPROBE)
    calibrated = SimpleNamespace(**{**vars(CROSSPROBE), "calibration": object()})
    assert Plan.from_request(body, Settings(), calibrated).min_relevance == 0.2
    with pytest.raises(InvalidRequest, match="min_score"):  # a family model: no curves, said with the way out
        Plan.from_request(body, Settings(model="hf:/models/clip"), TWO_TOWER)


def test_a_reranker_the_model_lacks_is_refused_when_named_and_skipped_when_it_is_the_default():
    settings = Settings(model="hf:/models/clip", default_rerank="temde")
    for asked in ("cp", "temde"):
        with pytest.raises(NoReranker) as e:
            Plan.from_request(SearchRequest(query="a dog", rerank=asked), settings, TWO_TOWER)
        assert e.value.code == "reranker_unavailable" and e.value.details == {"rerank": asked, "rerankers": []}
        assert f"rerank {asked}: this server's model (hf:/models/clip 0123456789abcdef) has no trained {asked}" \
            in e.value.message and 'send rerank "none"' in e.value.message
    plan = Plan.from_request(SearchRequest(query="a dog"), settings, TWO_TOWER)
    assert plan.rerank == "none" and "default reranker temde is not trained for this model" in plan.rerank_skipped
    plan = Plan.from_request(SearchRequest(query="a dog", rerank="none"), settings, TWO_TOWER)
    assert (plan.rerank, plan.rerank_skipped) == ("none", None)
    # a model with one head: that one runs, the other is refused
    temde_only = SimpleNamespace(rerankers=("temde",), calibration=None, fingerprint="fedcba9876543210")
    assert Plan.from_request(SearchRequest(query="a dog"), settings, temde_only).rerank == "temde"
    with pytest.raises(NoReranker, match="it has: temde"):
        Plan.from_request(SearchRequest(query="a dog", rerank="cp"), settings, temde_only)


def test_a_plan_is_never_changed_and_the_index_gives_a_new_one():
    """Built once: the mode and the reranker an index leads to come as a new plan (on_index), the request's stays."""
    import dataclasses

    plan = Plan.from_request(SearchRequest(query="a dog", k=5, mode="keyword"), Settings(default_rerank="cp"),
                             CROSSPROBE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.rerank = "none"  # type: ignore[misc]
    ran = plan.on_index(has_keywords=True)
    assert (plan.mode, plan.rerank) == ("keyword", "cp")
    assert (ran.mode, ran.rerank) == ("keyword", "none") and "BM25" in ran.rerank_skipped
    default = Plan.from_request(SearchRequest(query="a dog", k=5), Settings(default_rerank="cp"), CROSSPROBE)
    assert default.on_index(has_keywords=False).mode == "vector" and default.mode is None  # no keyword index
    with pytest.raises(InvalidRequest, match="no usable keyword index"):  # keyword asked, none there: a 422
        plan.on_index(has_keywords=False)


def test_one_search_checks_readiness_once(client, monkeypatch):
    """The plan's dependency checks that the service is ready; nothing on the way checks it again."""
    from crossprobe.service.state import ServiceState

    calls = []
    real = ServiceState.require_ready
    monkeypatch.setattr(ServiceState, "require_ready", lambda self: (calls.append(1), real(self))[1])
    r = client.post("/v1/search", json={"query": "a dog", "k": 3})
    assert r.status_code == 200 and len(calls) == 1, (r.status_code, calls)
