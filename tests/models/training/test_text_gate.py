"""The text gate's fit (models/training/text_gate.py) on generated data: cover geometry, which cells train, a probe
that finds the cells a sign covers, the threshold at a pass rate, and the same bytes from the same data.

The grids are generated here (a "writing" direction added to the cells a sign covers), so the test needs neither
Flickr8k nor the backbone nor OCR; `crossprobe fit-text-gate` runs the same functions on real photos."""
import json

import numpy as np
import pytest
from PIL import Image

from crossprobe.core import inputs
from crossprobe.core.text_gate import TextGate
from crossprobe.models.training import text_gate as fit

G = inputs.GRID


def test_a_box_covers_the_cells_under_it():
    c = fit.cell_cover([0, 0, 100, 100, 700, 700]).reshape(G, G)  # a cell is 100 x 100 here: exactly the first
    assert c[0, 0] == 1.0 and c.sum() == 1.0
    part = fit.cell_cover([0, 0, 50, 130, 700, 700]).reshape(G, G)  # half a cell wide, 1.3 tall
    assert part[0, 0] == pytest.approx(0.5) and part[1, 0] == pytest.approx(0.5 * 0.3) and part.sum() == pytest.approx(0.65)


def test_only_covered_and_uncovered_cells_train():
    feats = np.arange(2 * 49 * inputs.IMAGE_FEAT_DIM, dtype=np.float32).reshape(2, 49, -1)
    cover = np.zeros((2, 49))
    cover[0, 0], cover[0, 1] = 0.9, 0.1  # covered; partly: left out
    x, y = fit.training_cells(feats, cover, fit.MIN_COVER)
    assert len(x) == 2 * 49 - 1 and y.sum() == 1 and np.array_equal(x[y][0], feats[0, 0])


def _sign_set(folder, n: int, seed: int):
    """n photos with a sign box and n without (small generated JPEGs; the grids are generated apart)."""
    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True)
    truth, boxes = {}, {}
    for k in range(2 * n):
        name = f"{'t' if k < n else 'n'}{k:04d}_p{k}.jpg"
        Image.fromarray((rng.random((70, 70, 3)) * 255).astype(np.uint8)).save(folder / "images" / name)
        truth[name] = ["EXIT"] if k < n else []
        if k < n:
            r, c = rng.integers(0, G - 1, 2)
            boxes[name] = [int(c * 10), int(r * 10), 20, 20, 70, 70]  # 2 x 2 cells
    (folder / "truth.json").write_text(json.dumps(truth))
    (folder / "boxes.json").write_text(json.dumps(boxes))


def _fake_grids(monkeypatch, seed: int = 0):
    """grids() -> noise, plus a fixed direction in the cells a sign covers (read back from the set's boxes)."""
    direction = np.random.default_rng(99).standard_normal(inputs.IMAGE_FEAT_DIM).astype(np.float32)

    def grids(paths, cache):
        rng = np.random.default_rng(seed + len(paths))
        out = rng.standard_normal((len(paths), G * G, inputs.IMAGE_FEAT_DIM)).astype(np.float32)
        for i, p in enumerate(paths):
            boxes = json.loads((p.parent.parent / "boxes.json").read_text())
            if p.name in boxes:
                out[i] += 3 * np.outer(fit.cell_cover(boxes[p.name]) >= fit.MIN_COVER, direction)
        return out
    monkeypatch.setattr(fit, "grids", grids)


def test_the_probe_finds_the_sign_and_refits_to_the_same_bytes(tmp_path, monkeypatch):
    _sign_set(tmp_path / "train", 12, seed=0)
    _fake_grids(monkeypatch)
    gate, info = fit.train_probe(tmp_path / "train", None, 0, 0.1, tmp_path / "cache", log=lambda *_: None)
    assert info["train_positive_cells"] == 12 * 4 and info["train_cells"] == 24 * 49
    names, paths, has, cover = fit.sign_set(tmp_path / "train")
    p = gate.cells(fit.grids(paths, None))
    assert p[cover >= fit.MIN_COVER].min() > 0.9 > 0.1 > p[cover == 0].max()
    gate.save(tmp_path / "a")
    again, _ = fit.train_probe(tmp_path / "train", None, 0, 0.1, tmp_path / "cache", log=lambda *_: None)
    again.save(tmp_path / "b")
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert TextGate.load(tmp_path / "a").cfg.threshold == 0.5


def test_the_threshold_passes_the_detector_s_share_of_plain_photos(tmp_path, monkeypatch):
    _sign_set(tmp_path / "dev", 4, seed=1)
    _fake_grids(monkeypatch, seed=1)
    _sign_set(tmp_path / "train", 12, seed=0)
    gate, _ = fit.train_probe(tmp_path / "train", None, 0, 0.1, tmp_path / "cache", log=lambda *_: None)
    names, paths, has, _ = fit.sign_set(tmp_path / "dev")
    plain = ~has
    verdicts = {str(p): i % 4 == 0 for i, p in enumerate(paths)}  # the detector passes a known share
    monkeypatch.setattr(fit, "cached", lambda path, keys, fn: verdicts)
    t, chosen = fit.choose_threshold(gate, paths, plain, tmp_path / "cache", None)
    score = gate.cells(fit.grids(paths, None)).max(1)[plain]
    rate = np.mean([verdicts[str(p)] for p, q in zip(paths, plain) if q])
    assert t == fit.threshold_at(score, rate) and chosen["dev"]["photos_without_sign"] == int(plain.sum())
    t50, chosen50 = fit.choose_threshold(gate, paths, plain, tmp_path / "cache", 50.0)
    assert np.mean(score >= t50) == pytest.approx(0.5) and "50%" in chosen50["threshold_rule"]
