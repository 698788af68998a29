"""POST /v1/search (a JSON body: text, image, "like" items, filters ...) and POST /v1/search/image (an upload)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import ValidationError

from crossprobe.service import query_image
from crossprobe.service.deps import QUERY, KeyScope, Service, degraded_headers, ready, run_search, server_timing
from crossprobe.service.exceptions import InvalidRequest
from crossprobe.service.pipeline import Outcome, Plan
from crossprobe.service.schemas import (
    IMAGE_TOO_LARGE,
    POST_ROUTE,
    Hit,
    ImageSearchParams,
    IndexRef,
    KeywordInfo,
    ModelRef,
    Scores,
    SearchRequest,
    SearchResponse,
    error_responses,
)
from crossprobe.service.state import ServiceState
from crossprobe.storage.filter_model import filter_from_json

router = APIRouter(**QUERY)


async def search_plan(body: SearchRequest, state: Service, scope: KeyScope) -> Plan:
    """/v1/search's plan: the body validated, then the service ready (bad input is a 422 even while it loads)."""
    return ready(state).loaded_searcher.plan(body, scope=scope)


@router.post(
    "/v1/search",
    response_model=SearchResponse,
    responses=error_responses(
        404,
        413,
        503,
        *POST_ROUTE,
        s404='index_not_found: no such index here; item_not_found: a "like" id is not in the served version',
        s413=IMAGE_TOO_LARGE,
        s422="invalid_request: the body fails validation; invalid_image: "
        '"image" is not base64 or not a readable image; '
        "reranker_unavailable: rerank names a reranker the served model "
        "has not (GET /v1/indexes: model.rerankers)",
    ),
)
async def search(plan: Annotated[Plan, Depends(search_plan)], state: Service, response: Response) -> SearchResponse:
    """Images for a text, an image, indexed items (more like this), or a text with an image / items: encode,
    ANN shortlist, rerank (cp | temde | none; a query without text is not reranked), top k with metadata."""
    return await _answer(state, plan, response)


async def _answer(state: ServiceState, plan: Plan, response: Response) -> SearchResponse:
    """Run a search plan -> /v1/search's answer (with Server-Timing and the degraded header)."""
    out = await run_search(state, plan)
    answer = search_response(state, out.plan or plan, out)
    response.headers["Server-Timing"] = server_timing(answer.timings_ms)
    response.headers.update(degraded_headers(out))
    return answer


def search_response(state: ServiceState, plan: Plan, out: Outcome) -> SearchResponse:
    models = state.loaded_models
    return SearchResponse(
        results=[
            Hit(
                id=h.id,
                score=h.score,
                relevance=h.relevance,
                scores=Scores(ann=h.ann, rerank=h.rerank, keyword=h.keyword, keyword_coverage=h.coverage),
                metadata=h.metadata,
                highlights=h.highlights,
            )
            for h in out.hits
        ],
        total=out.total,
        offset=plan.offset,
        next_offset=plan.offset + plan.k if plan.offset + plan.k < out.total else None,
        sort=plan.sort,
        index=IndexRef(name=out.handle.name, version=out.handle.version),
        model=ModelRef(fingerprint=models.fingerprint, query_precision=models.query_precision),
        query_kind=plan.kind,
        rerank=plan.rerank,
        rerank_skipped=plan.rerank_skipped,
        mode=plan.mode,
        mode_note=plan.mode_note,
        keyword=KeywordInfo(**out.keyword.info()) if out.keyword is not None else None,
        deduplicated=out.deduplicated,
        filtered=out.filtered,
        facets=out.facets,
        timings_ms={k: round(v, 3) for k, v in out.timings_ms.items()},
        degraded=bool(out.degraded),
        degraded_reason=out.degraded_reason,
    )


# an upload: the image file itself as the body (curl --data-binary @photo.jpg) or a multipart form (curl -F
# image=@photo.jpg, an HTML form), the options as query parameters
_BINARY = {"type": "string", "format": "binary"}
_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "description": "the image file's bytes (JPEG, PNG, WebP, GIF, BMP, "
        "TIFF, HEIC/HEIF, AVIF, camera RAW), at most CROSSPROBE_QUERY_IMAGE_MAX_BYTES; or a "
        "multipart form with the file "
        'in the field "image"',
        "content": {
            "application/octet-stream": {"schema": _BINARY},
            "image/*": {"schema": _BINARY},
            "multipart/form-data": {
                "schema": {"type": "object", "required": ["image"], "properties": {"image": _BINARY}}
            },
        },
    },
    "x-constraints": ["the body (or the form's image) is an image file"],
}


def parse_filter(text: str | None):
    """/v1/search/image's `filter` query parameter (JSON) -> the same typed tree as /v1/search's; bad: 422."""
    if text is None:
        return None
    try:
        return filter_from_json(text)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "top level"
        raise InvalidRequest(f"invalid request: filter: {first['msg']} at {where}") from None
    except ValueError as e:
        raise InvalidRequest(f"invalid request: filter: {e}") from None


async def upload_plan(
    request: Request, params: Annotated[ImageSearchParams, Query()], state: Service, scope: KeyScope
) -> Plan:
    """/v1/search/image's plan: the parameters validated, the service ready, then the filter parsed and the
    image read (the body, or the form's file)."""
    searcher = ready(state).loaded_searcher
    flt = parse_filter(params.filter)
    data = await query_image.upload_bytes(request, state.settings.query_image_max_bytes)
    return searcher.plan(params, filter=flt, image=data, scope=scope)


@router.post(
    "/v1/search/image",
    response_model=SearchResponse,
    openapi_extra=_UPLOAD_BODY,
    responses=error_responses(
        404,
        413,
        503,
        *POST_ROUTE,
        s404="index_not_found: no such index here",
        s413=IMAGE_TOO_LARGE,
        s422="invalid_request: a parameter fails validation; invalid_image: "
        "the body is not a readable image; reranker_unavailable: rerank "
        "names a reranker the served model has not",
    ),
)
async def search_image(
    plan: Annotated[Plan, Depends(upload_plan)], state: Service, response: Response
) -> SearchResponse:
    """Query by image as an upload: the body is the image file, or a multipart form whose file field is "image";
    the same search as /v1/search's "image"."""
    return await _answer(state, plan, response)
