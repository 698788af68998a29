"""Write research/region_labels/imagenet_hypernyms.tsv once, from the WordNet 3.0 database Debian ships.

    apt-get install wordnet-base && python scripts/write_imagenet_hypernyms.py [/usr/share/wordnet]

For each of the 1,000 ImageNet classes (models/data/imagenet_classes.tsv, whose synset ids are WordNet 3.0 noun
offsets), every ancestor through hypernym and instance-hypernym links, with the number of ImageNet classes below
it. The region labels' hypernym matching (research/region_labels/vocabulary.py; measured, not served, so the table
lives beside that script and not in the installed package) keeps the ancestors that group a few classes ("dog" over
118 breeds, "car" over a dozen) and drops the abstract ones ("artifact" over half of ImageNet).
"""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ROOT / "models" / "data" / "imagenet_classes.tsv"
OUT = ROOT / "research" / "region_labels" / "imagenet_hypernyms.tsv"
HEADER = """# The WordNet 3.0 ancestors of each ImageNet-1k class: synset id, first lemma, and how many of the 1,000 classes
# lie below it. Written by scripts/write_imagenet_hypernyms.py from Debian's wordnet-base (WordNet 3.0, Princeton
# University, WordNet 3.0 licence: free use, copy and distribution with this notice;
# https://wordnet.princeton.edu/license-and-commercial-use).
"""


def read_nouns(root: Path) -> tuple[dict[str, list[str]], dict[str, str]]:
    """data.noun -> (offset -> hypernym offsets, offset -> first lemma with spaces)."""
    parents, names = {}, {}
    for line in (root / "data.noun").read_text(encoding="latin-1").splitlines():
        if line.startswith("  "):  # the licence header
            continue
        f = line.split(" | ")[0].split()
        off, n_words = f[0], int(f[3], 16)
        names[off] = f[4].replace("_", " ")
        i = 4 + 2 * n_words
        n_ptr = int(f[i])
        ptrs = [f[i + 1 + 4 * k : i + 5 + 4 * k] for k in range(n_ptr)]
        parents[off] = [p[1] for p in ptrs if p[0] in ("@", "@i") and p[2] == "n"]
    return parents, names


def ancestors(off: str, parents: dict[str, list[str]]) -> set[str]:
    seen, todo = set(), list(parents.get(off, []))
    while todo:
        a = todo.pop()
        if a not in seen:
            seen.add(a)
            todo += parents.get(a, [])
    return seen


def main(root: str = "/usr/share/wordnet") -> None:
    parents, names = read_nouns(Path(root))
    rows = [line.split("\t") for line in CLASSES.read_text().splitlines() if line and not line.startswith(("#", "index"))]
    anc = {int(i): sorted(ancestors(s[1:], parents)) for i, s, _ in rows}
    below = defaultdict(int)
    for a in anc.values():
        for off in a:
            below[off] += 1
    out = [f"{c}\tn{off}\t{names[off]}\t{below[off]}" for c, a in sorted(anc.items()) for off in a]
    OUT.write_text(HEADER + "index\tancestor\tname\tclasses_below\n" + "\n".join(out) + "\n")
    print(f"wrote {OUT} ({len(out)} rows, {len(below)} ancestors)")


if __name__ == "__main__":
    main(*sys.argv[1:])
