"""The web page (GET / and its static files) and POST /v1/explain, in-process over a tiny real index
(conftest's `built`: 12 generated images indexed by the indexer into a real Redis). The browser-driven
test of the same page is test_page_e2e.py (make test-e2e)."""
from __future__ import annotations

import json
import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import pytest

from crossprobe.service.schemas import MAX_EXPLAIN_IDS

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "service" / "static"


# ---- the page -------------------------------------------------------------------------------------
def test_page_has_every_control_labelled(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    # the search box, its label, its button; Enter submits because it sits in a <form>
    assert re.search(r'<form id="search-form" role="search"', html)
    assert re.search(r'<label for="q"[ >]', html) and re.search(r'<input id="q" name="q" type="search"', html)
    assert '<button id="search-button" type="submit">' in html
    # the reranker switch: one radio per mode, inside a fieldset with a legend
    assert "<legend>Reranker</legend>" in html
    for mode in ("cp", "temde", "none"):
        assert f'<input type="radio" name="rerank" value="{mode}"' in html
    # the index picker (filled from /v1/indexes), k, the explain toggle; each with a label
    for control in ("index", "k", "explain"):
        assert f'<label for="{control}">' in html and f'id="{control}"' in html
    # where answers go: a live status line, stage timings, the explain legend, the result list
    assert 'id="status"' in html and 'role="status"' in html and 'aria-live="polite"' in html
    assert 'id="timings"' in html and 'id="legend"' in html and '<ol id="results"' in html
    assert 'lang="en"' in html and 'name="viewport"' in html and 'class="skip-link" href="#results"' in html


def test_details_holds_what_an_engineer_reads(client):
    """Issue 46: the reranker, match mode, results per page, explain, how the search ran and its stage timings sit
    in one panel behind a "Details" button, closed at first; the cards' scores show only while it is open. The
    browser test (test_page_e2e.py) measures that the photos come first."""
    html = client.get("/").text
    assert re.search(r'<button id="details-button" class="secondary toggle" type="button" aria-controls="details"'
                     r'\s+aria-expanded="false">Details</button>', html)
    assert html.count('<section id="details" ') == 1
    head, panel = html.split('<section id="details" ')[1].split(">", 1)
    assert head.endswith("hidden")
    panel = panel.split("</section>")[0]
    for part in ("<legend>Reranker</legend>", '<select id="mode"', '<select id="k"', 'id="explain"',
                 'id="timings"', 'id="how"'):
        assert part in panel, part
    css = (STATIC / "app.css").read_text()
    assert re.search(r"^\.scores \{ display: none;", css, re.M)
    assert ".results.show-scores .scores { display: flex; }" in css


def test_page_loads_nothing_from_elsewhere(client):
    r = client.get("/")
    # own files only: the policy forbids inline code and other origins, and no URL points elsewhere
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
    for f in [r.text] + [p.read_text() for p in STATIC.iterdir()]:
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", f), "a reference to another origin"
        assert "@import" not in f and "url(http" not in f
        assert "<script>" not in f and " style=" not in f  # would be refused by the policy
    assert re.search(r'<script type="module" src="static/app.js"></script>', r.text)  # modules: deferred
    assert '<link rel="stylesheet" href="static/app.css">' in r.text


def test_static_files_are_served(client):
    for name, ctype in (("app.js", "javascript"), ("app.css", "text/css"), ("index.html", "text/html")):
        r = client.get(f"/static/{name}")
        assert r.status_code == 200 and ctype in r.headers["content-type"], name
        assert r.content == (STATIC / name).read_bytes()
    assert client.get("/static/nothing.js").status_code == 404
    assert client.get("/static/../app.py").status_code == 404
    # every API route the scripts call exists
    js = "".join(p.read_text() for p in STATIC.glob("*.js"))
    for route in ("v1/indexes", "v1/search", "v1/search/image?", "v1/explain", "v1/items/"):
        assert f'"{route}' in js, route
    paths = set(client.get("/openapi.json").json()["paths"])
    assert {"/v1/indexes", "/v1/search", "/v1/search/image", "/v1/explain", "/v1/items/{item_id}/image"} <= paths


def test_modules_import_only_the_page_own_files(client):
    """The page is ES modules without a build step: app.js imports the others by relative path. Every import is
    one of the page's own files (served, shipped), and every script is reached from app.js."""
    reached, todo = set(), ["app.js"]
    while todo:
        name = todo.pop()
        reached.add(name)
        src = (STATIC / name).read_text()
        assert "require(" not in src and "eval(" not in src and "new Function" not in src  # the CSP refuses eval
        for spec in re.findall(r'^import\s[^;]*?\sfrom\s+"([^"]+)";', src, re.M | re.S):
            assert spec.startswith("./") and spec.endswith(".js"), spec  # relative: works under a path prefix
            target = spec[2:]
            assert (STATIC / target).is_file(), spec
            assert client.get(f"/static/{target}").headers["content-type"].startswith("text/javascript")
            if target not in reached:
                todo.append(target)
    assert reached == {p.name for p in STATIC.glob("*.js")}, reached
    for p in STATIC.iterdir():
        assert len(p.read_text().splitlines()) <= 500, p.name  # small files a newcomer can read


def test_page_has_the_image_like_and_filter_controls(client):
    html = client.get("/").text
    # query by image: a button for the file picker, a picker limited to the formats the service decodes
    assert '<button id="image-button" class="secondary" type="button"' in html and ">Search by image</button>" in html
    m = re.search(r'<input id="image-file" type="file" hidden\s+accept="([^"]+)">', html)
    assert m and {t for t in m.group(1).split(",") if t.startswith("image/")} == {
        f"image/{t}" for t in ("jpeg", "png", "webp", "gif", "bmp", "tiff", "heic", "heif", "avif")}
    assert {".heic", ".avif", ".dng", ".nef"} <= set(m.group(1).split(","))  # by name: no type on many systems
    # pages and order: "More results" (hidden until an answer has a next page), a labelled "Order" select
    assert '<button id="more-results" class="secondary" type="button" hidden>More results</button>' in html
    assert '<label for="sort">Order</label>' in html
    assert set(re.findall(r'<option value="([^"]+)"', html.split('id="sort"')[1].split("</select>")[0])) == {
        "relevance", "date_taken", "-date_taken", "date_added", "-date_added"}
    assert 'id="query-chips"' in html and "Drop or paste an image" in html
    # the text / image weight: a labelled 0..1 slider with its value shown
    assert '<label id="weight-label" for="weight">' in html
    assert re.search(r'<input id="weight" name="weight" type="range" min="0" max="1" step="0.1" value="0.5"', html)
    assert '<output id="weight-value" for="weight">' in html
    # filters: chips, the filters in force, the matching count, a labelled date range
    assert '<section id="refine" class="refine" aria-labelledby="refine-title" hidden>' in html
    for part in ('id="facets"', '<ul id="active-filters"', 'id="filter-count"'):
        assert part in html, part
    for end in ("from", "to"):
        assert f'<label for="taken-{end}">{end}</label>' in html
        assert f'<input id="taken-{end}" name="taken-{end}" type="date">' in html
    js = "".join(p.read_text() for p in STATIC.glob("*.js"))
    assert '"More like this"' in js and "aria-pressed" in js
    assert "body.filtered" in js and "toLocaleString(\"en\")" in js  # the matching count, as "1,234"


def test_indexes_tell_the_page_the_image_limit(client, built):
    from crossprobe.service.settings import Settings

    limits = client.get("/v1/indexes").json()["limits"]
    assert limits == {"query_image_bytes": Settings().query_image_max_bytes,
                      "query_image_pixels": Settings().query_image_max_pixels}


def test_the_requests_the_page_builds_are_answered(client, built):
    """The page's three new requests, as app.js builds them, against the real index: an image upload (multipart,
    options and the filter as query parameters), "More like this" with chips' filter tree, and a date range."""
    files = {i: built.gallery / i for i in built.ids}
    item = built.ids[0]
    fmt = client.get(f"/v1/items/{item}").json()["metadata"]["format"]
    r = client.post("/v1/search/image", params={"k": "3", "query": "a red square", "rerank": "cp", "weight": "0.5",
                                                "index": "photos",
                                                "filter": json.dumps({"field": "format", "eq": fmt})},
                    files={"image": (item.split("/")[-1], files[item].read_bytes(), "image/png")})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["query_kind"] == "text+image" and body["filtered"]["matching"] >= 1
    assert all(h["metadata"]["format"] == fmt for h in body["results"])
    like = {"k": 12, "like": item, "index": "photos", "filter": {"and": [
        {"field": "format", "in": [fmt, "GIF"]}, {"field": "width", "gte": 1}]}}
    r = client.post("/v1/search", json=like)
    assert r.status_code == 200, r.text
    ids = [h["id"] for h in r.json()["results"]]
    assert item not in ids and ids and all(h["metadata"]["format"] in (fmt, "GIF") for h in r.json()["results"])
    # the date range ("taken", the day after "to" as an open bound): this gallery has no dates, none match
    r = client.post("/v1/search", json={"query": "a red square", "filter": {
        "field": "taken", "gte": "2021-01-01", "lt": "2022-01-01"}})
    assert r.status_code == 200, r.text
    assert r.json()["results"] == [] and r.json()["filtered"]["matching"] == 0


def test_static_files_ship_in_the_wheel():
    # every file of the page matches a package-data pattern of crossprobe.service (else the wheel lacks it)
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = data["crossprobe.service"]
    for f in STATIC.iterdir():
        assert any(fnmatch(f"static/{f.name}", g) for g in globs), f.name


# ---- POST /v1/explain -----------------------------------------------------------------------------
def _top(client, query: str, k: int = 5) -> list[str]:
    r = client.post("/v1/search", json={"query": query, "k": k})
    assert r.status_code == 200, r.text
    return [h["id"] for h in r.json()["results"]]


def _check_map(m, grid: int = 7) -> np.ndarray:
    a = np.asarray(m, np.float64)
    assert a.shape == (grid, grid)
    assert (a >= 0).all() and abs(a.sum() - 1.0) < 1e-5
    return a


def test_explain_returns_a_7x7_distribution_per_image(client, built):
    ids = _top(client, "a red square")
    r = client.post("/v1/explain", json={"query": "a red square", "ids": ids, "index": "photos"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["index"] == {"name": "photos", "version": built.version}
    # the test checkpoint has region labels: the map is each region's label against the query
    assert body["grid"] == 7 and body["mode"] == "labels" and "ImageNet head" in body["description"]
    assert set(body["maps"]) == set(ids) == set(body["probe_maps"]) and body["unavailable"] == {}
    for i in ids:
        _check_map(body["maps"][i])
        _check_map(body["probe_maps"][i])
    t = body["timings_ms"]
    assert {"queue", "encode", "metadata", "decode", "backbone", "attention", "total"} <= set(t)
    assert "backbone;dur=" in r.headers["server-timing"] and "attention;dur=" in r.headers["server-timing"]
    metrics = client.get("/metrics").text
    assert 'crossprobe_stage_seconds_count{stage="explain_attention"}' in metrics
    assert 'crossprobe_stage_seconds_count{stage="explain_backbone"}' in metrics


def test_explain_depends_on_the_query_and_the_image(client, built):
    ids = built.ids[:4]
    a = client.post("/v1/explain", json={"query": "a red square", "ids": ids}).json()
    b = client.post("/v1/explain", json={"query": "two dogs running on the beach at sunset", "ids": ids}).json()
    # the probes' own map is the image's alone; the query's map moves with the query
    for i in ids:
        assert np.allclose(a["probe_maps"][i], b["probe_maps"][i], atol=1e-6)
    assert max(np.abs(np.subtract(a["maps"][i], b["maps"][i])).max() for i in ids) > 1e-6
    # different images, different maps
    assert not np.allclose(a["probe_maps"][ids[0]], a["probe_maps"][ids[1]], atol=1e-4)
    # the second request read the grids from the explainer's cache: no decode, no backbone run
    assert b["timings_ms"]["backbone"] == 0.0


def test_explain_matches_pytorch(client, built, svc_ckpt, bert):
    """The service's map of one indexed file = PyTorch's ExplainGraph over PyTorch's backbone grid of the same
    file (the query-independent map, so the int8 query tower's rounding stays out of the comparison)."""
    import torch

    from crossprobe.models import backbones as bb
    from crossprobe.core import inputs
    from crossprobe.models import checkpoint
    from crossprobe.models.graphs import ExplainGraph

    item = built.ids[5]
    got = client.post("/v1/explain", json={"query": "anything", "ids": [item]}).json()["probe_maps"][item]
    model, _ = checkpoint.load(svc_ckpt, bert)
    with torch.inference_mode():
        grid = bb.ImageBackbone()(torch.from_numpy(inputs.load_image(built.gallery / item)[None]))
        p_t = torch.zeros(1, model.cp.cfg.m, model.cp.cfg.d)
        _, want = ExplainGraph(model.eval())(grid, p_t)
    assert np.abs(np.asarray(got).reshape(-1) - want[0].numpy()).max() < 1e-4


def test_explain_label_map_scores_each_region_by_its_label(client, built, svc_ckpt, bert):
    """The label map is the region term's per-cell score (the query against the cell's ImageNet label) as a softmax:
    cells that share a label share a weight, and cells with different labels differ."""
    import torch

    from crossprobe.models import backbones as bb
    from crossprobe.core import inputs
    from crossprobe.models import checkpoint

    item = built.ids[5]
    got = np.asarray(client.post("/v1/explain", json={"query": "a red square", "ids": [item]}).json()["maps"][item]).reshape(-1)
    model, _ = checkpoint.load(svc_ckpt, bert)
    with torch.inference_mode():
        grid = bb.ImageBackbone()(torch.from_numpy(inputs.load_image(built.gallery / item)[None]))
        labels = model.bridge.cell_labels(grid)[0].numpy()
    assert len(set(labels)) > 1
    for c in set(labels):
        assert np.ptp(got[labels == c]) < 1e-6, c
    by_label = {c: got[labels == c][0] for c in set(labels)}
    assert len({round(v, 7) for v in by_label.values()}) > 1


def test_explain_repeated_ids_count_once(client, built):
    r = client.post("/v1/explain", json={"query": "a red square", "ids": [built.ids[0]] * 3})
    assert r.status_code == 200 and list(r.json()["maps"]) == [built.ids[0]]


@pytest.mark.parametrize("body, status, code", [
    ({"query": "a red square", "ids": ["no-such-image.png"]}, 404, "item_not_found"),
    ({"query": "a red square", "ids": "IDS", "index": "nope"}, 404, "index_not_found"),
    ({"query": "a red square", "ids": ["x"] * (MAX_EXPLAIN_IDS + 1)}, 422, "invalid_request"),
    ({"query": "a red square", "ids": []}, 422, "invalid_request"),
    ({"query": " \u200b ", "ids": "IDS"}, 422, "invalid_request"),
    ({"ids": "IDS"}, 422, "invalid_request"),
    ({"query": "a red square", "ids": "IDS", "k": 3}, 422, "invalid_request"),
    ({"query": "a red square", "ids": [""]}, 422, "invalid_request"),
])
def test_explain_bad_input_is_a_4xx(client, built, body, status, code):
    if body.get("ids") == "IDS":
        body = {**body, "ids": built.ids[:2]}
    r = client.post("/v1/explain", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code


def test_explain_names_every_unknown_id(client, built):
    r = client.post("/v1/explain", json={"query": "a red square", "ids": [built.ids[0], "gone-1.png", "gone-2.png"]})
    assert r.status_code == 404 and r.json()["error"]["details"] == {"ids": ["gone-1.png", "gone-2.png"]}


def test_explain_a_deleted_file_is_unavailable_not_an_error(client, built):
    # an id never explained above (so its grid is not cached): its file goes away after indexing
    seen = set(_top(client, "a red square")) | set(built.ids[:6])
    item = next(i for i in reversed(built.ids) if i not in seen)
    path = built.gallery / item
    data = path.read_bytes()
    path.unlink()
    try:
        r = client.post("/v1/explain", json={"query": "a red square", "ids": [built.ids[0], item]})
    finally:
        path.write_bytes(data)
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body["maps"]) == [built.ids[0]] and "missing" in body["unavailable"][item]
