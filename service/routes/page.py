"""GET /: the web page (service/static/: plain HTML, JS and CSS, no build step)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

router = APIRouter()

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
# the page loads only its own files and calls only this origin: no inline script or style, nothing from a CDN
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


@router.get("/", include_in_schema=False)
async def page() -> Response:
    """The search page, photos first: query box, a status line, the result grid; filters and "Details" (reranker,
    match mode, timings, scores, the "explain" heat maps) open on demand (static/app.js calls /v1/indexes,
    /v1/search, /v1/search/image, /v1/explain, /v1/items/{id}/image)."""
    return FileResponse(
        STATIC_DIR / "index.html",
        media_type="text/html; charset=utf-8",
        headers={"Content-Security-Policy": PAGE_CSP, "Cache-Control": "no-cache"},
    )
