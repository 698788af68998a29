"""The web page in a real browser (`make test-e2e`; left out of `make test` by the e2e marker).

Playwright (PyPI, the `e2e` extra) drives Debian's chromium (/usr/bin/chromium: no browser download)
against `crossprobe serve` in a subprocess on a free loopback port. The index is built by the indexer
from scikit-image's sample photos with the committed checkpoint (models/checkpoints/default), through a
manifest that gives them tags, a camera and a date taken (MANIFEST), so the page shows real rankings ("a cup
of coffee" must find the coffee photo; an indexed photo dropped on the page finds itself first) and real
filters. Screenshots of the results, the explain view, the phone layout, the image query, "More like this"
and the filter chips go to artifacts/e2e/ (gitignored), printed at the end of each test (-s shows them);
search-1280.png and search-390.png are the ones docs/images/ keeps (looked at, then copied by hand).

The ONNX graphs of the committed checkpoint are kept under artifacts/e2e/ between runs (keyed by its
fingerprint, written atomically), so a second run starts in seconds instead of exporting them again.
"""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from crossprobe.service.server import free_port
from tests.service.live import stop

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "artifacts" / "e2e"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
QUERY = "a cup of coffee"
INDEX = "samples"
# the gallery's manifest: id (the file's name, as a folder build would give it) -> tags, camera, date taken
SPACE, OBJECTS, SURFACES = ["space"], ["object"], ["texture"]
MANIFEST = {
    "astronaut": (SPACE + ["people"], "Canon EOS 80D", "2018-03-01"), "camera": (["people"] + OBJECTS, None, None),
    "cat": (["animal"], "NIKON D750", "2019-06-10"), "coffee": (OBJECTS + ["food"], "NIKON D750", "2019-07-04"),
    "coins": (OBJECTS, "Canon EOS 80D", "2020-01-20"), "horse": (["animal"], None, "2020-05-05"),
    "moon": (SPACE, "Canon EOS 80D", "2021-02-02"), "rocket": (SPACE, "NIKON D750", "2021-09-09"),
    "motorcycle": (OBJECTS + ["people"], "Apple iPhone 12", "2021-11-11"), "hubble": (SPACE, None, None),
    "clock": (OBJECTS, "Apple iPhone 12", "2019-12-31"), "page": (SURFACES, None, None),
    "brick": (SURFACES, "Apple iPhone 12", "2020-08-08"), "grass": (SURFACES, None, "2020-08-09"),
    "retina": (["science"], None, None), "colorwheel": (SURFACES, None, None),
}


@pytest.fixture(scope="module")
def site(redis_server, redis_url, bert, tmp_path_factory):  # noqa: F811 (fixtures from tests/indexer)
    """(base URL, gallery folder) of a live service over an index of the sample photos, built with the
    committed checkpoint from a manifest (MANIFEST's tags, cameras and dates)."""
    with sample_site(redis_server, redis_url, bert, tmp_path_factory.mktemp("page-e2e")) as (url, gallery):
        yield url, gallery


@contextmanager
def sample_site(redis_server, redis_url, bert, work: Path, port: int | None = None,
                captions: dict[str, str] | None = None, model: str | None = None, **env: str):
    """`crossprobe serve` (a subprocess, on `port` or a free one) over the sample photos indexed into a flushed
    Redis -> (base URL, gallery folder), until the block ends. captions: photo name -> its manifest caption;
    model: a spec both the index and the service use (default: the committed checkpoint); env: more CROSSPROBE_*
    settings. The server's log: <work>/server.log."""
    from crossprobe.indexer import build
    from crossprobe.indexer.jobs.settings import IndexerSettings
    from crossprobe.models.demo import write_sample_gallery

    if not Path(CHROMIUM).exists():
        pytest.fail(f"no browser at {CHROMIUM}: run `make test-e2e` (it installs Debian's chromium)")
    redis_server.flushall()
    gallery = write_sample_gallery(work / "gallery")
    lines = []
    for name, (tags, camera, taken) in MANIFEST.items():
        line = {"id": f"{name}.jpg", "uri": str(gallery / f"{name}.jpg"), "tags": tags}
        line.update({k: v for k, v in (("camera", camera), ("taken", taken), ("caption", (captions or {}).get(name)))
                     if v})
        lines.append(json.dumps(line) + "\n")
    assert len(lines) == len(list(gallery.glob("*.jpg")))
    manifest = work / "samples.jsonl"
    manifest.write_text("".join(lines))
    ixs = IndexerSettings(redis_url=redis_url, index_root=work / "indexes", model_dir=OUT / "onnx-indexer", batch_size=8,
                          threads=2, progress=False, ocr=True,  # OCR: page.jpg's printed words become searchable
                          model=model)
    build(INDEX, manifest=manifest, settings=ixs, bert=bert, log=lambda *_: None)  # ckpt None: the committed one

    port = port or free_port()
    env = {**os.environ, "REDIS_URL": redis_url, "CROSSPROBE_INDEX_ROOT": str(ixs.index_root),
           "CROSSPROBE_ARTIFACTS_DIR": str(OUT / "onnx-service"), "CROSSPROBE_RELOAD_INTERVAL_S": "0",
           "CROSSPROBE_THREADS": "2", "CROSSPROBE_ACCESS_LOG": "false", "CROSSPROBE_LOG_LEVEL": "warning",
           "HF_HUB_OFFLINE": "1", **env}
    env.pop("CROSSPROBE_CKPT", None)
    env.pop("CROSSPROBE_MODEL", None)
    if model:
        env["CROSSPROBE_MODEL"] = model
    log = work / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "crossprobe.service.cli", "serve", "--host", "127.0.0.1",
                                 "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600  # a first run exports the checkpoint's graphs (minutes on 2 busy cores)
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        yield url, gallery
    finally:
        stop(proc)
    assert "Traceback" not in log.read_text(), log.read_text()


@pytest.fixture(scope="module")
def server(site):
    return site[0]


@pytest.fixture(scope="module")
def gallery(site) -> Path:
    return site[1]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture()
def errors() -> list[str]:
    """The page's script errors and failed resources (a test that provokes an error answer takes it out)."""
    return []


@pytest.fixture()
def page(browser, server, errors):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=server)
    pg = ctx.new_page()
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: m.type == "error" and errors.append(m.text))
    yield pg
    ctx.close()
    assert not errors, errors  # no script error and no failed resource on the way


def shot(target, name: str, **kw) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    target.screenshot(path=str(path), **kw)
    print(f"screenshot: {path}")
    return path


def wait_js(page, script: str, arg=None, timeout_s: float = 60.0) -> None:
    """Poll a script with page.evaluate until it is truthy. Not page.wait_for_function: that compiles its
    predicate with eval() inside the page, which the page's Content-Security-Policy (no 'unsafe-eval')
    refuses, and the test must run under the policy the page ships with."""
    deadline = time.monotonic() + timeout_s
    while not _evaluate_settled(page, script, arg):
        assert time.monotonic() < deadline, f"timed out waiting for: {script}"
        time.sleep(0.1)


def _evaluate_settled(page, script: str, arg=None):
    """page.evaluate, where a page that is navigating (a new tab going from about:blank to its blob: URL) counts as
    "not yet" instead of failing: Playwright throws "Execution context was destroyed" when the document changes under
    a running evaluate, which made test_page_works_with_keys_in_a_browser fail in 4 of 6 runs here."""
    from playwright.sync_api import Error

    try:
        return page.evaluate(script, arg)
    except Error as e:
        if "Execution context was destroyed" in str(e):
            return False
        raise


def search(page, query: str = QUERY) -> dict:
    with page.expect_response(lambda r: r.url.endswith("/v1/search")) as resp:
        page.get_by_label("Describe the image you want").fill(query)
        page.keyboard.press("Enter")
    body = resp.value.json()
    wait_js(page, "n => document.querySelectorAll('#results li.card').length === n",
                           arg=len(body["results"]))
    return body


def thumbnails_loaded(page) -> None:
    wait_js(page, "[...document.querySelectorAll('#results img')].every(i => i.complete && i.naturalWidth > 0)")


def open_details(page) -> None:
    """Open the "Details" panel (the reranker, match mode, explain, timings and the cards' scores live there)."""
    button = page.get_by_role("button", name="Details", exact=True)
    if button.get_attribute("aria-expanded") != "true":
        button.click()
    assert button.get_attribute("aria-expanded") == "true" and page.locator("#details").is_visible()


def heat_maps_drawn(page) -> None:
    wait_js(page, """() => {
        const cs = [...document.querySelectorAll('#results canvas.heat')];
        return cs.length > 0 && cs.every(c => !c.hidden && c.getBoundingClientRect().width > 20);
    }""")


# ---- the tests -------------------------------------------------------------------------------------
def test_search_shows_photos_with_scores_and_timings_under_details(page):
    page.goto("/")
    wait_js(page, "document.querySelector('#index option') && document.querySelector('#index').value !== ''")
    assert page.locator("#index option").first.inner_text().startswith(f"{INDEX} (16 images)")
    assert page.locator("#index").is_hidden()  # one library: nothing to choose
    body = search(page)
    thumbnails_loaded(page)
    cards = page.locator("#results li.card")
    assert cards.count() == 12 == len(body["results"])
    names = cards.locator(".name").all_inner_texts()
    assert names == [h["id"] for h in body["results"]]
    assert "coffee.jpg" in names[:3], names  # the model card: coffee first (fp32); int8 may swap near ties
    # the numbers wait behind "Details": no score, cosine or relevance on a card until it is opened
    assert cards.locator(".scores").evaluate_all("els => els.length === 12 && els.every(e => !e.offsetParent)")
    assert page.locator("#timings").is_hidden() and page.locator('input[name="rerank"]').first.is_hidden()
    # "Strong match" exactly where the answer's calibrated relevance is high (0.3); none for a small gallery's 0.13
    strong = cards.evaluate_all("els => els.map(e => !!e.querySelector('.strong-match'))")
    assert strong == [(h["relevance"] or 0) >= 0.3 for h in body["results"]], (strong, body["results"])
    open_details(page)
    scores = cards.locator(".score").all_inner_texts()
    assert scores[0] == f"score {body['results'][0]['score']:.3f}" and all(s.startswith("score ") for s in scores)
    assert cards.locator(".relevance").first.inner_text() == f"relevance {body['results'][0]['relevance']:.2f}"
    assert cards.locator(".score").first.is_visible() and cards.locator(".ann").first.is_visible()
    # alt text on every thumbnail; each result is a link to the full-size image
    assert cards.locator("img").first.get_attribute("alt").startswith("Result 1: ")
    assert cards.locator("img").evaluate_all("imgs => imgs.every(i => i.alt.length > 10)")
    first = body["results"][0]["id"]
    assert cards.locator("a.thumb").first.evaluate("a => a.href").startswith(f"{page.url.split('?')[0]}v1/items/{first}/image")
    # the answer's stage timings, and how the search ran
    timings = page.locator("#timings-search")
    assert re.fullmatch(r": search [0-9.]+\s+ms", page.locator("#timings-summary").inner_text())
    for stage in ("encode", "ann", "fetch", "rerank", "metadata"):
        assert timings.get_by_text(stage, exact=True).is_visible(), stage
    assert "reranked by temde" in page.locator("#how").inner_text()  # the page's default, as the server's
    assert page.locator("#how").inner_text().startswith(f"Searched {INDEX}, ")
    shot(page, "results.png", full_page=True)
    # closed again (the keyboard works it too: it is a button): the numbers go with it
    page.get_by_role("button", name="Details", exact=True).press("Enter")
    assert page.locator("#details").is_hidden() and cards.locator(".score").first.is_hidden()


def test_reranker_switch_is_used_by_the_request(page):
    page.goto("/")
    search(page)
    open_details(page)
    for mode, said in (("cp", "reranked by cp"), ("none", "ranked by the two-tower score"),
                       ("temde", "reranked by temde")):
        with page.expect_request(lambda r: r.url.endswith("/v1/search")) as req:
            page.locator(f'input[name="rerank"][value="{mode}"]').check()
        assert req.value.post_data_json["rerank"] == mode
        assert req.value.post_data_json["query"] == QUERY
        resp = req.value.response().json()
        assert resp["rerank"] == mode
        wait_js(page, "s => document.querySelector('#how').textContent.includes(s)", arg=said)
        assert page.locator("#timings-search").get_by_text("rerank", exact=True).count() == (mode != "none")
        assert f"rerank={mode}" in page.url  # the address says what is on screen


def test_explain_overlays_heat_maps(page):
    page.goto("/")
    search(page)
    thumbnails_loaded(page)
    open_details(page)
    with page.expect_response(lambda r: r.url.endswith("/v1/explain")) as resp:
        page.get_by_label("Explain: show where the model looked").check()
    assert resp.value.status == 200
    body = resp.value.json()
    ids = page.locator("#results li.card").evaluate_all("els => els.map(e => e.dataset.id)")
    assert set(body["maps"]) == set(ids)
    heat_maps_drawn(page)
    # every overlay is painted (7x7, some cells opaque) and lies over its picture, inside the thumbnail
    drawn = page.evaluate("""() => [...document.querySelectorAll('#results li.card')].map(li => {
        const c = li.querySelector('canvas.heat'), d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let alpha = 0; for (let i = 3; i < d.length; i += 4) alpha = Math.max(alpha, d[i]);
        const cr = c.getBoundingClientRect(), tr = li.querySelector('.thumb').getBoundingClientRect();
        return {w: c.width, alpha, label: c.getAttribute('aria-label'),
                inside: cr.left >= tr.left - 1 && cr.right <= tr.right + 1 && cr.top >= tr.top - 1 && cr.bottom <= tr.bottom + 1};
    })""")
    assert all(d["w"] == 7 and d["alpha"] > 150 and d["inside"] and d["label"].startswith("Heat map for ")
               for d in drawn), drawn
    assert page.locator("#legend").is_visible()
    assert "ImageNet head" in page.locator("#explain-help").inner_text()  # the committed checkpoint: label maps
    assert "an even share" in page.locator("#explain-spread").inner_text()
    assert page.locator("#timings-explain").get_by_text("backbone", exact=True).is_visible()
    assert page.locator(".explain-note").first.inner_text().startswith("peak ")
    shot(page, "explain.png", full_page=True)
    shot(page.locator("#results li.card").first, "explain-first-result.png")
    # off again: the overlays go
    page.get_by_label("Explain: show where the model looked").uncheck()
    wait_js(page, "[...document.querySelectorAll('#results canvas.heat')].every(c => c.hidden)")


def test_keyboard_only(page):
    page.goto("/")
    wait_js(page, "document.activeElement && document.activeElement.id === 'q'")  # autofocus
    page.keyboard.type(QUERY)
    with page.expect_response(lambda r: r.url.endswith("/v1/search")):
        page.keyboard.press("Enter")
    page.wait_for_selector("#results li.card")

    def tab_to(selector: str, limit: int = 60) -> None:  # the filter chips sit between the form and the results
        for _ in range(limit):
            page.keyboard.press("Tab")
            if page.evaluate("s => document.activeElement.matches(s)", selector):
                return
        raise AssertionError(f"Tab never reached {selector}")

    # every stop shows where focus is
    tab_to("#search-button")
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"
    tab_to("#details-button")  # "Details": a button, Enter opens its panel
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"
    page.keyboard.press("Enter")
    assert page.locator("#details-button").get_attribute("aria-expanded") == "true"
    tab_to('input[name="rerank"]')
    with page.expect_request(lambda r: r.url.endswith("/v1/search")) as req:
        page.keyboard.press("ArrowRight")  # the radio group: arrows choose (temde, the default, then cp)
    assert req.value.post_data_json["rerank"] == "cp"
    wait_js(page, "document.querySelector('#how').textContent.includes('reranked by cp')")
    tab_to("#explain")
    with page.expect_response(lambda r: r.url.endswith("/v1/explain")):
        page.keyboard.press("Space")
    heat_maps_drawn(page)
    tab_to("#results a.thumb")
    assert page.evaluate("document.activeElement.closest('li.card') === document.querySelector('#results li.card')")
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"
    page.keyboard.press("Tab")  # the result's "More like this"
    assert page.evaluate("document.activeElement.matches('#results li.card:first-child button.more-like')")
    page.keyboard.press("Tab")  # the next result
    assert page.evaluate("document.activeElement.closest('li.card') === document.querySelectorAll('#results li.card')[1]")
    with page.context.expect_page() as popup:
        page.keyboard.press("Enter")  # opens the full-size image
    popup.value.wait_for_load_state()
    assert "/v1/items/" in popup.value.url
    popup.value.close()


def test_phone_width(browser, server):
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True,
                              has_touch=True, base_url=server)
    page = ctx.new_page()
    try:
        page.goto(f"/?q={QUERY.replace(' ', '+')}&explain=1")  # a search restored from its address
        page.wait_for_selector("#results li.card")
        thumbnails_loaded(page)
        heat_maps_drawn(page)
        shot(page, "phone.png", full_page=True)
        # nothing wider than the screen; two columns of results
        wide = page.evaluate("""() => [...document.querySelectorAll('body *')].filter(e =>
            e.getBoundingClientRect().right > document.documentElement.clientWidth + 0.5).map(e => e.id || e.className)""")
        assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth"), wide
        cols = page.evaluate("getComputedStyle(document.querySelector('#results')).gridTemplateColumns.split(' ').length")
        assert cols == 2
        # the timings wait behind "Details", so the results come first
        assert page.locator("#details").is_hidden() and page.locator("#timings").is_hidden()
        assert page.locator("#timings-summary").text_content().startswith(": search ")
    finally:
        ctx.close()


# ---- the photos first (issue 46): what a person sees after a search, without scrolling ---------------------
# the result photos whose boxes lie entirely inside the viewport, loaded, and not covered by anything else (the
# element at each box's centre belongs to its own link): their places in the result list
IN_VIEW = """() => [...document.querySelectorAll('#results li.card img')].map((img, i) => {
    const r = img.getBoundingClientRect();
    const inside = r.width > 0 && r.height > 0 && r.top >= 0 && r.left >= 0 &&
        r.bottom <= window.innerHeight && r.right <= window.innerWidth;
    const top = inside && document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
    return inside && img.complete && img.naturalWidth > 0 && top && top.closest('a.thumb') === img.closest('a.thumb')
        ? i : -1;
}).filter(i => i >= 0)"""


@pytest.mark.parametrize(("width", "height", "want"), [(1280, 800, 8), (390, 844, 1)], ids=["desktop", "phone"])
def test_photos_come_first(browser, server, width, height, want):
    """After a search the photos fill the first screen: at 1280x800 the first 8 results' photos (at least) lie
    entirely inside the viewport, on a 390x844 phone the first one does; nothing scrolled. The screenshots of
    what a person sees (the viewport) are search-1280.png and search-390.png (docs/images/ keeps them)."""
    phone = width < 600
    ctx = browser.new_context(viewport={"width": width, "height": height}, base_url=server, is_mobile=phone,
                              has_touch=phone)
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    try:
        ready(page)
        body = search(page)
        thumbnails_loaded(page)
        seen = page.evaluate(IN_VIEW)
        print(f"\n{width}x{height}: {len(seen)} of {len(body['results'])} photos entirely in view: {seen}")
        assert page.evaluate("window.scrollY") == 0
        assert len(seen) >= want and seen[:want] == list(range(want)), seen
        # what sits behind "Details" is out of sight: reranker, match mode, timings, scores
        for sel in ('input[name="rerank"]', "#mode", "#timings", "#results .score", "#results .relevance"):
            assert page.locator(sel).first.is_hidden(), sel
        shot(page, f"search-{width}.png")
    finally:
        ctx.close()
    assert not errors, errors


def test_strong_match_marker_and_degraded_notice(page):
    """Two answer fields the sample gallery does not produce, as the page shows them: a result whose calibrated
    relevance is high gets "Strong match" (one just under 0.3 does not), and a degraded answer says so in the status
    line, with the reason under Details. The answer is the live server's, with those fields changed on its way."""
    def patch(route):
        resp = route.fetch()
        body = resp.json()
        body["results"][0]["relevance"], body["results"][1]["relevance"] = 0.62, 0.29
        body.update(degraded=True, degraded_reason="feature_store_unavailable: Redis could not be reached")
        route.fulfill(response=resp, json=body)

    page.route("**/v1/search", patch)
    ready(page)
    body = search(page)
    cards = page.locator("#results li.card")
    marked = cards.evaluate_all("els => els.map(e => !!e.querySelector('.strong-match'))")
    assert marked[:2] == [True, False] and marked == [h["relevance"] >= 0.3 for h in body["results"]]
    assert cards.first.locator(".strong-match").is_visible()
    assert cards.first.locator(".strong-match").inner_text() == "Strong match"
    status = page.locator("#status")
    assert "may be incomplete" in status.inner_text() and "warn" in status.get_attribute("class")
    assert "Redis" not in status.inner_text()  # the codes are for Details
    open_details(page)
    assert "Degraded: feature_store_unavailable: Redis could not be reached" in page.locator("#how").inner_text()
    assert cards.first.locator(".relevance").inner_text() == "relevance 0.62"


# ---- query by image, more like this, filters (issue 17) ------------------------------------------------
def ready(page) -> None:
    page.goto("/")
    wait_js(page, "document.querySelector('#index option') && document.querySelector('#index').value !== ''")


def card_ids(page) -> list[str]:
    return page.locator("#results li.card").evaluate_all("els => els.map(e => e.dataset.id)")


def results_shown(page, body: dict) -> None:
    wait_js(page, "ids => JSON.stringify([...document.querySelectorAll('#results li.card')].map(e => e.dataset.id))"
                  " === JSON.stringify(ids)", arg=[h["id"] for h in body["results"]])


def drop(page, path: Path, mime: str = "image/jpeg", name: str | None = None) -> None:
    """A file dropped on the search form, as a person drags one from their desktop: a DataTransfer holding it,
    dispatched as dragenter / dragover / drop (Playwright cannot drag from outside the page)."""
    data = base64.b64encode(path.read_bytes()).decode()
    dt = page.evaluate_handle("""([b64, name, type]) => {
        const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
        const dt = new DataTransfer();
        dt.items.add(new File([bytes], name, {type}));
        return dt;
    }""", [data, name or path.name, mime])
    for event in ("dragenter", "dragover", "drop"):
        page.dispatch_event("#search-form", event, {"dataTransfer": dt})


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

