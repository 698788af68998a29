"""The web page in a real browser, shared by the browser tests (`make test-e2e`; marker e2e): a live service over
the sample photos, Debian's chromium through Playwright, and what a person does on the page.

Playwright (PyPI, the `e2e` extra) drives Debian's chromium (/usr/bin/chromium: no browser download)
against `crossprobe serve` in a subprocess on a free loopback port. The index is built by the indexer
from scikit-image's sample photos with the committed checkpoint (models/checkpoints/default), through a
manifest that gives them tags, a camera and a date taken (MANIFEST), so the page shows real rankings ("a cup
of coffee" must find the coffee photo; an indexed photo dropped on the page finds itself first) and real
filters. Screenshots go to artifacts/e2e/ (gitignored), printed at the end of each test (-s shows them);
search-1280.png and search-390.png are the ones docs/images/ keeps (looked at, then copied by hand).

The ONNX graphs of the committed checkpoint are kept under artifacts/e2e/ between runs (keyed by its
fingerprint, written atomically), so a second run starts in seconds instead of exporting them again.

A test module takes the fixtures by importing them (browser, errors, page, site, server, gallery).
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from crossprobe.service.server import free_port
from tests.service.live import stop

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
    ixs = IndexerSettings(redis_url=redis_url, index_root=work / "indexes", models_dir=OUT / "onnx-indexer", batch_size=8,
                          threads=2, progress=False, ocr=True,  # OCR: page.jpg's printed words become searchable
                          model=model)
    build(INDEX, manifest=manifest, settings=ixs, bert=bert, log=lambda *_: None)  # ckpt None: the committed one

    port = port or free_port()
    env = {**os.environ, "REDIS_URL": redis_url, "CROSSPROBE_INDEX_ROOT": str(ixs.index_root),
           "CROSSPROBE_MODELS_DIR": str(OUT / "onnx-service"), "CROSSPROBE_RELOAD_INTERVAL_S": "0",
           "CROSSPROBE_THREADS": "2", "CROSSPROBE_ACCESS_LOG": "false", "CROSSPROBE_LOG_LEVEL": "warning",
           "HF_HUB_OFFLINE": "1", **env}
    env.pop("CROSSPROBE_CKPT", None)
    env.pop("CROSSPROBE_MODEL", None)
    if model:
        env["CROSSPROBE_MODEL"] = model
    log = work / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "crossprobe.cli", "serve", "--host", "127.0.0.1",
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

