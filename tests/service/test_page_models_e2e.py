"""The web page over a two-tower-only model, in a real browser (`make test-e2e`; marker e2e): a random-weight tiny
Hugging Face CLIP (tests/support/reference_models.py) exported through the inference seam indexes the sample photos and
serves them. Its page offers no reranker choice and no explain switch (GET /v1/indexes: the model has neither), and
its searches run and say they ranked by the two-tower score; an address asking for a reranker does not make the page
send one."""
from __future__ import annotations

import pytest

from tests.indexer.conftest import redis_server, redis_url  # noqa: F401 (fixtures)
# page: a browser tab on this module's `server` (pytest resolves the imported fixture's `server` here)
from tests.service.browser import (browser, errors, open_details, page, sample_site, search, shot,  # noqa: F401
                                         wait_js)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(redis_server, redis_url, bert, tmp_path_factory):  # noqa: F811
    from tests.support import reference_models as rm

    work = tmp_path_factory.mktemp("page-two-tower")
    ref = rm.build("hf_clip", work / "hf_clip_tiny", size="tiny")
    with sample_site(redis_server, redis_url, bert, work, model=f"hf:{ref.path}") as (url, _):
        yield url


def test_a_two_tower_models_page_offers_no_reranker_choice(page, server):
    import httpx

    model = httpx.get(f"{server}/v1/indexes", timeout=10).json()["model"]
    assert model["rerankers"] == [] and model["default_rerank"] == "none" and not model["explain"], model
    page.goto("/?rerank=temde&explain=1")  # an address from a crossprobe-model service: neither may stick
    wait_js(page, "document.querySelector('#index option') && document.querySelector('#index').value !== ''")
    open_details(page)
    assert page.locator("fieldset.rerank").is_hidden()
    assert page.locator('input[name="rerank"]:visible').count() == 0
    assert page.locator("#explain").is_hidden() and not page.locator("#explain").is_checked()
    with page.expect_request(lambda r: r.url.endswith("/v1/search")) as req:
        body = search(page, "a cup of coffee")
    assert req.value.post_data_json["rerank"] == "none"  # never a reranker the model lacks (that would be a 422)
    assert body["rerank"] == "none" and body["rerank_skipped"] is None and len(body["results"]) == 12
    assert all(h["relevance"] is None for h in body["results"])  # no calibration for a family model
    assert "ranked by the two-tower score" in page.locator("#how").inner_text()
    assert page.locator("#legend").is_hidden()  # no explain legend, no heat maps asked for
    shot(page, "two-tower-model.png", full_page=True)
