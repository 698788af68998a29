"""GET /v1/items/{id}/image: the indexed file of an indexed item, as a resized JPEG.

Safety: the file read is the `uri` the indexer recorded for an id of the served
version; the request's id is looked up, never joined onto a path, so no request
can name a file that was not indexed. Every format the indexer reads (core/image_formats.py). The size
that decoding will produce is checked before decoding (a file replaced by a decompression bomb since indexing
is refused), after JPEG draft mode (large photos decode at reduced scale) or a HEIC's thumbnail is chosen.
"""

from __future__ import annotations

import io

from PIL import Image, ImageOps

from crossprobe.core import image_formats
from crossprobe.service.exceptions import ImageUnavailable


def resized_jpeg(path: str, max_side: int, quality: int, max_pixels: int) -> bytes:
    try:
        with image_formats.open_path(path, max_side, max_pixels=max_pixels) as pic:  # HEIC, AVIF, RAW's preview
            why = pic.over(max_pixels)  # after JPEG draft / a HEIC's thumbnail: what decoding will hold
            if why:
                raise ImageUnavailable(f"{why}, over the {max_pixels}-pixel limit (CROSSPROBE_IMAGE_MAX_PIXELS)")
            out = ImageOps.exif_transpose(pic.image).convert("RGB")  # first frame of a GIF / page of a TIFF
        out.thumbnail((max_side, max_side), Image.Resampling.BILINEAR)
        buf = io.BytesIO()
        out.save(buf, "JPEG", quality=quality, optimize=False)
        return buf.getvalue()
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise ImageUnavailable("the indexed file is no longer there") from None
    except ImageUnavailable:
        raise
    except image_formats.Oversized as e:
        raise ImageUnavailable(f"{e}, over the {max_pixels}-pixel limit (CROSSPROBE_IMAGE_MAX_PIXELS)") from None
    except Exception as e:  # noqa: BLE001 - UnidentifiedImageError, OSError, LibRaw's errors, a bomb: a file gone bad
        raise ImageUnavailable(f"the indexed file cannot be decoded any more ({type(e).__name__})") from None
