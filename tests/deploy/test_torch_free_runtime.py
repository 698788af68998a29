"""The container image ships without PyTorch (docs/deployment.md): once `crossprobe export` has written every
graph, the batch indexer and the service run on ONNX Runtime alone, and a checkpoint whose graphs are missing is
refused with what to do. Each case runs in a subprocess whose `import torch` fails, as it does in the image."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.indexer.conftest import make_images


@pytest.fixture(scope="module")
def graphs(svc_ckpt, bert, tmp_path_factory) -> Path:  # noqa: F811
    """What the image's build exports: every service graph, the int8 query tower and the image backbone."""
    from crossprobe.models import export

    d = tmp_path_factory.mktemp("image-graphs")
    folder = export.ensure_graphs(d, export.SERVICE_GRAPHS, svc_ckpt, bert=bert)
    export.ensure_int8_query(folder)
    export.ensure_backbone(d)
    return d


def _run(code: str, no_torch: Path, env: dict, timeout: int = 240) -> subprocess.CompletedProcess:
    full = {**os.environ, **env, "PYTHONPATH": str(no_torch)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full,
                          timeout=timeout)


def test_index_and_serve_without_torch(no_torch, graphs, svc_ckpt, redis_server, redis_url, tmp_path):  # noqa: F811
    redis_server.flushall()
    gallery = tmp_path / "gallery"
    make_images(gallery, 6)
    env = {"REDIS_URL": redis_url, "CROSSPROBE_INDEX_ROOT": str(tmp_path / "indexes"),
           "CROSSPROBE_MODELS_DIR": str(graphs),
           "CROSSPROBE_CKPT": str(svc_ckpt), "CROSSPROBE_INDEX_PROGRESS": "false"}
    p = _run(f"""
        import sys
        from pathlib import Path
        from fastapi.testclient import TestClient
        from crossprobe.cli import app
        from typer.testing import CliRunner
        r = CliRunner().invoke(app, ["index", "build", "--name", "photos", "--images", {str(gallery)!r},
                                           "--ckpt", {str(svc_ckpt)!r}])
        assert r.exit_code == 0, r.output
        from crossprobe.service.app import create_app
        from crossprobe.service.server import wait_ready
        from crossprobe.service.settings import Settings
        with TestClient(create_app(Settings(reload_interval_s=0, access_log=False)), base_url="http://localhost") as c:
            wait_ready(c)
            hits = c.post("/v1/search", json={{"index": "photos", "query": "a photo", "k": 3}}).json()["results"]
            assert len(hits) == 3, hits
            first = next(p for p in sorted(Path({str(gallery)!r}).iterdir()) if p.suffix.lower() in (".jpg", ".png"))
            img = c.post("/v1/search/image?index=photos&k=1", files={{"file": first.open("rb")}})
            assert img.status_code == 200 and img.json()["results"][0]["id"] == first.name, img.text
            ex = c.post("/v1/explain", json={{"index": "photos", "query": "a photo", "ids": [hits[0]["id"]]}})
            assert ex.status_code == 200, ex.text
        assert "torch" not in sys.modules or sys.modules["torch"] is None
        print("OK")
        """, no_torch, env)
    assert p.returncode == 0 and "OK" in p.stdout, p.stdout[-2000:] + p.stderr[-4000:]


def test_a_checkpoint_without_graphs_is_refused_with_what_to_do(no_torch, graphs, svc_ckpt, tmp_path):  # noqa: F811
    """A mounted new checkpoint (another fingerprint) whose graphs the image does not hold: the service and the
    batch job both refuse it, naming `crossprobe export` and the two settings, rather than a bare ImportError."""
    import json
    import shutil

    ckpt = tmp_path / "new-ckpt"
    shutil.copytree(svc_ckpt, ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["fingerprint"] = "0123456789abcdef"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    p = _run(f"""
        from pathlib import Path
        from crossprobe.models import export
        try:
            export.ensure_graphs(Path({str(graphs)!r}), export.SEARCH_GRAPHS, Path({str(ckpt)!r}))
        except export.GraphsUnavailable as e:
            print("REFUSED", e)
        """, no_torch, {})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "REFUSED" in p.stdout and "0123456789abcdef" in p.stdout
    for hint in ("crossprobe export", "CROSSPROBE_MODELS_DIR"):
        assert hint in p.stdout
