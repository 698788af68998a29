"""The text gate (core/text_gate.py): the trained checkpoint, its geometry and its folding."""
from __future__ import annotations

import numpy as np
import pytest

from crossprobe.core.text_gate import DEFAULT_GATE, TextGate, TextGateConfig


def test_the_shipped_gate_loads_with_its_threshold():
    gate = TextGate.load()
    assert gate.w.shape == (1280,) and 0 < gate.cfg.threshold < 1
    assert TextGate.load(threshold=0.5).cfg.threshold == 0.5  # CROSSPROBE_INDEX_OCR_GATE_THRESHOLD
    assert (DEFAULT_GATE / "config.json").is_file()


def test_cells_are_probabilities_per_cell():
    gate = TextGate(np.ones(1280, np.float32) / 1280, 0.0, TextGateConfig(0.6))
    grid = np.zeros((2, 49, 1280), np.float32)
    grid[1, 10] = 5.0  # one cell of the second photo
    p = gate.cells(grid)
    assert p.shape == (2, 49) and np.allclose(p[0], 0.5) and p[1, 10] > 0.99 and np.allclose(p[1, :10], 0.5)


def test_the_crop_is_the_passing_cells_widened_by_the_margin():
    gate = TextGate(np.zeros(1280, np.float32), 0.0, TextGateConfig(0.6, margin=1))
    p = np.zeros(49)
    assert gate.crop(p, 700, 350) is None  # nothing passes: nothing is read
    p[3 * 7 + 3] = 0.9  # the middle cell
    assert gate.crop(p, 700, 350) == (200, 100, 500, 250)  # cells 2..4 in both directions
    p[0] = 0.9  # and the top-left corner: the box spans both, clipped at the photo's edge
    assert gate.crop(p, 700, 350) == (0, 0, 500, 250)
    assert TextGate(gate.w, 0.0, TextGateConfig(0.6, margin=0)).crop(p, 700, 350) == (0, 0, 400, 200)


def test_a_standardised_probe_folds_into_raw_weights():
    rng = np.random.default_rng(0)
    w, mu, sd = rng.normal(size=1280), rng.normal(size=1280), rng.uniform(0.5, 2, 1280)
    x = rng.normal(size=(3, 49, 1280)).astype(np.float32)
    gate = TextGate.from_standardised(w, 0.3, mu, sd, TextGateConfig(0.5))
    want = 1 / (1 + np.exp(-(((x - mu) / sd) @ w + 0.3)))
    assert np.allclose(gate.cells(x), want, atol=1e-4)


def test_bad_configs_are_refused():
    for bad in (dict(threshold=0.0), dict(threshold=1.0), dict(threshold=0.5, margin=7)):
        with pytest.raises(ValueError):
            TextGateConfig(**bad)
    with pytest.raises(ValueError):
        TextGate(np.zeros(10), 0.0, TextGateConfig(0.5))
