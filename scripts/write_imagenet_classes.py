"""Write models/data/imagenet_classes.tsv once, from the class lists timm ships.

    pip download --no-deps timm -d /tmp/timm && python scripts/write_imagenet_classes.py /tmp/timm/timm-*.whl

timm is read from its wheel (a zip) and is not a dependency of crossprobe. The
ImageNet-1k class order is the sorted WordNet synset ids (timm's
`imagenet_synsets.txt`), which is the order of EfficientNet-Lite's 1,000 logits;
the names are WordNet lemmas (timm's `imagenet_synset_to_lemma.txt`).
"""
from __future__ import annotations

import sys
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "crossprobe" / "models" / "data" / "imagenet_classes.tsv"
HEADER = """# ImageNet-1k classes in the order of EfficientNet-Lite's 1,000 logits: index, WordNet synset id, lemmas.
# Source: timm {version} (Apache-2.0), timm/data/_info/imagenet_synsets.txt and imagenet_synset_to_lemma.txt,
# written by scripts/write_imagenet_classes.py. The lemmas are from WordNet 3.0 (Princeton University,
# WordNet 3.0 licence: free use, copy and distribution with this notice; https://wordnet.princeton.edu/license-and-commercial-use).
"""


def main(wheel: str) -> None:
    with zipfile.ZipFile(wheel) as z:
        synsets = z.read("timm/data/_info/imagenet_synsets.txt").decode().split()
        lemmas = dict(line.split("\t", 1) for line in z.read("timm/data/_info/imagenet_synset_to_lemma.txt").decode().splitlines() if "\t" in line)
    assert len(synsets) == 1000 and synsets == sorted(synsets), "expected the 1,000 sorted ImageNet-1k synsets"
    version = Path(wheel).name.split("-")[1]
    rows = [f"{i}\t{s}\t{lemmas[s].strip()}" for i, s in enumerate(synsets)]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(HEADER.format(version=version) + "index\tsynset\tlemmas\n" + "\n".join(rows) + "\n")
    print(f"wrote {OUT} ({len(rows)} classes)")


if __name__ == "__main__":
    main(sys.argv[1])
