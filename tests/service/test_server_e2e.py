"""End to end: `crossprobe serve` as a real uvicorn process on loopback, a real Redis server, an index
built by the indexer, queried over HTTP, then stopped with SIGTERM (graceful shutdown)."""
from __future__ import annotations

import io
import json
import signal

import httpx
from PIL import Image

from tests.service.live import start, stop


def test_serve_over_http(built, svc_ckpt, artifacts, redis_url, tmp_path):
    log = tmp_path / "server.log"
    proc, base = start({"REDIS_URL": redis_url, "CROSSPROBE_INDEX_ROOT": str(built.ixs.index_root),
                        "CROSSPROBE_CKPT": str(svc_ckpt), "CROSSPROBE_MODELS_DIR": str(artifacts),
                        "CROSSPROBE_RELOAD_INTERVAL_S": "0"}, log)
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            r = http.post("/v1/search", json={"query": "a red square", "k": 4, "rerank": "cp"})
            assert r.status_code == 200, r.text
            body = r.json()
            assert len(body["results"]) == 4 and body["index"]["version"] == built.version
            assert "rerank;dur=" in r.headers["server-timing"]
            first = body["results"][0]["id"]
            img = http.get(f"/v1/items/{first}/image")
            assert img.status_code == 200 and img.headers["content-type"] == "image/jpeg"
            assert Image.open(io.BytesIO(img.content)).format == "JPEG"

            r = http.post("/knn-service", content=json.dumps({"text": "a red square", "modality": "image",
                                                              "num_images": 2, "indice_name": "photos"}),
                          headers={"Content-Type": "text/plain"})
            assert r.status_code == 200 and len(r.json()) == 2
            assert http.post("/v1/search", json={"query": "a", "k": 0}).status_code == 422
            assert 'crossprobe_stage_seconds_count{stage="rerank"}' in http.get("/metrics").text
    finally:
        stop(proc)
    # uvicorn shuts down gracefully, then re-raises the SIGTERM it caught (exit status -15)
    text = log.read_text()
    assert proc.returncode in (0, -signal.SIGTERM), text
    assert "Application shutdown complete" in text and "Traceback" not in text, text
