"""clip-retrieval's own web front-end against `crossprobe serve`, in a real browser (`make test-e2e`; left out of
`make test` by the e2e marker).

The front-end is the static build clip-retrieval ships in its wheel (front/build/, a Lit page that reads
config.json for its back end), taken from the wheel on PyPI at test time, not copied into this repository:
`pip download clip-retrieval==2.45.0 --no-deps` into artifacts/clip_front/wheel/ (gitignored; later runs reuse
it; the tests skip, saying so, only when it cannot be downloaded). It is served by Python's http.server on one
loopback port, `crossprobe serve` over the sample photos (tests/service/browser.py sample_site, with captions) on another,
with CROSSPROBE_CORS_ORIGINS = the front's origin and CROSSPROBE_PUBLIC_URL = the server's address, as docs/api.md
tells a clip-front user to set them. Playwright drives Debian's chromium.

What each control of the front does against crossprobe, checked here:
  text search, Enter        the expected photo first ("a cup of coffee" -> coffee), every picture loads
  camera button (upload)    search by the image: the uploaded photo finds itself first; a photo over the
                            body limit gets a notice tile saying so (413 too_large)
  Display captions / similarities   shown from the answer (captions from the index's manifest)
  Search over: text         a notice tile: there is no text index here (422 unsupported); back to "image":
                            the results again
  Safe mode, Remove violence, Enable aesthetic scoring, Search with multilingual clip   accepted and not applied
                            (no safety model, violence detector, aesthetic embeddings or multilingual tower):
                            the same results, none hidden; X-Crossprobe-Ignored names them
  Hide (near) duplicate images   deduplicate: applied (cosine >= 0.94 to a better result)
  a result's "search with this image" icon   image_url: a notice tile (crossprobe fetches no URL; upload it)
No answer leaves the page broken or showing stale results without a word (the front has no error display of
its own: before, an error object made it throw while drawing). Screenshots: artifacts/clip_front/.
"""
from __future__ import annotations

import functools
import json
import subprocess
import sys
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from crossprobe.service.server import free_port
from tests.service.browser import INDEX, QUERY, sample_site, wait_js
from tests.service.browser import browser  # noqa: F401 (a fixture)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "artifacts" / "clip_front"
CLIP_RETRIEVAL = "clip-retrieval==2.45.0"
WHEELS = OUT / "wheel"
# the scikit-image sample photos' captions, written into the index's manifest (clip-front displays captions)
CAPTIONS = {"astronaut": "Astronaut Eileen Collins", "camera": "Cameraman with a tripod", "cat": "Chelsea the cat",
            "coffee": "Coffee on a saucer", "coins": "Greek coins from Pompeii", "horse": "Horse silhouette",
            "moon": "Surface of the moon", "rocket": "A rocket on its launch pad", "motorcycle": "A red motorcycle",
            "hubble": "Hubble deep field", "clock": "A wall clock", "page": "A scanned page of text",
            "brick": "A brick wall", "grass": "Grass", "retina": "A retina", "colorwheel": "A colour wheel"}
# what a client may claim about the address it reached: no URL in any answer may follow it (a forged Host itself is
# refused before any route: below, and tests/service/test_host_guard.py)
FORGED = {"X-Forwarded-Host": "evil2.example.net", "X-Forwarded-Proto": "gopher",
          "Forwarded": "host=evil3.example.net;proto=gopher"}
SWITCHES = {  # the front's checkbox label -> (request field, value when ticked, in X-Crossprobe-Ignored)
    "Safe mode": ("use_safety_model", True, True), "Remove violence": ("use_violence_detector", True, True),
    "Enable aesthetic scoring": ("aesthetic_score", "9", True),
    "Search with multilingual clip": ("use_mclip", True, True),
    "Hide (near) duplicate images": ("deduplicate", True, False)}


# ---- the front-end's static build, from the clip-retrieval wheel ------------------------------------------------
def _wheel() -> Path:
    found = sorted(WHEELS.glob("clip_retrieval-2.45.0-*.whl"))
    if not found:
        WHEELS.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", CLIP_RETRIEVAL, "--no-deps", "-q", "-d",
                            str(WHEELS)], capture_output=True, text=True, timeout=600)
        found = sorted(WHEELS.glob("clip_retrieval-2.45.0-*.whl"))
        if not found:
            pytest.skip(f"cannot download the {CLIP_RETRIEVAL} wheel (it holds clip-retrieval's front-end): "
                        f"pip said: {(r.stderr or r.stdout).strip()[-800:]}")
    return found[0]


@pytest.fixture(scope="module")
def front_build(tmp_path_factory) -> Path:
    """clip-retrieval's front/build/ (index.html, main.<hash>.js, assets/, config.json), unpacked from the wheel."""
    dest = tmp_path_factory.mktemp("clip-front")
    with zipfile.ZipFile(_wheel()) as z:
        names = [n for n in z.namelist() if n.startswith("front/build/")]
        assert "front/build/index.html" in names and "front/build/config.json" in names, names[:20]
        z.extractall(dest, names)
    return dest / "front" / "build"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def sites(front_build, redis_server, redis_url, bert, tmp_path_factory):  # noqa: F811
    """(front URL, crossprobe URL, gallery, server log): the front's static build served on one loopback port,
    `crossprobe serve` on another, set up as docs/api.md says (CORS origin and public URL)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(front_build)))
    thread = threading.Thread(target=httpd.serve_forever, name="clip-front", daemon=True)
    thread.start()
    front = f"http://127.0.0.1:{httpd.server_address[1]}"
    port = free_port()
    back = f"http://127.0.0.1:{port}"
    work = tmp_path_factory.mktemp("clip-front-e2e")
    # what clip_front.py's /config.json answers: the back end and its index
    (front_build / "config.json").write_text(json.dumps({"defaultBackend": back, "defaultIndex": INDEX}))
    try:
        with sample_site(redis_server, redis_url, bert, work, port=port, captions=CAPTIONS,
                         CROSSPROBE_CORS_ORIGINS=front, CROSSPROBE_PUBLIC_URL=back,
                         CROSSPROBE_LOG_LEVEL="info") as (url, gallery):
            assert url == back
            yield front, back, gallery, work / "server.log"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


@pytest.fixture()
def seen() -> dict:
    """What the page ran into: uncaught script errors, and answers >= 400 (url, status)."""
    return {"pageerrors": [], "failed": []}


@pytest.fixture()
def page(browser, sites, seen):  # noqa: F811
    front = sites[0]
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    pg.on("pageerror", lambda e: seen["pageerrors"].append(str(e)))
    pg.on("response", lambda r: r.status >= 400 and seen["failed"].append((r.url, r.status)))
    pg.goto(f"{front}/")
    # the front has read config.json and /indices-list: the index is in its select
    wait_js(pg, "i => [...(document.querySelector('clip-front').shadowRoot?.querySelectorAll('option') || [])]"
                ".some(o => o.value === i)", arg=INDEX)
    yield pg
    ctx.close()
    assert not seen["pageerrors"], seen["pageerrors"]  # the front never threw, whatever crossprobe answered
    # the only failed fetches: the loader clip-retrieval's own build names and does not ship (chromium needs no
    # polyfill), and the error answers a test provoked on purpose (it empties the list once checked)
    assert [u for u, _ in seen["failed"] if not u.endswith("/vendor/webcomponents-loader.js")] == [], seen["failed"]


def shot(page, name: str) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


# ---- reading the page ----------------------------------------------------------------------------------------
SHOWN = """() => [...document.querySelector('clip-front').shadowRoot.querySelectorAll('#products figure')]
    .filter(f => getComputedStyle(f).display !== 'none')
    .map(f => { const img = f.querySelector('img.pic'), cap = f.querySelector('figcaption'), p = f.querySelector('p');
                return {src: img.getAttribute('src'), loaded: img.complete && img.naturalWidth > 0,
                        caption: cap ? cap.textContent.trim() : null, title: img.getAttribute('title'),
                        similarity: p ? p.textContent.trim() : null}; })"""


def shown(page) -> list[dict]:
    return page.evaluate(SHOWN)


def pictures_loaded(page, n: int) -> list[dict]:
    """Wait until n results are shown with their pictures loaded -> them."""
    wait_js(page, f"n => {{ const s = ({SHOWN})(); return s.length === n && s.every(x => x.loaded); }}", arg=n)
    return shown(page)


def knn(page, action, check_status: int = 200):
    """Run `action` (a click, Enter...) and return (request body, answer body, answer headers) of the
    /knn-service call it makes."""
    with page.expect_response(lambda r: r.url.endswith("/knn-service")) as resp:
        action()
    r = resp.value
    assert r.status == check_status, (r.status, r.text()[:500])
    return r.request.post_data_json, r.json(), r.all_headers()


def text_search(page, sites, query: str = QUERY):
    front, back = sites[0], sites[1]
    bar = page.locator("clip-front #searchBar")

    def go():
        bar.fill(query)
        bar.press("Enter")

    sent, body, headers = knn(page, go)
    assert sent["text"] == query and sent["modality"] == "image" and sent["indice_name"] == INDEX
    assert isinstance(body, list) and body and body[0]["id"] == "coffee.jpg", [x["id"] for x in body][:5]
    with_url = [x for x in body if "url" in x]
    # absolute, under CROSSPROBE_PUBLIC_URL: the front resolves them against nothing of its own
    assert with_url and all(x["url"].startswith(f"{back}/v1/items/") for x in with_url), with_url[:2]
    assert front != back
    return sent, body, headers


def results_shown(page, body) -> list[dict]:
    """Every result of the answer is shown, in its order, with its picture loaded (none hidden)."""
    with_url = [x for x in body if "url" in x]
    got = pictures_loaded(page, len(with_url))
    assert [g["src"] for g in got] == [x["url"] for x in with_url]
    return got


# ---- the tests -------------------------------------------------------------------------------------------------
def test_text_search_shows_the_expected_photos_with_captions_and_similarities(page, sites):
    sent, body, headers = text_search(page, sites)
    got = results_shown(page, body)
    assert got[0]["caption"] == CAPTIONS["coffee"] == got[0]["title"]  # "Display captions" is on by default
    assert [g["caption"] for g in got] == [x["caption"] for x in body if "url" in x]
    assert all(g["similarity"] is None for g in got)  # "Display similarities" is off by default
    page.locator("clip-front").get_by_label("Display similarities").click()
    wait_js(page, f"() => ({SHOWN})().every(x => x.similarity !== null)")
    got = shown(page)
    assert [g["similarity"] for g in got] == [f"{x['similarity']:.4f}" for x in body if "url" in x]
    # the front's defaults: safe mode and violence removal on, which crossprobe cannot apply: said, not hidden
    assert sent["use_safety_model"] is True and sent["use_violence_detector"] is True
    assert headers["x-crossprobe-ignored"] == "use_safety_model,use_violence_detector"
    shot(page, "text-search.png")


def test_image_search_by_upload(page, sites, seen, tmp_path):
    gallery = sites[2]

    def upload(path: Path):
        def go():
            with page.expect_file_chooser() as chooser:
                page.locator("clip-front #imageSearch").click()  # the camera button
            chooser.value.set_files(str(path))
        return go

    sent, body, _ = knn(page, upload(gallery / "coffee.jpg"))
    assert sent["image"] and sent["text"] in ("", None) and sent["modality"] == "image"
    assert body[0]["id"] == "coffee.jpg", [x["id"] for x in body][:5]  # an indexed photo finds itself first
    results_shown(page, body)
    shot(page, "image-search.png")

    # a photo over the body limit (1 MiB, base64 included): a notice tile, not the previous results
    big = tmp_path / "big.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (700, 700, 3), np.uint8)).save(big)
    assert big.stat().st_size > 1 << 20
    _, body, _ = knn(page, upload(big), check_status=413)
    notice = _notice_shown(page, body, "too_large")
    assert "limit" in notice["title"]
    shot(page, "image-too-large.png")
    seen["failed"] = [f for f in seen["failed"] if f[1] != 413]


def _notice_shown(page, body, code: str) -> dict:
    """The error answer is clip_back's list of one notice, and the front shows exactly it, its picture loaded."""
    assert len(body) == 1 and body[0]["error"]["code"] == code, body
    (got,) = pictures_loaded(page, 1)
    assert got["src"] == body[0]["url"] and got["title"] == body[0]["caption"]
    assert got["caption"].startswith("crossprobe: ")  # figcaption: its first 50 characters
    return got


def test_search_over_text_says_there_is_no_text_index(page, sites, seen):
    _, before, _ = text_search(page, sites)
    results_shown(page, before)
    select = page.locator("clip-front select:has(option[value='text'])")  # "Search over"
    sent, body, _ = knn(page, lambda: select.select_option("text"), check_status=422)
    assert sent["modality"] == "text" and sent["text"] == QUERY
    notice = _notice_shown(page, body, "unsupported")
    assert "no text index" in notice["title"] and "Search over" in notice["title"]
    shot(page, "search-over-text.png")
    sent, body, _ = knn(page, lambda: select.select_option("image"))
    assert sent["modality"] == "image" and [x["id"] for x in body] == [x["id"] for x in before]
    results_shown(page, body)
    seen["failed"] = [f for f in seen["failed"] if f[1] != 422]


@pytest.mark.parametrize("label", list(SWITCHES))
def test_switches(page, sites, label):
    """Each switch: its field is sent, and the answer shows the same results (crossprobe applies none of the
    first four, and names them in X-Crossprobe-Ignored; deduplicate it applies, and this gallery has no near
    duplicates), none hidden."""
    field, on, ignored = SWITCHES[label]
    _, before, headers = text_search(page, sites)
    results_shown(page, before)
    box = page.locator("clip-front").get_by_label(label, exact=True)
    for _ in range(2):  # toggle, and back
        sent, body, headers = knn(page, box.click)
        ticked = sent[field] == on
        assert ticked == box.is_checked(), (label, sent[field])
        names = headers.get("x-crossprobe-ignored", "").split(",")
        assert (field in names) == (ticked and ignored), (label, sent[field], names)
        assert [x["id"] for x in body] == [x["id"] for x in before], label
        results_shown(page, body)


def test_search_with_a_results_image_url_says_to_upload_it(page, sites, seen):
    _, before, _ = text_search(page, sites)
    results_shown(page, before)
    first = page.locator("clip-front #products figure").first
    first.hover()
    sent, body, _ = knn(page, first.locator("img.subImageSearch").click, check_status=422)
    assert sent["image_url"] == before[0]["url"]
    notice = _notice_shown(page, body, "unsupported")
    assert "camera button" in notice["title"]
    shot(page, "image-url.png")
    seen["failed"] = [f for f in seen["failed"] if f[1] != 422]


def test_no_header_steers_a_url_on_the_live_server(sites):
    """The live uvicorn server (which trusts X-Forwarded-* from 127.0.0.1 for the client's address and scheme):
    forged Host, X-Forwarded-Host, X-Forwarded-Proto and Forwarded change no URL of any answer."""
    back, log = sites[1], sites[3]
    query = json.dumps({"text": QUERY, "modality": "image", "num_images": 4, "indice_name": INDEX})
    with httpx.Client(base_url=back, timeout=60) as http:
        for path, content in (("/knn-service", query), ("/metadata", json.dumps({"ids": ["coffee.jpg"]}))):
            honest = http.post(path, content=content)
            forged = http.post(path, content=content, headers=FORGED)
            assert forged.status_code == honest.status_code == 200 and forged.json() == honest.json()
            assert "evil" not in forged.text and "gopher" not in forged.text
            urls = [u for u in json.dumps(forged.json()).split('"') if "/v1/items/" in u]
            assert urls and all(u.startswith(f"{back}/v1/items/") for u in urls), urls
        r = http.get("/v1/indexes/", headers=FORGED)  # once a redirect to http://<Host>/v1/indexes
        assert r.status_code == 404 and "location" not in r.headers
        r = http.post("/knn-service", content=query, headers={"Host": "evil.example.net"})  # a rebound name
        assert r.status_code == 400 and "evil.example.net" in r.text and "/v1/items/" not in r.text
    assert f"clip-retrieval's front-end: image URLs under {back}" in log.read_text()  # the start-up line
