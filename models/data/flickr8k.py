"""Flickr8k as shipped in ../shared/datasets/flickr8k (research use only: read in
place, never copied into the repository).

Layout: images/<name>.jpg (224x224), captions.tsv (image<TAB>caption, 5 per
image), splits/{train,dev,test}.txt.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = Path(__file__).resolve().parents[2].parent / "shared" / "datasets" / "flickr8k"


def dataset_root() -> Path:
    """FLICKR8K_DIR if set, else ../shared/datasets/flickr8k beside the checkout."""
    return Path(os.environ.get("FLICKR8K_DIR", DEFAULT_ROOT))


def available(root: Path | None = None) -> bool:
    root = root or dataset_root()
    return (root / "captions.tsv").is_file() and (root / "splits" / "test.txt").is_file()


@dataclass
class Flickr8k:
    root: Path
    images: list[str]  # all image names, sorted: row i of the image feature cache
    captions: list[str]  # all captions: row j of the caption feature cache
    caption_image: list[int]  # caption j -> image row
    splits: dict[str, list[int]]  # split -> image rows

    @classmethod
    def load(cls, root: Path | None = None) -> "Flickr8k":
        root = Path(root or dataset_root())
        if not available(root):
            raise FileNotFoundError(
                f"Flickr8k not found at {root}; set FLICKR8K_DIR or place it at ../shared/datasets/flickr8k"
            )
        rows: list[tuple[str, str]] = []
        with open(root / "captions.tsv", newline="", encoding="utf-8") as f:
            reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            header = next(reader)
            assert header[:2] == ["image", "caption"], header
            rows = [(r[0], r[1]) for r in reader if len(r) >= 2]
        images = sorted({name for name, _ in rows})
        index = {name: i for i, name in enumerate(images)}
        splits = {}
        for split in ("train", "dev", "test"):
            names = [n.strip() for n in (root / "splits" / f"{split}.txt").read_text().splitlines() if n.strip()]
            splits[split] = [index[n] for n in names]
        return cls(
            root=root,
            images=images,
            captions=[c for _, c in rows],
            caption_image=[index[n] for n, _ in rows],
            splits=splits,
        )

    def image_path(self, row: int) -> Path:
        return self.root / "images" / self.images[row]

    def captions_of(self, image_rows: list[int]) -> list[int]:
        """Caption rows whose image is in image_rows, in caption order."""
        wanted = set(image_rows)
        return [j for j, i in enumerate(self.caption_image) if i in wanted]
