"""Query images (POST /v1/search "image", /knn-service "image"): base64 text -> bytes -> the indexer's pixels.

Every refusal is the client's: a 4xx with a stable code, never a 5xx, and bounded work before it:
  too_large     413  more than Settings.query_image_max_bytes decoded bytes (checked on the base64 text's
                     length before decoding it), or more than query_image_max_pixels in the header
  invalid_image 422  not base64, or bytes Pillow cannot read as an image (unknown format, truncated, corrupt)

Pixels are made exactly as the indexer makes them (crossprobe.core.image_formats.open_picture, then
crossprobe.core.inputs.load_image, which indexer/jobs/decode.py calls on the file it opened): the same formats
(JPEG, PNG, WebP, GIF, BMP, TIFF, HEIC / HEIF, AVIF, camera RAW by its embedded preview), JPEG draft mode,
EXIF orientation, RGB, 224 x 224. So an indexed file sent as a query gives the very g_I the index stores for it.
"""

from __future__ import annotations

import base64
import binascii
import io
import re

import numpy as np
from PIL import Image

from crossprobe.core import image_formats, inputs
from crossprobe.service.exceptions import CrossprobeError, InvalidImage, InvalidRequest, TooLarge

# a data URL's prefix ("data:image/jpeg;base64,"), which browsers' FileReader.readAsDataURL produces
_DATA_URL = re.compile(r"^data:[\w.+-]+/[\w.+-]+;base64,", re.IGNORECASE)
_WHITESPACE = re.compile(r"\s+")


UPLOAD_FIELDS = ("image", "file")  # the multipart form's file field (the web page and curl -F use "image")


async def upload_bytes(request, max_bytes: int) -> bytes:
    """POST /v1/search/image's image: the body itself (curl --data-binary @photo.jpg), or a multipart/form-data
    upload (curl -F image=@photo.jpg; an HTML form) whose file field is "image" (or "file"). Starlette's parser
    (python-multipart) spools a large part to disk; the body size is already bounded by BodyGuard."""
    ctype = request.headers.get("content-type", "").lower()
    if not ctype.startswith("multipart/form-data"):
        data = await request.body()
    else:
        try:
            form = await request.form(max_files=1, max_fields=16)
        except Exception as e:  # noqa: BLE001 - a malformed multipart body is the client's: 422, never a 500
            raise InvalidRequest(
                f"invalid request: the multipart body cannot be read ({getattr(e, 'detail', e)})"
            ) from None
        try:
            part = next((form[f] for f in UPLOAD_FIELDS if f in form and hasattr(form[f], "read")), None)
            if part is None:
                raise InvalidRequest(
                    'invalid request: the multipart form has no file field named "image" (curl -F image=@photo.jpg)'
                )
            data = await part.read(max_bytes + 1)
        finally:
            await form.close()
    if len(data) > max_bytes:
        raise TooLarge(f"the image is over {max_bytes} bytes (CROSSPROBE_QUERY_IMAGE_MAX_BYTES)")
    if not data:
        raise InvalidImage("the image is empty: send the image file's bytes")
    return data


def b64_bytes(text: str, max_bytes: int, field: str = "image") -> bytes:
    """base64 (standard or URL-safe alphabet, padding optional, a data: URL prefix allowed) -> bytes."""
    text = _WHITESPACE.sub("", _DATA_URL.sub("", text, count=1))
    if len(text) * 3 // 4 > max_bytes + 2:  # before decoding: the length alone says the size
        raise TooLarge(f"{field}: the image is over {max_bytes} bytes (CROSSPROBE_QUERY_IMAGE_MAX_BYTES)")
    if not text:
        raise InvalidImage(f"{field}: empty")
    try:
        alt = b"-_" if ("-" in text or "_" in text) else None
        data = base64.b64decode(text + "=" * (-len(text) % 4), altchars=alt, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidImage(f"{field}: not base64 ({e})") from None
    if len(data) > max_bytes:
        raise TooLarge(f"{field}: the image is {len(data)} bytes, over {max_bytes} (CROSSPROBE_QUERY_IMAGE_MAX_BYTES)")
    return data


def pixels(
    data: bytes,
    max_pixels: int,
    field: str = "image",
    preprocess=inputs.load_image,
    size: int = inputs.IMAGE_SIZE,
    reduce: bool = True,
) -> np.ndarray:
    """Image file bytes -> (3, S, S) float32, as the indexer decodes its files (every format of
    crossprobe.core.image_formats: HEIC, AVIF and camera RAW too). preprocess, size, reduce: the model's
    (Backend.preprocessor, Backend.image_size, Backend.reduced_decoding; default crossprobe's own)."""
    if not data:
        raise InvalidImage(f"{field}: empty")
    try:
        # our pixel limit is checked on what will be decoded (after JPEG draft / a HEIC's thumbnail), before any
        # decode (no warnings filter: it is process-wide state, not thread-safe); Pillow's own
        # DecompressionBombError stays as a second guard for the formats image_formats opens through Image.open
        with image_formats.open_picture(io.BytesIO(data), None, size, reduce, max_pixels) as pic:  # header only
            if not reduce:
                pic.fit(max_pixels)
            why = pic.over(max_pixels)
            if why:
                raise TooLarge(f"{field}: {why}, over {max_pixels} (CROSSPROBE_QUERY_IMAGE_MAX_PIXELS)")
            return preprocess(pic.image)  # first frame of a GIF / page of a TIFF
    except CrossprobeError:
        raise
    except image_formats.Oversized as e:
        raise TooLarge(f"{field}: {e}, over {max_pixels} (CROSSPROBE_QUERY_IMAGE_MAX_PIXELS)") from None
    except Image.DecompressionBombError as e:
        raise TooLarge(f"{field}: {e}") from None
    except Exception as e:  # noqa: BLE001 - whatever a decoder raises on hostile bytes is the input's fault
        raise InvalidImage(f"{field}: not a readable image ({type(e).__name__}: {str(e)[:200]})") from None
