"""The clip-retrieval (rom1504/clip-retrieval, clip_back) HTTP API over this service's search.

  POST /knn-service   {"text", "modality": "image", "num_images", "num_result_ids", "indice_name", ...}
                      -> [{"id", "similarity", "url", "caption", ...metadata}, ..., {"id", "similarity"}, ...]
  GET  /indices-list  -> ["name", ...]
  POST /metadata      {"ids": [...], "indice_name"} -> [{"id", "metadata": {"url", "caption", ...}}, ...]

As in clip_back: the first num_images results carry metadata; the rest, up to
num_result_ids, are ids and similarities only, for a client to page through
with /metadata. /metadata answers a list of {"id", "metadata"} because that is
what clip_back returns and its front-end reads. Bodies are parsed from the raw
bytes whatever the Content-Type: the front-end posts JSON as text/plain (which
avoids a CORS preflight). Differences: ids are the index's string ids (not
integer rows); "similarity" is the ranking score (the reranker's logit for a
text query unless the server's default rerank is "none"; the cosine for image
and embedding queries, which are not reranked); "image" (base64) and
"embedding_input" (a vector of the index's dimension) are queries as in clip_back,
embedding_input first, then image, then text; image_url and a text index are
refused with 422 "unsupported"; num_images is capped at 200 and num_result_ids
at 1000; deduplicate (default true, as in clip_back) drops results whose stored
vectors have a cosine >= 0.94 with a better one. use_safety_model,
use_violence_detector, aesthetic_score and use_mclip are accepted and not applied
(there is no safety model, violence detector, aesthetic embedding or multilingual
text tower here; clip_back skips each the same way on an index served without
it): no result is ever dropped for them, and the answer names the ones asked for
in `X-Crossprobe-Ignored`.

Image URLs: service/urls.py (absolute under CROSSPROBE_PUBLIC_URL, else
root-relative; never from request headers). Errors for clip-retrieval's
front-end (text/plain posts) come as one notice result it can draw (errors.py).

Redis down: /knn-service still answers clip_back's list, from the ANN
stage: ANN order, "similarity" is then the two-tower cosine (not the reranker's
logit; both are "higher is better", which is all clip_back clients read), and
only "url" and an empty "caption" beside id and similarity. The response says so
in a header clients ignore safely, `X-Crossprobe-Degraded: feature_store_unavailable`
(exposed to the origins CROSSPROBE_CORS_ORIGINS allows). /metadata has nothing to answer without
Redis: 503 feature_store_unavailable with Retry-After.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Request, Response
from pydantic import ValidationError

from crossprobe.service import query_image
from crossprobe.service.deps import QUERY, SEARCH, KeyScope, Service, degraded_headers, read_metadata, ready, run_search
from crossprobe.service.errors import validation_error
from crossprobe.service.exceptions import InvalidRequest, Unsupported
from crossprobe.service.pipeline import Plan, public_metadata
from crossprobe.service.registry import IndexHandle
from crossprobe.service.schemas import (
    ANY_ROUTE,
    IMAGE_TOO_LARGE,
    POST_ROUTE,
    KnnRequest,
    KnnResult,
    MetadataEntry,
    MetadataRequest,
    error_responses,
    is_invisible,
)
from crossprobe.service.settings import MAX_K, MAX_SHORTLIST, Settings
from crossprobe.service.urls import item_image_url

# deduplicate (clip_back's default true): results whose stored vectors have at least this cosine with a better
# result are dropped, clip_back's get_non_uniques threshold
DEDUP_COSINE = 0.94
# the options of a /knn-service request that were asked for and not applied (comma separated; exposed to the
# origins CROSSPROBE_CORS_ORIGINS allows)
IGNORED_HEADER = "X-Crossprobe-Ignored"

# the route groups of deps.py: a search key when keys are set; /knn-service runs the query tower, so it also
# takes a rate-limit token. (clip-retrieval's own front-end sends no key: with keys on, put a proxy that adds
# X-API-Key in front of it, or keep this service's keys off behind a private network.)
query_routes = APIRouter(tags=["clip-retrieval"], **QUERY)
read_routes = APIRouter(tags=["clip-retrieval"], **SEARCH)


async def _json(request: Request) -> Any:
    """The body as JSON. Its size (Settings.max_body_bytes) and nesting depth were checked by BodyGuard
    before this route ran (body_guard.py); RecursionError is still a 422 should a parser recurse anyway."""
    raw = await request.body()
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise InvalidRequest(f"invalid request: body is not valid JSON ({e})") from None


def _flat(settings: Settings, index: str, item_id: str, meta: dict | None) -> dict:
    out = {k: v for k, v in (public_metadata(meta, settings.expose_uri) or {}).items() if k != "id"}
    out["caption"] = out.get("caption") or ""
    out["url"] = item_image_url(settings, index, item_id)  # absolute with CROSSPROBE_PUBLIC_URL (urls.py)
    return out


async def _parse(request: Request, model):
    """Body (JSON whatever the content type) -> a validated request model, or a 422."""
    try:
        return model.model_validate(await _json(request))
    except ValidationError as e:
        raise validation_error(e.errors(), drop_prefix=()) from None


def _body_doc(model) -> dict[str, Any]:
    """openapi_extra for a route that parses its raw body itself (_parse, for clip_back's text/plain posts):
    FastAPI sees no body parameter, so the body is declared here, from the model the route validates with."""
    return {
        "requestBody": {
            "required": True,
            "description": "JSON, whatever the Content-Type (clip-retrieval's front-end posts it as text/plain)",
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }


@dataclass
class KnnSearch:
    """A /knn-service request in this service's terms: the plan, and clip_back's options that are not applied."""

    plan: Plan
    ignored: list[str]


async def knn_search(request: Request, state: Service, scope: KeyScope) -> KnnSearch:
    """The body parsed and checked (422 unsupported / invalid_request, 413 / 422 for the image), then the service
    ready, then the plan: clip_back's query (embedding_input, else image, else text: its precedence) and options."""
    req = await _parse(request, KnnRequest)
    if req.image_url:
        raise Unsupported(
            "search by an image URL is not supported (nothing is fetched): send the image, "
            'base64, as "image" (clip-retrieval\'s front-end: the camera button)'
        )
    if req.modality != "image":
        raise Unsupported(
            'no text index here, only images: use "modality": "image" (clip-retrieval\'s '
            'front-end: "Search over" image)'
        )
    text = image = embedding = None
    if req.embedding_input:
        embedding = np.asarray(req.embedding_input, np.float64)  # float64: the searcher's _query_vector scales it
    elif req.image:
        image = query_image.b64_bytes(req.image, state.settings.query_image_max_bytes)
    elif req.text and not is_invisible(req.text):
        text = req.text
    else:  # no query, or text of only whitespace / NUL / zero-width characters: nothing to search
        raise InvalidRequest('invalid request: text: send a non-blank "text", an "image" or an "embedding_input"')
    searcher = ready(state).loaded_searcher
    k = min(req.num_images, MAX_K)
    total = min(max(req.num_result_ids or k, k), MAX_SHORTLIST)
    # shortlist: max(server default, total), so the reranker sees at least as many candidates as returned
    plan = searcher.plan(
        query=text,
        k=k,
        index=req.indice_name,
        tail=total - k,
        image=image,
        embedding=embedding,
        dedup=DEDUP_COSINE if req.deduplicate else None,
        mode="vector",
        scope=scope,
    )  # clip_back's contract: a vector search
    return KnnSearch(plan, _ignored(req))


# response_model_exclude_unset: the results past num_images are {"id", "similarity"} alone, as clip_back's
@query_routes.post(
    "/knn-service",
    response_model=list[KnnResult],
    response_model_exclude_unset=True,
    openapi_extra=_body_doc(KnnRequest),
    responses=error_responses(
        404,
        413,
        503,
        *POST_ROUTE,
        s404="index_not_found: no such index here",
        s413=IMAGE_TOO_LARGE,
        s422="invalid_request: the body fails validation (an "
        "embedding_input of another length than the index's vectors); "
        'invalid_image: "image" is not base64 or not an image; '
        'unsupported: image_url, or modality "text"',
    ),
)
async def knn_service(
    knn: Annotated[KnnSearch, Depends(knn_search)], state: Service, response: Response
) -> list[KnnResult]:
    out = await run_search(state, knn.plan)
    name = out.handle.name
    # degraded (Redis down): the same list, ANN order, similarity = the two-tower cosine, no metadata fields
    # beyond url / caption ""; said by a header only, since clip_back clients read a bare list
    response.headers.update(degraded_headers(out))
    if knn.ignored:
        response.headers[IGNORED_HEADER] = ",".join(knn.ignored)
    return [
        KnnResult.model_validate({**_flat(state.settings, name, h.id, h.metadata), "id": h.id, "similarity": h.score})
        for h in out.hits
    ] + [KnnResult(id=h.id, similarity=h.score) for h in out.tail]


def _ignored(req: KnnRequest) -> list[str]:
    """The options this request asks for that are not applied here (the module's docstring says why)."""
    asked = {
        "use_safety_model": req.use_safety_model,
        "use_violence_detector": req.use_violence_detector,
        "aesthetic_score": req.aesthetic_score not in (None, ""),
        "use_mclip": req.use_mclip,
    }
    return [name for name, on in asked.items() if on]


@read_routes.get("/indices-list", responses=error_responses(*ANY_ROUTE))
async def indices_list(state: Service, scope: KeyScope) -> list[str]:
    reg = state.registry
    return sorted(scope.visible(reg.handles)) if reg else []


@dataclass
class MetadataLookup:
    """A /metadata request: its ids, and the served version they are looked up in."""

    ids: list[str]
    handle: IndexHandle


async def metadata_lookup(request: Request, state: Service, scope: KeyScope) -> MetadataLookup:
    """The body parsed (422), then the service ready, then the version (404 index_not_found, within the key's
    scope)."""
    req = await _parse(request, MetadataRequest)
    handle = ready(state).loaded_registry.get(req.indice_name, scope=scope)
    return MetadataLookup([str(i) for i in req.ids], handle)


@read_routes.post(
    "/metadata",
    response_model=list[MetadataEntry],
    openapi_extra=_body_doc(MetadataRequest),
    responses=error_responses(404, 503, *POST_ROUTE, s404="index_not_found: no such index here"),
)
async def metadata(lookup: Annotated[MetadataLookup, Depends(metadata_lookup)], state: Service) -> list[MetadataEntry]:
    handle, ids = lookup.handle, lookup.ids
    known = [i for i in ids if i in handle.ids]  # only indexed ids reach Redis
    metas = dict(zip(known, await read_metadata(state, handle, known, "metadata"))) if known else {}
    return [
        MetadataEntry(
            id=i, metadata=_flat(state.settings, handle.name, i, metas[i]) if metas.get(i) is not None else None
        )
        for i in ids
    ]
