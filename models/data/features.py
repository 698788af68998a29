"""Frozen-backbone feature cache: computed once, resumable, read by training and eval.

- images.npy  (N_img, 49, 1280) float16: EfficientNet-Lite0 grids, through ONNX
  Runtime (measured ~3-10x faster than PyTorch eager on 2 CPU cores);
  images_gray.npy, the same for the images' grayscale copies, when training asks for them.
- text.npy    (N_cap, 40, 384) float16: MiniLM hidden states after the frozen
  bottom layers; text_mask.npy (N_cap, 40) uint8.

Each array is a .npy memmap filled in chunks; `<name>.progress` records how many
rows are committed (written atomically after the chunk is flushed), so a killed
run continues where it stopped instead of starting again.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm import tqdm

from crossprobe.core import inputs
from crossprobe.core.atomic import atomic_write


class ChunkedCache:
    """A resumable (rows, *shape) .npy memmap with a committed-rows counter."""

    def __init__(self, path: Path, shape: tuple[int, ...], dtype):
        self.path = path
        self.progress = path.with_suffix(".progress")
        if path.exists() and self.progress.exists():
            self.arr = np.load(path, mmap_mode="r+")
            if self.arr.shape != shape:
                raise ValueError(f"{path} has shape {self.arr.shape}, expected {shape}; delete it to rebuild")
            self.done = json.loads(self.progress.read_text())["rows"]
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.arr = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
            self.done = 0
            atomic_write(self.progress, json.dumps({"rows": 0}))

    @property
    def complete(self) -> bool:
        return self.done >= self.arr.shape[0]

    def commit(self, start: int, values: np.ndarray) -> None:
        self.arr[start : start + len(values)] = values
        self.arr.flush()
        self.done = start + len(values)
        atomic_write(self.progress, json.dumps({"rows": self.done}))


def image_backbone_session(cache_dir: Path, threads: int | None = None, spinning: bool | None = None):
    """ONNX Runtime session for the frozen image backbone (exported once per folder: models/export.py)."""
    from crossprobe.core.runtime import session
    from crossprobe.models.export import ensure_backbone

    return session(ensure_backbone(cache_dir), threads, spinning)


def cache_images(
    paths: list[Path], out: Path, batch: int = 32, desc: str = "image grids", gray: bool = False
) -> np.ndarray:
    """Encode every image to its (49, 1280) grid; decode of the next batch overlaps encode.
    gray: the grids of the images' grayscale copies (the towers' grayscale augmentation)."""
    cache = ChunkedCache(out, (len(paths), inputs.GRID * inputs.GRID, inputs.IMAGE_FEAT_DIM), np.float16)
    if cache.complete:
        return np.load(out, mmap_mode="r")
    sess = image_backbone_session(out.parent)
    starts = list(range(cache.done, len(paths), batch))

    def decode(s: int) -> np.ndarray:
        return np.stack([inputs.load_image(p, gray=gray) for p in paths[s : s + batch]])

    with (
        ThreadPoolExecutor(max_workers=1) as pool,
        tqdm(total=len(paths), initial=cache.done, desc=desc, unit="img") as bar,
    ):
        nxt = pool.submit(decode, starts[0]) if starts else None
        for i, s in enumerate(starts):
            assert nxt is not None  # the next start's decode is always in flight inside the loop
            pixels = nxt.result()
            nxt = pool.submit(decode, starts[i + 1]) if i + 1 < len(starts) else None
            grid = sess.run(None, {"pixels": pixels})[0]  # (B, 49, 1280)
            cache.commit(s, grid.astype(np.float16))
            bar.update(len(pixels))
    return np.load(out, mmap_mode="r")


def cache_text(captions: list[str], out: Path, frozen_layers: int, batch: int = 256, desc: str = "caption states"):
    """Run MiniLM's embeddings + bottom `frozen_layers` layers over every caption."""
    import torch  # here, not at the top: the indexer and the service import this module for the image session

    from crossprobe.models import backbones as bb

    n = len(captions)
    states = ChunkedCache(out, (n, inputs.MAX_TOKENS, inputs.TEXT_FEAT_DIM), np.float16)
    masks = ChunkedCache(out.with_name(out.stem + "_mask.npy"), (n, inputs.MAX_TOKENS), np.uint8)
    if states.complete and masks.complete:
        return np.load(out, mmap_mode="r"), np.load(masks.path, mmap_mode="r")
    tok = inputs.load_tokenizer()
    bottom = bb.MiniLMBottom(bb.load_minilm(), frozen_layers).eval()
    start = min(states.done, masks.done)
    with tqdm(total=n, initial=start, desc=desc, unit="cap") as bar:
        for s in range(start, n, batch):
            ids, mask = inputs.tokenize(tok, captions[s : s + batch])
            with torch.inference_mode():
                h = bottom(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
            T = ids.shape[1]
            padded = np.zeros((len(ids), inputs.MAX_TOKENS, inputs.TEXT_FEAT_DIM), np.float16)
            padded[:, :T] = h
            pm = np.zeros((len(ids), inputs.MAX_TOKENS), np.uint8)
            pm[:, :T] = mask
            states.commit(s, padded)
            masks.commit(s, pm)
            bar.update(len(ids))
    return np.load(out, mmap_mode="r"), np.load(masks.path, mmap_mode="r")
