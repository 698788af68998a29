"""Text gate: which of a photo's 7 x 7 backbone cells carry writing, from the grid the indexer computes anyway.

Index-time OCR (indexer/jobs/ocr.py) is too slow to run on every photo (about 200 ms on one core against the
encoder's 16 ms). This gate is a logistic regression over each cell's frozen EfficientNet-Lite0 features:

    z_j  = grid_j @ w + b                  (B, 49)   grid: (B, 49, 1280), the backbone's output
    p_j  = sigmoid(z_j)                    (B, 49)   probability that cell j holds writing
    pass = max_j p_j >= threshold          (B,)      only these photos are read
    crop = the cells with p_j >= threshold, widened by `margin` cells: the part of the photo OCR reads

It costs one (49 x 1280) . (1280) product per photo, where rapidocr's own detector as a gate costs about 13 ms.
Trained by `crossprobe fit-text-gate` (models/training/text_gate.py) on Flickr8k train photos with synthetic signs
(a cell is writing where the sign covers it), on the real writing full OCR reads in other train photos, and on
generated documents and screens; the threshold is chosen there on dev, and its recall and pass rate are in
docs/research/text_search.md. The backbone is the same for every crossprobe checkpoint, so one gate serves them all.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from crossprobe.core import DEFAULT_CHECKPOINT
from crossprobe.core.inputs import GRID, IMAGE_FEAT_DIM

# the committed gate: package data of crossprobe.models, beside the committed checkpoint
DEFAULT_GATE = DEFAULT_CHECKPOINT.parent / "text_gate"


@dataclass(frozen=True)
class TextGateConfig:
    threshold: float  # a photo passes when its best cell's probability reaches this
    margin: int = 1  # cells added on each side of the passing cells: a word runs on past the cell that shows it

    def __post_init__(self):
        if not 0.0 < self.threshold < 1.0 or not 0 <= self.margin < GRID:
            raise ValueError(f"bad text gate config {self}")


class TextGate:
    def __init__(self, w: np.ndarray, b: float, cfg: TextGateConfig):
        if w.shape != (IMAGE_FEAT_DIM,):
            raise ValueError(f"text gate weights {w.shape}, expected ({IMAGE_FEAT_DIM},)")
        self.w, self.b, self.cfg = np.asarray(w, np.float32), float(b), cfg

    def cells(self, grid: np.ndarray) -> np.ndarray:
        """(B, 49, 1280) -> (B, 49) probability of writing per cell."""
        z = grid @ self.w + self.b
        return 1.0 / (1.0 + np.exp(-z))

    def crop(self, p: np.ndarray, width: int, height: int) -> tuple[int, int, int, int] | None:
        """(49,) one photo's cell probabilities, its size -> (x0, y0, x1, y1) the part to read, None: no text.
        The grid is the photo squashed to a square (core/inputs.py), so a cell is a 1/7 x 1/7 tile of it."""
        on = np.argwhere(p.reshape(GRID, GRID) >= self.cfg.threshold)
        if not len(on):
            return None
        m = self.cfg.margin
        (r0, c0), (r1, c1) = np.maximum(on.min(0) - m, 0), np.minimum(on.max(0) + m, GRID - 1)
        return (
            int(c0 * width / GRID),
            int(r0 * height / GRID),
            int(round((c1 + 1) * width / GRID)),
            int(round((r1 + 1) * height / GRID)),
        )

    def save(self, folder: Path, about: dict | None = None) -> None:
        """The folder (model.safetensors, config.json), written whole under a temporary name and renamed."""
        from safetensors.numpy import save_file

        from crossprobe.core.atomic import atomic_dir

        with atomic_dir(folder) as tmp:
            save_file({"w": self.w, "b": np.asarray([self.b], np.float32)}, str(tmp / "model.safetensors"))
            (tmp / "config.json").write_text(json.dumps({"gate": asdict(self.cfg), **(about or {})}, indent=1) + "\n")

    @classmethod
    def load(cls, folder: Path = DEFAULT_GATE, threshold: float | None = None) -> "TextGate":
        """threshold: instead of the trained one (CROSSPROBE_INDEX_OCR_GATE_THRESHOLD)."""
        from safetensors.numpy import load_file

        t = load_file(str(folder / "model.safetensors"))
        cfg = json.loads((folder / "config.json").read_text())["gate"]
        if threshold is not None:
            cfg = {**cfg, "threshold": threshold}
        return cls(t["w"], float(t["b"][0]), TextGateConfig(**cfg))

    @classmethod
    def from_standardised(
        cls, w: np.ndarray, b: float, mu: np.ndarray, sd: np.ndarray, cfg: TextGateConfig
    ) -> "TextGate":
        """A probe fitted on (x - mu) / sd, folded into one (w, b) on raw features."""
        return cls(w / sd, b - float((mu / sd) @ w), cfg)
