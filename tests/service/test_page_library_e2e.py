"""The page's library features in a real browser (`make test-e2e`; marker e2e): query by image (a photo dropped on
the page finds itself first; a bad file is told what is wrong), "More like this", more results and the order by date,
the filter chips and the address that restores them, and a keyword-only hit with the words it matched. The site,
the browser and the helpers: tests/service/browser.py. Screenshots of the image query, "More like this" and the
filter chips go to artifacts/e2e/."""
from __future__ import annotations

import base64
import json
import os

import pytest

from tests.service.browser import (INDEX, MANIFEST, OUT, QUERY, browser, card_ids, drop, errors,  # noqa: F401
                                   gallery, open_details, page, ready, results_shown, search, server, shot, site,
                                   thumbnails_loaded, wait_js)

pytestmark = pytest.mark.e2e


def test_image_query_finds_itself_first(page, gallery, tmp_path):
    ready(page)
    # chosen with the button's file picker
    with page.expect_response(lambda r: "/v1/search/image" in r.url) as resp:
        with page.expect_file_chooser() as chooser:
            page.get_by_role("button", name="Search by image").click()
        chooser.value.set_files(str(gallery / "coffee.jpg"))
    assert resp.value.status == 200, resp.value.text()
    body = resp.value.json()
    results_shown(page, body)
    assert body["query_kind"] == "image" and card_ids(page)[0] == "coffee.jpg"
    chip = page.locator("#query-chips .query-chip.image")
    assert chip.is_visible() and "coffee.jpg" in chip.inner_text()
    assert chip.locator("img").evaluate("i => i.src.startsWith('blob:') && i.complete && i.naturalWidth > 0")
    assert "for the image “coffee.jpg”" in page.locator("#status").inner_text()
    open_details(page)
    assert page.locator("#timings-search").get_by_text("encode_image", exact=True).is_visible()
    # dropped on the search area: it replaces the first one
    with page.expect_response(lambda r: "/v1/search/image" in r.url) as resp:
        drop(page, gallery / "cat.jpg")
    body = resp.value.json()
    results_shown(page, body)
    assert card_ids(page)[0] == "cat.jpg" and page.locator("#query-chips .query-chip").count() == 1
    thumbnails_loaded(page)
    shot(page, "image-query.png", full_page=True)
    # pasted (an image on the clipboard): it replaces the second one
    data = base64.b64encode((gallery / "rocket.jpg").read_bytes()).decode()
    with page.expect_response(lambda r: "/v1/search/image" in r.url) as resp:
        page.evaluate("""b64 => {
            const dt = new DataTransfer();
            dt.items.add(new File([Uint8Array.from(atob(b64), c => c.charCodeAt(0))], 'image.png', {type: 'image/jpeg'}));
            document.querySelector('#q').dispatchEvent(new ClipboardEvent('paste', {clipboardData: dt, bubbles: true}));
        }""", data)
    results_shown(page, resp.value.json())
    assert card_ids(page)[0] == "rocket.jpg"
    # dropped again, the cat: shown in the screenshot
    with page.expect_response(lambda r: "/v1/search/image" in r.url) as resp:
        drop(page, gallery / "cat.jpg")
    results_shown(page, resp.value.json())
    thumbnails_loaded(page)
    # with a text too: text + image, weighed by the slider
    page.get_by_label("Describe the image you want").fill(QUERY)
    assert page.get_by_label("Weight of the image").is_visible()
    with page.expect_response(lambda r: "/v1/search/image" in r.url) as resp:
        page.keyboard.press("Enter")
    assert "query=a+cup+of+coffee" in resp.value.url and "weight=0.5" in resp.value.url
    assert resp.value.json()["query_kind"] == "text+image"
    wait_js(page, "document.querySelector('#status').textContent.includes('and the image “cat.jpg”')")
    # the chip's x: the text alone again
    with page.expect_request(lambda r: r.url.endswith("/v1/search")) as req:
        page.get_by_role("button", name="Remove the image cat.jpg").click()
    assert "image" not in req.value.post_data_json and req.value.post_data_json["query"] == QUERY
    assert page.locator("#query-chips").is_hidden() and page.get_by_label("Weight of the image").is_hidden()


def test_image_checks_say_what_is_wrong(page, errors, tmp_path):
    import numpy as np
    from PIL import Image

    ready(page)
    status = page.locator("#status")
    # not an image: refused here, nothing is sent
    notes = tmp_path / "notes.txt"
    notes.write_text("not a picture")
    sent = []
    page.on("request", lambda r: "/v1/search" in r.url and sent.append(r.url))
    page.set_input_files("#image-file", str(notes))
    wait_js(page, "document.querySelector('#status').textContent.includes('is not an image')")
    assert "“notes.txt” is not an image this service reads (text/plain)" in status.inner_text()
    assert "error" in status.get_attribute("class") and not sent
    # over the service's limit (768 KiB) and not decodable here: said, nothing sent
    junk = tmp_path / "huge.jpg"
    junk.write_bytes(os.urandom(900_000))
    drop(page, junk)
    wait_js(page, "document.querySelector('#status').textContent.includes('over this service')")
    assert "“huge.jpg” is 900 KB, over this service's limit of 786 KB" in status.inner_text() and not sent
    # over the limit but a real photo: shrunk here, then searched
    big = tmp_path / "big.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (700, 900, 3), dtype=np.uint8)).save(big)
    assert big.stat().st_size > 786_432
    with page.expect_response(lambda r: "/v1/search/image" in r.url) as resp:
        page.set_input_files("#image-file", str(big))
    assert resp.value.status == 200
    assert "shrunk from" in page.locator("#query-chips").inner_text()
    # an image's name but not an image's bytes: the service's own 422 message, as it is
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 20)
    with page.expect_response(lambda r: "/v1/search/image" in r.url) as resp:
        drop(page, bad, mime="image/png")
    assert resp.value.status == 422
    message = resp.value.json()["error"]["message"]
    wait_js(page, "m => document.querySelector('#status').textContent === 'Search failed: ' + m", arg=message)
    assert errors == ["Failed to load resource: the server responded with a status of 422 (Unprocessable Entity)"]
    errors.clear()  # the one error answer this test asked for


def test_more_like_this_leaves_the_item_out(page):
    ready(page)
    first = search(page)["results"][0]["id"]
    thumbnails_loaded(page)
    button = page.locator("#results li.card").first.get_by_role("button", name=f"More like this: {first}")
    with page.expect_response(lambda r: r.url.endswith("/v1/search")) as resp:
        button.click()
    assert resp.value.request.post_data_json == {"k": 12, "like": first, "index": INDEX}
    body = resp.value.json()
    results_shown(page, body)
    ids = card_ids(page)
    assert first not in ids and len(ids) == 12 and body["query_kind"] == "like"
    chip = page.locator("#query-chips .query-chip.like")
    assert chip.inner_text().startswith(f"like: {first}")
    assert f"more like “{first}”" in page.locator("#status").inner_text()
    assert page.get_by_label("Describe the image you want").input_value() == ""  # the text is kept aside
    assert page.evaluate("document.activeElement.id") == "results"  # focus follows to the new results
    assert f"like={first}" in page.url
    thumbnails_loaded(page)
    shot(page, "more-like-this.png", full_page=True)
    # the chip's x: the text comes back and is searched again
    with page.expect_request(lambda r: r.url.endswith("/v1/search")) as req:
        chip.get_by_role("button", name=f"Remove “more like {first}”").click()
    assert req.value.post_data_json["query"] == QUERY and "like" not in req.value.post_data_json
    wait_js(page, "document.querySelector('#query-chips').hidden")


def test_more_results_and_the_order_by_date(page):
    """Issue 34: "More results" fetches the next page of the same ranking below the first; "Order" sorts the
    ranked results by date taken (undated last) and pages on in that order."""
    ready(page)
    first = search(page)
    assert first["total"] == 16 and first["next_offset"] == 12
    more = page.get_by_role("button", name="More results")
    assert more.is_visible()
    assert page.locator("#status").inner_text().startswith("12 of 16 results")
    with page.expect_response(lambda r: r.url.endswith("/v1/search")) as resp:
        more.click()
    assert resp.value.request.post_data_json == {"k": 12, "offset": 12, "query": QUERY, "rerank": "temde",
                                                 "mode": "hybrid", "index": INDEX}
    second = resp.value.json()
    assert len(second["results"]) == 4 and second["next_offset"] is None
    want = [h["id"] for h in first["results"] + second["results"]]
    wait_js(page, "n => document.querySelectorAll('#results li.card').length === n", arg=16)
    assert card_ids(page) == want and len(set(want)) == 16  # one ranking: nothing twice
    assert page.locator("#results li.card img").nth(12).get_attribute("alt").startswith("Result 13: ")  # numbered on
    wait_js(page, "!document.querySelector('#more-results').offsetParent")  # the last page: no button
    assert page.locator("#status").inner_text().startswith("16 results")
    assert page.evaluate("document.activeElement.closest('li') && document.activeElement.closest('li').dataset.id") \
        == want[12]  # focus goes on where the new page starts
    thumbnails_loaded(page)
    shot(page, "more-results.png", full_page=True)
    # newest taken first: the dated photos by date, then the undated in relevance order; a new first page
    with page.expect_response(lambda r: r.url.endswith("/v1/search")) as resp:
        page.get_by_label("Order").select_option("-date_taken")
    assert resp.value.request.post_data_json["sort"] == "-date_taken" and "offset" not in resp.value.request.post_data_json
    body = resp.value.json()
    results_shown(page, body)
    with page.expect_response(lambda r: r.url.endswith("/v1/search")) as resp:
        more.click()
    ids = [h["id"] for h in body["results"] + resp.value.json()["results"]]
    wait_js(page, "n => document.querySelectorAll('#results li.card').length === n", arg=16)
    assert card_ids(page) == ids
    dated = sorted(((t, f"{n}.jpg") for n, (_, _, t) in MANIFEST.items() if t), reverse=True)
    assert ids[:len(dated)] == [i for _, i in dated]
    assert ids[len(dated):] == [i for i in want if i not in set(ids[:len(dated)])]  # relevance order
    assert "sort=-date_taken" in page.url and "newest taken first" in page.locator("#status").inner_text()
    shot(page, "order-by-date.png", full_page=True)


def test_filter_chips_narrow_the_results(page):
    ready(page)
    hits = search(page)["results"]
    refine = page.locator("#refine")
    assert refine.is_hidden()  # closed at first: the photos come first
    page.get_by_role("button", name="Filters").click()
    assert refine.is_visible() and page.locator("#filters-button").get_attribute("aria-expanded") == "true"
    # a chip per tag, format and camera of the results, with how many of them carry it
    space = refine.locator('button.facet-chip[data-field="tags"][data-value="space"]')
    shown = sum("space" in h["metadata"]["tags"] for h in hits)
    assert space.inner_text().split() == ["space", str(shown), "of", "12", "results"]  # "of 12 results": unseen
    assert space.get_attribute("aria-pressed") == "false"
    assert refine.locator('button.facet-chip[data-field="format"]').inner_text().split()[:2] == ["JPEG", "12"]
    n_space = sum("space" in tags for tags, _, _ in MANIFEST.values())
    with page.expect_response(lambda r: r.url.endswith("/v1/search")) as resp:
        space.click()
    assert resp.value.request.post_data_json["filter"] == {"field": "tags", "eq": "space"}
    body = resp.value.json()
    results_shown(page, body)
    assert len(body["results"]) == n_space == body["filtered"]["matching"]
    assert all("space" in h["metadata"]["tags"] for h in body["results"])
    assert page.locator("#filter-count").inner_text() == f"{n_space} items match"
    assert page.locator("#active-filters").inner_text().startswith("tags: space")
    assert refine.locator('button.facet-chip[data-value="space"]').get_attribute("aria-pressed") == "true"
    # a second tag: OR within the field; a camera: AND across fields
    with page.expect_response(lambda r: r.url.endswith("/v1/search")):
        refine.locator('button.facet-chip[data-field="tags"][data-value="people"]').click()
    with page.expect_response(lambda r: r.url.endswith("/v1/search")) as resp:
        refine.locator('button.facet-chip[data-field="camera"][data-value="Canon EOS 80D"]').click()
    assert resp.value.request.post_data_json["filter"] == {"and": [
        {"field": "tags", "in": ["space", "people"]}, {"field": "camera", "eq": "Canon EOS 80D"}]}
    want = {f"{n}.jpg" for n, (tags, cam, _) in MANIFEST.items() if {"space", "people"} & set(tags)
            and cam == "Canon EOS 80D"}
    body = resp.value.json()
    results_shown(page, body)
    assert set(card_ids(page)) == want and body["filtered"]["matching"] == len(want)
    assert page.locator("#filter-count").inner_text() == f"{len(want)} items match"
    thumbnails_loaded(page)
    shot(page, "filter-chips.png", full_page=True)
    # closed, the filters in force and the count stay in sight
    page.get_by_role("button", name="Filters").click()
    assert refine.is_hidden() and page.locator("#active-filters").is_visible()
    assert page.locator("#filter-count").is_visible()
    page.get_by_role("button", name="Filters").click()
    # a date range taken from / to ("to" includes its day), kept in the address
    with page.expect_response(lambda r: r.url.endswith("/v1/search")):
        page.locator("#taken-from").fill("2021-01-01")
    with page.expect_response(lambda r: r.url.endswith("/v1/search")) as resp:
        page.locator("#taken-to").fill("2021-12-31")
    flt = resp.value.request.post_data_json["filter"]
    assert {"field": "taken", "gte": "2021-01-01", "lt": "2022-01-01"} in flt["and"]
    in_2021 = {f"{n}.jpg" for n, (_, _, taken) in MANIFEST.items() if taken and taken.startswith("2021")}
    results_shown(page, resp.value.json())
    assert set(card_ids(page)) == want & in_2021 == {"moon.jpg"}
    assert page.locator("#filter-count").inner_text() == "1 item matches"
    assert "taken: 2021-01-01 – 2021-12-31" in page.locator("#active-filters").inner_text()
    assert "filter=" in page.url
    # every filter removed with its chip's x: all results again, no count
    while page.locator("#active-filters .chip-remove").count():
        with page.expect_response(lambda r: r.url.endswith("/v1/search")):
            page.locator("#active-filters .chip-remove").first.click()
    wait_js(page, "document.querySelector('#filter-count').hidden")
    assert len(card_ids(page)) == 12


def test_like_and_filters_are_restored_from_the_address(page):
    flt = json.dumps({"tags": ["object"], "to": "2019-12-31"})
    with page.expect_response(lambda r: r.url.endswith("/v1/search")) as resp:
        page.goto(f"/?like=coffee.jpg&k=6&filter={flt}")
    assert resp.value.request.post_data_json == {"k": 6, "like": "coffee.jpg", "index": INDEX, "filter": {
        "and": [{"field": "tags", "eq": "object"}, {"field": "taken", "lt": "2020-01-01"}]}}
    body = resp.value.json()
    results_shown(page, body)
    want = {f"{n}.jpg" for n, (tags, _, taken) in MANIFEST.items()
            if "object" in tags and taken and taken < "2020" and n != "coffee"}
    assert set(card_ids(page)) == want == {"clock.jpg"}
    assert page.locator("#query-chips").inner_text().startswith("like: coffee.jpg")
    assert page.locator("#taken-to").input_value() == "2019-12-31"
    assert page.locator("#filter-count").inner_text() == "1 item matches"


def teardown_module(_module):
    kept = sorted(p.name for p in OUT.glob("*.png")) if OUT.exists() else []
    print(f"\nscreenshots in {OUT}: {', '.join(kept)}")


def test_a_keyword_only_hit_shows_the_words_it_matched(page):
    """A word printed in page.jpg (read by OCR at index time, where the text gate sees writing) finds it with
    "words only", and the card marks the word in the photo's text."""
    page.goto("/")
    open_details(page)
    page.select_option("#mode", "keyword")
    body = search(page, "segmentation")
    assert body["mode"] == "keyword" and [h["id"] for h in body["results"]] == ["page.jpg"], body
    card = page.locator("#results li.card").first
    assert card.locator(".found-text mark").all_inner_texts() == ["segmentation"]
    assert "text in photo" in card.locator(".found-text").inner_text()
    shot(page, "keyword-hit.png", full_page=True)
    with page.expect_response(lambda r: r.url.endswith("/v1/search")) as resp:
        page.select_option("#mode", "hybrid")  # words and meaning: the same photo first, the others after it
    body = resp.value.json()
    assert body["mode"] == "hybrid" and body["results"][0]["id"] == "page.jpg" and len(body["results"]) > 1
