"""A text-in-image set made reproducibly from Flickr8k photos (issue 31): words on signs, screens and paper.

Each photo of a split gets, with a fixed seed, one patch: a sign (a solid board), a screen (dark with light
text) or a paper sheet (off-white with dark text), carrying one to three words from WORDS or a made-up code
(a name, a number: the rare words keyword search is for). The patch is drawn with a TrueType font, turned by a
perspective warp, blurred a little and pasted at 20-50% of the photo's width. The same number of other photos of
the split are left as they are: the negatives a text gate must reject. Ground truth: the words drawn on each.

    python -m research.text_search.textset --split dev --n 200 --out artifacts/textset/dev
        -> <out>/images/*.jpg, <out>/truth.json ({image: [words]}, negatives with []),
           <out>/boxes.json ({image: [x, y, w, h, photo w, photo h]} of each patch: where the text is)

Photos and derived images stay under artifacts/ (research use only; never in the repository).
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from crossprobe.models.data.flickr8k import Flickr8k

WORDS = ["EXIT", "BAKERY", "PHARMACY", "HOTEL", "PARKING", "OPEN", "CLOSED", "SALE", "STOP", "CAFE", "MUSEUM",
         "LIBRARY", "STATION", "PLATFORM", "TICKETS", "POLICE", "TAXI", "PIZZA", "SUSHI", "GARAGE", "MARKET",
         "THEATER", "CINEMA", "BANK", "POST", "OFFICE", "SCHOOL", "HOSPITAL", "AIRPORT", "HARBOR", "BRIDGE",
         "GARDEN", "BEACH", "TRAIL", "CAMPING", "DANGER", "WARNING", "SILENCE", "WELCOME", "ENTRANCE", "RECEPTION",
         "INVOICE", "RECEIPT", "TOTAL", "AGENDA", "MEETING", "BUDGET", "REPORT", "SUMMARY", "ROADMAP", "DEADLINE",
         "BIRTHDAY", "WEDDING", "CONCERT", "FESTIVAL", "MARATHON", "FINISH", "START", "NORTH", "SOUTH", "EAST",
         "WEST", "CENTRAL", "AVENUE", "STREET", "LANE", "ROAD", "HIGHWAY", "BAKER", "MILLER", "HARRISON", "OAKWOOD",
         "RIVERSIDE", "LAKEVIEW", "SUNSET", "MORNING", "COFFEE", "ESPRESSO", "BURGERS", "NOODLES", "DUMPLINGS",
         "FLOWERS", "BOOKS", "MUSIC", "VINYL", "GUITARS", "BICYCLES", "REPAIR", "LAUNDRY", "BARBER", "DENTIST",
         "VETERINARY", "FIREWORKS", "TOURNAMENT", "CHAMPIONS", "VOLUNTEERS", "RECYCLING", "ELEVATOR", "STAIRS"]
FONTS = ["/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf", "/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf",
         "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
         "/usr/share/fonts/truetype/liberation/LiberationMono-Bold.ttf"]
STYLES = {"sign": ((30, 90, 160), (255, 255, 255)), "screen": ((20, 20, 25), (120, 255, 140)),
          "paper": ((245, 242, 230), (30, 30, 30))}


def phrase(rng: random.Random) -> list[str]:
    """One to three words; one in five a made-up code (e.g. 'K7-2291'), a rare token no caption has."""
    words = rng.sample(WORDS, rng.choice([1, 1, 2, 3]))
    if rng.random() < 0.2:
        words[-1] = f"{rng.choice('ABCDEFGHKMNPRSTVXZ')}{rng.randint(1, 9)}-{rng.randint(1000, 9999)}"
    return words


def font(rng: random.Random, size: int) -> ImageFont.FreeTypeFont:
    have = [f for f in FONTS if Path(f).exists()]
    return ImageFont.truetype(rng.choice(have), size) if have else ImageFont.load_default(size=size)


def patch(words: list[str], style: str, rng: random.Random) -> Image.Image:
    bg, fg = STYLES[style]
    f = font(rng, 64)
    lines = [" ".join(words)] if len(words) < 3 or rng.random() < 0.5 else [" ".join(words[:2]), words[2]]
    boxes = [f.getbbox(line) for line in lines]
    w = max(b[2] - b[0] for b in boxes) + 48
    h = sum(b[3] - b[1] + 16 for b in boxes) + 32
    im = Image.new("RGB", (w, h), bg)
    d = ImageDraw.Draw(im)
    y = 16
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


def make(split: str, n: int, out: Path, seed: int = 0) -> dict:
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
    (out / "boxes.json").write_text(json.dumps(boxes))
    return truth


def split_cli(doc: str, make, n: int, n_help: str, folder: str) -> tuple[Path, dict]:
    """The command line of a generated set (this one, docset.py): --split, --n, --seed, --out -> (out, truth)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--split", default="dev", choices=["train", "dev", "test"])
    ap.add_argument("--n", type=int, default=n, help=n_help)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(folder) / args.split
    return out, make(args.split, args.n, out, args.seed)


def main() -> None:
    out, truth = split_cli(__doc__, make, 200, "photos with text (and as many without)", "artifacts/textset")
    print(f"{out}: {sum(bool(w) for w in truth.values())} photos with text, {sum(not w for w in truth.values())} without")


if __name__ == "__main__":
    main()
