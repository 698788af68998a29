"""Documents and screens, made reproducibly: pages, receipts, slides and screenshots (issue 31's text gate).

textset.py puts one small sign into a photo. A library also holds pictures that are mostly text: a scanned page,
a receipt, a slide, a screenshot. Squashed to the encoder's 224 x 224 their text is a texture, not a sign, and a
gate trained on signs alone misses them (the demo's page.jpg). This makes such pictures with the lines' boxes: in
one of three the document is photographed, pasted at 50-90% of a Flickr8k photo of the same split. The words are
those of the split's captions, so no word crosses splits.

    python -m research.text_search.docset --split train --n 300 --out artifacts/docset/train
        -> <out>/images/*.jpg, <out>/boxes.json ({image: [[x0, y0, x1, y1] of each line]}),
           <out>/truth.json ({image: [words]})
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from PIL import Image, ImageDraw

from crossprobe.models.data.flickr8k import Flickr8k
from research.text_search.textset import font, split_cli

KINDS = ("page", "receipt", "slide", "screenshot")


def _lines(rng: random.Random, vocab: list[str], n: int, lo: int, hi: int) -> list[str]:
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def document(kind: str, vocab: list[str], rng: random.Random) -> tuple[Image.Image, list[list[int]], list[str]]:
    """One picture of a kind -> (image, line boxes, words)."""
    if kind == "page":
        size, bg, fg, px, cols = (rng.randint(600, 900), rng.randint(800, 1100)), (250, 248, 240), (20, 20, 20), rng.randint(14, 24), (5, 12)
    elif kind == "receipt":
        size, bg, fg, px, cols = (rng.randint(300, 420), rng.randint(700, 1000)), (245, 245, 240), (40, 40, 40), rng.randint(14, 18), (2, 4)
    elif kind == "slide":
        size = rng.choice([(960, 540), (1280, 720)])
        bg, fg = rng.choice([((255, 255, 255), (30, 30, 60)), ((20, 40, 90), (250, 250, 250)), ((240, 235, 220), (60, 20, 20))])
        px, cols = rng.randint(26, 36), (3, 6)
    else:
        size, bg, fg, px, cols = rng.choice([(1024, 640), (1280, 800)]), (255, 255, 255), (30, 30, 30), rng.randint(13, 16), (3, 8)
    img = Image.new("RGB", size, bg)
    d = ImageDraw.Draw(img)
    boxes, words = [], []
    x, y = int(size[0] * 0.06), int(size[1] * 0.05)
    if kind == "screenshot":  # a side bar and a title bar, as an app window
        d.rectangle((0, 0, size[0], 40), fill=(60, 60, 70))
        d.rectangle((0, 40, 200, size[1]), fill=(235, 235, 240))
        x, y = 220, 60
    if kind in ("slide", "page"):  # a title, larger
        title = _lines(rng, vocab, 1, 2, 5)[0]
        f = font(rng, int(px * 1.8))
        b = d.textbbox((x, y), title, font=f)
        d.text((x, y), title, font=f, fill=fg)
        boxes.append(list(b))
        words += title.split()
        y = b[3] + px
    f = font(rng, px)
    while y + px * 1.5 < size[1] * 0.95:
        line = _lines(rng, vocab, 1, *cols)[0]
        if kind == "receipt":
            line = f"{line[:24].upper():<24} {rng.randint(1, 99)}.{rng.randint(0, 99):02d}"
        elif kind == "slide":
            line = "- " + line
        b = d.textbbox((x, y), line, font=f)
        if b[2] > size[0] * 0.97:  # a line that would run off the picture: shorter
            line = line[: max(1, int(len(line) * (size[0] * 0.9 - x) / max(1, b[2] - x)))]
            b = d.textbbox((x, y), line, font=f)
        d.text((x, y), line, font=f, fill=fg)
        boxes.append(list(b))
        words += line.split()
        y = b[3] + int(px * (0.5 if kind != "slide" else 1.2))
    return img, boxes, words


def make(split: str, n: int, out: Path, seed: int = 0) -> dict:
    ds = Flickr8k.load()
    rng = random.Random(seed)
    rows = ds.splits[split][:]
    vocab = sorted({w.strip(".,").lower() for j in ds.captions_of(rows) for w in ds.captions[j].split() if w.isalpha()})
    rng.shuffle(rows)
    (out / "images").mkdir(parents=True, exist_ok=True)
    truth, boxes = {}, {}
    for k in range(n):
        kind = KINDS[k % len(KINDS)]
        img, bx, words = document(kind, vocab, rng)
        if rng.random() < 1 / 3:  # photographed: the document covers 50-90% of a photo of the split
            photo = Image.open(ds.image_path(rows[k])).convert("RGB").resize((img.width, img.height))
            s = rng.uniform(0.5, 0.9)
            small = img.resize((int(img.width * s), int(img.height * s)), Image.Resampling.LANCZOS)
            ox, oy = rng.randint(0, img.width - small.width), rng.randint(0, img.height - small.height)
            photo.paste(small, (ox, oy))
            img, bx = photo, [[int(ox + a * s), int(oy + b * s), int(ox + c * s), int(oy + e * s)] for a, b, c, e in bx]
        name = f"d{k:04d}_{kind}.jpg"
        img.save(out / "images" / name, quality=90)
        truth[name], boxes[name] = words, bx
    (out / "truth.json").write_text(json.dumps(truth))
    (out / "boxes.json").write_text(json.dumps(boxes))
    return truth


def main() -> None:
    out, truth = split_cli(__doc__, make, 100, "documents and screens", "artifacts/docset")
    print(f"{out}: {len(truth)} documents")


if __name__ == "__main__":
    main()
