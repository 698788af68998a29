"""A folder of images with captions: crossprobe's one layout for image-caption pairs, for training rerankers on a
backbone (`crossprobe train --backbone`), evaluating any model (`crossprobe eval --data`), and the out-of-domain
development set ../shared/datasets/coco-mini-dev (never training).

    <folder>/images/<file>        the photos (a name may hold sub-folders: images/a/b.jpg is "a/b.jpg")
    <folder>/captions.tsv         UTF-8, tab separated, a header line, then one caption per line:

        image<TAB>caption[<TAB>split]
        dog.jpg<TAB>a dog runs on the beach<TAB>train
        dog.jpg<TAB>a brown dog in the surf<TAB>train
        cat.jpg<TAB>a cat asleep on a sofa<TAB>test

Several captions of one image are several lines. `split` is train | dev | test, optional: a file without the column,
or an empty cell, means train. Every line of an image names the same split. Columns after these are ignored. A line
that cannot be used (too few fields, an empty caption, an unknown split, an image name leaving images/, a split
that contradicts the image's earlier lines) is counted and kept in `bad_lines` with its reason, never dropped
silently; a captioned image missing from images/ is an error. `crossprobe data convert` (convert.py) writes this
layout from COCO's captions JSON and the Karpathy-split JSON.
"""

from __future__ import annotations

import csv
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from crossprobe.core.atomic import atomic_path

log = logging.getLogger("crossprobe.models.data")

DEFAULT_COCO = Path(__file__).resolve().parents[2].parent / "shared" / "datasets" / "coco-mini-dev"
CAPTIONS = "captions.tsv"
SPLITS = ("train", "dev", "test")
DEFAULT_SPLIT = "train"
ALL = "all"  # every split at once (rows(ALL))


def coco_root() -> Path:
    """COCO_MINI_DEV_DIR if set, else ../shared/datasets/coco-mini-dev beside the checkout."""
    return Path(os.environ.get("COCO_MINI_DEV_DIR", DEFAULT_COCO))


@dataclass(frozen=True)
class BadLine:
    """A line of captions.tsv that was not used."""

    line: int  # 1-based, the header being line 1
    reason: str
    text: str  # the line as read (cut at 200 characters)


@dataclass
class CaptionedFolder:
    root: Path
    images: list[str]  # image file names, sorted: row i of its feature cache
    captions: list[str]  # row j of its caption cache
    caption_image: list[int]  # caption j -> image row
    image_split: list[str] = field(default_factory=list)  # image row -> train | dev | test
    bad_lines: list[BadLine] = field(default_factory=list)

    @staticmethod
    def available(root: Path) -> bool:
        return (Path(root) / CAPTIONS).is_file() and (Path(root) / "images").is_dir()

    @classmethod
    def load(cls, root: Path) -> "CaptionedFolder":
        root = Path(root)
        if not cls.available(root):
            raise FileNotFoundError(f"no {CAPTIONS} + images/ at {root}")
        rows, bad = read_captions(root / CAPTIONS)
        split_of = {n: s for n, _, s in rows}
        images = sorted(split_of)
        missing = [n for n in images if not (root / "images" / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{len(missing)} captioned images missing under {root / 'images'}: {missing[:3]}")
        if bad:
            log.warning(
                "%s: %d lines not used (%s); first: line %d, %s",
                root / CAPTIONS,
                len(bad),
                ", ".join(f"{r}: {n}" for r, n in Counter(b.reason for b in bad).items()),
                bad[0].line,
                bad[0].reason,
            )
        index = {n: i for i, n in enumerate(images)}
        return cls(
            root, images, [c for _, c, _ in rows], [index[n] for n, _, _ in rows], [split_of[n] for n in images], bad
        )

    def image_path(self, row: int) -> Path:
        return self.root / "images" / self.images[row]

    def rows(self, split: str) -> tuple[list[int], list[int]]:
        """-> (image rows, caption rows) of a split (train | dev | test, or "all")."""
        if split != ALL and split not in SPLITS:
            raise ValueError(f"split {split!r}: one of {', '.join(SPLITS + (ALL,))}")
        imgs = [i for i, s in enumerate(self.image_split) if split in (ALL, s)]
        keep = set(imgs)
        return imgs, [j for j, i in enumerate(self.caption_image) if i in keep]

    def split_counts(self) -> dict[str, int]:
        """Captions per split (the splits present only)."""
        return dict(Counter(self.image_split[i] for i in self.caption_image))

    def bad_summary(self) -> dict[str, int]:
        """Lines not used, by reason."""
        return dict(Counter(b.reason for b in self.bad_lines))


def read_captions(path: Path) -> tuple[list[tuple[str, str, str]], list[BadLine]]:
    """captions.tsv -> ([(image, caption, split)], the lines not used). A wrong header is an error."""
    rows: list[tuple[str, str, str]] = []
    bad: list[BadLine] = []
    split_of: dict[str, tuple[str, int]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader, [])
        if header[:2] != ["image", "caption"]:
            raise ValueError(f"{path}: header must be image<TAB>caption[<TAB>split], got {header}")
        split_col = header.index("split") if "split" in header[2:] else None
        for fields in reader:
            if not fields:
                continue  # a blank line holds nothing to lose
            line = reader.line_num
            reason = _check(fields, split_col)
            if reason is None:
                name, caption = fields[0], fields[1]
                split = (
                    fields[split_col].strip() if split_col is not None and len(fields) > split_col else ""
                ) or DEFAULT_SPLIT
                first = split_of.setdefault(name, (split, line))
                if first[0] != split:
                    reason = f"split differs from the image's line {first[1]}"
            if reason is not None:
                bad.append(BadLine(line, reason, "\t".join(fields)[:200]))
                continue
            rows.append((name, caption, split))
    return rows, bad


def _check(fields: list[str], split_col: int | None) -> str | None:
    """Why a line cannot be used, or None."""
    if len(fields) < 2:
        return "fewer than 2 fields"
    name = fields[0]
    p = PurePosixPath(name)
    if not name or p.is_absolute() or ".." in p.parts or "\\" in name:
        return "image name outside images/"
    if not fields[1].strip():
        return "empty caption"
    if split_col is not None and len(fields) > split_col:
        s = fields[split_col].strip()
        if s and s not in SPLITS:
            return "unknown split"  # not train, dev or test
    return None


def write_captions(path: Path, rows: list[tuple[str, str, str]]) -> None:
    """[(image, caption, split)] -> captions.tsv, atomically (a temp file renamed into place): a reader sees the
    old file or the new one, never half of it. Whitespace inside a caption (tabs, newlines) becomes one space."""
    path = Path(path)
    with atomic_path(path, fsync=True) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write("image\tcaption\tsplit\n")
        for name, caption, split in rows:
            f.write(f"{name}\t{' '.join(caption.split())}\t{split}\n")
