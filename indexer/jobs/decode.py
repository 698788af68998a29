"""Decode stage: file -> (3, 224, 224) float32 pixels + metadata, or a Skip with a reason.

Bad input never stops a job. The header is read first (Image.open is lazy) so an
oversized image is refused before any pixel is decoded; JPEG draft mode, EXIF
orientation, RGB and the resize are crossprobe.models.backbones.load_image's.
Pillow releases the GIL while decoding and resizing, so a thread pool overlaps
this stage with the encoder. The file facts recorded for filters (indexer/storage/filter_columns.py) come from the same
open: width, height, format, and from EXIF where present the date taken (DateTimeOriginal, else DateTime;
ISO 8601, the camera's local time as written, no zone) and the camera (Make + Model).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
from PIL import Image, UnidentifiedImageError

from crossprobe.indexer.jobs.sources import Item, Skip
from crossprobe.models import inputs


@dataclass
class Decoded:
    rows: list[int]  # positions (in the build's item list) that decoded
    pixels: np.ndarray  # (len(rows), 3, 224, 224) float32
    meta: list[dict]  # per decoded row: width, height, format of the original file (+ taken, camera: exif_facts)
    skips: list[tuple[int, Skip]]  # (position, why) for the rest


EXIF_IFD, DATETIME_ORIGINAL, DATETIME, MAKE, MODEL = 0x8769, 0x9003, 0x0132, 0x010F, 0x0110


def exif_facts(img: Image.Image) -> dict:
    """{"taken": "2019-05-01T14:03:22", "camera": "Canon EOS 80D"}, each only when the file has it and it reads
    cleanly: a garbled tag (cameras write "0000:00:00 00:00:00" when the clock was never set) is left out,
    never an error; the image is indexed either way."""
    out: dict = {}
    try:
        exif = img.getexif()
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
    try:
        with open(item.uri, "rb") as f:
            if not f.read(1):
                return Skip(item.id, item.uri, "empty", "zero-byte file")
            f.seek(0)
            with Image.open(f) as img:  # lazy: only the header so far
                w, h = img.size
                if w * h > max_pixels:
                    return Skip(item.id, item.uri, "oversized", f"{w}x{h} = {w * h} pixels > max_pixels {max_pixels}")
                fmt = img.format
                facts = exif_facts(img)  # header data: read before load_image decodes the pixels
                x = inputs.load_image(img)  # first frame of a GIF / first page of a TIFF
        return x, {"width": w, "height": h, "format": fmt, **facts}
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        return Skip(item.id, item.uri, "missing", str(e)[:200])
    except Image.DecompressionBombError as e:
        return Skip(item.id, item.uri, "oversized", str(e)[:200])
    except UnidentifiedImageError as e:
        return Skip(item.id, item.uri, "not_image", str(e)[:200])
    except Exception as e:  # noqa: BLE001 - any decoder failure is a skip, never a stopped job
        reason = "truncated" if "truncated" in str(e).lower() else "corrupt"
        return Skip(item.id, item.uri, reason, f"{type(e).__name__}: {e}"[:200])


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
