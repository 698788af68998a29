"""A generated mini-corpus in the Flickr8k layout (24 coloured squares, 5 captions
each, 16/4/4 split) for end-to-end training tests without the shared data."""
import numpy as np
import pytest
from PIL import Image

COLORS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220), "yellow": (230, 220, 30)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("flickr")
    (root / "images").mkdir()
    (root / "splits").mkdir()
    rng = np.random.default_rng(0)
    names, rows = [], []
    for i in range(24):
        color = list(COLORS)[i % 4]
        arr = np.clip(np.array(COLORS[color]) + rng.normal(0, 20, (64, 64, 3)), 0, 255).astype(np.uint8)
        name = f"{i:04d}_img.jpg"
        Image.fromarray(arr).save(root / "images" / name)
        names.append(name)
        rows += [(name, f"a {color} square number {k}") for k in range(5)]
    (root / "captions.tsv").write_text("image\tcaption\n" + "".join(f"{n}\t{c}\n" for n, c in rows))
    (root / "splits" / "train.txt").write_text("\n".join(names[:16]))
    (root / "splits" / "dev.txt").write_text("\n".join(names[16:20]))
    (root / "splits" / "test.txt").write_text("\n".join(names[20:]))
    return root
