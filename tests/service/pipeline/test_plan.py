"""Plan.from_request (service/pipeline/plan.py): one plan from any request model, by the fields' names, with the
route's translations and the server's defaults."""
from __future__ import annotations

import base64
import io
from dataclasses import fields

import pytest
from PIL import Image

from crossprobe.service.exceptions import InvalidRequest
from crossprobe.service.pipeline import Plan
from crossprobe.service.schemas import ImageSearchParams, SearchRequest
from crossprobe.service.settings import MAX_SHORTLIST, Settings


def test_every_request_field_reaches_the_plan():
    # a request field without a plan field of the same name would be dropped without a word
    names = {f.name for f in fields(Plan)}
    assert set(SearchRequest.model_fields) <= names, set(SearchRequest.model_fields) - names
    assert set(ImageSearchParams.model_fields) <= names, set(ImageSearchParams.model_fields) - names


def test_a_search_request_becomes_its_plan_with_the_server_defaults():
    settings = Settings(default_rerank="cp", default_shortlist=50)
    body = SearchRequest(query="a dog", k=7, like=["a", "b", "a"], weight=0.2, dedup=0.9, sort="-date_added",
                         offset=3, min_score=0.1, mode="vector", facets=True)
    plan = Plan.from_request(body, settings, None)
    assert (plan.query, plan.k, plan.rerank, plan.shortlist, plan.rerank_skipped) == ("a dog", 7, "cp", 50, None)
    assert plan.like == ["a", "b"] and plan.kind == "text+like"  # repeats count once
    assert (plan.weight, plan.dedup, plan.sort, plan.offset, plan.min_score, plan.mode, plan.facets) == (
        0.2, 0.9, "-date_added", 3, 0.1, "vector", True)
    assert Plan.from_request(SearchRequest(query="a dog", k=80, rerank="none"), settings, None).shortlist == 80


def test_without_a_text_nothing_reranks_and_an_image_arrives_as_bytes():
    plan = Plan.from_request(SearchRequest(like="x"), Settings(default_rerank="temde"), None)
    assert plan.like == ["x"] and plan.rerank == "none" and "rerank temde needs a text query" in plan.rerank_skipped
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buf, "PNG")
    plan = Plan.from_request(SearchRequest(image=base64.b64encode(buf.getvalue()).decode()), Settings(), None)
    assert plan.image == buf.getvalue() and plan.kind == "image"


def test_the_route_translations_win_and_the_shortlist_covers_the_tail():
    params = ImageSearchParams(k=5, query="a cat", filter='{"field": "tags", "eq": "x"}', sort="date_taken")
    plan = Plan.from_request(params, Settings(), None, filter="the parsed tree", image=b"jpeg bytes")
    assert (plan.filter, plan.image, plan.k, plan.query, plan.sort) == ("the parsed tree", b"jpeg bytes", 5, "a cat",
                                                                        "date_taken")
    assert plan.kind == "text+image"
    plan = Plan.from_request(None, Settings(default_shortlist=10), None, k=40, tail=30, image=b"x")
    assert plan.query is None and plan.shortlist == 70 and plan.tail == 30
    assert Plan.from_request(None, Settings(), None, k=40, tail=5000, image=b"x").shortlist == MAX_SHORTLIST


def test_min_relevance_needs_the_checkpoints_calibration():
    body = SearchRequest(query="a dog", min_relevance=0.2)
    with pytest.raises(InvalidRequest, match="no calibration.json"):
        Plan.from_request(body, Settings(), None)
    assert Plan.from_request(body, Settings(), object()).min_relevance == 0.2
