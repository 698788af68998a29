"""Flickr8k with its frozen-backbone feature cache, as training and eval see it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from crossprobe.models.data.features import cache_images, cache_text
from crossprobe.models.data.flickr8k import Flickr8k


@dataclass
class CachedData:
    ds: Flickr8k
    grids: np.ndarray  # (N_img, 49, 1280) float16
    states: np.ndarray  # (N_cap, 40, 384) float16, MiniLM after the frozen layers
    masks: np.ndarray  # (N_cap, 40) uint8
    image_captions: list[list[int]]  # image row -> its caption rows
    gray_grids: np.ndarray | None = None  # (N_img, 49, 1280) float16, the grayscale copies' grids (with_gray)

    @classmethod
    def build(
        cls, cache_dir: Path, frozen_layers: int, root: Path | None = None, in_memory: bool = True
    ) -> "CachedData":
        ds = Flickr8k.load(root)
        cache_dir = Path(cache_dir)
        grids = cache_images([ds.image_path(i) for i in range(len(ds.images))], cache_dir / "images.npy")
        states, masks = cache_text(ds.captions, cache_dir / f"text_l{frozen_layers}.npy", frozen_layers)
        if in_memory:  # ~2.3 GB; random batches from RAM instead of page faults
            grids, states, masks = np.load(cache_dir / "images.npy"), np.asarray(states), np.asarray(masks)
        caps: list[list[int]] = [[] for _ in ds.images]
        for j, i in enumerate(ds.caption_image):
            caps[i].append(j)
        return cls(ds, grids, states, masks, caps)

    def with_gray(self, cache_dir: Path) -> "CachedData":
        """Load (and cache once) the grids of every image's grayscale copy, into memory: the towers' grayscale
        augmentation."""
        if self.gray_grids is None:
            paths = [self.ds.image_path(i) for i in range(len(self.ds.images))]
            self.gray_grids = np.array(
                cache_images(paths, Path(cache_dir) / "images_gray.npy", desc="grayscale grids", gray=True)
            )
        return self

    def split_images(self, split: str) -> list[int]:
        return self.ds.splits[split]

    def split_captions(self, split: str) -> list[int]:
        return self.ds.captions_of(self.ds.splits[split])

    def text_batch(self, caps: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Caption rows -> (B, T, 384) float32 states, (B, T) bool mask, T trimmed to the longest."""
        m = torch.from_numpy(self.masks[caps]).bool()
        T = int(m.sum(1).max())
        return torch.from_numpy(self.states[caps][:, :T]).float(), m[:, :T]
