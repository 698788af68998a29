"""A version a later release wrote (its manifest's format beyond storage/layout.py's FORMAT) activated under a
running service: refused with the writer's release and what to do, while the version served keeps serving."""
from __future__ import annotations

import json
import time

from fastapi.testclient import TestClient

from crossprobe.service.app import create_app
from crossprobe.storage import layout
from crossprobe.storage.redis_conn import connect
from crossprobe.storage.store import Store
from tests.indexer.conftest import make_images
from tests.service.conftest import build_index, service_settings, wait_ready


def test_a_later_releases_version_is_refused_and_the_served_one_keeps_serving(built, svc_ckpt, bert, artifacts,
                                                                                tmp_path):
    make_images(tmp_path / "more", 4, seed=11, prefix="later")
    store = Store(built.ixs, connect(built.ixs))
    later = build_index(built.ixs, tmp_path / "more", svc_ckpt, bert)
    store.activate("photos", built.version)
    path = store.version_dir("photos", later) / layout.MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), "format": layout.FORMAT + 1, "crossprobe": "9.1.0"}))
    try:
        with TestClient(create_app(service_settings(built, svc_ckpt, artifacts, reload_interval_s=0.1))) as c:
            wait_ready(c)
            store.r.set(store.active_key("photos"), later)  # as a 9.1.0 job would switch it
            deadline = time.monotonic() + 30
            while "photos" not in (unavailable := c.get("/v1/indexes").json()["unavailable"]):
                assert time.monotonic() < deadline, unavailable
                time.sleep(0.05)
            why = unavailable["photos"]
            assert f"version {later} is in storage format {layout.FORMAT + 1}, written by crossprobe 9.1.0" in why
            assert "pip install --upgrade crossprobe" in why
            r = c.post("/v1/search", json={"query": "a photo", "k": 3})
            assert r.status_code == 200 and r.json()["index"]["version"] == built.version
            assert 'crossprobe_reloads_total{index="photos",outcome="storage_format"}' in c.get("/metrics").text
    finally:
        store.r.set(store.active_key("photos"), built.version)
        store.drop("photos", later)
