"""Converters into crossprobe's captioned-folder layout (captioned.py): `crossprobe data convert coco | karpathy`.

    COCO captions JSON      annotations/captions_<split><year>.json: images [{id, file_name}], annotations
                            [{image_id, caption}]; every caption goes to the one split the command names
    Karpathy-split JSON     dataset_coco.json, dataset_flickr30k.json, dataset_flickr8k.json: images [{filename,
                            filepath?, split, sentences [{raw}]}]; split train and restval -> train, val -> dev,
                            test -> test (restval is the COCO validation images Karpathy's split trains on)

Images are linked (a symbolic link to the source file, the default) or copied into <out>/images/. A folder that
already holds captions.tsv keeps its lines and gains the new ones (convert COCO's train and val files one after
the other into one folder); a line already there is not added twice. captions.tsv is written last and atomically,
so it never names an image that is not in the folder. Nothing is dropped silently: every annotation, image or
sentence not used is counted by reason in the report, with the first few as examples.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from crossprobe.core.atomic import atomic_path
from crossprobe.models.data.captioned import CAPTIONS, SPLITS, read_captions, write_captions

KARPATHY_SPLITS = {"train": "train", "restval": "train", "val": "dev", "test": "test"}
EXAMPLES = 5  # bad entries quoted in the report, per reason


@dataclass
class Pair:
    """One caption to write: its image's source file, its name under images/, the caption, its split."""

    source: Path
    name: str
    caption: str
    split: str


@dataclass
class Report:
    """What a conversion wrote and what it did not use (by reason, with examples)."""

    out: Path
    images: int = 0  # images placed in the folder by this run (linked or copied)
    captions: Counter = field(default_factory=Counter)  # captions added, by split
    kept: int = 0  # lines the folder's captions.tsv held before
    already: int = 0  # captions already in the folder, not added twice
    bad: Counter = field(default_factory=Counter)  # entries not used, by reason
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def skip(self, reason: str, what: str, n: int = 1) -> None:
        self.bad[reason] += n
        if len(self.examples[reason]) < EXAMPLES:
            self.examples[reason].append(what[:200])

    def summary(self) -> str:
        added = sum(self.captions.values())
        lines = [
            f"{self.out}: {added} captions added "
            f"({', '.join(f'{s} {n}' for s, n in sorted(self.captions.items())) or 'none'}), "
            f"{self.images} images placed, {self.kept} lines kept from before, {self.already} already there"
        ]
        if self.bad:
            lines.append(f"not used: {sum(self.bad.values())}")
            for reason, n in self.bad.most_common():
                lines.append(f"  {n} x {reason}: e.g. {'; '.join(self.examples[reason])}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "out": str(self.out),
            "images": self.images,
            "captions": dict(self.captions),
            "kept": self.kept,
            "already": self.already,
            "bad": dict(self.bad),
            "examples": dict(self.examples),
        }


def _read_json(path: Path) -> dict:
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(d, dict) or not isinstance(d.get("images"), list):
        raise ValueError(f'{path}: no "images" list at the top level')
    return d


def _plain_name(name) -> str | None:
    """A file name with no folder part, or None."""
    if not isinstance(name, str) or not name or "\\" in name or PurePosixPath(name).name != name or name in (".", ".."):
        return None
    return name


def _caption(raw) -> str | None:
    """A caption with its whitespace (tabs, newlines) collapsed, or None when there is none."""
    if not isinstance(raw, str):
        return None
    return " ".join(raw.split()) or None


def from_coco(captions_json: Path, images: Path, out: Path, split: str = "train", link: bool = True) -> Report:
    """COCO's captions JSON (module docstring) -> <out>, every caption in `split`."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: one of {', '.join(SPLITS)}")
    d = _read_json(captions_json)
    report = Report(Path(out))
    names: dict[object, str] = {}
    for im in d["images"]:
        name = _plain_name(im.get("file_name")) if isinstance(im, dict) else None
        if name is None or "id" not in im:
            report.skip("image entry without an id or a plain file name", json.dumps(im)[:200])
            continue
        names[im["id"]] = name
    pairs = []
    for a in d.get("annotations") or []:
        if not isinstance(a, dict) or a.get("image_id") not in names:
            report.skip("caption of an unknown image id", json.dumps(a)[:200])
            continue
        caption = _caption(a.get("caption"))
        if caption is None:
            report.skip("empty caption", json.dumps(a)[:200])
            continue
        name = names[a["image_id"]]
        pairs.append(Pair(Path(images) / name, name, caption, split))
    return write_folder(pairs, Path(out), link, report)


def from_karpathy(dataset_json: Path, images: Path, out: Path, link: bool = True) -> Report:
    """A Karpathy-split JSON (module docstring) -> <out>, each image in its split."""
    d = _read_json(dataset_json)
    report = Report(Path(out))
    pairs = []
    for im in d["images"]:
        name = _plain_name(im.get("filename")) if isinstance(im, dict) else None
        if name is None:
            report.skip("image entry without a plain file name", json.dumps(im)[:200])
            continue
        split = KARPATHY_SPLITS.get(im.get("split"))
        sentences = im.get("sentences") if isinstance(im.get("sentences"), list) else []
        if split is None:
            report.skip("unknown split", f"{name}: split {im.get('split')!r}", max(1, len(sentences)))
            continue
        folder = im.get("filepath") if isinstance(im.get("filepath"), str) else ""
        source = Path(images) / folder / name
        if folder and not source.exists() and (Path(images) / name).exists():
            source = Path(images) / name  # the images kept in one folder, without COCO's train2014/ val2014/
        if not sentences:
            report.skip("image without sentences", name)
        for s in sentences:
            caption = _caption(s.get("raw")) if isinstance(s, dict) else None
            if caption is None:
                report.skip("empty caption", f"{name}: {json.dumps(s)[:150]}")
                continue
            pairs.append(Pair(source, name, caption, split))
    return write_folder(pairs, Path(out), link, report)


def write_folder(pairs: list[Pair], out: Path, link: bool, report: Report) -> Report:
    """Place each pair's image in <out>/images/ and add its line to <out>/captions.tsv (module docstring)."""
    (out / "images").mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, str, str]] = []
    if (out / CAPTIONS).exists():
        rows, before_bad = read_captions(out / CAPTIONS)
        if before_bad:  # they stay out of the rewritten file: say so
            for b in before_bad:
                report.skip(f"line of the existing {CAPTIONS} not kept ({b.reason})", f"line {b.line}: {b.text}")
        report.kept = len(rows)
    split_of = {n: s for n, _, s in rows}
    seen = {(n, c) for n, c, _ in rows}
    source: dict[str, Path] = {}  # name -> the file it was placed from (or tried)
    placed: dict[str, bool] = {}
    for p in pairs:
        if split_of.setdefault(p.name, p.split) != p.split:
            report.skip(
                "image already in the folder under another split", f"{p.name}: {split_of[p.name]}, not {p.split}"
            )
            continue
        if source.setdefault(p.name, p.source) != p.source:
            report.skip("two source files of one name", f"{p.name}: {source[p.name]} and {p.source}")
            continue
        if p.name not in placed:
            placed[p.name] = _place(p, out / "images" / p.name, link, report)
        if not placed[p.name]:
            report.skip("caption of an image not placed", f"{p.name}: {p.caption}")
            continue
        if (p.name, p.caption) in seen:
            report.already += 1
            continue
        seen.add((p.name, p.caption))
        rows.append((p.name, p.caption, p.split))
        report.captions[p.split] += 1
    write_captions(out / CAPTIONS, rows)
    return report


def _place(p: Pair, dest: Path, link: bool, report: Report) -> bool:
    """dest = the pair's image (a link to it, or a copy), unless it is already that file -> whether it is there."""
    if not p.source.is_file():
        report.skip("image file missing", str(p.source))
        return False
    if dest.exists() or dest.is_symlink():
        try:
            if os.path.samefile(dest, p.source) or _same_bytes(dest, p.source):
                return True
        except OSError:
            pass
        report.skip("another file of that name is in the folder", f"{dest} is not {p.source}")
        return False
    with atomic_path(dest, mode=None if link else 0o644, unique=True) as tmp:  # the image appears whole, by one rename
        if link:
            os.symlink(p.source.resolve(), tmp)
        else:
            shutil.copyfile(p.source, tmp)
    report.images += 1
    return True


def _same_bytes(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True
