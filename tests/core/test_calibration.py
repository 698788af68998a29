"""core/calibration.py: the curve (fit, apply, shift, stored form) and the calibration error."""
import numpy as np
import pytest

from crossprobe.core import calibration


def test_fit_recovers_a_known_probability_and_ece_measures_it():
    rng = np.random.default_rng(0)
    s = rng.uniform(-3, 3, 40_000)
    p = 1 / (1 + np.exp(-2 * s))  # the truth: P(match | score)
    y = (rng.random(len(s)) < p).astype(float)
    curve = calibration.fit(s, y)
    assert np.all(np.diff(curve.x) > 0) and np.all(np.diff(curve.y) >= 0) and len(curve.x) <= 200
    held = rng.uniform(-3, 3, 20_000)
    truth = 1 / (1 + np.exp(-2 * held))
    assert np.abs(curve(held) - truth).mean() < 0.03
    y_held = (rng.random(len(held)) < truth).astype(float)
    assert calibration.ece(curve(held), y_held) < 0.02  # calibrated
    assert calibration.ece(np.clip(truth + 0.2, 0, 1), y_held) > 0.1  # over-confident by up to 0.2: seen as such


def test_the_shift_judges_a_score_against_its_shortlist_and_keeps_the_order():
    c = calibration.Curve(np.array([0.0, 10.0]), np.array([0.0, 1.0]), shift=1.0)
    high = c.of_shortlist(np.array([12.0, 10.0, 8.0]))  # a query whose best stands 2 above the mean
    flat = c.of_shortlist(np.array([20.0, 19.9, 19.8]))  # higher scores, but nothing stands out
    assert high[0] == pytest.approx(0.2) and flat[0] == pytest.approx(0.01)
    assert list(np.argsort(-high)) == [0, 1, 2]
    assert c.of_shortlist(np.array([])).size == 0


def test_stored_form_round_trips_and_is_checked(tmp_path):
    cal = calibration.Calibration({"cp": calibration.Curve(np.array([-1.0, 2.0]), np.array([0.1, 0.7]), 0.5)},
                                  {"fingerprint": "x"})
    cal.save(tmp_path)
    back = calibration.Calibration.load(tmp_path)
    assert back.meta == {"fingerprint": "x"} and back.curves["cp"].shift == 0.5
    assert np.allclose(back.relevance("cp", np.array([2.0, -1.0])), cal.relevance("cp", np.array([2.0, -1.0])))
    assert back.relevance("temde", np.array([1.0])) is None
    assert calibration.Calibration.load(tmp_path / "none") is None
    for bad in ({"x": [1, 0], "y": [0, 1]}, {"x": [0, 1], "y": [1, 0]}, {"x": [0, 1], "y": [0, 2]},
                {"x": [0], "y": []}, {"x": [0, 1], "y": [0, 1], "shift": -1}):
        with pytest.raises(ValueError):
            calibration.Curve.from_json(bad)
