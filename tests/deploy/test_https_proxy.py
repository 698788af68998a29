"""HTTPS in front: deploy/caddy/Caddyfile, unchanged, run by a real Caddy (Debian's, `make system` installs it) in
front of a real `crossprobe serve` over a real index (tests/service/conftest.py's), both on loopback ports.

Caddy signs its certificate with its own authority (`tls internal`); every request here verifies that certificate
against the authority's root.crt from Caddy's data folder, never with verification off. The service runs with
CROSSPROBE_PUBLIC_URL set to the proxy's https address, as docs/deployment.md says to: the page, the API and the
thumbnails are fetched through the proxy, and the image URLs the service hands out (/knn-service) are followed as
a client would. Both processes are started here and stopped here by their PIDs."""
from __future__ import annotations

import os
import re
import socket
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from crossprobe.service.server import free_port
from tests.deploy.conftest import DEPLOY, tool
from tests.service.live import serve, stop

CADDYFILE = DEPLOY / "caddy" / "Caddyfile"


def _tail(*logs: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())


@pytest.fixture(scope="module")
def proxy(built, svc_ckpt, artifacts, tmp_path_factory):
    """-> (https base URL, an SSL context trusting only Caddy's root, the service's own http base URL)."""
    tmp = tmp_path_factory.mktemp("https-proxy")
    https_port, http_port = free_port(), free_port()
    site = f"https://localhost:{https_port}"
    with serve(built, svc_ckpt, artifacts, tmp / "serve.log", CROSSPROBE_PUBLIC_URL=site) as upstream:
        env = {**os.environ, "HOME": str(tmp), "XDG_DATA_HOME": str(tmp / "data"),
               "XDG_CONFIG_HOME": str(tmp / "config"),
               "CROSSPROBE_SITE": f"localhost:{https_port}", "CROSSPROBE_UPSTREAM": upstream.removeprefix("http://"),
               "CADDY_HTTP_PORT": str(http_port), "CADDY_ADMIN": "off", "CADDY_BIND": "127.0.0.1"}
        log = tmp / "caddy.log"
        with open(log, "wb") as out:
            caddy = subprocess.Popen([tool("caddy"), "run", "--config", str(CADDYFILE), "--adapter", "caddyfile"],
                                     env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            root = tmp / "data" / "caddy" / "pki" / "authorities" / "local" / "root.crt"
            deadline = time.monotonic() + 60
            while True:
                assert caddy.poll() is None, f"caddy exited\n{_tail(log)}"
                if root.exists():
                    try:
                        ctx = ssl.create_default_context(cafile=str(root))
                        if httpx.get(f"{site}/healthz", verify=ctx, timeout=5).status_code == 200:
                            break
                    except (httpx.TransportError, ssl.SSLError):
                        pass  # the certificate is being issued, or the file half written
                assert time.monotonic() < deadline, f"no answer over HTTPS at {site}\n{_tail(log, tmp / 'serve.log')}"
                time.sleep(0.2)
            yield site, ctx, upstream, http_port
        finally:
            stop(caddy)


@pytest.fixture(scope="module")
def https(proxy):
    site, ctx, _, _ = proxy
    with httpx.Client(base_url=site, verify=ctx, timeout=30) as c:
        yield c


def test_the_certificate_is_caddys_and_verified_against_its_root_only(proxy):
    site, ctx, _, _ = proxy
    port = int(site.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        cert = tls.getpeercert()
    issuer = dict(x[0] for x in cert["issuer"])
    assert "Caddy Local Authority" in issuer["commonName"], cert
    assert ("DNS", "localhost") in cert["subjectAltName"]
    # the same request with the usual trust (certifi, the system's store) is refused: verification is real here
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{site}/healthz", timeout=5)


def test_the_search_page_and_its_files_load_over_https(https):
    """The page, then what a browser loads from it: its stylesheet and script (relative URLs) and the ES modules
    those import, each over the proxy."""
    page = https.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), page.text[:300]
    assert "http://" not in page.text  # nothing the browser would block as mixed content
    todo = re.findall(r'(?:src|href)="(static/[^"]+)"', page.text)
    assert {"static/app.css", "static/app.js"} <= set(todo), page.text[:800]
    seen = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        r = https.get(f"/{path}")
        assert r.status_code == 200, (path, r.status_code)
        if path.endswith(".js"):
            todo += [f"static/{m}" for m in re.findall(r'from "\./([\w.-]+\.js)"', r.text)]
    assert "static/api.js" in seen, seen


def test_the_api_answers_through_the_proxy_as_it_does_directly(https, proxy):
    body = {"query": "a red square", "index": "photos", "k": 5}
    via = https.post("/v1/search", json=body)
    direct = httpx.post(f"{proxy[2]}/v1/search", json=body, timeout=30)
    assert via.status_code == 200 and direct.status_code == 200, via.text
    ids = [h["id"] for h in via.json()["results"]]
    assert len(ids) == 5 and ids == [h["id"] for h in direct.json()["results"]]


def test_thumbnails_load_through_the_proxy(https, proxy, built):
    item = built.ids[0]
    via = https.get(f"/v1/items/{item}/image", params={"index": "photos", "size": 64})
    direct = httpx.get(f"{proxy[2]}/v1/items/{item}/image", params={"index": "photos", "size": 64}, timeout=30)
    assert via.status_code == 200 and via.headers["content-type"] == "image/jpeg", via.text[:300]
    assert via.content == direct.content and via.headers["cache-control"] == direct.headers["cache-control"]


def test_image_urls_handed_out_are_https_under_the_public_url_and_load(https, proxy):
    """CROSSPROBE_PUBLIC_URL at work: clip-retrieval's /knn-service answers carry absolute image URLs on the proxy's
    https address (whatever Host the request came with), and a client that follows them gets the images."""
    site = proxy[0]
    r = https.post("/knn-service", json={"text": "a red square", "modality": "image", "num_images": 3,
                                         "indice_name": "photos", "num_result_ids": 3})
    assert r.status_code == 200, r.text
    urls = [x["url"] for x in r.json() if "url" in x]
    assert len(urls) == 3 and all(u.startswith(f"{site}/v1/items/") for u in urls), urls
    for u in urls:
        img = https.get(u)
        assert img.status_code == 200 and img.headers["content-type"] == "image/jpeg", (u, img.text[:300])


def test_plain_http_is_redirected_to_https(proxy):
    site, _, _, http_port = proxy
    r = httpx.get(f"http://localhost:{http_port}/v1/indexes", timeout=5)
    assert r.status_code in (301, 308) and r.headers["location"] == f"{site}/v1/indexes", (r.status_code, r.headers)
