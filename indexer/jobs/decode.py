"""Decode stage: file -> (3, 224, 224) float32 pixels + metadata, or a Skip with a reason.

Bad input never stops a job. Every format of crossprobe.models.image_formats is read (HEIC / HEIF, AVIF,
camera RAW through its embedded preview, besides Pillow's own); the header is read first (lazily) and reduced
decoding asked for (JPEG draft scale, a HEIC's thumbnail), so the pixel limit (max_pixels) is checked on what
will really be decoded, before any pixel is: a 200 MP JPEG decodes at 1/8 scale and is indexed, a PNG or an AVIF
over the limit is an "oversized" skip (they decode in full). EXIF orientation, RGB and the resize are
crossprobe.models.inputs.load_image's. Skip reasons: empty, missing, unreadable (permission denied),
symlink_loop, video (by extension or by its MP4 / QuickTime header), not_image, oversized, truncated, corrupt.
Pillow releases the GIL while decoding and resizing, so a thread pool overlaps
this stage with the encoder. The file facts recorded for filters (indexer/storage/filter_columns.py) come from the same
open: width, height, format, and from EXIF where present the date taken (DateTimeOriginal, else DateTime;
ISO 8601, the camera's local time as written, no zone) and the camera (Make + Model). The file's size and
mtime (bytes, mtime_ns) as opened are recorded too: `crossprobe index watch` (watch.py) finds changed files by them.
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from PIL import Image, UnidentifiedImageError

from crossprobe.indexer.jobs.sources import Item, Skip
from crossprobe.models import image_formats, inputs

# ISO base media brands of videos (MP4, QuickTime, 3GP): a video renamed .jpg, or in a manifest, is a "video" skip
VIDEO_BRANDS = {b"isom", b"iso2", b"iso4", b"iso5", b"iso6", b"mp41", b"mp42", b"qt  ", b"M4V ", b"M4VP",
                b"3gp4", b"3gp5", b"3gp6", b"3g2a", b"avc1", b"dash", b"MSNV", b"XAVC"}


@dataclass
class Decoded:
    rows: list[int]  # positions (in the build's item list) that decoded
    pixels: np.ndarray  # (len(rows), 3, 224, 224) float32
    meta: list[dict]  # per decoded row: width, height, format of the original file (+ taken, camera: exif_facts)
    skips: list[tuple[int, Skip]]  # (position, why) for the rest


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


def decode_one(item: Item, max_pixels: int) -> tuple[np.ndarray, dict] | Skip:
    ext = os.path.splitext(item.uri)[1].lower()
    if ext in image_formats.VIDEO_EXTS:
        return Skip(item.id, item.uri, "video", f"a {ext} file is a video: only still images are indexed")
    try:
        with open(item.uri, "rb") as f:
            st = os.fstat(f.fileno())  # the file as opened: `index watch` compares it with the folder's later stat
            head = f.read(16)
            if not head:
                return Skip(item.id, item.uri, "empty", "zero-byte file")
            f.seek(0)
            try:
                pic = image_formats.open_picture(f, item.uri, inputs.IMAGE_SIZE)  # lazy: only the header so far
            except (image_formats.NotAnImage, UnidentifiedImageError) as e:
                if head[4:8] == b"ftyp" and head[8:12] in VIDEO_BRANDS:
                    return Skip(item.id, item.uri, "video", f"an MP4 / QuickTime video ({head[8:12].decode()})")
                if image_formats.image_magic(head) and _broken(e) == "truncated":  # an image's header, its data cut
                    return Skip(item.id, item.uri, "truncated", f"{type(e).__name__}: {e}"[:200])
                return Skip(item.id, item.uri, "not_image", str(e)[:200])
            with pic:
                w, h = pic.width, pic.height
                dw, dh = pic.image.size  # after draft: what decoding will really produce
                if dw * dh > max_pixels:
                    return Skip(item.id, item.uri, "oversized",
                                f"{w}x{h} {pic.format} decodes at {dw}x{dh} = {dw * dh} pixels > max_pixels "
                                f"{max_pixels} (CROSSPROBE_INDEX_MAX_PIXELS)")
                facts = exif_facts(pic.exif())  # header data: read before load_image decodes the pixels
                x = inputs.load_image(pic.image)  # first frame of a GIF / first page of a TIFF
        return x, {"width": w, "height": h, "format": pic.format, **facts, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    except (FileNotFoundError, IsADirectoryError) as e:
        return Skip(item.id, item.uri, "missing", str(e)[:200])
    except PermissionError as e:
        return Skip(item.id, item.uri, "unreadable", str(e)[:200])
    except OSError as e:
        if e.errno == errno.ELOOP:  # a symbolic link that leads back to itself
            return Skip(item.id, item.uri, "symlink_loop", str(e)[:200])
        return Skip(item.id, item.uri, _broken(e), f"{type(e).__name__}: {e}"[:200])
    except Image.DecompressionBombError as e:
        return Skip(item.id, item.uri, "oversized", str(e)[:200])
    except Exception as e:  # noqa: BLE001 - any decoder failure is a skip, never a stopped job
        return Skip(item.id, item.uri, _broken(e), f"{type(e).__name__}: {e}"[:200])


def _broken(e: Exception) -> str:
    """truncated (its data ends early: a file still being written or copied) or corrupt, from a decoder's error.
    LibRaw's I/O error on a file read into memory means its data ended early too."""
    msg = str(e).lower()
    cut = any(w in msg for w in ("truncated", "end of file", "premature end")) or type(e).__name__ == "LibRawIOError"
    return "truncated" if cut else "corrupt"


def decode_batch(items: list[Item], start: int, max_pixels: int) -> Decoded:
    """Decode items (which sit at positions start.. in the build's list)."""
    rows, pix, meta, skips = [], [], [], []
    for i, it in enumerate(items):
        r = decode_one(it, max_pixels)
        if isinstance(r, Skip):
            skips.append((start + i, r))
        else:
            rows.append(start + i)
            pix.append(r[0])
            meta.append(r[1])
    pixels = np.stack(pix) if pix else np.zeros((0, 3, inputs.IMAGE_SIZE, inputs.IMAGE_SIZE), np.float32)
    return Decoded(rows, pixels, meta, skips)
