"""The image URLs this service hands out, made in one place.

    item_image_url(settings, index, id) -> <CROSSPROBE_PUBLIC_URL>/v1/items/<id>/image?index=<index>
                                           (root-relative /v1/items/... when no public URL is configured)

Every answer that carries an image URL builds it here (today /knn-service and /metadata, the clip-retrieval
routes; the /v1 answers carry ids and the web page builds its own same-origin URLs from them). The base is the
configured public URL only, never anything of the request: Host, X-Forwarded-Host, X-Forwarded-Proto and
Forwarded are chosen by whoever sends the request, and these URLs end up in other people's pages and in shared
caches (a poisoned cache or an injected link otherwise).

A page on another origin, clip-retrieval's front-end, needs both settings: CROSSPROBE_PUBLIC_URL (it resolves a
root-relative URL against its own origin, gets 404s and hides every image) and CROSSPROBE_CORS_ORIGINS (its
browser lets it read no answer otherwise). clip_front_hint says what is missing, at start-up.
"""

from __future__ import annotations

import logging
from urllib.parse import quote

from crossprobe.service.settings import Settings

PUBLIC_URL_ENV = "CROSSPROBE_PUBLIC_URL"  # the name the docs and hints give (CROSSPROBE_PUBLIC_BASE_URL: an alias)


def item_image_url(settings: Settings, index: str, item_id: str) -> str:
    base = (settings.public_base_url or "").rstrip("/")
    return f"{base}/v1/items/{quote(item_id, safe='/')}/image?index={quote(index, safe='')}"


def clip_front_hint(settings: Settings) -> tuple[int, str] | None:
    """(logging level, message) for the start-up log: what a page on another origin (clip-retrieval's front-end) still
    needs, given the CORS origins and the public URL; None when neither is set (a same-origin deployment)."""
    cors, public = settings.cors_list, settings.public_base_url
    if cors and not public:
        return (
            logging.WARNING,
            f"CROSSPROBE_CORS_ORIGINS is set ({', '.join(cors)}) but {PUBLIC_URL_ENV} is "
            "not: image URLs in /knn-service and /metadata answers are root-relative (/v1/items/...), and a "
            "page on another origin, such as clip-retrieval's front-end, resolves them against its own origin "
            f"and shows no images. Set {PUBLIC_URL_ENV} to the address browsers reach this service at "
            "(e.g. https://search.example.org)",
        )
    if public and not cors:
        return (
            logging.INFO,
            f"image URLs are absolute, under {public}; for clip-retrieval's front-end (a page "
            "on another origin) also set CROSSPROBE_CORS_ORIGINS to that page's origin, or its browser reads "
            "no answer",
        )
    if public and cors:
        return (
            logging.INFO,
            f"clip-retrieval's front-end: image URLs under {public}; pages of {', '.join(cors)} may call the API",
        )
    return None
