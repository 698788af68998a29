"""Keys scoped to libraries (service/scope.py; security.py's key entries; registry.get's scope), over every route
that names, defaults to or lists an index.

Two real indexes in one Redis, built by the indexer: "photos" (conftest's `built`, 12 images) and "archive" (6
other images, other ids). The server's default index is "archive", outside the scoped key's scope. Keys:
SCOPED reads photos only, EVERY_KEY reads both, ADMIN is the admin key (never a search key). In process
(TestClient), each request of ROUTES is tried with each of TRIES: the scoped key asking for photos works; asking
for archive it gets exactly the answer of an index that does not exist ("nowhere": same status, headers and body,
the name aside); naming no index it reads photos (its own first index), never the server's default; the
unscoped key reads both; the admin key is refused as a search key (403) and is no search key in its own header
(401). The listing routes show a scoped key its indexes only. test_every_index_route_is_in_the_matrix fails when
a route that reads an index is added without being scoped or without a place in ROUTES; docs/security.md's
tables are matrix_table()'s.
"""
from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Callable
from urllib.parse import parse_qs, urlsplit

import pytest
from PIL import Image

from crossprobe.service import deps, security
from crossprobe.service.exceptions import IndexNotFound, IndexUnavailable
from crossprobe.service.settings import Settings
from crossprobe.service.scope import EVERY, Scope
from tests.indexer.conftest import make_images
from tests.service.conftest import _client, build_index
from tests.service.test_security import _app_routes

A, B, MISSING = "photos", "archive", "nowhere"
SCOPED = "scoped-key-1111111111111111"
EVERY_KEY = "every-key-2222222222222222"
ADMIN = "admin-key-3333333333333333"
DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def test_keys_scoped_to_indexes(tmp_path):
    """`KEY` reads every index, `KEY INDEX [INDEX ...]` those only (spaces or tabs between; docs/security.md).
    Every key that was valid before scopes (visible ASCII, no comma: ':', '=', '|' included) still reads all;
    start-up's refusals (an index name that is not one, a key given two scopes): test_security.py."""
    f = tmp_path / "keys"
    f.write_text("# key            indexes\nfile-key-aaaaaaaaaaaa   photos\t archive\nfile-key-bbbbbbbbbbbb\n"
                 "old:style=key|cccccccc\nfile-key-dddddddddddd photos photos\n", encoding="utf-8")
    s = Settings(api_keys="env-key-eeeeeeeeeeee photos , env-key-ffffffffffff,\n file-key-aaaaaaaaaaaa photos archive", api_keys_file=f)
    assert security.load_search_keys(s) == {
        "env-key-eeeeeeeeeeee": Scope(("photos",)), "env-key-ffffffffffff": EVERY, "file-key-aaaaaaaaaaaa": Scope(("photos", "archive")),
        "file-key-bbbbbbbbbbbb": EVERY, "old:style=key|cccccccc": EVERY, "file-key-dddddddddddd": Scope(("photos",))}
    assert Scope(("photos",)).allows("photos") and not Scope(("photos",)).allows("archive")
    assert EVERY.allows("anything") and EVERY.names is None


@pytest.fixture(scope="module")
def archive(built, svc_ckpt, bert, tmp_path_factory) -> list[str]:
    """Index "archive" beside conftest's "photos", in the same root and Redis: its ids (none is a photos id)."""
    from crossprobe.indexer import open_index

    gallery = tmp_path_factory.mktemp("archive") / "gallery"
    make_images(gallery, 6, seed=7, prefix="arc")
    build_index(built.ixs, gallery, svc_ckpt, bert, name=B)
    ids = list(open_index(B, None, built.ixs).ids)
    assert ids and not set(ids) & set(built.ids)
    return ids


@pytest.fixture(scope="module")
def app(built, archive, svc_ckpt, artifacts):
    """Both indexes served; a key for photos only, a key for every index, the admin key; default index archive."""
    yield from _client(built, svc_ckpt, artifacts, api_keys=f"{SCOPED} {A}, {EVERY_KEY}", admin_key=ADMIN,
                       auth_failures_burst=100_000,
                       default_index=B, warmup=False)


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (48, 40), (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


PNG = _png()


def _q(index: str | None, **more) -> str:
    """A query string with `index` when one is named."""
    params = {**({"index": index} if index is not None else {}), **more}
    return "?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""


def _named(body: dict, field: str, index: str | None) -> dict:
    return {**body, field: index} if index is not None else body


# route (its template) -> (what it is, how to ask it: index named (None: none), ids of that index -> request)
Ask = Callable[[str | None, list[str]], tuple[str, str, dict]]
ROUTES: dict[str, list[tuple[str, Ask]]] = {
    "/v1/search": [
        ("search (text, facets)", lambda ix, ids: ("POST", "/v1/search", {"json": _named(
            {"query": "a red square", "k": 2, "rerank": "none", "facets": True}, "index", ix)})),
        ("more like this", lambda ix, ids: ("POST", "/v1/search", {"json": _named(
            {"like": ids[:1], "k": 2}, "index", ix)})),
        ("search by image (base64)", lambda ix, ids: ("POST", "/v1/search", {"json": _named(
            {"image": base64.b64encode(PNG).decode(), "k": 2}, "index", ix)})),
    ],
    "/v1/search/image": [("search by image (upload)", lambda ix, ids: (
        "POST", "/v1/search/image" + _q(ix, k=2), {"content": PNG, "headers": {"Content-Type": "image/png"}}))],
    "/v1/explain": [("explain", lambda ix, ids: ("POST", "/v1/explain", {"json": _named(
        {"query": "a red square", "ids": ids[:1]}, "index", ix)}))],
    "/v1/items/{item_id:path}": [("item metadata", lambda ix, ids: ("GET", f"/v1/items/{ids[0]}" + _q(ix), {}))],
    "/v1/items/{item_id:path}/image": [("thumbnail", lambda ix, ids: (
        "GET", f"/v1/items/{ids[0]}/image" + _q(ix, size=32), {}))],
    "/knn-service": [("clip-retrieval knn", lambda ix, ids: ("POST", "/knn-service", {"json": _named(
        {"text": "a red square", "num_images": 2}, "indice_name", ix)}))],
    "/metadata": [("clip-retrieval metadata", lambda ix, ids: ("POST", "/metadata", {"json": _named(
        {"ids": ids[:2]}, "indice_name", ix)}))],
}
LISTS = {"/v1/indexes": "index list", "/indices-list": "clip-retrieval index list"}
# the routes that read no index, and why (every other route is in ROUTES or LISTS)
NO_INDEX = {"/healthz": "liveness", "/readyz": "readiness (behind keys it names no index: tested below)",
            "/metrics": "aggregates, behind its own key", "/admin/reload": "the admin key's", "/": "the page's HTML"}

# what every request of ROUTES is tried with: (key, its header, the index asked (None: none), the answer expected:
# a code for the test, words for docs/security.md)
TRIES = [
    ("scoped to photos", {"X-API-Key": SCOPED}, A, "200 photos", "200, from photos"),
    ("scoped to photos", {"X-API-Key": SCOPED}, B, "404 = nowhere",
     "404 `index_not_found`, the same status, headers and body as for `nowhere` (the name aside)"),
    ("scoped to photos", {"X-API-Key": SCOPED}, MISSING, "404 photos", "404 `index_not_found`: \"no index 'nowhere' "
     "here; served: ['photos']\""),
    ("scoped to photos", {"X-API-Key": SCOPED}, None, "200 photos",
     "200, from photos (the key's first index: the server's default, archive, is not the key's)"),
    ("every index", {"X-API-Key": EVERY_KEY}, A, "200 photos", "200, from photos"),
    ("every index", {"X-API-Key": EVERY_KEY}, B, "200 archive", "200, from archive"),
    ("every index", {"X-API-Key": EVERY_KEY}, None, "200 archive", "200, from archive (the server's default)"),
    ("every index", {"X-API-Key": EVERY_KEY}, MISSING, "404 archive photos",
     "404 `index_not_found`: \"no index 'nowhere' here; served: ['archive', 'photos']\""),
    ("the admin key, as X-API-Key", {"X-API-Key": ADMIN}, A, "403", "403 `forbidden`"),
    ("the admin key, as X-Admin-Key", {"X-Admin-Key": ADMIN}, A, "401", "401 `unauthorized` (no search key sent)"),
]
# the listing routes: key -> (header, the answer expected)
LIST_TRIES = {"scoped to photos": ({"X-API-Key": SCOPED}, "photos only (default photos)"),
              "every index": ({"X-API-Key": EVERY_KEY}, "archive and photos (default archive)"),
              "the admin key, as X-API-Key": ({"X-API-Key": ADMIN}, "403 `forbidden`"),
              "the admin key, as X-Admin-Key": ({"X-Admin-Key": ADMIN}, "401 `unauthorized`")}


def matrix_table() -> str:
    """docs/security.md's tables: the requests tried, and what each key got asking each index on every one of them."""
    rows = ["| route | request |", "|---|---|"]
    for path, cases in ROUTES.items():
        for what, ask in cases:
            method = ask(A, ["id"])[0]
            rows.append(f"| `{method} {path.replace(':path', '')}` | {what} |")
    rows += ["", "| key | index asked | answer, on every request above |", "|---|---|---|"]
    rows += [f"| {key} | {index or '(none)'} | {words} |" for key, _, index, _, words in TRIES]
    rows += ["", "| key | `GET /v1/indexes`, `GET /indices-list` |", "|---|---|"]
    rows += [f"| {key} | {words} |" for key, (_, words) in LIST_TRIES.items()]
    return "\n".join(rows)


def _ask(c, ask: Ask, index: str | None, ids: list[str], headers: dict):
    method, path, kw = ask(index, ids)
    return c.request(method, path, **{**kw, "headers": {**kw.get("headers", {}), **headers}})


def _answered_from(r) -> str | None:
    """The index an answer came from, where it says (search, explain, item: "index"; knn: its image URLs)."""
    if r.headers["content-type"] == "image/jpeg":
        return None
    body = r.json()
    if isinstance(body, dict):
        return body["index"]["name"]
    if body and "url" in body[0]:  # /knn-service
        names = {parse_qs(urlsplit(h["url"]).query)["index"][0] for h in body if "url" in h}
        assert len(names) == 1, names
        return names.pop()
    assert body and all(e["metadata"] is not None for e in body), body  # /metadata: every id found
    return None


def _error(r, status: int, code: str) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    return body["error"]


def _same_answer(r_other, other: str, r_missing, missing: str) -> None:
    """Two answers that differ in nothing but the index name asked for: status, headers, body."""
    assert r_other.status_code == r_missing.status_code, (r_other.text, r_missing.text)
    skip = {"content-length", "date"}
    hdr = lambda r: {k: v for k, v in r.headers.items() if k not in skip}  # noqa: E731
    assert hdr(r_other) == hdr(r_missing)
    assert r_other.text.replace(f"'{other}'", "'?'") == r_missing.text.replace(f"'{missing}'", "'?'")
    assert other not in r_other.text.replace(f"'{other}'", "'?'")  # named only where the request named it


CASES = [pytest.param(path, what, ask, id=what.replace(" ", "-")) for path, cases in ROUTES.items()
         for what, ask in cases]


@pytest.mark.parametrize("path, what, ask", CASES)
def test_scope_on_a_route_that_names_an_index(app, built, archive, path, what, ask):
    ids = {A: built.ids, B: archive, MISSING: archive}
    answers = {}
    for key, headers, index, expect, _ in TRIES:
        # no index named: the ids of the index that answers (the key's own first, or the server's default)
        of = ids[index] if index is not None else (built.ids if headers.get("X-API-Key") == SCOPED else archive)
        r = answers[key, index] = _ask(app, ask, index, of, headers)
        status, *names = expect.split()
        if status == "200":
            assert r.status_code == 200, (key, index, r.status_code, r.text)
            came = _answered_from(r)
            assert came in (None, names[0]), (key, index, came)
        elif status == "403":
            _error(r, 403, "forbidden")
        elif status == "401":
            _error(r, 401, "unauthorized")
        elif names != ["=", MISSING]:
            served = ", ".join(f"'{n}'" for n in names)  # the served indexes the key may read, only those
            assert _error(r, 404, "index_not_found")["message"] == f"no index '{index}' here; served: [{served}]"
    _same_answer(answers["scoped to photos", B], B, answers["scoped to photos", MISSING], MISSING)


def test_more_like_this_with_another_librarys_ids(app, built, archive):
    """"like" ids are looked up in the index searched: another library's ids are as unknown as made-up ones."""
    key = {"X-API-Key": SCOPED}
    other = app.post("/v1/search", json={"like": archive[:1], "index": A, "k": 2}, headers=key)
    made_up = app.post("/v1/search", json={"like": ["made-up-id.jpg"], "index": A, "k": 2}, headers=key)
    assert _error(other, 404, "item_not_found")["details"] == {"ids": archive[:1]}
    assert other.text.replace(archive[0], "?") == made_up.text.replace("made-up-id.jpg", "?")


def test_listing_routes_show_a_key_its_indexes(app):
    for key, names, default in (("scoped to photos", [A], A), ("every index", [B, A], B)):
        headers = LIST_TRIES[key][0]
        body = app.get("/v1/indexes", headers=headers).json()
        assert [ix["name"] for ix in body["indexes"]] == sorted(names)
        assert body["default"] == default and [ix["name"] for ix in body["indexes"] if ix["default"]] == [default]
        assert app.get("/indices-list", headers=headers).json() == sorted(names)
    assert B not in app.get("/v1/indexes", headers={"X-API-Key": SCOPED}).text
    for path in LISTS:
        _error(app.get(path, headers=LIST_TRIES["the admin key, as X-API-Key"][0]), 403, "forbidden")
        _error(app.get(path, headers=LIST_TRIES["the admin key, as X-Admin-Key"][0]), 401, "unauthorized")


def test_a_refused_index_outside_the_scope_is_not_found(app, monkeypatch):
    """An index whose active version was refused is 503 index_unavailable to a key that may read it, and to any
    other key the 404 of an index that does not exist (it is named in /v1/indexes' "unavailable" only in scope)."""
    reg = app.app.state.svc.registry
    monkeypatch.setattr(reg, "problems", {**reg.problems, "broken": "fingerprint mismatch"})
    body = {"query": "a red square", "k": 1, "rerank": "none"}
    everyone = app.post("/v1/search", json={**body, "index": "broken"}, headers={"X-API-Key": EVERY_KEY})
    _error(everyone, 503, "index_unavailable")
    scoped = [app.post("/v1/search", json={**body, "index": n}, headers={"X-API-Key": SCOPED})
              for n in ("broken", MISSING)]
    _same_answer(scoped[0], "broken", scoped[1], MISSING)
    unavailable = app.get("/v1/indexes", headers={"X-API-Key": EVERY_KEY}).json()["unavailable"]
    assert unavailable == {"broken": "fingerprint mismatch"}
    assert app.get("/v1/indexes", headers={"X-API-Key": SCOPED}).json()["unavailable"] == {}


def test_registry_lookups_within_a_scope(app):
    """registry.get / default_name directly: the default of a key whose scope holds the server's default is that
    default; else its own first served index, else its first; a scope must always be given (keyword, no default)."""
    reg = app.app.state.svc.registry
    assert reg.default_name() == reg.default_name(EVERY) == B
    assert reg.default_name(Scope((A,))) == A and reg.default_name(Scope((A, B))) == B  # B is the server's
    assert reg.default_name(Scope(("unbuilt", A))) == A and reg.default_name(Scope(("unbuilt",))) == "unbuilt"
    with pytest.raises(IndexNotFound, match=r"no index 'unbuilt' here; served: \[\]"):
        reg.get(None, scope=Scope(("unbuilt",)))
    with pytest.raises(IndexNotFound, match=r"served: \['photos'\]"):
        reg.get(B, scope=Scope((A,)))
    assert reg.get(B, scope=EVERY).name == B
    with pytest.raises(TypeError):
        reg.get(B)  # the scope is required: every lookup says whose it is
    reg.problems["broken"] = "x"
    try:
        with pytest.raises(IndexUnavailable):
            reg.get("broken", scope=Scope(("broken",)))
    finally:
        del reg.problems["broken"]


def test_readyz_names_no_index_behind_keys(app, client):
    """/readyz is open (load balancers send no key): behind search keys it says how many indexes are served, not
    which; without keys, as before, each index's version."""
    r = app.get("/readyz")
    assert r.status_code == 200 and r.json()["indexes_served"] == 2 and "indexes" not in r.json()
    assert A not in r.text and B not in r.text
    assert set(client.get("/readyz").json()["indexes"]) == {A, B}


def _search_group(app) -> dict[str, object]:
    out = {}
    for r in _app_routes(app.routes):
        top = [d.call for d in getattr(getattr(r, "dependant", None), "dependencies", [])]
        if security.search_client in top:
            out[r.path] = r
    return out


def _calls(dependant):
    for d in dependant.dependencies:
        yield d.call
        yield from _calls(d)


def test_every_index_route_is_in_the_matrix(app):
    """Every route behind a search key names, defaults to or lists indexes: each must take the key's scope
    (deps.key_scope somewhere in its dependencies) and have its place in ROUTES or LISTS; every other route is in
    NO_INDEX. A new route fails here until it is scoped and tested."""
    group = _search_group(app.app)
    assert set(group) == set(ROUTES) | set(LISTS)
    for path, route in group.items():
        assert deps.key_scope in set(_calls(route.dependant)), f"{path} does not look its index up in the key's scope"
    others = {r.path for r in _app_routes(app.app.routes) if getattr(r, "dependant", None) is not None} - set(group)
    assert others == set(NO_INDEX)


def test_docs_show_the_matrix():
    """docs/security.md's tables of routes and keys are this module's: regenerate them from matrix_table()."""
    assert matrix_table() in DOC.read_text(encoding="utf-8"), "\n" + matrix_table()


def test_page_lists_only_the_keys_indexes(app):
    """The page fills its index picker from /v1/indexes with the key in the field (api.js: keyHeaders), and loads
    the list again whenever the key changes (a new key may read other libraries)."""
    from tests.service.test_page import STATIC

    js = (STATIC / "app.js").read_text()
    handler = js.split('keyInput.addEventListener("change"')[1].split("});")[0]
    assert "keyChanged()" in handler and "start(" in handler  # start() = loadIndexes() first
    submit = js.split('form.addEventListener("submit"')[1].split("});")[0]
    assert "keyChanged()" in submit and "start(" in submit
    assert 'api("v1/indexes")' in js and "fillIndexes(body)" in js
    scoped = app.get("/v1/indexes", headers={"X-API-Key": SCOPED}).json()
    assert [ix["name"] for ix in scoped["indexes"]] == [A]  # one library: the picker hides itself (fillIndexes)
    assert '$("index-field").hidden = body.indexes.length < 2' in js


@pytest.mark.e2e
def test_page_with_a_scoped_key_in_a_browser(built, archive, svc_ckpt, artifacts):
    """Debian's chromium on a server with both keys: with the scoped key the page offers photos only (no picker)
    and searches it; with the unscoped key typed in its place, the picker comes back with both libraries."""
    import httpx
    from playwright.sync_api import sync_playwright

    from crossprobe.service.server import running, wait_ready
    from tests.service.conftest import service_settings
    from tests.service.browser import CHROMIUM, CHROMIUM_ARGS, wait_js

    s = service_settings(built, svc_ckpt, artifacts, api_keys=f"{SCOPED} {A}, {EVERY_KEY}", default_index=B,
                         warmup=False, port=0)
    with running(s) as url, sync_playwright() as p:
        with httpx.Client(base_url=url) as http:
            wait_ready(http)
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=url).new_page()
        page.goto("/")
        wait_js(page, "() => !document.getElementById('key-field').hidden")
        page.get_by_label("API key").fill(SCOPED)
        page.get_by_label("Describe the image you want").fill("a red square")
        with page.expect_response(lambda r: r.url.endswith("/v1/search") and r.status == 200) as searched:
            page.get_by_label("Describe the image you want").press("Enter")
        assert json.loads(searched.value.request.post_data)["index"] == A
        assert page.evaluate("() => [...document.querySelectorAll('#index option')].map(o => o.value)") == [A]
        assert page.locator("#index-field").is_hidden()
        page.get_by_label("API key").fill(EVERY_KEY)
        page.get_by_label("API key").press("Enter")
        wait_js(page, "() => document.querySelectorAll('#index option').length === 2")
        assert page.evaluate("() => [...document.querySelectorAll('#index option')].map(o => o.value)") == [B, A]
        # the index of the search on screen stays chosen (the page keeps it in its URL)
        assert page.evaluate("() => document.getElementById('index').value") == A
        assert page.locator("#index-field").is_visible()
        browser.close()
