"""A text-in-image set made reproducibly from Flickr8k photos (issue 31): words on signs, screens and paper.

Each photo of a split gets, with a fixed seed, one patch: a sign (a solid board), a screen (dark with light
text) or a paper sheet (off-white with dark text), carrying one to three words from WORDS or a made-up code
(a name, a number: the rare words keyword search is for). The patch is drawn with a TrueType font, turned by a
perspective warp, blurred a little and pasted at 20-50% of the photo's width. The same number of other photos of
the split are left as they are: the negatives a text gate must reject. Ground truth: the words drawn on each.

    python -m research.text_search.textset --split dev --n 200 --out artifacts/textset/dev
        -> <out>/images/*.jpg, <out>/truth.json ({image: [words]}, negatives with []),
           <out>/boxes.json ({image: [x, y, w, h, photo w, photo h]} of each patch: where the text is)

The set is made by crossprobe.models.training.text_gate_sets (the served text gate trains on it: `crossprobe
fit-text-gate`); this is its command line. Photos and derived images stay under artifacts/ (never in the repository).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from crossprobe.models.training.text_gate_sets import WORDS, make_signs as make  # noqa: F401 (WORDS: engines.py)


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
