"""The demo runs the committed checkpoint over real photos, offline."""
import numpy as np
from PIL import Image

from crossprobe.demo import EXPECTED, QUERIES, run_demo, sample_gallery


def test_sample_gallery_is_bundled():
    g = sample_gallery()
    assert {"cat", "coffee", "rocket", "astronaut", "motorcycle", "horse"} <= set(g)


def test_demo_ranks_the_gallery():
    res = run_demo(None, None, 3, None, echo=lambda *_: None)
    assert list(res) == QUERIES and all(len(v) == 3 for v in res.values())
    # what the model card reports for the committed checkpoint: the cat, the motorcycle and the
    # horse come first for their queries; the coffee cup, rocket and astronaut do not (card: "Where it fails")
    assert res["a cat"][0] == "cat"
    assert res["a man riding a motorcycle"][0] == "motorcycle"
    assert res["a black and white photo of a horse"][0] == "horse"
    hits = sum(res[q][0] == photo for q, photo in EXPECTED.items())
    assert hits >= 3


def test_demo_on_a_folder_skips_unreadable_files(tmp_path):
    Image.fromarray(np.full((50, 50, 3), 200, np.uint8)).save(tmp_path / "a.png")
    (tmp_path / "broken.jpg").write_bytes(b"not an image")
    msgs = []
    res = run_demo(tmp_path, ["a white wall"], 3, None, echo=msgs.append)
    assert res["a white wall"] == ["a.png"]
