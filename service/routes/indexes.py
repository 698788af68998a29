"""GET /v1/indexes, POST /admin/reload, and the operational routes: /healthz, /readyz, /metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from crossprobe.service import errors, metrics, security
from crossprobe.service.deps import ADMIN, SEARCH, KeyScope, Service
from crossprobe.service.pipeline.plan import default_rerank
from crossprobe.service.schemas import (
    ANY_ROUTE,
    POST_ROUTE,
    IndexesResponse,
    IndexInfo,
    QueryLimits,
    ServedModel,
    error_responses,
)

if TYPE_CHECKING:
    from crossprobe.core.inference import Backend
    from crossprobe.core.int8 import Int8Check

router = APIRouter(**SEARCH)  # a search key when keys are set: the index list
admin = APIRouter(**ADMIN)  # X-Admin-Key: /admin/*
ops = APIRouter()  # open: health and readiness; /metrics behind its own optional key


@router.get("/v1/indexes", response_model=IndexesResponse, responses=error_responses(*ANY_ROUTE))
async def indexes(state: Service, scope: KeyScope) -> IndexesResponse:
    """The served indexes the key may read (all without keys), the default of a request that names none, the
    refused versions among them, and the query limits."""
    reg = state.registry
    # limits: what a client can check before it sends a query image (the web page shrinks a larger photo)
    limits = QueryLimits(
        query_image_bytes=state.settings.query_image_max_bytes, query_image_pixels=state.settings.query_image_max_pixels
    )
    model = served_model(state)
    if reg is None:
        return IndexesResponse(model=model, indexes=[], default=None, unavailable={}, limits=limits)
    default = reg.default_name(scope)
    return IndexesResponse(
        model=model,
        indexes=[IndexInfo(**h.info(), default=n == default) for n, h in sorted(scope.visible(reg.handles).items())],
        default=default,
        unavailable=scope.visible(reg.problems),
        limits=limits,
    )


def served_model(state) -> ServedModel | None:
    """The served model and what it offers (the page shows only these rerankers); None while it loads."""
    m = state.models
    if m is None:
        return None
    return ServedModel(
        spec=str(state.settings.model_spec),
        fingerprint=m.fingerprint,
        rerankers=list(m.rerankers),
        default_rerank=default_rerank(state.settings, m),
        explain=state.explain_offered,
        relevance=m.calibration is not None,
    )


@ops.get(
    "/healthz",
    responses=error_responses(
        503, *ANY_ROUTE, s503="startup_failed: the models or the index registry failed to load (the message says why)"
    ),
)
async def healthz(state: Service):
    """Liveness: the process serves HTTP and its start-up has not failed (models may still be loading, and no
    index may exist yet: see /readyz). The container image's HEALTHCHECK asks this: an api waiting for its first
    index is healthy, one whose models failed to load is not."""
    if state.failure:
        # not errors.answer: a health probe every few seconds is not an error to count
        return JSONResponse(errors.body("startup_failed", state.why_not_ready()), errors.STATUS["startup_failed"])
    return {"status": "ok"}


@ops.get(
    "/readyz",
    responses=error_responses(
        503,
        *ANY_ROUTE,
        s503="not_ready: still loading (Retry-After); "
        "feature_store_unavailable: Redis is down and CROSSPROBE_READYZ_REQUIRES_REDIS is set",
    ),
)
async def readyz(request: Request, state: Service) -> JSONResponse:
    """Readiness: models loaded, at least one index served, warm-up query done; `feature_store` says whether
    Redis is usable (the circuit breaker's state); `model_spec` and `rerankers`: the served model and the
    rerankers it has; "int8" (int8 queries only): the load-time check's kernel path, weight format and cosine. Redis
    down: still ready with "status": "degraded" (searches answer from the ANN stage), or
    503 feature_store_unavailable with CROSSPROBE_READYZ_REQUIRES_REDIS. "indexes": each served index's version, and
    "unavailable" the indexes not served and why (e.g. built with another model: what to do); behind search keys
    only how many ("indexes_served", "indexes_unavailable")."""
    fs = state.feature_store.health()
    if not state.ready:
        return JSONResponse(
            errors.body("not_ready", state.why_not_ready(), {"feature_store": fs}), 503, headers={"Retry-After": "1"}
        )
    if not fs["up"] and state.settings.readyz_requires_redis:
        return JSONResponse(
            errors.body("feature_store_unavailable", f"Redis is down ({fs['last_error']})", {"feature_store": fs}),
            503,
            headers={"Retry-After": str(state.feature_store.retry_after_s)},
        )
    reg, models = state.loaded_registry, state.loaded_models  # loaded: the service is ready
    served, refused = reg.handles, reg.problems
    # behind search keys, an open route must not name the indexes: a key scoped to one library would learn the
    # others' names here (docs/security.md). GET /v1/indexes gives each key the versions it may read
    indexes = (
        {"indexes_served": len(served), "indexes_unavailable": len(refused)}
        if security.access(request).search_keys_on
        else {"indexes": {n: h.version for n, h in served.items()}, "unavailable": dict(refused)}
    )
    return JSONResponse(
        {
            "status": "ready" if fs["up"] else "degraded",
            "model": models.fingerprint,
            "model_spec": str(state.settings.model_spec),
            "rerankers": list(models.rerankers),
            "query_precision": models.query_precision,
            "device": device_of(models),
            **({"int8": c.as_dict()} if (c := int8_check(models)) is not None else {}),
            **indexes,
            "feature_store": fs,
        }
    )


def int8_check(models: Backend) -> Int8Check | None:
    """The load-time check of an int8 query graph (None: not int8). Backend declares it an object: cast to what
    core.int8.check makes."""
    return cast("Int8Check | None", models.int8_check)


def device_of(models) -> str:
    """Where the model runs: "cuda:0 (NVIDIA H200)" (PyTorch on a GPU), "cuda (ONNX Runtime)" (its CUDA provider),
    "cpu"."""
    provider = (models.providers or ["cpu"])[0]
    if provider.startswith("torch:cuda"):
        dev = provider.removeprefix("torch:")
        return f"{dev if ':' in dev else dev + ':0'} ({models.device_name()})"
    return "cuda (ONNX Runtime)" if provider == "CUDAExecutionProvider" else "cpu"


# Prometheus' text format: the 200 is declared as text/plain. response_class=Response (no media type of its own):
# with the default class the 200 would say JSON, with PlainTextResponse the JSON errors would say text/plain
@ops.get(
    "/metrics",
    dependencies=security.METRICS,
    response_class=Response,
    responses={
        **security.METRICS_RESPONSES,
        **error_responses(*ANY_ROUTE),
        200: {
            "description": "Prometheus text exposition format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
    },
)
async def prometheus() -> Response:
    data, ctype = metrics.render()
    return Response(data, media_type=ctype)


@admin.post("/admin/reload", responses=error_responses(503, *POST_ROUTE))
async def admin_reload(state: Service) -> dict:
    """Check every index's `active` key now and switch to new versions (also retries a refused one)."""
    return {"indexes": await state.reload(force=True)}
