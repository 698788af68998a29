"""The Host check and CORP (service/host_guard.py; issue 55): a page that rebinds its own name to this address gets
400 invalid_host, not the photos; the health routes answer any Host; images say same-origin."""
from __future__ import annotations

import pytest

from crossprobe.service.host_guard import host_name
from crossprobe.service.settings import Settings
from tests.service.conftest import _client


@pytest.fixture(scope="module")
def guarded(built, svc_ckpt, artifacts):
    yield from _client(built, svc_ckpt, artifacts, allowed_hosts=Settings.model_fields["allowed_hosts"].default)


def test_the_default_names_are_the_loopback_ones():
    assert Settings().allowed_host_list == ["localhost", "127.0.0.1", "::1"]
    assert [host_name(h) for h in ("LocalHost:8000", "[::1]:8000", "127.0.0.1", "::1", "evil.example.net:80")] == \
        ["localhost", "::1", "127.0.0.1", "::1", "evil.example.net"]


@pytest.mark.parametrize("host", ["evil.example.net", "evil.example.net:8000", "localhost.evil.example.net", ""])
def test_a_foreign_host_gets_no_photo(guarded, host, built):
    item = built.ids[0]
    r = guarded.get(f"/v1/items/{item}/image", params={"index": "photos"}, headers={"Host": host})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host", r.text
    assert "CROSSPROBE_ALLOWED_HOSTS" in r.json()["error"]["message"]
    r = guarded.post("/v1/search", json={"query": "a dog"}, headers={"Host": host})
    assert r.status_code == 400 and "results" not in r.text


@pytest.mark.parametrize("host", ["localhost", "localhost:8000", "127.0.0.1:8000", "[::1]:8000"])
def test_loopback_names_pass_and_images_are_same_origin(guarded, host, built):
    r = guarded.get(f"/v1/items/{built.ids[0]}/image", params={"index": "photos"}, headers={"Host": host})
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/")
    assert r.headers["cross-origin-resource-policy"] == "same-origin"


def test_health_answers_any_host_and_a_star_turns_the_check_off(guarded, built, svc_ckpt, artifacts):
    assert guarded.get("/healthz", headers={"Host": "10.1.2.3:8000"}).status_code == 200
    for c in _client(built, svc_ckpt, artifacts, allowed_hosts="*"):
        assert c.get("/v1/indexes", headers={"Host": "search.example.org"}).status_code == 200
