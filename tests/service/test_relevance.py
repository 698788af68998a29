"""Calibrated relevance in /v1/search (core/calibration.py, service/pipeline/stages.py's relevance stage): each text query's
result carries the checkpoint's curve of its rerank mode applied to its score, min_relevance cuts the ranked
answer (total and pages included), and queries that are not a text alone get no relevance and refuse a cutoff.

With the committed checkpoint and its fitted calibration, over the sample photos: queries about things the
gallery does not hold return nothing at the cutoff the dev sets chose, and queries it does hold keep their photo.
"""
from __future__ import annotations

import base64
import io
import json
import shutil

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from crossprobe.core import DEFAULT_CHECKPOINT, calibration
from crossprobe.service.app import create_app
from tests.service.conftest import service_settings, wait_ready

# a curve per mode over the small test model's score ranges: relevance rises linearly across them
CURVES = {"none": {"x": [-1.0, 1.0], "y": [0.0, 1.0]}, "cp": {"x": [-30.0, 30.0], "y": [0.0, 1.0]},
          "temde": {"x": [-30.0, 30.0], "y": [0.0, 1.0]}}


@pytest.fixture(scope="module")
def cal_client(built, svc_ckpt, artifacts, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("cal-ckpt") / "ck"
    shutil.copytree(svc_ckpt, ckpt)  # same weights, same fingerprint (calibration.json is not part of it)
    (ckpt / calibration.FILE).write_text(json.dumps({"curves": CURVES, "meta": {}}))
    with TestClient(create_app(service_settings(built, ckpt, artifacts))) as c:
        wait_ready(c)
        yield c


@pytest.mark.parametrize("mode", ["none", "cp", "temde"])
def test_each_result_carries_its_modes_curve_of_its_score(cal_client, mode):
    r = cal_client.post("/v1/search", json={"query": "a red square", "k": 12, "rerank": mode})
    assert r.status_code == 200, r.text
    hits = r.json()["results"]
    c = CURVES[mode]
    for h in hits:
        assert h["relevance"] == pytest.approx(float(np.interp(h["score"], c["x"], c["y"])), abs=1e-4)
    rel = [h["relevance"] for h in hits]
    assert rel == sorted(rel, reverse=True) and len(set(rel)) > 1  # ranked by score, so by relevance


def test_min_relevance_cuts_the_ranked_answer_and_its_pages(cal_client):
    whole = cal_client.post("/v1/search", json={"query": "a red square", "k": 12, "rerank": "cp"}).json()["results"]
    rel = sorted(h["relevance"] for h in whole)
    cut = (rel[len(rel) // 2 - 1] + rel[len(rel) // 2]) / 2  # between two results: half of them pass
    body = cal_client.post("/v1/search", json={"query": "a red square", "k": 4, "rerank": "cp",
                                               "min_relevance": cut}).json()
    kept = [h["id"] for h in whole if h["relevance"] >= cut]
    assert body["total"] == len(kept) == 6 and [h["id"] for h in body["results"]] == kept[:4]
    page2 = cal_client.post("/v1/search", json={"query": "a red square", "k": 4, "rerank": "cp", "min_relevance": cut,
                                                "offset": 4}).json()
    assert [h["id"] for h in page2["results"]] == kept[4:] and page2["next_offset"] is None
    none = cal_client.post("/v1/search", json={"query": "a red square", "rerank": "cp", "min_relevance": 1.0}).json()
    assert none["results"] == [] and none["total"] == 0


def _png() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("body", [{"image": "PNG"}, {"query": "red", "image": "PNG"}, {"like": "img_000.jpg"}])
def test_queries_that_are_not_a_text_alone_have_no_relevance_and_refuse_a_cutoff(cal_client, body):
    body = {k: _png() if v == "PNG" else v for k, v in body.items()}
    r = cal_client.post("/v1/search", json=body)
    assert r.status_code == 200, r.text
    assert all(h["relevance"] is None for h in r.json()["results"]) and r.json()["results"]
    r = cal_client.post("/v1/search", json={**body, "min_relevance": 0.5})
    assert r.status_code == 422 and "min_relevance needs a text query" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.5", True, [0.5]])
def test_min_relevance_out_of_range_or_not_a_number_is_422(cal_client, bad):
    r = cal_client.post("/v1/search", json={"query": "a dog", "min_relevance": bad})
    assert r.status_code == 422, r.text


def test_a_checkpoint_without_calibration_gives_null_relevance_and_a_clear_422(client):
    body = client.post("/v1/search", json={"query": "a dog"}).json()
    assert body["results"] and all(h["relevance"] is None for h in body["results"])
    r = client.post("/v1/search", json={"query": "a dog", "min_relevance": 0.5})
    assert r.status_code == 422 and "has no relevance calibration" in r.json()["error"]["message"], r.text


def test_the_committed_checkpoint_is_calibrated_for_every_mode():
    cal = calibration.Calibration.load(DEFAULT_CHECKPOINT)
    assert cal is not None and set(cal.curves) == {"none", "cp", "temde"}
    assert cal.meta["fingerprint"] == json.loads((DEFAULT_CHECKPOINT / "config.json").read_text())["fingerprint"]
    for c in cal.curves.values():  # probabilities that rise with the score, from near 0 to well above it
        assert c.y[0] < 0.05 and c.y[-1] > 0.5


# ---- the committed checkpoint and its fitted curves, over the sample photos -------------------------------------
ABSENT = ["a jellyfish in dark water", "a bowl of ramen noodles", "a hairy tarantula", "a pink flamingo",
          "a sliced pineapple", "a hedgehog in the leaves", "a wedding cake with flowers", "a plate of dumplings"]
PRESENT = {"a cat": "cat.jpg", "a cup of coffee": "coffee.jpg", "a man riding a motorcycle": "motorcycle.jpg"}


@pytest.fixture(scope="module")
def real_client(redis_server, redis_url, bert, tmp_path_factory):  # noqa: F811 (fixtures from tests/indexer)
    from crossprobe.indexer import build
    from crossprobe.indexer.jobs.settings import IndexerSettings
    from crossprobe.models.demo import write_sample_gallery
    from crossprobe.service.settings import Settings

    redis_server.flushall()
    work = tmp_path_factory.mktemp("relevance-real")
    ixs = IndexerSettings(redis_url=redis_url, index_root=work / "indexes", models_dir=work / "onnx", batch_size=8,
                          threads=2, progress=False)
    build("samples", images=write_sample_gallery(work / "gallery"), settings=ixs, bert=bert, log=lambda *_: None)
    settings = Settings(redis_url=redis_url, index_root=ixs.index_root, models_dir=work / "onnx-service", threads=2,
                        reload_interval_s=0, access_log=False)
    with TestClient(create_app(settings)) as c:
        wait_ready(c)
        yield c


@pytest.mark.parametrize("mode", ["cp", "temde", "none"])
def test_queries_for_things_absent_from_the_gallery_return_nothing_at_a_cutoff(real_client, mode):
    """At min_relevance 0.1 (docs/api.md's example) at least half of the queries about things none of the 16 photos
    shows return nothing (on the dev sets' 50 such queries: 26 to 40 of 50, docs/research/calibration.md), while
    the photo a present query finds first keeps its place. What the cutoff costs is real too: "a cup of coffee"
    finds the coffee first, at a relevance under 0.1, so the cutoff drops it (not asserted: a weakness, not a
    promise)."""
    def top(q: str, **kw) -> list[dict]:
        r = real_client.post("/v1/search", json={"query": q, "rerank": mode, **kw})
        assert r.status_code == 200, r.text
        return r.json()["results"]

    empty = [q for q in ABSENT if not top(q, min_relevance=0.1)]
    assert len(empty) >= len(ABSENT) // 2, f"{mode}: only {empty} of {ABSENT} returned nothing"
    for q, photo in PRESENT.items():
        assert top(q)[0]["id"] == photo  # without a cutoff: found first
        kept = top(q, min_relevance=0.1)
        assert not kept or kept[0]["id"] == photo
    assert top("a cat", min_relevance=0.1)[0]["id"] == "cat.jpg"
    absent_best = np.mean([top(q)[0]["relevance"] for q in ABSENT])
    present_best = np.mean([top(q)[0]["relevance"] for q in PRESENT])
    assert absent_best < present_best, (absent_best, present_best)
