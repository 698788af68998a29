"""Calibrated relevance: a ranking score -> the probability that the result matches the query, per rerank mode.

A score means different things per mode (a cosine near 0.3 for none, a fused logit near 10 for cp), so no
min_score threshold means "relevant". Each mode gets a monotone curve fitted by isotonic regression on the
dev captions' served results (`crossprobe calibrate`, models/training/calibrate.py): for every caption, its
shortlist through the API, labelled 1 where the result is the caption's own photo. The curve is stored beside the
checkpoint's
weights as calibration.json, so it travels with the model it was fitted for (it is not part of the
fingerprint: refitting needs no reindex). Applying it needs only numpy (np.interp between the fitted points),
so the torch-free runtime image uses it too.

The probability is of "this is the photo the caption was written for", on collections like the dev sets (a
thousand-odd photos): conservative where a collection holds many photos that fit a query equally well.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FILE = "calibration.json"


@dataclass
class Curve:
    """A non-decreasing piecewise-linear map z -> probability, flat beyond its ends, where z = score - shift x
    (the mean score of the query's shortlist). shift 0: the score alone; shift 1: the score against what the
    same query gives every candidate; more: the lead over the shortlist counts more than the score itself.
    Within one query z keeps the score's order, so relevance never reorders results."""

    x: np.ndarray  # (n,) increasing z
    y: np.ndarray  # (n,) non-decreasing probabilities in [0, 1]
    shift: float = 0.0

    def __call__(self, z: np.ndarray) -> np.ndarray:
        return np.interp(np.asarray(z, np.float64), self.x, self.y)

    def of_shortlist(self, scores: np.ndarray) -> np.ndarray:
        """Relevance of each candidate of one query's shortlist (scores: all of them, (K,))."""
        scores = np.asarray(scores, np.float64)
        return self(scores - self.shift * scores.mean()) if len(scores) else scores

    def to_json(self) -> dict:
        return {
            "x": [round(float(v), 6) for v in self.x],
            "y": [round(float(v), 6) for v in self.y],
            "shift": self.shift,
        }

    @classmethod
    def from_json(cls, d: dict) -> "Curve":
        x, y = np.asarray(d["x"], np.float64), np.asarray(d["y"], np.float64)
        if (
            x.ndim != 1
            or x.shape != y.shape
            or len(x) < 1
            or np.any(np.diff(x) < 0)
            or np.any(np.diff(y) < 0)
            or y.min() < 0
            or y.max() > 1
        ):
            raise ValueError("a calibration curve needs increasing x and non-decreasing y in [0, 1] of one length")
        shift = float(d.get("shift", 0.0))
        if not 0 <= shift <= 4:
            raise ValueError(f"a calibration curve's shift is in [0, 4], not {shift}")
        return cls(x, y, shift)


@dataclass
class Calibration:
    curves: dict[str, Curve]  # rerank mode (none | cp | temde) -> its curve
    meta: dict  # how it was fitted: data, command, ECE per set (models/training/calibrate.py)

    def relevance(self, mode: str, scores: np.ndarray) -> np.ndarray | None:
        """scores: every candidate of one query's shortlist, as ranked in `mode` -> their relevance (None: the
        mode has no curve)."""
        curve = self.curves.get(mode)
        return None if curve is None else curve.of_shortlist(scores)

    @classmethod
    def load(cls, ckpt: Path) -> "Calibration | None":
        """The checkpoint directory's calibration.json; None where it has none (results carry no relevance)."""
        p = Path(ckpt) / FILE
        if not p.exists():
            return None
        d = json.loads(p.read_text())
        return cls({m: Curve.from_json(c) for m, c in d["curves"].items()}, d.get("meta", {}))

    def save(self, ckpt: Path) -> None:
        from crossprobe.core.atomic import atomic_write

        atomic_write(
            Path(ckpt) / FILE,
            json.dumps({"curves": {m: c.to_json() for m, c in self.curves.items()}, "meta": self.meta}, indent=1),
        )


def fit(
    scores: np.ndarray, labels: np.ndarray, weights: np.ndarray | None = None, max_points: int = 200, shift: float = 0.0
) -> Curve:
    """Isotonic regression of labels (0/1) on scores (already less shift x their shortlist's mean), rows weighted
    by `weights` -> a Curve of at most max_points points (fit time only: scikit-learn is not in the runtime image)."""
    from sklearn.isotonic import IsotonicRegression

    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(scores, labels, sample_weight=weights)
    x, y = np.asarray(iso.X_thresholds_, np.float64), np.asarray(iso.y_thresholds_, np.float64)
    if len(x) > max_points:  # keep the curve small: points at even quantiles of the thresholds, ends kept
        keep = np.unique(np.linspace(0, len(x) - 1, max_points).round().astype(int))
        x, y = x[keep], y[keep]
    return Curve(x, np.maximum.accumulate(y), shift)


def reliability(p: np.ndarray, y: np.ndarray, bins: int = 10) -> list[dict]:
    """Equal-width bins of predicted probability -> per bin: count, mean predicted, fraction positive."""
    p, y = np.asarray(p, np.float64), np.asarray(y, np.float64)
    edges = np.linspace(0, 1, bins + 1)
    which = np.clip(np.digitize(p, edges[1:-1]), 0, bins - 1)
    out = []
    for b in range(bins):
        m = which == b
        out.append(
            {
                "lo": round(float(edges[b]), 3),
                "hi": round(float(edges[b + 1]), 3),
                "n": int(m.sum()),
                "predicted": round(float(p[m].mean()), 4) if m.any() else None,
                "observed": round(float(y[m].mean()), 4) if m.any() else None,
            }
        )
    return out


def ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error: the count-weighted mean |predicted - observed| over equal-width bins."""
    n = len(p)
    return float(sum(b["n"] / n * abs(b["predicted"] - b["observed"]) for b in reliability(p, y, bins) if b["n"]))
