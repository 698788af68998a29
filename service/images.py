"""GET /v1/items/{id}/image: the indexed file of an indexed item, as a resized JPEG.

Safety: the file read is the `uri` the indexer recorded for an id of the served
version; the request's id is looked up, never joined onto a path, so no request
can name a file that was not indexed. The header is checked before decoding
(a file replaced by a decompression bomb since indexing is refused), and JPEG
draft mode decodes large photos at reduced scale.
"""
from __future__ import annotations

import io

from PIL import Image, ImageOps, UnidentifiedImageError

from crossprobe.service.exceptions import ImageUnavailable


def resized_jpeg(path: str, max_side: int, quality: int, max_pixels: int) -> bytes:
    try:
        with Image.open(path) as img:
            w, h = img.size
            if w * h > max_pixels:
                raise ImageUnavailable(f"{w}x{h} exceeds the {max_pixels}-pixel limit")
            if img.format == "JPEG":
                img.draft("RGB", (max_side, max_side))
            out = ImageOps.exif_transpose(img).convert("RGB")  # first frame of a GIF / page of a TIFF
        out.thumbnail((max_side, max_side), Image.BILINEAR)
        buf = io.BytesIO()
        out.save(buf, "JPEG", quality=quality, optimize=False)
        return buf.getvalue()
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise ImageUnavailable("the indexed file is no longer there") from None
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise ImageUnavailable(f"the indexed file cannot be decoded any more ({type(e).__name__})") from None
