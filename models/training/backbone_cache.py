"""A backbone's outputs over a captioned folder, computed once through the inference seam and cached: what reranker
heads train on (backbone_heads.py). The backbone runs as it serves (Backend.preprocessor, image_grid, text_tokens
of core/inference/exported.py): no second way to run a model.

    <cache>/<backbone fingerprint>-<data digest>/
        cells.npy     (N_img, P, W) float16   the trunk's patch tokens
        pooled.npy    (N_img, d) float32      its image embedding (not unit norm)
        readable.npy  (N_img,) uint8          1: the file decoded (0: counted as a skip, its captions left out)
        tokens.npy    (N_cap, T, W_t) float16 its text token states, T the longest caption's tokens
        mask.npy      (N_cap, T) uint8
        text.npy      (N_cap, d) float32      its text embedding (not unit norm)

Each array fills in chunks and resumes after a kill (data/features.py's ChunkedCache). The digest names the images
and captions, so another folder (or an edited captions.tsv) gets a cache of its own.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from crossprobe.core.inference.decode import DEFAULT_MAX_PIXELS, Unreadable, decode_file
from crossprobe.models.data.captioned import CaptionedFolder
from crossprobe.models.data.features import ChunkedCache

if TYPE_CHECKING:  # the backends with tokenize / text_tokens (backbone_heads.backbone refuses the others)
    from crossprobe.core.inference.exported import ExportedBackend


class NoTokenStates(ValueError):
    """A backbone whose graphs give no token states (an Immich folder): no heads can be trained on it."""


@dataclass
class BackboneOutputs:
    cells: np.ndarray  # (N_img, P, W) float16
    pooled: np.ndarray  # (N_img, d) float32
    readable: np.ndarray  # (N_img,) bool
    tokens: np.ndarray  # (N_cap, T, W_t) float16
    mask: np.ndarray  # (N_cap, T) uint8
    text: np.ndarray  # (N_cap, d) float32
    skipped: dict[str, int] = field(default_factory=dict)  # images that did not decode, by reason


def shapes(backend: ExportedBackend) -> tuple[int, int, int, int]:
    """(P, W, W_t, d) of the backbone, from one probe run (refusing a backbone without token states)."""
    grid = backend.image_grid(np.zeros((1, 3, backend.image_size, backend.image_size), np.float32))
    emb, tokens, _ = backend.text_tokens(["a photo"])
    if tokens is None or grid.pooled is None or grid.cells.shape[1] < 2:
        raise NoTokenStates(
            f"model {getattr(backend, 'spec', None) or backend.fingerprint} gives no patch tokens or text token states "
            f"(an Immich folder's graphs give pooled embeddings only): train heads on an export that has them "
            f"(`crossprobe models export open_clip:... | hf:...`)"
        )
    return grid.cells.shape[1], grid.cells.shape[2], tokens.shape[2], emb.shape[1]


def digest(folder: CaptionedFolder) -> str:
    h = hashlib.sha256(json.dumps([folder.images, folder.captions, folder.caption_image]).encode())
    return h.hexdigest()[:16]


def cache_outputs(
    backend: ExportedBackend,
    folder: CaptionedFolder,
    cache_root: Path,
    batch: int = 32,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> BackboneOutputs:
    """The backbone's outputs for every image and caption of `folder` (module docstring), computed where missing."""
    P, W, W_t, d = shapes(backend)
    where = Path(cache_root) / f"{backend.fingerprint}-{digest(folder)}"
    n, c = len(folder.images), len(folder.captions)
    T = max(
        1,
        max(
            (int(m.sum()) for s in range(0, c, 1024) for m in backend.tokenize(folder.captions[s : s + 1024])[1]),
            default=1,
        ),
    )
    img = [
        ChunkedCache(where / f, shape, dt)
        for f, shape, dt in (
            ("cells.npy", (n, P, W), np.float16),
            ("pooled.npy", (n, d), np.float32),
            ("readable.npy", (n,), np.uint8),
        )
    ]
    txt = [
        ChunkedCache(where / f, shape, dt)
        for f, shape, dt in (
            ("tokens.npy", (c, T, W_t), np.float16),
            ("mask.npy", (c, T), np.uint8),
            ("text.npy", (c, d), np.float32),
        )
    ]
    skipped = _images(backend, folder, img, batch, max_pixels)
    _texts(backend, folder.captions, txt, T, batch)
    cells, pooled, readable = (np.load(x.path, mmap_mode="r") for x in img)
    tokens, mask, text = (np.load(x.path, mmap_mode="r") for x in txt)
    earlier = int((readable == 0).sum()) - sum(skipped.values())
    if earlier:  # a resumed cache: these were counted (with their reasons) by an earlier run
        skipped["unreadable (an earlier run)"] = earlier
    return BackboneOutputs(cells, pooled, readable.astype(bool), tokens, mask, text, skipped)


def _images(
    backend: ExportedBackend, folder: CaptionedFolder, caches: list[ChunkedCache], batch: int, max_pixels: int
) -> dict[str, int]:
    """Fill the image caches from where they stopped; decode of the next batch overlaps the backbone."""
    cells, pooled, readable = caches
    start, n = min(x.done for x in caches), len(folder.images)
    prep, size = backend.preprocessor(), backend.image_size
    reduce = backend.reduced_decoding  # the heads train on the pixels the indexer will give them
    skipped: Counter = Counter()

    def decode(s: int) -> list:
        return [
            decode_file(str(folder.image_path(i)), max_pixels, prep, size, reduce) for i in range(s, min(n, s + batch))
        ]

    starts = list(range(start, n, batch))
    with (
        ThreadPoolExecutor(max_workers=1) as pool,
        tqdm(total=n, initial=start, desc="backbone images", unit="img", leave=False) as bar,
    ):
        nxt = pool.submit(decode, starts[0]) if starts else None
        for k, s in enumerate(starts):
            assert nxt is not None  # the next start's decode is always in flight inside the loop
            got = nxt.result()
            nxt = pool.submit(decode, starts[k + 1]) if k + 1 < len(starts) else None
            ok = np.array([not isinstance(g, Unreadable) for g in got])
            skipped.update(g.reason for g in got if isinstance(g, Unreadable))
            B = len(got)
            c = np.zeros((B, *cells.arr.shape[1:]), np.float16)
            p = np.zeros((B, pooled.arr.shape[1]), np.float32)
            if ok.any():
                grid = backend.image_grid(np.stack([g[0] for g, good in zip(got, ok) if good]))
                c[ok], p[ok] = grid.cells.astype(np.float16), grid.pooled
            cells.commit(s, c)
            pooled.commit(s, p)
            readable.commit(s, ok.astype(np.uint8))
            bar.update(B)
    return dict(skipped)


def _texts(backend: ExportedBackend, captions: list[str], caches: list[ChunkedCache], T: int, batch: int) -> None:
    tokens, mask, text = caches
    start = min(x.done for x in caches)
    for s in tqdm(range(start, len(captions), batch), desc="backbone captions", leave=False):
        emb, tok, m = backend.text_tokens(captions[s : s + batch])
        t = min(T, tok.shape[1])  # a fixed-context tower (open_clip) gives T tokens or more: the rest is padding
        tk = np.zeros((len(emb), T, tok.shape[2]), np.float16)
        mk = np.zeros((len(emb), T), np.uint8)
        tk[:, :t], mk[:, :t] = tok[:, :t], m[:, :t]
        tokens.commit(s, tk)
        mask.commit(s, mk)
        text.commit(s, np.asarray(emb, np.float32))
