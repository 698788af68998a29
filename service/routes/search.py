"""POST /v1/search (a JSON body: text, image, "like" items, filters ...) and POST /v1/search/image (an upload)."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from crossprobe.service import query_image
from crossprobe.service.deps import QUERY, degraded_headers, run_search, server_timing, svc
from crossprobe.service.exceptions import InvalidRequest
from crossprobe.indexer.storage.filter_model import filter_from_json
from crossprobe.service.schemas import (OFFSET_HELP, POST_ROUTE, SORT_HELP, VISIBLE_TEXT_HELP, QueryText,
                                        SearchRequest, SearchResponse, Sort, error_responses)
from crossprobe.service.settings import MAX_K, MAX_SHORTLIST, Rerank
from crossprobe.service.state import ServiceState

router = APIRouter(**QUERY)


@router.post("/v1/search", response_model=SearchResponse,
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
                               filter=body.filter, facets=body.facets, offset=body.offset, sort=body.sort,
                               min_relevance=body.min_relevance, mode=body.mode)
    return await _answer(state, plan)


async def _answer(state: ServiceState, plan) -> Response:
    """Run a search plan -> /v1/search's JSON answer (with Server-Timing and the degraded header)."""
    out = await run_search(state, plan)
    timings = {k: round(v, 3) for k, v in out.timings_ms.items()}
    payload = {
        "results": [{"id": h.id, "score": h.score, "relevance": h.relevance,
                     "scores": {"ann": h.ann, "rerank": h.rerank, "keyword": h.keyword,
                                "keyword_coverage": h.coverage},
                     "metadata": h.metadata, "highlights": h.highlights} for h in out.hits],
        "total": out.total,
        "offset": plan.offset,
        "next_offset": plan.offset + plan.k if plan.offset + plan.k < out.total else None,
        "sort": plan.sort,
        "index": {"name": out.handle.name, "version": out.handle.version},
        "model": {"fingerprint": state.models.fingerprint, "query_precision": state.models.query_precision},
        "query_kind": plan.kind,
        "rerank": plan.rerank,
        "rerank_skipped": plan.rerank_skipped,
        "mode": plan.mode,
        "mode_note": plan.mode_note,
        "keyword": out.keyword.info() if out.keyword is not None else None,
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
                                "TIFF, HEIC/HEIF, AVIF, camera RAW), at most CROSSPROBE_QUERY_IMAGE_MAX_BYTES; or a "
                                "multipart form with the file "
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
        raise InvalidRequest(f"invalid request: filter: {first['msg']} at {where}") from None
    except ValueError as e:
        raise InvalidRequest(f"invalid request: filter: {e}") from None


@router.post("/v1/search/image", response_model=SearchResponse, openapi_extra=_UPLOAD_BODY,
                   responses=error_responses(404, 413, 503, *POST_ROUTE, s404="index_not_found: no such index here",
                                             s413="too_large: the body is longer than CROSSPROBE_MAX_BODY_BYTES, or "
                                             "the image is over CROSSPROBE_QUERY_IMAGE_MAX_BYTES bytes or "
                                             "CROSSPROBE_QUERY_IMAGE_MAX_PIXELS pixels",
                                             s422="invalid_request: a parameter fails validation; invalid_image: "
                                             "the body is not a readable image"))
async def search_image(request: Request,
                       k: Annotated[int, Query(ge=1, le=MAX_K, description="results to return")] = 10,
                       query: Annotated[QueryText | None, Query(
                           description=f"a text to combine with the image: {VISIBLE_TEXT_HELP}")] = None,
                       weight: Annotated[float, Query(ge=0, le=1, description="the image's weight beside query")] = 0.5,
                       rerank: Annotated[Rerank | None, Query(description="with query: cp | temde | none")] = None,
                       index: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
                       dedup: Annotated[float | None, Query(gt=0, le=1, description="near-duplicate cosine")] = None,
                       filter: Annotated[str | None, Query(
                           max_length=16_384, description="a metadata filter as JSON text, the same as /v1/search's "
                           "\"filter\" (not JSON, or not such a filter: 422)",
                           json_schema_extra={"contentMediaType": "application/json",
                                              "x-constraints": ["JSON text of /v1/search's filter"]})] = None,
                       offset: Annotated[int, Query(ge=0, le=MAX_SHORTLIST, description=OFFSET_HELP)] = 0,
                       sort: Annotated[Sort, Query(description=SORT_HELP)] = "relevance",
                       ) -> Response:
    """Query by image as an upload: the body is the image file, or a multipart form whose file field is "image";
    the same search as /v1/search's "image"."""
    state = svc(request)
    state.require_ready()
    flt = parse_filter(filter)
    data = await query_image.upload_bytes(request, state.settings.query_image_max_bytes)
    plan = state.searcher.plan(query, k, rerank, None, index, image=data, weight=weight, dedup=dedup, filter=flt,
                               offset=offset, sort=sort)
    return await _answer(state, plan)
