"""Documents and screens, made reproducibly: pages, receipts, slides and screenshots (issue 31's text gate).

textset.py puts one small sign into a photo. A library also holds pictures that are mostly text: a scanned page,
a receipt, a slide, a screenshot. Squashed to the encoder's 224 x 224 their text is a texture, not a sign, and a
gate trained on signs alone misses them (the demo's page.jpg). This makes such pictures with the lines' boxes: in
one of three the document is photographed, pasted at 50-90% of a Flickr8k photo of the same split. The words are
those of the split's captions, so no word crosses splits.

    python -m research.text_search.docset --split train --n 300 --out artifacts/docset/train
        -> <out>/images/*.jpg, <out>/boxes.json ({image: [[x0, y0, x1, y1] of each line]}),
           <out>/truth.json ({image: [words]})

The documents are made by crossprobe.models.training.text_gate_sets (the served text gate trains on them:
`crossprobe fit-text-gate`); this is their command line.
"""
from __future__ import annotations

from crossprobe.models.training.text_gate_sets import make_documents as make
from research.text_search.textset import split_cli


def main() -> None:
    out, truth = split_cli(__doc__, make, 100, "documents and screens", "artifacts/docset")
    print(f"{out}: {len(truth)} documents")


if __name__ == "__main__":
    main()
