"""Hot reload: a newly activated version is served without a failed request (poller and /admin/reload)."""
from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from crossprobe.storage.redis_conn import connect
from crossprobe.storage.store import Store
from crossprobe.service.app import create_app
from tests.indexer.conftest import make_images
from tests.service.conftest import build_index, service_settings, wait_ready


@pytest.fixture(scope="module")
def versions(built, svc_ckpt, bert, tmp_path_factory):
    """v1 = `built` (12 images) and v2 (6 other images), both complete, v1 active."""
    two = tmp_path_factory.mktemp("second-gallery")
    make_images(two, 6, seed=7, prefix="new")
    v2 = build_index(built.ixs, two, svc_ckpt, bert)  # the indexer activates it...
    store = Store(built.ixs, connect(built.ixs))
    store.activate("photos", built.version)  # ...so roll back: each test switches to v2 itself
    return store, built.version, v2, two


def _version(client) -> str:
    r = client.post("/v1/search", json={"query": "a photo", "k": 3})
    assert r.status_code == 200, r.text
    return r.json()["index"]["version"]


def _wait_until(cond, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_admin_reload_switches_on_demand(versions, built, svc_ckpt, artifacts, monkeypatch):
    store, v1, v2, _ = versions
    with TestClient(create_app(service_settings(built, svc_ckpt, artifacts))) as c:  # polling off
        wait_ready(c)
        assert _version(c) == v1
        store.activate("photos", v2)
        assert _version(c) == v1  # nothing polls: still the pinned version
        r = c.post("/admin/reload")  # no key: 401; a wrong one: 403 (security.py, as for search keys)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        r = c.post("/admin/reload", headers={"X-Admin-Key": "wrong"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
        r = c.post("/admin/reload", headers={"X-Admin-Key": "s3cret-admin-key-0123"})
        assert r.status_code == 200
        assert r.json()["indexes"]["photos"] == {"version": v2, "changed": True, "previous": v1}
        body = c.post("/v1/search", json={"query": "a photo", "k": 6}).json()
        assert body["index"]["version"] == v2 and all("new_" in h["id"] for h in body["results"])
        assert 'crossprobe_index_items{index="photos"} 6.0' in c.get("/metrics").text
        monkeypatch.setattr(c.app.state.svc.settings, "admin_key", None)
        r = c.post("/admin/reload", headers={"X-Admin-Key": "s3cret-admin-key-0123"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_disabled"
    store.activate("photos", v1)


def test_activation_under_load_fails_no_request(versions, built, svc_ckpt, artifacts):
    store, v1, v2, _ = versions
    with TestClient(create_app(service_settings(built, svc_ckpt, artifacts, reload_interval_s=0.1))) as c:
        wait_ready(c)
        assert _version(c) == v1
        stop = threading.Event()
        seen: list[list[tuple[int, str | None, str]]] = [[], [], []]

        def client_loop(i: int) -> None:
            while not stop.is_set():
                r = c.post("/v1/search", json={"query": f"query {i}", "k": 3, "rerank": ("cp", "temde", "none")[i]})
                ok = r.status_code == 200
                seen[i].append((r.status_code, r.json()["index"]["version"] if ok else None, "" if ok else r.text))

        threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        try:
            _wait_until(lambda: all(len(s) >= 3 for s in seen))
            store.activate("photos", v2)  # what the indexer does last: one SET
            _wait_until(lambda: all(any(v == v2 for _, v, _ in s) for s in seen))
            assert [v for v, _ in store.gc("photos")] == [v1]  # then the old version goes, keys and files
            counts = [len(s) for s in seen]
            _wait_until(lambda: all(len(s) >= n + 10 for s, n in zip(seen, counts)))  # after the gc too
        finally:
            stop.set()
            for t in threads:
                t.join(30)
    for s in seen:
        failed = [text for status, _, text in s if status != 200]
        assert not failed, failed[:3]
        vs = [v for _, v, _ in s]
        cut = vs.index(v2)  # per client: v1 until the switch, v2 after it, never back
        assert cut > 0 and set(vs[:cut]) == {v1} and set(vs[cut:]) == {v2}


def test_a_version_deleted_under_the_service_degrades_then_retries(versions, built, svc_ckpt, bert, artifacts):
    """gc before the switch (the wrong order) costs the rerank, not the request; a request that finds
    its version deleted after the switch answers from the new version."""
    from crossprobe.core.runtime import StageTimer

    store, _, v2, two = versions  # v2 is active (the previous test switched to it)
    with TestClient(create_app(service_settings(built, svc_ckpt, artifacts))) as c:  # polling off
        wait_ready(c)
        svc = c.app.state.svc
        old = svc.registry.current("photos")
        assert old.version == v2
        v3 = build_index(built.ixs, two, svc_ckpt, bert)  # activates v3...
        assert [v for v, _ in store.gc("photos")] == [v2]  # ...and v2, still served here, is deleted at once
        body = c.post("/v1/search", json={"query": "a photo", "k": 3, "rerank": "cp"}).json()
        assert body["degraded"] and "features missing" in body["degraded_reason"]
        assert body["index"]["version"] == v2 and all(h["scores"]["rerank"] is None for h in body["results"])
        assert c.post("/admin/reload", headers={"X-Admin-Key": "s3cret-admin-key-0123"}).json()["indexes"]["photos"]["version"] == v3
        body = c.post("/v1/search", json={"query": "a photo", "k": 3, "rerank": "cp"}).json()
        assert not body["degraded"] and body["index"]["version"] == v3
        # a request that took the v2 handle before the switch: its fetch fails, it retries on v3
        q = svc.models.encode_texts(["a photo"])[0]
        out = svc.searcher._after_encode(q, old, svc.searcher.plan(query="a photo", k=3, rerank="cp"), StageTimer())
        assert out.handle.version == v3 and not out.degraded and all(h.rerank is not None for h in out.hits)


def test_a_dropped_index_is_no_longer_served(versions, built, svc_ckpt, bert, artifacts, tmp_path):
    """`crossprobe index drop` removes the active key and every version's files: the next reload stops serving
    the index, and its routes answer 404 index_not_found (never a 5xx), while the other index carries on. A
    request that comes between the drop and the reload answers from the handle it has, without a 5xx."""
    store = versions[0]
    make_images(tmp_path / "g", 4, seed=9, prefix="gone")
    build_index(built.ixs, tmp_path / "g", svc_ckpt, bert, name="gone")
    with TestClient(create_app(service_settings(built, svc_ckpt, artifacts))) as c:  # polling off
        wait_ready(c)
        r = c.post("/v1/search", json={"query": "a photo", "k": 2, "index": "gone"})
        assert r.status_code == 200 and r.json()["index"]["name"] == "gone"
        dropped, _ = store.drop_index("gone")
        assert len(dropped) == 1
        r = c.post("/v1/search", json={"query": "a photo", "k": 2, "index": "gone"})
        assert r.status_code < 500, r.text  # the pinned handle: its values are gone, degraded at worst
        out = c.post("/admin/reload", headers={"X-Admin-Key": "s3cret-admin-key-0123"}).json()["indexes"]
        assert out["gone"]["version"] is None and out["gone"]["changed"] and "photos" in out
        for method, path, body in (("POST", "/v1/search", {"query": "a photo", "k": 2, "index": "gone"}),
                                   ("GET", "/v1/items/gone_000.jpg?index=gone", None)):
            r = c.request(method, path, json=body)
            assert r.status_code == 404 and r.json()["error"]["code"] == "index_not_found", (path, r.text)
        listed = c.get("/v1/indexes").json()
        assert [i["name"] for i in listed["indexes"]] == ["photos"] and "gone" not in listed["unavailable"]
        assert c.post("/v1/search", json={"query": "a photo", "k": 2}).status_code == 200  # the other index
        text = c.get("/metrics").text
        assert 'crossprobe_index_items{index="gone"}' not in text and 'version_info{index="gone"' not in text
        assert 'crossprobe_reloads_total{index="gone",outcome="dropped"} 1.0' in text
        again = c.post("/admin/reload", headers={"X-Admin-Key": "s3cret-admin-key-0123"}).json()["indexes"]
        assert "gone" not in again  # looked at once, then forgotten
