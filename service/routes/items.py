"""GET /v1/items/{id} (an indexed item's metadata) and GET /v1/items/{id}/image (its file, resized)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from crossprobe.service import security
from crossprobe.service.deps import SEARCH, KeyScope, Service, read_metadata, ready
from crossprobe.service.exceptions import ImageUnavailable, ItemNotFound
from crossprobe.service.images import resized_jpeg
from crossprobe.service.pipeline import public_metadata
from crossprobe.service.registry import IndexHandle
from crossprobe.service.schemas import ANY_ROUTE, IndexRef, ItemResponse, error_responses
from crossprobe.service.scope import Scope
from crossprobe.service.state import ServiceState

log = logging.getLogger("crossprobe.service")

router = APIRouter(**SEARCH)

IndexName = Annotated[str | None, Query(max_length=64)]
Size = Annotated[int | None, Query(ge=16, le=4096, description="max side in pixels")]


@dataclass
class Item:
    """An indexed item a route is asked about: its id, the served version that holds it, the image's size."""

    id: str
    handle: IndexHandle
    size: int | None = None


def _item(state: ServiceState, scope: Scope, item_id: str, index: str | None, size: int | None = None) -> Item:
    """The parameters validated, then the service ready (503), then the version (404, within the key's scope)
    and the id in it (404)."""
    handle = ready(state).loaded_registry.get(index, scope=scope)
    if item_id not in handle.ids:
        raise ItemNotFound(f"no item {item_id!r} in {handle.name}/{handle.version}")
    return Item(item_id, handle, size)


async def item_ref(item_id: str, state: Service, scope: KeyScope, index: IndexName = None) -> Item:
    return _item(state, scope, item_id, index)


async def item_image_ref(
    item_id: str, state: Service, scope: KeyScope, index: IndexName = None, size: Size = None
) -> Item:
    return _item(state, scope, item_id, index, size)


# declared before /v1/items/{item_id:path}, which would otherwise swallow ".../image"
# response_class=Response: the 200 is image/jpeg only (FastAPI's default class would also declare JSON)
@router.get(
    "/v1/items/{item_id:path}/image",
    response_class=Response,
    responses={
        200: {
            "description": "the image, resized",
            "content": {"image/jpeg": {"schema": {"type": "string", "format": "binary"}}},
        },
        **error_responses(
            404,
            422,
            503,
            *ANY_ROUTE,
            s404="index_not_found, item_not_found; image_unavailable: no "
            "file is recorded for the item, or it is gone or unreadable",
        ),
    },
)
async def item_image(request: Request, item: Annotated[Item, Depends(item_image_ref)], state: Service) -> Response:
    """The indexed file of an indexed item, resized to fit `size` (default CROSSPROBE_IMAGE_MAX_SIDE)."""
    handle, item_id = item.handle, item.id
    meta = (await read_metadata(state, handle, [item_id], "item"))[0]
    if not meta or not meta.get("uri"):
        raise ImageUnavailable(f"{item_id!r} has no file recorded in {handle.name}/{handle.version}")
    if not handle.file_allowed(meta["uri"]):  # a path written into Redis, or a link made since: never opened
        log.warning(
            "%s/%s: %r's recorded file is outside the index's image folders", handle.name, handle.version, item_id
        )
        raise ImageUnavailable(f"{item_id!r}: its recorded file lies outside {handle.name}'s image folders")
    settings = state.settings
    side = min(item.size or settings.image_max_side, settings.image_max_side)
    try:
        with state.decoders.admit():
            data = await asyncio.to_thread(
                resized_jpeg, meta["uri"], side, settings.image_quality, settings.image_max_pixels
            )
    except ImageUnavailable as e:
        raise ImageUnavailable(f"{item_id!r}: {e}") from None
    # behind search keys: private, or a shared cache (CDN, proxy) would hand it to callers without a key
    cache = "private" if security.access(request).search_keys_on else "public"
    # CORP: no other site's page may embed the photos (with no keys, a page elsewhere could otherwise show them);
    # where CROSSPROBE_CORS_ORIGINS lets pages elsewhere in (clip-retrieval's front-end), they may
    corp = "cross-origin" if settings.cors_list else "same-origin"
    headers = {"Cache-Control": f"{cache}, max-age=300", "Cross-Origin-Resource-Policy": corp}
    return Response(data, media_type="image/jpeg", headers=headers)


@router.get(
    "/v1/items/{item_id:path}", response_model=ItemResponse, responses=error_responses(404, 422, 503, *ANY_ROUTE)
)
async def item(item: Annotated[Item, Depends(item_ref)], state: Service) -> ItemResponse:
    """Metadata of one indexed item (as the indexer stored it)."""
    meta = (await read_metadata(state, item.handle, [item.id], "item"))[0]
    return ItemResponse(
        id=item.id,
        index=IndexRef(name=item.handle.name, version=item.handle.version),
        metadata=public_metadata(meta, state.settings.expose_uri),
    )
