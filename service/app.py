"""The FastAPI app: wiring only (routes are in routes/, errors in errors.py, metrics in metrics.py).

    create_app(Settings()) -> FastAPI          `crossprobe serve` runs it with uvicorn

Layering as in text-embeddings-inference: routes (routes/, by resource; their shared dependencies in
deps.py) -> the request pipeline's named stages (pipeline/: encode -> ann -> fetch -> rerank -> respond,
with the query batcher, batcher.py) -> backends (inference.py: ONNX Runtime; registry.py: the served index
versions over crossprobe.storage; breaker.py: the feature store behind its circuit breaker).

Routes: GET / (the web page, static/), POST /v1/search, POST /v1/search/image, POST /v1/explain,
GET /v1/indexes, GET /v1/items/{id}, GET /v1/items/{id}/image, GET /healthz, GET /readyz, GET /metrics,
POST /admin/reload, and the clip-retrieval compatible /knn-service, /indices-list, /metadata.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.staticfiles import StaticFiles

from crossprobe.core import release
from crossprobe.service import errors, security, urls
from crossprobe.service.body_guard import BodyGuard
from crossprobe.service.deps import DEGRADED_HEADER
from crossprobe.service.host_guard import HostGuard
from crossprobe.service.metrics import MetricsMiddleware
from crossprobe.service.routes import clip, explain, indexes, items, page, search
from crossprobe.service.settings import Settings
from crossprobe.service.state import ServiceState

log = logging.getLogger("crossprobe.service")

ROUTERS = (
    indexes.ops,
    page.router,
    search.router,
    explain.router,
    indexes.router,
    items.router,
    indexes.admin,
    clip.query_routes,
    clip.read_routes,
)


def create_app(settings: Settings | None = None, bert=None) -> FastAPI:
    settings = settings or Settings()
    access = security.Access(settings)  # a key that cannot work fails here, before anything starts
    state = ServiceState(settings, bert)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if settings.load_in_background:
            state.spawn_start()
        else:
            await state.start()
        try:
            yield
        finally:
            await state.stop()

    # redirect_slashes off: Starlette's redirect of /v1/search/ to /v1/search wrote the request's Host header into
    # its Location (a Host-steered URL in an answer, which a shared cache keeps); such paths are 404 instead
    app = FastAPI(
        title="crossprobe",
        summary="Text-to-image search: two-tower ANN shortlist + Cross-probe / T-EMDE reranking",
        version=release.version(),
        lifespan=lifespan,
        redirect_slashes=False,
    )
    app.state.svc = state
    app.state.access = access
    errors.install(app)
    # innermost of the three: its 413 / 422 answers still get CORS headers and are counted by MetricsMiddleware
    app.add_middleware(BodyGuard, max_bytes=settings.max_body_bytes)
    if settings.cors_list:
        # clip-retrieval's front-end runs on another origin; X-Admin-Key is deliberately not an allowed header
        # (admin calls come from scripts, not from pages), X-API-Key is (a page elsewhere with a search key)
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_list,
            allow_methods=["GET", "POST"],
            allow_headers=["Content-Type", security.API_KEY_HEADER],
            expose_headers=["Server-Timing", DEGRADED_HEADER, clip.IGNORED_HEADER, "Retry-After"],
        )
    hint = urls.clip_front_hint(settings)  # what a page on another origin (clip-retrieval's front-end) needs
    if hint:
        log.log(hint[0], "%s", hint[1])
    app.add_middleware(MetricsMiddleware)
    # outermost: a foreign Host is refused before anything else runs (still counted: errors.answer)
    app.add_middleware(HostGuard, allowed=settings.allowed_host_list)
    for router in ROUTERS:
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=page.STATIC_DIR), name="static")
    security.document_optional_keys(app, access)
    return app
