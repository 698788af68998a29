"""Decode stage: file -> (3, 224, 224) float32 pixels + metadata, or a Skip with a reason.

Bad input never stops a job. The header is read first (Image.open is lazy) so an
oversized image is refused before any pixel is decoded; JPEG draft mode, EXIF
orientation, RGB and the resize are crossprobe.models.backbones.load_image's.
Pillow releases the GIL while decoding and resizing, so a thread pool overlaps
this stage with the encoder.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

from crossprobe.indexer.sources import Item, Skip
from crossprobe.models import backbones as bb


@dataclass
class Decoded:
    rows: list[int]  # positions (in the build's item list) that decoded
    pixels: np.ndarray  # (len(rows), 3, 224, 224) float32
    meta: list[dict]  # per decoded row: width, height, format of the original file
    skips: list[tuple[int, Skip]]  # (position, why) for the rest


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
                x = bb.load_image(img)  # first frame of a GIF / first page of a TIFF
        return x, {"width": w, "height": h, "format": fmt}
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
    pixels = np.stack(pix) if pix else np.zeros((0, 3, bb.IMAGE_SIZE, bb.IMAGE_SIZE), np.float32)
    return Decoded(rows, pixels, meta, skips)
