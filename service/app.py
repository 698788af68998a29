"""Router layer: the FastAPI app (routes, errors, metrics middleware, lifespan).

    create_app(Settings()) -> FastAPI          `crossprobe serve` runs it with uvicorn

Routes: GET / (the web page, service/static/), POST /v1/search, POST /v1/explain, GET /v1/indexes,
GET /v1/items/{id}, GET /v1/items/{id}/image, GET /healthz, GET /readyz, GET /metrics, POST /admin/reload,
and the clip-retrieval compatible /knn-service, /indices-list, /metadata (clip_compat.py).

Routes sit in groups by who may call them (security.py: the group's dependency checks its key first):
query_routes and read_routes need a search key when keys are set, admin_routes the admin key; `router`'s
are open (/metrics takes its own optional key).
"""
from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, AsyncIterator

import numpy as np
from fastapi import APIRouter, FastAPI, Query, Request
from pydantic import ValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.routing import Match

from crossprobe.service import errors, metrics, query_image, security
from crossprobe.service.backend import EXPLAIN_MODES
from crossprobe.service.batcher import Overloaded
from crossprobe.service.body_guard import BodyGuard
from crossprobe.service.breaker import FeatureStoreUnavailable
from crossprobe.service.errors import ApiError
from crossprobe.service.http_timeouts import TIMED_OUT_SCOPE_KEY
from crossprobe.service.images import ImageUnavailable, resized_jpeg
from crossprobe.service.pipeline import Outcome, public_metadata
from crossprobe.service.schemas import (ANY_ROUTE, POST_ROUTE, ExplainRequest, ExplainResponse, ItemResponse,
                                        SearchRequest, SearchResponse, error_responses, filter_from_json,
                                        is_invisible)
from crossprobe.service.settings import MAX_K, MAX_QUERY_CHARS, Rerank, Settings
from crossprobe.service.state import ServiceState

router = APIRouter()  # open: health, readiness, the page; /metrics behind its own optional key
# search key (when keys are set) + rate limit: the routes that run the query tower
query_routes = APIRouter(dependencies=security.QUERY, responses=security.QUERY_RESPONSES)
read_routes = APIRouter(dependencies=security.SEARCH, responses=security.SEARCH_RESPONSES)  # search key: indexes, items
admin_routes = APIRouter(dependencies=security.ADMIN, responses=security.ADMIN_RESPONSES)  # X-Admin-Key: /admin/*


def svc(request: Request) -> ServiceState:
    return request.app.state.svc


def server_timing(timings_ms: dict[str, float]) -> str:
    return ", ".join(f"{k};dur={v:.3f}" for k, v in timings_ms.items())


# Response header on degraded answers: the degraded codes, comma separated (e.g. feature_store_unavailable).
# A header because /knn-service must keep clip_back's body (a bare list); /v1/search sends it too.
DEGRADED_HEADER = "X-Crossprobe-Degraded"


def degraded_headers(out: Outcome) -> dict[str, str]:
    return {DEGRADED_HEADER: ",".join(out.degraded_codes)} if out.degraded else {}


def overloaded(e: Overloaded) -> ApiError:
    return ApiError(429, "overloaded", f"too many searches in progress, retry shortly ({e})",
                    headers={"Retry-After": "1"})


async def run_search(state: ServiceState, plan) -> Outcome:
    """Admission control around one search: 429 at once when the queue is full."""
    state.require_ready()
    try:
        with state.limiter.admit():
            out = await state.searcher.search(plan)
    except Overloaded as e:
        raise overloaded(e) from None
    # labelled by the mode the search ran with (crossprobe_search_*{rerank}); warm-up searches never come here
    metrics.observe_stages(out.timings_ms, rerank=plan.rerank, degraded=tuple(out.degraded_codes))
    if out.degraded:
        metrics.error("degraded")
    return out


@query_routes.post("/v1/search", response_model=SearchResponse,
                   responses=error_responses(404, 413, 503, *POST_ROUTE,
                                             s404="index_not_found: no such index here; item_not_found: a \"like\" "
                                             "id is not in the served version",
                                             s413="too_large: the body is longer than CROSSPROBE_MAX_BODY_BYTES, or "
                                             "the image is over CROSSPROBE_QUERY_IMAGE_MAX_BYTES bytes or "
                                             "CROSSPROBE_QUERY_IMAGE_MAX_PIXELS pixels",
                                             s422="invalid_request: the body fails validation; invalid_image: "
                                             "\"image\" is not base64 or not a readable image"))
async def search(body: SearchRequest, request: Request) -> Response:
    """Images for a text, an image, indexed items (more like this), or a text with an image / items: encode,
    ANN shortlist, rerank (cp | temde | none; a query without text is not reranked), top k with metadata."""
    state = svc(request)
    state.require_ready()  # before touching state.searcher, which exists only once loaded
    image = None
    if body.image is not None:
        image = query_image.b64_bytes(body.image, state.settings.query_image_max_bytes)
    plan = state.searcher.plan(body.query, body.k, body.rerank, body.shortlist, body.index, body.min_score,
                               image=image, like=body.like_ids, weight=body.weight, dedup=body.dedup,
                               filter=body.filter, facets=body.facets)
    return await _answer(state, plan)


async def _answer(state: ServiceState, plan) -> Response:
    """Run a search plan -> /v1/search's JSON answer (with Server-Timing and the degraded header)."""
    out = await run_search(state, plan)
    timings = {k: round(v, 3) for k, v in out.timings_ms.items()}
    payload = {
        "results": [{"id": h.id, "score": h.score, "scores": {"ann": h.ann, "rerank": h.rerank},
                     "metadata": h.metadata} for h in out.hits],
        "index": {"name": out.handle.name, "version": out.handle.version},
        "model": {"fingerprint": state.models.fingerprint, "query_precision": state.models.query_precision},
        "query_kind": plan.kind,
        "rerank": plan.rerank,
        "rerank_skipped": plan.rerank_skipped,
        "deduplicated": out.deduplicated,
        "filtered": out.filtered,
        "facets": out.facets,
        "timings_ms": timings,
        "degraded": bool(out.degraded),
        "degraded_reason": out.degraded_reason,
    }
    return JSONResponse(payload, headers={"Server-Timing": server_timing(timings), **degraded_headers(out)})


# an upload: the image file itself as the body (curl --data-binary @photo.jpg) or a multipart form (curl -F
# image=@photo.jpg, an HTML form), the options as query parameters
_BINARY = {"type": "string", "format": "binary"}
_UPLOAD_BODY = {"requestBody": {"required": True, "description": "the image file's bytes (JPEG, PNG, WebP, GIF, BMP, "
                                "TIFF), at most CROSSPROBE_QUERY_IMAGE_MAX_BYTES; or a multipart form with the file "
                                "in the field \"image\"",
                                "content": {"application/octet-stream": {"schema": _BINARY},
                                            "image/*": {"schema": _BINARY},
                                            "multipart/form-data": {"schema": {
                                                "type": "object", "required": ["image"],
                                                "properties": {"image": _BINARY}}}}},
                "x-constraints": ["the body (or the form's image) is an image file"]}


def parse_filter(text: str | None):
    """/v1/search/image's `filter` query parameter (JSON) -> the same typed tree as /v1/search's; bad: 422."""
    if text is None:
        return None
    try:
        return filter_from_json(text)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "top level"
        raise ApiError(422, "invalid_request", f"invalid request: filter: {first['msg']} at {where}") from None
    except ValueError as e:
        raise ApiError(422, "invalid_request", f"invalid request: filter: {e}") from None


@query_routes.post("/v1/search/image", response_model=SearchResponse, openapi_extra=_UPLOAD_BODY,
                   responses=error_responses(404, 413, 503, *POST_ROUTE, s404="index_not_found: no such index here",
                                             s413="too_large: the body is longer than CROSSPROBE_MAX_BODY_BYTES, or "
                                             "the image is over CROSSPROBE_QUERY_IMAGE_MAX_BYTES bytes or "
                                             "CROSSPROBE_QUERY_IMAGE_MAX_PIXELS pixels",
                                             s422="invalid_request: a parameter fails validation; invalid_image: "
                                             "the body is not a readable image"))
async def search_image(request: Request,
                       k: Annotated[int, Query(ge=1, le=MAX_K, description="results to return")] = 10,
                       query: Annotated[str | None, Query(min_length=1, max_length=MAX_QUERY_CHARS,
                                                          description="a text to combine with the image")] = None,
                       weight: Annotated[float, Query(ge=0, le=1, description="the image's weight beside query")] = 0.5,
                       rerank: Annotated[Rerank | None, Query(description="with query: cp | temde | none")] = None,
                       index: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
                       dedup: Annotated[float | None, Query(gt=0, le=1, description="near-duplicate cosine")] = None,
                       filter: Annotated[str | None, Query(
                           max_length=16_384, description="a metadata filter as JSON text, the same as /v1/search's "
                           "\"filter\" (not JSON, or not such a filter: 422)",
                           json_schema_extra={"contentMediaType": "application/json",
                                              "x-constraints": ["JSON text of /v1/search's filter"]})] = None,
                       ) -> Response:
    """Query by image as an upload: the body is the image file, or a multipart form whose file field is "image";
    the same search as /v1/search's "image"."""
    state = svc(request)
    state.require_ready()
    if query is not None and is_invisible(query):
        raise ApiError(422, "invalid_request", "invalid request: query: query is blank (only whitespace, control or "
                       "invisible characters)")
    flt = parse_filter(filter)
    data = await query_image.upload_bytes(request, state.settings.query_image_max_bytes)
    plan = state.searcher.plan(query, k, rerank, None, index, image=data, weight=weight, dedup=dedup, filter=flt)
    return await _answer(state, plan)


@query_routes.post("/v1/explain", response_model=ExplainResponse, responses=error_responses(404, 503, *POST_ROUTE))
async def explain(body: ExplainRequest, request: Request) -> Response:
    """Where the Cross-probe reranker looked in each image for this query: a 7x7 weight map per id (sums to 1).

    The grid is not stored, so each image is decoded and run through the image backbone again (backend.Explainer;
    the graphs load on the first call). Unknown index or id: 404; more than MAX_EXPLAIN_IDS ids: 422. An id whose
    file is gone gets no map and a reason under `unavailable`, so one missing file does not hide the others."""
    state = svc(request)
    state.require_ready()
    handle = state.registry.get(body.index)
    ids = list(dict.fromkeys(body.ids))
    unknown = [i for i in ids if i not in handle.ids]
    if unknown:
        raise ApiError(404, "item_not_found", f"{len(unknown)} of the ids are not in {handle.name}/{handle.version}: "
                       f"{unknown[:5]}", {"ids": unknown})
    t0 = time.perf_counter()
    loop = asyncio.get_running_loop()
    try:
        # the same admission queue as searches: an explain costs more CPU than a search (a backbone run per id)
        with state.limiter.admit():
            q, info = await state.batcher.submit(body.query)
            t = time.perf_counter()
            metas = await read_metadata(state, handle, ids, "explain")
            metadata_ms = (time.perf_counter() - t) * 1000
            loading = not state.models.explainer_loaded
            t = time.perf_counter()
            explainer = await loop.run_in_executor(state.pool, state.models.explainer)
            load_ms = (time.perf_counter() - t) * 1000
            res = await loop.run_in_executor(state.pool, explainer.explain, handle, ids, metas, q.p_t)
    except Overloaded as e:
        raise overloaded(e) from None
    timings = {"queue": info.queue_ms, "encode": info.encode_ms, "metadata": metadata_ms,
               # the first explain of a process loads (or exports) the graphs: said, so the total adds up
               **({"load": load_ms} if loading else {}), **res.timings_ms}
    # own stage names in crossprobe_stage_seconds: explain traffic must not move the search stages' percentiles
    metrics.observe_stages({f"explain_{k}": v for k, v in timings.items()})
    timings = {k: round(v, 3) for k, v in {**timings, "total": (time.perf_counter() - t0) * 1000}.items()}
    payload = {
        "index": {"name": handle.name, "version": handle.version},
        "mode": explainer.mode,
        "description": EXPLAIN_MODES[explainer.mode],
        "grid": explainer.grid_side,
        "maps": {i: np.round(m, 6).tolist() for i, m in res.maps.items()},
        "probe_maps": {i: np.round(m, 6).tolist() for i, m in res.probe_maps.items()},
        "unavailable": res.unavailable,
        "timings_ms": timings,
    }
    return JSONResponse(payload, headers={"Server-Timing": server_timing(timings)})


@read_routes.get("/v1/indexes", responses=error_responses(*ANY_ROUTE))
async def indexes(request: Request) -> dict:
    state = svc(request)
    reg = state.registry
    # limits: what a client can check before it sends a query image (the web page shrinks a larger photo)
    limits = {"query_image_bytes": state.settings.query_image_max_bytes,
              "query_image_pixels": state.settings.query_image_max_pixels}
    if reg is None:
        return {"indexes": [], "default": None, "unavailable": {}, "limits": limits}
    default = reg.default_name()
    return {"indexes": [{**h.info(), "default": n == default} for n, h in sorted(reg.handles.items())],
            "default": default, "unavailable": dict(reg.problems), "limits": limits}


def _item(state: ServiceState, item_id: str, index: str | None):
    state.require_ready()
    handle = state.registry.get(index)
    if item_id not in handle.ids:
        raise ApiError(404, "item_not_found", f"no item {item_id!r} in {handle.name}/{handle.version}")
    return handle


async def read_metadata(state: ServiceState, handle, ids: list[str], op: str) -> list[dict | None]:
    """One MGET of metadata through the breaker; Redis down -> 503 feature_store_unavailable (at once while
    the breaker is open). Off the event loop: even a bounded Redis wait must not stall other requests."""
    try:
        return await asyncio.to_thread(state.feature_store.call, op, handle.reader.metadata, ids)
    except FeatureStoreUnavailable as e:
        raise errors.feature_store_unavailable(e, state.feature_store.retry_after_s) from None


# declared before /v1/items/{item_id:path}, which would otherwise swallow ".../image"
# response_class=Response: the 200 is image/jpeg only (FastAPI's default class would also declare JSON)
@read_routes.get("/v1/items/{item_id:path}/image", response_class=Response, responses={
    200: {"description": "the image, resized", "content": {"image/jpeg": {"schema": {"type": "string",
                                                                                     "format": "binary"}}}},
    **error_responses(404, 422, 503, *ANY_ROUTE, s404="index_not_found, item_not_found; image_unavailable: no "
                      "file is recorded for the item, or it is gone or unreadable")})
async def item_image(request: Request, item_id: str,
                     index: Annotated[str | None, Query(max_length=64)] = None,
                     size: Annotated[int | None, Query(ge=16, le=4096, description="max side in pixels")] = None
                     ) -> Response:
    """The indexed file of an indexed item, resized to fit `size` (default CROSSPROBE_IMAGE_MAX_SIDE)."""
    state = svc(request)
    handle = _item(state, item_id, index)
    meta = (await read_metadata(state, handle, [item_id], "item"))[0]
    if not meta or not meta.get("uri"):
        raise ApiError(404, "image_unavailable", f"{item_id!r} has no file recorded in {handle.name}/{handle.version}")
    s = state.settings
    side = min(size or s.image_max_side, s.image_max_side)
    try:
        data = await asyncio.to_thread(resized_jpeg, meta["uri"], side, s.image_quality, s.image_max_pixels)
    except ImageUnavailable as e:
        raise ApiError(404, "image_unavailable", f"{item_id!r}: {e}") from None
    # behind search keys: private, or a shared cache (CDN, proxy) would hand it to callers without a key
    cache = "private" if security.access(request).search_keys_on else "public"
    return Response(data, media_type="image/jpeg", headers={"Cache-Control": f"{cache}, max-age=300"})


@read_routes.get("/v1/items/{item_id:path}", response_model=ItemResponse,
                 responses=error_responses(404, 422, 503, *ANY_ROUTE))
async def item(request: Request, item_id: str, index: Annotated[str | None, Query(max_length=64)] = None) -> dict:
    """Metadata of one indexed item (as the indexer stored it)."""
    state = svc(request)
    handle = _item(state, item_id, index)
    meta = (await read_metadata(state, handle, [item_id], "item"))[0]
    return {"id": item_id, "index": {"name": handle.name, "version": handle.version},
            "metadata": public_metadata(meta, state.settings.expose_uri)}


@router.get("/healthz", responses=error_responses(*ANY_ROUTE))
async def healthz() -> dict:
    """Liveness: the process serves HTTP (models may still be loading; see /readyz)."""
    return {"status": "ok"}


@router.get("/readyz", responses=error_responses(503, *ANY_ROUTE, s503="not_ready: still loading (Retry-After); "
                 "feature_store_unavailable: Redis is down and CROSSPROBE_READYZ_REQUIRES_REDIS is set"))
async def readyz(request: Request) -> JSONResponse:
    """Readiness: models loaded, at least one index served, warm-up query done; `feature_store` says whether
    Redis is usable (the circuit breaker's state). Redis down: still ready with "status": "degraded"
    (searches answer from the ANN stage), or 503 feature_store_unavailable with CROSSPROBE_READYZ_REQUIRES_REDIS."""
    state = svc(request)
    fs = state.feature_store.health()
    if not state.ready:
        return JSONResponse(errors.body("not_ready", state.why_not_ready(), {"feature_store": fs}), 503,
                            headers={"Retry-After": "1"})
    if not fs["up"] and state.settings.readyz_requires_redis:
        return JSONResponse(errors.body("feature_store_unavailable", f"Redis is down ({fs['last_error']})",
                                        {"feature_store": fs}), 503,
                            headers={"Retry-After": str(state.feature_store.retry_after_s)})
    return JSONResponse({"status": "ready" if fs["up"] else "degraded", "model": state.models.fingerprint,
                         "query_precision": state.models.query_precision,
                         "indexes": {n: h.version for n, h in state.registry.handles.items()},
                         "feature_store": fs})


# Prometheus' text format: the 200 is declared as text/plain. response_class=Response (no media type of its own):
# with the default class the 200 would say JSON, with PlainTextResponse the JSON errors would say text/plain
@router.get("/metrics", dependencies=security.METRICS, response_class=Response,
            responses={**security.METRICS_RESPONSES, **error_responses(*ANY_ROUTE),
                       200: {"description": "Prometheus text exposition format",
                             "content": {"text/plain": {"schema": {"type": "string"}}}}})
async def prometheus() -> Response:
    data, ctype = metrics.render()
    return Response(data, media_type=ctype)


@admin_routes.post("/admin/reload", responses=error_responses(503, *POST_ROUTE))
async def admin_reload(request: Request) -> dict:
    """Check every index's `active` key now and switch to new versions (also retries a refused one)."""
    return {"indexes": await svc(request).reload(force=True)}


class MetricsMiddleware:
    """Latency and count per route template and status (templates, not raw paths: bounded label values)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            if scope.get(TIMED_OUT_SCOPE_KEY):  # the body's deadline passed: the protocol answered 408 itself
                status = 408
            metrics.observe_request(_route_template(scope), status, time.perf_counter() - start)


def _route_template(scope) -> str:
    route = scope.get("route")
    if route is None:  # no route chosen yet (BodyGuard's 413 / 422, a 408): look for one that matches fully
        route = _full_match(getattr(getattr(scope.get("app"), "router", None), "routes", ()), scope)
    return getattr(route, "path", None) or "unmatched"


def _full_match(routes, scope):
    for r in routes:
        # FastAPI 0.16x keeps an included router as one entry (an _IncludedRouter, with no path of its own):
        # without this descent every answer given before routing was counted as "unmatched"
        inner = getattr(r, "original_router", None)
        if inner is not None:
            found = _full_match(inner.routes, scope)
            if found is not None:
                return found
        elif r.matches(scope)[0] == Match.FULL:
            return r
    return None


# ---- the web page (GET /): plain files of this package, no build step ---------------------------
STATIC_DIR = Path(__file__).resolve().parent / "static"
# the page loads only its own files and calls only this origin: no inline script or style, nothing from a CDN
PAGE_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
            "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


@router.get("/", include_in_schema=False)
async def page() -> Response:
    """The search page: query box, reranker switch, index picker, result grid with scores and timings, and
    the "explain" heat maps (static/app.js calls /v1/indexes, /v1/search, /v1/explain, /v1/items/{id}/image)."""
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html; charset=utf-8",
                        headers={"Content-Security-Policy": PAGE_CSP, "Cache-Control": "no-cache"})


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

    app = FastAPI(title="crossprobe", summary="Text-to-image search: two-tower ANN shortlist + Cross-probe / "
                  "T-EMDE reranking", version="0.1.0", lifespan=lifespan)
    app.state.svc = state
    app.state.access = access
    errors.install(app)
    # innermost of the three: its 413 / 422 answers still get CORS headers and are counted by MetricsMiddleware
    app.add_middleware(BodyGuard, max_bytes=settings.max_body_bytes)
    if settings.cors_list:
        # clip-retrieval's front-end runs on another origin; X-Admin-Key is deliberately not an allowed header
        # (admin calls come from scripts, not from pages), X-API-Key is (a page elsewhere with a search key)
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_list, allow_methods=["GET", "POST"],
                           allow_headers=["Content-Type", security.API_KEY_HEADER],
                           expose_headers=["Server-Timing", DEGRADED_HEADER, "Retry-After"])
    app.add_middleware(MetricsMiddleware)
    for group in (router, query_routes, read_routes, admin_routes):
        app.include_router(group)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    from crossprobe.service.clip_compat import query_routes as clip_queries
    from crossprobe.service.clip_compat import read_routes as clip_reads

    app.include_router(clip_queries)
    app.include_router(clip_reads)
    security.document_optional_keys(app, access)
    return app
