"""Decode stage of a job: a batch of items -> the model's pixels + each file's facts, and a Skip for the rest.

Reading one file is crossprobe.core.inference.decode's (below both the jobs and the service, so that the
explainer decodes an indexed file exactly as the indexer did); this stage turns what cannot be read into the
job's skips (counted in report.json, never a stopped job). Pillow releases the GIL while decoding and
resizing, so a thread pool overlaps this stage with the encoder.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from crossprobe.core import inputs
from crossprobe.core.inference.decode import Preprocess, Unreadable, decode_file
from crossprobe.indexer.jobs.sources import Item, Skip


@dataclass
class Decoded:
    rows: list[int]  # positions (in the build's item list) that decoded
    pixels: np.ndarray  # (len(rows), 3, S, S) float32
    meta: list[dict]  # per decoded row: width, height, format of the original file (+ taken, camera: exif_facts)
    skips: list[tuple[int, Skip]]  # (position, why) for the rest


def decode_one(
    item: Item,
    max_pixels: int,
    preprocess: Preprocess = inputs.load_image,
    size: int = inputs.IMAGE_SIZE,
    reduce: bool = True,
) -> tuple[np.ndarray, dict] | Skip:
    r = decode_file(item.uri, max_pixels, preprocess, size, reduce)
    return Skip(item.id, item.uri, r.reason, r.error) if isinstance(r, Unreadable) else r


def decode_batch(
    items: list[Item],
    start: int,
    max_pixels: int,
    preprocess: Preprocess = inputs.load_image,
    size: int = inputs.IMAGE_SIZE,
    reduce: bool = True,
) -> Decoded:
    """Decode items (which sit at positions start.. in the build's list); reduce: IndexerSettings.reduce_for."""
    rows, pix, meta, skips = [], [], [], []
    for i, it in enumerate(items):
        r = decode_one(it, max_pixels, preprocess, size, reduce)
        if isinstance(r, Skip):
            skips.append((start + i, r))
        else:
            rows.append(start + i)
            pix.append(r[0])
            meta.append(r[1])
    pixels = np.stack(pix) if pix else np.zeros((0, 3, size, size), np.float32)
    return Decoded(rows, pixels, meta, skips)
