"""The web page in a real browser (`make test-e2e`; left out of `make test` by the e2e marker).

Playwright (PyPI, the `e2e` extra) drives Debian's chromium (/usr/bin/chromium: no browser download)
against `crossprobe serve` in a subprocess on a free loopback port. The index is built by the indexer
from scikit-image's sample photos with the committed checkpoint (models/checkpoints/default), so the page
shows real rankings: "a cup of coffee" must find the coffee photo. Screenshots of the results, the explain
view and the phone layout go to artifacts/e2e/ (gitignored), printed at the end of each test (-s shows them).

The ONNX graphs of the committed checkpoint are kept under artifacts/e2e/ between runs (keyed by its
fingerprint, written atomically), so a second run starts in seconds instead of exporting them again.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
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


@pytest.fixture(scope="module")
def server(redis_server, redis_url, bert, tmp_path_factory):  # noqa: F811 (fixtures from tests/indexer)
    """Base URL of a live service over an index of the sample photos, built with the committed checkpoint."""
    from crossprobe.indexer import build
    from crossprobe.indexer.redis_conn import Settings as IndexSettings
    from crossprobe.service.demo import write_sample_gallery

    if not Path(CHROMIUM).exists():
        pytest.fail(f"no browser at {CHROMIUM}: run `make test-e2e` (it installs Debian's chromium)")
    redis_server.flushall()
    work = tmp_path_factory.mktemp("page-e2e")
    gallery = write_sample_gallery(work / "gallery")
    ixs = IndexSettings(redis_url=redis_url, root=work / "indexes", model_dir=OUT / "onnx-indexer", batch_size=8,
                        threads=2, progress=False)
    build(INDEX, images=gallery, settings=ixs, bert=bert, log=lambda *_: None)  # ckpt None: the committed one

    port = free_port()
    env = {**os.environ, "REDIS_URL": redis_url, "CROSSPROBE_INDEX_ROOT": str(ixs.root),
           "CROSSPROBE_ARTIFACTS_DIR": str(OUT / "onnx-service"), "CROSSPROBE_RELOAD_INTERVAL_S": "0",
           "CROSSPROBE_THREADS": "2", "CROSSPROBE_ACCESS_LOG": "false", "CROSSPROBE_LOG_LEVEL": "warning",
           "HF_HUB_OFFLINE": "1"}
    env.pop("CROSSPROBE_CKPT", None)
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
        yield url
    finally:
        stop(proc)
    assert "Traceback" not in log.read_text(), log.read_text()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture()
def page(browser, server):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=server)
    pg = ctx.new_page()
    errors: list[str] = []
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
    while not page.evaluate(script, arg):
        assert time.monotonic() < deadline, f"timed out waiting for: {script}"
        time.sleep(0.1)


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


def heat_maps_drawn(page) -> None:
    wait_js(page, """() => {
        const cs = [...document.querySelectorAll('#results canvas.heat')];
        return cs.length > 0 && cs.every(c => !c.hidden && c.getBoundingClientRect().width > 20);
    }""")


# ---- the tests -------------------------------------------------------------------------------------
def test_search_shows_scored_thumbnails_and_timings(page):
    page.goto("/")
    wait_js(page, "document.querySelector('#index option') && document.querySelector('#index').value !== ''")
    assert page.locator("#index option").first.inner_text().startswith(f"{INDEX} (16 images)")
    body = search(page)
    thumbnails_loaded(page)
    cards = page.locator("#results li.card")
    assert cards.count() == 12 == len(body["results"])
    names = [n.split(". ", 1)[1] for n in cards.locator(".name").all_inner_texts()]
    assert names == [h["id"] for h in body["results"]]
    assert "coffee.jpg" in names[:3], names  # the model card: coffee first (fp32); int8 may swap near ties
    scores = cards.locator(".score").all_inner_texts()
    assert scores[0] == f"score {body['results'][0]['score']:.3f}" and all(s.startswith("score ") for s in scores)
    # alt text on every thumbnail; each result is a link to the full-size image
    assert cards.locator("img").first.get_attribute("alt").startswith("Result 1: ")
    assert cards.locator("img").evaluate_all("imgs => imgs.every(i => i.alt.length > 10)")
    first = body["results"][0]["id"]
    assert cards.locator("a.thumb").first.evaluate("a => a.href").startswith(f"{page.url.split('?')[0]}v1/items/{first}/image")
    # the answer's stage timings
    timings = page.locator("#timings-search")
    assert page.locator("#timings").evaluate("d => d.open")  # open on a wide screen
    assert re.fullmatch(r": search [0-9.]+\s+ms", page.locator("#timings-summary").inner_text())
    for stage in ("encode", "ann", "fetch", "rerank", "metadata"):
        assert timings.get_by_text(stage, exact=True).is_visible(), stage
    assert "reranked by cp" in page.locator("#status").inner_text()
    shot(page, "results.png", full_page=True)


def test_reranker_switch_is_used_by_the_request(page):
    page.goto("/")
    search(page)
    for mode, said in (("temde", "reranked by temde"), ("none", "ranked by the two-tower score"),
                       ("cp", "reranked by cp")):
        with page.expect_request(lambda r: r.url.endswith("/v1/search")) as req:
            page.locator(f'input[name="rerank"][value="{mode}"]').check()
        assert req.value.post_data_json["rerank"] == mode
        assert req.value.post_data_json["query"] == QUERY
        resp = req.value.response().json()
        assert resp["rerank"] == mode
        wait_js(page, "s => document.querySelector('#status').textContent.includes(s)", arg=said)
        assert page.locator("#timings-search").get_by_text("rerank", exact=True).count() == (mode != "none")
        assert f"rerank={mode}" in page.url  # the address says what is on screen


def test_explain_overlays_heat_maps(page):
    page.goto("/")
    search(page)
    thumbnails_loaded(page)
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
    assert "text probes" in page.locator("#explain-help").inner_text()
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

    def tab_to(selector: str, limit: int = 12) -> None:
        for _ in range(limit):
            page.keyboard.press("Tab")
            if page.evaluate("s => document.activeElement.matches(s)", selector):
                return
        raise AssertionError(f"Tab never reached {selector}")

    # every stop shows where focus is
    tab_to("#search-button")
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"
    tab_to('input[name="rerank"]')
    with page.expect_request(lambda r: r.url.endswith("/v1/search")) as req:
        page.keyboard.press("ArrowRight")  # the radio group: arrows choose
    assert req.value.post_data_json["rerank"] == "temde"
    wait_js(page, "document.querySelector('#status').textContent.includes('reranked by temde')")
    tab_to("#explain")
    with page.expect_response(lambda r: r.url.endswith("/v1/explain")):
        page.keyboard.press("Space")
    heat_maps_drawn(page)
    tab_to("#results a.thumb")
    assert page.evaluate("document.activeElement.closest('li.card') === document.querySelector('#results li.card')")
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"
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
        # nothing wider than the screen; two columns of results
        assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
        cols = page.evaluate("getComputedStyle(document.querySelector('#results')).gridTemplateColumns.split(' ').length")
        assert cols == 2
        # the timings fold into one line, so the results come first
        assert page.locator("#timings").evaluate("d => !d.open")
        assert page.locator("#timings summary").inner_text().startswith("Stage timings: search ")
        shot(page, "phone.png", full_page=True)
    finally:
        ctx.close()


def teardown_module(_module):
    kept = sorted(p.name for p in OUT.glob("*.png")) if OUT.exists() else []
    print(f"\nscreenshots in {OUT}: {', '.join(kept)}")
