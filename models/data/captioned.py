"""A folder of images with captions (`images/<file>` + `captions.tsv` with header image<TAB>caption),
the layout of ../shared/datasets/coco-mini-dev: the out-of-domain development set (never training).

A user can measure crossprobe on their own photos the same way: write a captions.tsv beside them.
"""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_COCO = Path(__file__).resolve().parents[2].parent / "shared" / "datasets" / "coco-mini-dev"


def coco_root() -> Path:
    """COCO_MINI_DEV_DIR if set, else ../shared/datasets/coco-mini-dev beside the checkout."""
    return Path(os.environ.get("COCO_MINI_DEV_DIR", DEFAULT_COCO))


@dataclass
class CaptionedFolder:
    root: Path
    images: list[str]  # image file names, sorted: row i of its feature cache
    captions: list[str]  # row j of its caption cache
    caption_image: list[int]  # caption j -> image row

    @staticmethod
    def available(root: Path) -> bool:
        return (Path(root) / "captions.tsv").is_file() and (Path(root) / "images").is_dir()

    @classmethod
    def load(cls, root: Path) -> "CaptionedFolder":
        root = Path(root)
        if not cls.available(root):
            raise FileNotFoundError(f"no captions.tsv + images/ at {root}")
        with open(root / "captions.tsv", newline="", encoding="utf-8") as f:
            reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            header = next(reader)
            if header[:2] != ["image", "caption"]:
                raise ValueError(f"{root / 'captions.tsv'}: header must be image<TAB>caption, got {header}")
            rows = [(r[0], r[1]) for r in reader if len(r) >= 2]
        images = sorted({n for n, _ in rows})
        missing = [n for n in images if not (root / "images" / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{len(missing)} captioned images missing under {root / 'images'}: {missing[:3]}")
        index = {n: i for i, n in enumerate(images)}
        return cls(root, images, [c for _, c in rows], [index[n] for n, _ in rows])

    def image_path(self, row: int) -> Path:
        return self.root / "images" / self.images[row]
