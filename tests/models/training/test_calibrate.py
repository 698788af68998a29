"""The relevance fit (models/training/calibrate.py) on generated served results: one curve per mode, its shift from
SHIFTS, what it stores in a checkpoint, and the same curves from the same rows."""
import json

import numpy as np

from crossprobe.core import calibration
from crossprobe.models.training import calibrate as cal


def _rows(rng, captions: int, photos: int, mode_gain: float) -> tuple[list, dict]:
    """Each caption's shortlist of every photo: its own photo scores higher on average (by mode_gain)."""
    pairs = [(f"caption {q}", f"p{q % photos}") for q in range(captions)]
    score, label, rank, query = [], [], [], []
    for q, (_, gold) in enumerate(pairs):
        s = rng.normal(0.2, 0.05, photos)
        s[q % photos] += mode_gain * rng.random()
        order = np.argsort(-s)
        score += s[order].tolist()
        label += [int(f"p{i}" == gold) for i in order]
        rank += list(range(photos))
        query += [q] * photos
    return pairs, {"score": np.asarray(score), "label": np.asarray(label), "rank": np.asarray(rank),
                   "query": np.asarray(query)}


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    sets, data = {}, {m: {} for m in cal.MODES}
    for name, captions, photos in (("f8k-dev", 120, 30), ("ood-dev", 40, 40)):
        for m, gain in zip(cal.MODES, (0.1, 0.3, 0.2)):
            pairs, rows = _rows(rng, captions, photos, gain)
            data[m][name] = rows
        sets[name] = {"pairs": pairs, "images": photos}
    absent = {m: [rng.normal(0.2, 0.05, 40).tolist() for _ in cal.ABSENT] for m in cal.MODES}
    return data, absent, sets


def test_one_monotone_curve_per_mode_with_a_shift_from_the_grid():
    data, absent, sets = _data()
    out = cal.analyse(data, absent, sets)
    assert set(out["curves"]) == set(cal.MODES)
    for m in cal.MODES:
        c = calibration.Curve.from_json(out["curves"][m])  # validates: increasing x, non-decreasing y in [0, 1]
        assert c.shift in cal.SHIFTS
        assert set(out["ece"][m]) == set(sets) and all(0 <= v <= 1 for v in out["ece"][m].values())
        assert len(out["absent"][m]["top1_relevance"]) == len(cal.ABSENT)
    assert out["sets"] == {"f8k-dev": {"captions": 120, "photos": 30}, "ood-dev": {"captions": 40, "photos": 40}}


def test_the_same_rows_give_the_same_file(tmp_path):
    """What makes `crossprobe calibrate` reproducible: the fit has no randomness beyond its fixed-seed folds, and the
    cached scores it reads back are the rows it saved."""
    data, absent, sets = _data()
    cal.save_scores(tmp_path / "scores.json", data, absent)
    again, absent_again = cal.load_scores(tmp_path / "scores.json")
    meta = {"fingerprint": "f" * 16, "command": "test"}
    files = []
    for d, a in ((data, absent), (again, absent_again)):
        out = cal.analyse(d, a, sets)
        out["meta"] = meta
        ckpt = tmp_path / f"ck{len(files)}"
        ckpt.mkdir()
        cal.served(out).save(ckpt)
        files.append((ckpt / calibration.FILE).read_bytes())
    assert files[0] == files[1]
    stored = json.loads(files[0])
    assert set(stored["meta"]) == {"ece", "ece_top1", "sets", "fingerprint", "command"}
    loaded = calibration.Calibration.load(tmp_path / "ck0")
    assert set(loaded.curves) == set(cal.MODES)
