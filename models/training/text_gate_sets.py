"""The text gate's generated training and dev sets (models/training/text_gate.py), made reproducibly from
Flickr8k photos with a fixed seed: the same split, n and seed give the same files.

- Signs: each photo of a split gets one patch, a sign (a solid board), a screen (dark with light text) or a paper
  sheet (off-white with dark text), carrying one to three words from WORDS or a made-up code (a name, a number:
  the rare words keyword search is for). The patch is drawn with a TrueType font, turned by a perspective warp,
  blurred a little and pasted at 20-50% of the photo's width. The same number of other photos of the split are
  left as they are: the negatives a text gate must reject. Ground truth: the words drawn on each, and where.
- Documents and screens: pages, receipts, slides and screenshots with the boxes of their lines. Squashed to the
  encoder's 224 x 224 their text is a texture, not a sign, and a gate trained on signs alone misses them. In one
  of three the document is photographed, pasted at 50-90% of a Flickr8k photo of the same split. The words are
  those of the split's captions, so no word crosses splits.

research/text_search/textset.py and docset.py are their command lines for the research that uses them.
Photos and derived images stay under artifacts/ (never in the repository).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from crossprobe.core.atomic import atomic_write
from crossprobe.models.data.flickr8k import Flickr8k

WORDS = [
    "EXIT",
    "BAKERY",
    "PHARMACY",
    "HOTEL",
    "PARKING",
    "OPEN",
    "CLOSED",
    "SALE",
    "STOP",
    "CAFE",
    "MUSEUM",
    "LIBRARY",
    "STATION",
    "PLATFORM",
    "TICKETS",
    "POLICE",
    "TAXI",
    "PIZZA",
    "SUSHI",
    "GARAGE",
    "MARKET",
    "THEATER",
    "CINEMA",
    "BANK",
    "POST",
    "OFFICE",
    "SCHOOL",
    "HOSPITAL",
    "AIRPORT",
    "HARBOR",
    "BRIDGE",
    "GARDEN",
    "BEACH",
    "TRAIL",
    "CAMPING",
    "DANGER",
    "WARNING",
    "SILENCE",
    "WELCOME",
    "ENTRANCE",
    "RECEPTION",
    "INVOICE",
    "RECEIPT",
    "TOTAL",
    "AGENDA",
    "MEETING",
    "BUDGET",
    "REPORT",
    "SUMMARY",
    "ROADMAP",
    "DEADLINE",
    "BIRTHDAY",
    "WEDDING",
    "CONCERT",
    "FESTIVAL",
    "MARATHON",
    "FINISH",
    "START",
    "NORTH",
    "SOUTH",
    "EAST",
    "WEST",
    "CENTRAL",
    "AVENUE",
    "STREET",
    "LANE",
    "ROAD",
    "HIGHWAY",
    "BAKER",
    "MILLER",
    "HARRISON",
    "OAKWOOD",
    "RIVERSIDE",
    "LAKEVIEW",
    "SUNSET",
    "MORNING",
    "COFFEE",
    "ESPRESSO",
    "BURGERS",
    "NOODLES",
    "DUMPLINGS",
    "FLOWERS",
    "BOOKS",
    "MUSIC",
    "VINYL",
    "GUITARS",
    "BICYCLES",
    "REPAIR",
    "LAUNDRY",
    "BARBER",
    "DENTIST",
    "VETERINARY",
    "FIREWORKS",
    "TOURNAMENT",
    "CHAMPIONS",
    "VOLUNTEERS",
    "RECYCLING",
    "ELEVATOR",
    "STAIRS",
]
FONTS = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationMono-Bold.ttf",
]
STYLES = {
    "sign": ((30, 90, 160), (255, 255, 255)),
    "screen": ((20, 20, 25), (120, 255, 140)),
    "paper": ((245, 242, 230), (30, 30, 30)),
}


def phrase(rng: random.Random) -> list[str]:
    """One to three words; one in five a made-up code (e.g. 'K7-2291'), a rare token no caption has."""
    words = rng.sample(WORDS, rng.choice([1, 1, 2, 3]))
    if rng.random() < 0.2:
        words[-1] = f"{rng.choice('ABCDEFGHKMNPRSTVXZ')}{rng.randint(1, 9)}-{rng.randint(1000, 9999)}"
    return words


def missing_fonts() -> list[str]:
    """The FONTS this machine lacks (Debian: fonts-dejavu-core, fonts-liberation). With any missing, font() draws
    with the others and the random stream takes another course: other sets, and another gate fitted on them."""
    return [f for f in FONTS if not Path(f).exists()]


def font(rng: random.Random, size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    have = [f for f in FONTS if Path(f).exists()]
    return ImageFont.truetype(rng.choice(have), size) if have else ImageFont.load_default(size=size)


def patch(words: list[str], style: str, rng: random.Random) -> Image.Image:
    bg, fg = STYLES[style]
    f = font(rng, 64)
    lines = [" ".join(words)] if len(words) < 3 or rng.random() < 0.5 else [" ".join(words[:2]), words[2]]
    boxes = [f.getbbox(line) for line in lines]
    w = max(b[2] - b[0] for b in boxes) + 48
    h = sum(b[3] - b[1] + 16 for b in boxes) + 32
    # int(): Pillow types bounding boxes as floats; a font's are whole pixels (ints) at an int size
    im = Image.new("RGB", (int(w), int(h)), bg)
    d = ImageDraw.Draw(im)
    y: float = 16
    for line, b in zip(lines, boxes):
        d.text((24 - b[0], y - b[1]), line, font=f, fill=fg)
        y += b[3] - b[1] + 16
    return im


def warp(im: Image.Image, rng: random.Random) -> Image.Image:
    """A perspective view of the patch (corners moved by up to 12% of its size), on a transparent field."""
    w, h = im.size
    j = lambda s: rng.uniform(0, 0.12) * s  # noqa: E731
    src = [(j(w), j(h)), (w - j(w), j(h)), (w - j(w), h - j(h)), (j(w), h - j(h))]  # where the corners land
    dst = [(0, 0), (w, 0), (w, h), (0, h)]
    coeffs = _perspective(src, dst)
    rgba = im.convert("RGBA")
    return rgba.transform((w, h), Image.Transform.PERSPECTIVE, coeffs, Image.Resampling.BICUBIC)


def _perspective(src, dst) -> list[float]:
    """PIL's 8 coefficients mapping output points (src) back to input points (dst)."""
    a = []
    for (x, y), (u, v) in zip(src, dst):
        a.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
        a.append([0, 0, 0, x, y, 1, -v * x, -v * y])
    return np.linalg.solve(np.asarray(a, float), np.asarray([c for p in dst for c in p], float)).tolist()


def make_signs(split: str, n: int, out: Path, seed: int = 0) -> dict:
    """n photos of a split with a sign, screen or paper patch and n others left as they are (re-saved), with a
    fixed seed -> {image: [words]} (negatives []); writes <out>/images/*.jpg, truth.json and boxes.json
    ({image: [x, y, w, h, photo w, photo h]} of each patch)."""
    ds = Flickr8k.load()
    rng = random.Random(seed)
    rows = ds.splits[split][:]
    rng.shuffle(rows)
    (out / "images").mkdir(parents=True, exist_ok=True)
    truth, boxes = {}, {}
    for k, row in enumerate(rows[: 2 * n]):
        photo = Image.open(ds.image_path(row)).convert("RGB")
        name = f"{'t' if k < n else 'n'}{k:04d}_{ds.images[row]}"
        words: list[str] = []
        if k < n:
            words = phrase(rng)
            p = warp(patch(words, rng.choice(list(STYLES)), rng), rng)
            scale = rng.uniform(0.20, 0.50) * photo.width / p.width
            p = p.resize((max(1, int(p.width * scale)), max(1, int(p.height * scale))), Image.Resampling.LANCZOS)
            p = p.filter(ImageFilter.GaussianBlur(rng.uniform(0, 1.2)))
            x = rng.randint(0, max(0, photo.width - p.width))
            y = rng.randint(0, max(0, photo.height - p.height))
            photo.paste(p, (x, y), p)
            boxes[name] = [x, y, p.width, p.height, photo.width, photo.height]
        photo.save(out / "images" / name, quality=90)
        truth[name] = words
    (out / "truth.json").write_text(json.dumps(truth, indent=1))
    atomic_write(out / "boxes.json", json.dumps(boxes))  # last, and whole: its presence marks the set complete
    return truth


KINDS = ("page", "receipt", "slide", "screenshot")


def _lines(rng: random.Random, vocab: list[str], n: int, lo: int, hi: int) -> list[str]:
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def document(kind: str, vocab: list[str], rng: random.Random) -> tuple[Image.Image, list[list[float]], list[str]]:
    """One picture of a kind -> (image, line boxes, words)."""
    if kind == "page":
        size, bg, fg, px, cols = (
            (rng.randint(600, 900), rng.randint(800, 1100)),
            (250, 248, 240),
            (20, 20, 20),
            rng.randint(14, 24),
            (5, 12),
        )
    elif kind == "receipt":
        size, bg, fg, px, cols = (
            (rng.randint(300, 420), rng.randint(700, 1000)),
            (245, 245, 240),
            (40, 40, 40),
            rng.randint(14, 18),
            (2, 4),
        )
    elif kind == "slide":
        size = rng.choice([(960, 540), (1280, 720)])
        bg, fg = rng.choice(
            [((255, 255, 255), (30, 30, 60)), ((20, 40, 90), (250, 250, 250)), ((240, 235, 220), (60, 20, 20))]
        )
        px, cols = rng.randint(26, 36), (3, 6)
    else:
        size, bg, fg, px, cols = (
            rng.choice([(1024, 640), (1280, 800)]),
            (255, 255, 255),
            (30, 30, 30),
            rng.randint(13, 16),
            (3, 8),
        )
    img = Image.new("RGB", size, bg)
    d = ImageDraw.Draw(img)
    boxes: list[list[float]] = []
    words: list[str] = []
    y: float
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


def make_documents(split: str, n: int, out: Path, seed: int = 0) -> dict:
    """n documents and screens from a split's caption words, a third photographed on a photo of the split, with a
    fixed seed -> {image: [words]}; writes <out>/images/*.jpg, truth.json and boxes.json ({image: [[x0, y0, x1,
    y1] of each line]})."""
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
    atomic_write(out / "boxes.json", json.dumps(boxes))  # last, and whole: its presence marks the set complete
    return truth
