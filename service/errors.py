"""The one place where errors become HTTP answers: JSON with a stable code, {"error": {"code", "message", "details"?}}.

Code below the HTTP layer raises domain exceptions (exceptions.py) and the storage layer's own (AnnUnavailable,
FeatureStoreUnavailable, Redis errors); STATUS maps each code to its HTTP status, and install() registers the
handlers.

Clients branch on `code`, never on the message. Codes:
  invalid_request 422   body or parameter fails validation (unknown field, k out of range, bad JSON, a
                        body that is not UTF-8, nested deeper than 32 levels...)
  unsupported     422   a valid request for something not offered (image_url, a text index)
  invalid_image   422   a query image that is not base64 or not a readable image (query_image.py)
  reranker_unavailable 422  the request names a reranker (cp, temde) the served model has no trained head for
                        (a two-tower model: send rerank none, or leave it out); GET /v1/indexes' model.rerankers
                        lists what it has
  explain_unavailable 422   /v1/explain on a model without explain maps (GET /v1/indexes' model.explain)
  index_not_found 404   no such index here          item_not_found 404   id not in the served version
                        (also a /v1/search "like" id)
  image_unavailable 404 the indexed file is gone or unreadable
  not_found 404, method_not_allowed 405, too_large 413  (routing / size; 413 also for a query image over
                        CROSSPROBE_QUERY_IMAGE_MAX_BYTES or CROSSPROBE_QUERY_IMAGE_MAX_PIXELS)
  request_timeout 408   the request's head or body did not arrive in time (http_timeouts.py; written by the
                        HTTP protocol layer, then the connection is closed)
  invalid_host 400      the Host header names none of CROSSPROBE_ALLOWED_HOSTS (host_guard.py)
  unauthorized 401      the route's key header is missing (X-API-Key, X-Admin-Key, Authorization: Bearer
                        for /metrics); forbidden 403: it holds no key of that route's group (security.py)
  admin_disabled 403    /admin/* while no CROSSPROBE_ADMIN_KEY is set
  overloaded 429        the admission queue is full; retry after Retry-After seconds
  rate_limited 429      this search key's (or client address's) token bucket is empty; retry after Retry-After
  not_ready 503         models or indexes still loading   index_unavailable 503  index refused (see message)
  startup_failed 503    /healthz (and /readyz says why): the models or the index registry failed to load
  feature_store_unavailable 503  Redis (features, metadata) is down or paused: routes that need it
                        (items, images, /metadata; searches with CROSSPROBE_REDIS_DOWN_SEARCH=fail) answer
                        this at once while the circuit breaker is open; retry after Retry-After seconds
  ann_unavailable 503   the vector engine holding the index version (Milvus) cannot be reached or timed out;
                        retry after Retry-After seconds (FAISS versions are in the process: never)
  internal 500          a bug: never the answer to bad input

clip-retrieval's front-end reads every /knn-service answer as a list of results: for its requests (posted as
text/plain), an error is that list, one notice result drawn as a tile (clip_front_notice below).
"""

from __future__ import annotations

import logging
import textwrap
from typing import Any, Iterable, Mapping
from urllib.parse import quote
from xml.sax.saxutils import escape

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from crossprobe.core.inference import RerankerUnavailable
from crossprobe.service import metrics
from crossprobe.service.exceptions import CrossprobeError, InvalidRequest
from crossprobe.storage.ann import AnnUnavailable

log = logging.getLogger("crossprobe.service")

STATUS = {
    "invalid_request": 422,
    "unsupported": 422,
    "invalid_image": 422,
    "reranker_unavailable": 422,
    "explain_unavailable": 422,
    "unauthorized": 401,
    "forbidden": 403,
    "admin_disabled": 403,
    "index_not_found": 404,
    "item_not_found": 404,
    "image_unavailable": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "request_timeout": 408,
    "too_large": 413,
    "bad_request": 400,
    "invalid_host": 400,
    "overloaded": 429,
    "rate_limited": 429,
    "not_ready": 503,
    "startup_failed": 503,
    "index_unavailable": 503,
    "feature_store_unavailable": 503,
    "ann_unavailable": 503,
}
_HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "too_large"}


def body(code: str, message: str, details: Any = None) -> dict:
    err: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        err["details"] = details
    return {"error": err}


def answer(
    code: str,
    message: str,
    details: Any = None,
    headers: Mapping[str, str] | None = None,
    status: int | None = None,
    scope: Mapping[str, Any] | None = None,
) -> JSONResponse:
    """The JSON error answer for `code` (counted in crossprobe_errors_total). scope: the request's ASGI scope;
    a request of clip-retrieval's front-end gets the error as a notice result (clip_front_notice)."""
    metrics.error(code)
    status = status or STATUS.get(code, 500)
    if scope is not None and from_clip_front(scope):
        return JSONResponse([clip_front_notice(code, message, details, status)], status, headers=headers)
    return JSONResponse(body(code, message, details), status, headers=headers)


# ---- clip-retrieval's front-end -------------------------------------------------------------------------------
# The front-end (a page on another origin: docs/api.md) posts /knn-service as text/plain and parses every answer,
# whatever its status, as clip_back's list of results; it has no way to show an error. An error object made it
# fail while drawing: the page went on showing the previous results (or nothing) without a word. So its requests
# get the error as that list: one result whose picture and caption are the message, which it draws as a tile,
# with the error's own status and headers (Retry-After...), and the error object under "error". Other clients
# (JSON or no Content-Type: clip-retrieval's ClipClient, curl) get the error object as on every route.
CLIP_FRONT_ROUTE = "/knn-service"


def from_clip_front(scope: Mapping[str, Any]) -> bool:
    """A POST to /knn-service with a text/plain body: what clip-retrieval's front-end sends (its fetch() of a
    string; no JSON client does)."""
    if scope.get("type") != "http" or scope.get("method") != "POST" or scope.get("path") != CLIP_FRONT_ROUTE:
        return False
    ctype = dict(scope.get("headers") or ()).get(b"content-type", b"")
    return ctype.split(b";")[0].strip().lower() == b"text/plain"


def clip_front_notice(code: str, message: str, details: Any, status: int) -> dict:
    """The error as one clip_back result: caption = the message (the front shows its first 50 characters, all of
    it with "Display full captions", and as the picture's tooltip); url = a picture of it (an SVG data: URL: the
    front hides a result whose picture does not load); similarity 0."""
    return {
        "id": f"crossprobe:{code}",
        "similarity": 0.0,
        "caption": f"crossprobe: {message}",
        "url": _notice_picture(f"{code} ({status})", message),
        **body(code, message, details),
    }


def _notice_picture(title: str, message: str, width: int = 21, max_lines: int = 10) -> str:
    """An SVG of the message (the front draws a result's picture 150 px wide: ~12 px letters here)."""
    lines = textwrap.wrap(message, width) or [""]
    if len(lines) > max_lines:
        lines = lines[: max_lines - 1] + [lines[max_lines - 1][: width - 1] + "\u2026"]
    text = "".join(f'<tspan x="12" dy="{21 if i else 0}">{escape(line)}</tspan>' for i, line in enumerate(lines))
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="220" height="300" viewBox="0 0 220 300">'
        '<rect x="2" y="2" width="216" height="296" rx="10" fill="#fff4d6" stroke="#c98a00" stroke-width="3"/>'
        '<text x="12" y="30" font-family="sans-serif" font-size="21" font-weight="bold" fill="#7a4f00">'
        "crossprobe</text>"
        f'<text x="12" y="54" font-family="monospace" font-size="14" fill="#7a4f00">{escape(title)}</text>'
        f'<text x="12" y="84" font-family="sans-serif" font-size="16" fill="#222">{text}</text></svg>'
    )
    return "data:image/svg+xml," + quote(svg, safe="")


def _headers(exc: CrossprobeError) -> dict[str, str] | None:
    h = {}
    if exc.retry_after_s is not None:
        h["Retry-After"] = str(exc.retry_after_s)
    scheme = getattr(exc, "scheme", None)  # Unauthorized's challenge
    if scheme:
        h["WWW-Authenticate"] = scheme
    return h or None


def validation_error(errors: Iterable[Mapping[str, Any]], drop_prefix: tuple[str, ...] = ("body",)) -> InvalidRequest:
    """pydantic/FastAPI error list -> one 422 whose message names every bad field."""
    details = []
    for e in errors:
        loc = [str(p) for p in e.get("loc", ())]
        if loc and loc[0] in drop_prefix:
            loc = loc[1:]
        field = ".".join(loc) or "body"
        msg = str(e.get("msg", "invalid"))
        if e.get("type") == "json_invalid":
            msg = f"body is not valid JSON ({(e.get('ctx') or {}).get('error', 'decode error')})"
            field = "body"
        elif e.get("type") == "extra_forbidden":
            msg = "unknown field (not part of this API)"
        elif e.get("type") == "model_attributes_type":
            msg = "expected a JSON object (send Content-Type: application/json)"
        details.append({"field": field, "message": msg, "type": str(e.get("type", ""))})
    summary = "; ".join(f"{d['field']}: {d['message']}" for d in details) or "invalid request"
    return InvalidRequest(f"invalid request: {summary}", details)


def install(app: FastAPI) -> None:
    @app.exception_handler(CrossprobeError)
    async def _domain(request: Request, exc: CrossprobeError) -> JSONResponse:
        return answer(exc.code, exc.message, exc.details, _headers(exc), scope=request.scope)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return await _domain(request, validation_error(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and isinstance(exc.__cause__, ValueError):
            # FastAPI answers 400 "There was an error parsing the body" when a JSON body is not UTF-8 (its
            # UnicodeDecodeError, a ValueError, is the cause); every other bad body is a 422 here, /knn-service
            # and /metadata answer this one 422 too (their own parser), and JSON must be UTF-8 (RFC 8259): so
            # one answer for all routes, 422 invalid_request
            return answer(
                "invalid_request", f"invalid request: body is not valid JSON ({exc.__cause__})", scope=request.scope
            )
        code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        return answer(code, str(exc.detail), headers=exc.headers, status=exc.status_code, scope=request.scope)

    @app.exception_handler(RerankerUnavailable)
    async def _no_reranker(request: Request, exc: RerankerUnavailable) -> JSONResponse:
        # the model's own refusal (Backend.require_reranker), should a path reach it past the plan's check
        return answer("reranker_unavailable", str(exc), scope=request.scope)

    @app.exception_handler(AnnUnavailable)
    async def _ann_down(request: Request, exc: AnnUnavailable) -> JSONResponse:
        # the vector engine holding the version (Milvus) is down or past its timeout
        return answer("ann_unavailable", str(exc), headers={"Retry-After": "1"}, scope=request.scope)

    @app.exception_handler(RedisConnectionError)  # breaker.FeatureStoreUnavailable is one too
    @app.exception_handler(RedisTimeoutError)
    async def _redis_down(request: Request, exc: Exception) -> JSONResponse:
        # a Redis failure that no stage turned into a degraded answer is the feature store's, never a 500
        fs = getattr(getattr(request.app.state, "svc", None), "feature_store", None)
        return answer(
            "feature_store_unavailable",
            str(exc) or type(exc).__name__,
            headers={"Retry-After": str(fs.retry_after_s if fs else 1)},
            scope=request.scope,
        )

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return answer(
            "internal", f"internal error ({type(exc).__name__}); see the server log", status=500, scope=request.scope
        )
