"""The demo runs the committed checkpoint over real photos, offline."""
import numpy as np
from PIL import Image

from crossprobe import checkpoint
from crossprobe.demo import EXPECTED, QUERIES, run_demo, sample_gallery


def test_sample_gallery_is_bundled():
    g = sample_gallery()
    assert {"cat", "coffee", "rocket", "astronaut", "motorcycle", "horse"} <= set(g)


def test_demo_ranks_the_gallery():
    res = run_demo(None, None, 3, None, echo=lambda *_: None)
    assert list(res) == QUERIES and all(len(v) == 3 for v in res.values())
    assert res["a cat"][0] == "cat"
    assert res["a man riding a motorcycle"][0] == "motorcycle"
    # the committed model card tells the truth: its demo table's first image for every query is what the
    # demo ranks first (the card also says where the model fails: coffee, rocket, astronaut, and the
    # black-and-white horse, second behind the retina photo)
    card = (checkpoint.DEFAULT_CHECKPOINT / "MODEL_CARD.md").read_text()
    rows = [line.split(" | ") for line in card.splitlines() if line.startswith("| ") and line[2:].split(" | ")[0] in res]
    assert len(rows) == len(QUERIES)
    for r in rows:
        query, top = r[0][2:], r[1].split(", ")
        assert res[query][0] == top[0], query
    hits = sum(res[q][0] == photo for q, photo in EXPECTED.items())
    assert hits >= 2


def test_demo_on_a_folder_skips_unreadable_files(tmp_path):
    Image.fromarray(np.full((50, 50, 3), 200, np.uint8)).save(tmp_path / "a.png")
    (tmp_path / "broken.jpg").write_bytes(b"not an image")
    msgs = []
    res = run_demo(tmp_path, ["a white wall"], 3, None, echo=msgs.append)
    assert res["a white wall"] == ["a.png"]
