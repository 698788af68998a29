"""The service opens an item's file only under its version's image roots (service/registry.py's file_allowed,
storage/store.py's within_roots; issue 55): a path written into Redis by someone else, or a symbolic link made
in the folder after it was indexed, gets 404 image_unavailable from the thumbnail route and "unavailable" from
explain, never the file."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from crossprobe.service.app import create_app
from crossprobe.service.server import wait_ready
from crossprobe.storage.redis_conn import connect
from crossprobe.storage.store import Store
from tests.indexer.conftest import make_images
from tests.service.conftest import Built, build_index, service_settings


@pytest.fixture
def own(redis_server, redis_url, models_dir, svc_ckpt, bert, tmp_path):  # noqa: F811
    """A fresh index of its own (these tests change its files and its Redis values)."""
    from crossprobe.indexer import open_index
    from crossprobe.indexer.jobs.settings import IndexerSettings

    redis_server.flushall()
    ixs = IndexerSettings(redis_url=redis_url, index_root=tmp_path / "indexes", models_dir=models_dir, batch_size=8,
                          progress=False)
    gallery = tmp_path / "gallery"
    make_images(gallery, 4)
    version = build_index(ixs, gallery, svc_ckpt, bert)
    return Built(ixs, gallery, version, list(open_index("photos", None, ixs).ids))


def _secret(tmp_path):
    p = tmp_path / "private" / "secret.jpg"
    p.parent.mkdir()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(p)
    return p


def test_a_uri_rewritten_in_redis_is_never_opened(own, svc_ckpt, artifacts, tmp_path):
    secret = _secret(tmp_path)
    store = Store(own.ixs, connect(own.ixs))
    item = own.ids[0]
    key = store.meta_key("photos", own.version, item)
    meta = json.loads(store.r.get(key))
    store.r.set(key, json.dumps({**meta, "uri": str(secret)}))
    with TestClient(create_app(service_settings(own, svc_ckpt, artifacts))) as c:
        wait_ready(c)
        r = c.get(f"/v1/items/{item}/image")
        assert r.status_code == 404 and r.json()["error"]["code"] == "image_unavailable", r.text
        assert "outside" in r.json()["error"]["message"]
        other = c.get(f"/v1/items/{own.ids[1]}/image")
        assert other.status_code == 200  # the other items are served as before
        ex = c.post("/v1/explain", json={"query": "a photo", "ids": [item]})
        assert ex.status_code == 200 and "outside" in json.dumps(ex.json()), ex.text


def test_a_link_made_in_the_folder_after_indexing_is_refused(own, svc_ckpt, artifacts, tmp_path):
    secret = _secret(tmp_path)
    item = own.ids[0]
    path = own.gallery / item
    os.remove(path)
    os.symlink(secret, path)  # whoever may write into the folder swaps a photo for a link out of it
    with TestClient(create_app(service_settings(own, svc_ckpt, artifacts))) as c:
        wait_ready(c)
        r = c.get(f"/v1/items/{item}/image")
        assert r.status_code == 404 and r.json()["error"]["code"] == "image_unavailable", r.text
        os.remove(path)
        shutil.copy(secret, path)  # a real file in the folder again: served
        assert c.get(f"/v1/items/{item}/image").status_code == 200


def test_photo_decodes_are_admitted_a_few_at_a_time(own, svc_ckpt, artifacts, monkeypatch):
    """CROSSPROBE_DECODE_MAX_IN_FLIGHT: thumbnails (and explain maps) decode photos per request; past the limit
    the next one is 429 overloaded at once, with Retry-After, instead of another decode of up to 100 MP."""
    import threading

    from crossprobe.service.routes import items

    started, release = threading.Event(), threading.Event()
    real = items.resized_jpeg

    def slow(*a, **kw):
        started.set()
        release.wait(30)
        return real(*a, **kw)

    monkeypatch.setattr(items, "resized_jpeg", slow)
    with TestClient(create_app(service_settings(own, svc_ckpt, artifacts, decode_max_in_flight=1))) as c:
        wait_ready(c)
        first: list = []
        t = threading.Thread(target=lambda: first.append(c.get(f"/v1/items/{own.ids[0]}/image")))
        t.start()
        assert started.wait(30)
        r = c.get(f"/v1/items/{own.ids[1]}/image")
        assert r.status_code == 429 and r.json()["error"]["code"] == "overloaded", r.text
        assert "CROSSPROBE_DECODE_MAX_IN_FLIGHT=1" in r.json()["error"]["message"] and r.headers["Retry-After"]
        release.set()
        t.join(30)
        assert first[0].status_code == 200
        assert c.get(f"/v1/items/{own.ids[1]}/image").status_code == 200  # admitted again once it ended
