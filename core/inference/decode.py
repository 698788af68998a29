"""Decoding a photo file for a model: file -> the model's pixels + the file's facts, or why it cannot be read.

Below both the batch jobs (indexer/jobs/decode.py turns an Unreadable into a job's skip) and the service (the
explainer decodes an indexed file again exactly as the indexer did), so both read a file one way. Bad input
never stops a job.

Every format of crossprobe.core.image_formats is read (HEIC / HEIF, AVIF, camera RAW through its embedded
preview, besides Pillow's own); the header is read first (lazily) and, for a model whose reference decodes that
way (crossprobe's own), reduced decoding asked for (JPEG draft scale, a HEIC's thumbnail); a model whose reference
decodes the full picture (the exported families) gets the full picture, reduced only as far as the pixel limit
needs. The pixel limit (max_pixels) is checked on what will really be decoded, before any pixel is: a 200 MP JPEG
decodes at a reduced scale and is indexed, a PNG or an AVIF over the limit is an "oversized" skip (they decode in
full). EXIF orientation, RGB, the resize and the scaling are the model's
(Backend.preprocess; crossprobe's own: crossprobe.core.inputs.load_image).

Reasons a file gives no pixels: empty, missing, unreadable (permission denied), symlink_loop, video (by extension
or by its MP4 / QuickTime header), not_image, oversized, truncated, corrupt.

The file facts recorded for filters (storage/filter_columns.py) come from the same open: width, height,
format, and from EXIF where present the date taken (DateTimeOriginal, else DateTime; ISO 8601, the camera's
local time as written, no zone) and the camera (Make + Model). The file's size and mtime (bytes, mtime_ns) as
opened are recorded too: `crossprobe index watch` finds changed files by them.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from datetime import datetime
from typing import Callable

import numpy as np
from PIL import Image, UnidentifiedImageError

from crossprobe.core import image_formats, inputs

# ISO base media brands of videos (MP4, QuickTime, 3GP): a video renamed .jpg, or in a manifest, is a "video" skip
# the most pixels a photo may decode to before it is skipped as "oversized" (CROSSPROBE_INDEX_MAX_PIXELS; the
# indexer's settings say why that many)
DEFAULT_MAX_PIXELS = 100_000_000
VIDEO_BRANDS = {
    b"isom",
    b"iso2",
    b"iso4",
    b"iso5",
    b"iso6",
    b"mp41",
    b"mp42",
    b"qt  ",
    b"M4V ",
    b"M4VP",
    b"3gp4",
    b"3gp5",
    b"3gp6",
    b"3g2a",
    b"avc1",
    b"dash",
    b"MSNV",
    b"XAVC",
}


@dataclass(frozen=True)
class Unreadable:
    """Why a file gives no pixels: reason is one of the skip reasons above, error the decoder's words."""

    reason: str
    error: str = ""


Preprocess = Callable[[Image.Image], np.ndarray]  # a decoded image -> (3, S, S) float32 (Backend.preprocess)


EXIF_IFD, DATETIME_ORIGINAL, DATETIME, MAKE, MODEL = 0x8769, 0x9003, 0x0132, 0x010F, 0x0110


def exif_facts(img: Image.Image | Image.Exif) -> dict:
    """{"taken": "2019-05-01T14:03:22", "camera": "Canon EOS 80D"}, each only when the file has it and it reads
    cleanly: a garbled tag (cameras write "0000:00:00 00:00:00" when the clock was never set) is left out,
    never an error; the image is indexed either way."""
    out: dict = {}
    try:
        exif = img if isinstance(img, Image.Exif) else img.getexif()
    except Exception:  # noqa: BLE001 - a broken EXIF block is no reason to lose the picture
        return out
    if not exif:
        return out
    try:
        sub = exif.get_ifd(EXIF_IFD)
    except Exception:  # noqa: BLE001
        sub = {}
    for raw in (sub.get(DATETIME_ORIGINAL), exif.get(DATETIME)):
        if isinstance(raw, str):
            try:
                out["taken"] = datetime.strptime(raw.strip("\x00 ")[:19], "%Y:%m:%d %H:%M:%S").isoformat()
                break
            except ValueError:
                continue
    make, model = (str(exif.get(t) or "").strip("\x00 ") for t in (MAKE, MODEL))
    camera = model if not make or model.lower().startswith(make.lower().split()[0]) else f"{make} {model}"
    if camera.strip():
        out["camera"] = camera.strip()[:200]
    return out


def decode_file(
    path: str,
    max_pixels: int,
    preprocess: Preprocess = inputs.load_image,
    size: int = inputs.IMAGE_SIZE,
    reduce: bool = True,
) -> tuple[np.ndarray, dict] | Unreadable:
    """A file -> (its pixels, its facts: width, height, format, [taken, camera,] bytes, mtime_ns), or why not.
    size: the side the model takes, for reduced decoding (draft) and the pixel limit after it. reduce=False
    (Backend.reduced_decoding, for a model whose reference decodes the full picture): the full picture, reduced
    only as far as max_pixels needs."""
    ext = os.path.splitext(path)[1].lower()
    if ext in image_formats.VIDEO_EXTS:
        return Unreadable("video", f"a {ext} file is a video: only still images are indexed")
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())  # the file as opened: `index watch` compares it with the folder's later stat
            head = f.read(16)
            if not head:
                return Unreadable("empty", "zero-byte file")
            f.seek(0)
            try:
                pic = image_formats.open_picture(f, path, size, reduce, max_pixels)  # lazy: only the header so far
            except (image_formats.NotAnImage, UnidentifiedImageError) as e:
                if head[4:8] == b"ftyp" and head[8:12] in VIDEO_BRANDS:
                    return Unreadable("video", f"an MP4 / QuickTime video ({head[8:12].decode()})")
                if image_formats.image_magic(head) and _broken(e) == "truncated":  # an image's header, its data cut
                    return Unreadable("truncated", f"{type(e).__name__}: {e}"[:200])
                return Unreadable("not_image", str(e)[:200])
            with pic:
                w, h = pic.width, pic.height
                if not reduce:
                    pic.fit(max_pixels)
                why = pic.over(max_pixels)  # after draft: what decoding will really hold
                if why:
                    return Unreadable("oversized", f"{why} > max_pixels {max_pixels} (CROSSPROBE_INDEX_MAX_PIXELS)")
                facts = exif_facts(pic.exif())  # header data: read before load_image decodes the pixels
                x = preprocess(pic.image)  # first frame of a GIF / first page of a TIFF
        return x, {
            "width": w,
            "height": h,
            "format": pic.format,
            **facts,
            "bytes": st.st_size,
            "mtime_ns": st.st_mtime_ns,
        }
    except (FileNotFoundError, IsADirectoryError) as e:
        return Unreadable("missing", str(e)[:200])
    except PermissionError as e:
        return Unreadable("unreadable", str(e)[:200])
    except OSError as e:
        if e.errno == errno.ELOOP:  # a symbolic link that leads back to itself
            return Unreadable("symlink_loop", str(e)[:200])
        return Unreadable(_broken(e), f"{type(e).__name__}: {e}"[:200])
    except image_formats.Oversized as e:
        return Unreadable("oversized", f"{e} > max_pixels {max_pixels} (CROSSPROBE_INDEX_MAX_PIXELS)"[:300])
    except Image.DecompressionBombError as e:
        return Unreadable("oversized", str(e)[:200])
    except Exception as e:  # noqa: BLE001 - any decoder failure is a skip, never a stopped job
        return Unreadable(_broken(e), f"{type(e).__name__}: {e}"[:200])


def _broken(e: Exception) -> str:
    """truncated (its data ends early: a file still being written or copied) or corrupt, from a decoder's error.
    LibRaw's I/O error on a file read into memory means its data ended early too."""
    msg = str(e).lower()
    cut = any(w in msg for w in ("truncated", "end of file", "premature end")) or type(e).__name__ == "LibRawIOError"
    return "truncated" if cut else "corrupt"
