"""Calibrated answer scores: the Platt fit, its storage, and what a calibrated reader reports."""
import math
import random

import pytest

from fastqa.errors import UserError
from fastqa.tasks.qa.calibration import Calibration, fit_platt
from fastqa.tasks.qa.metric import exact_matches


def _platt_data(n: int, slope: float, bias: float, seed: int = 0) -> tuple[list[float], list[bool]]:
    """Raw scores uniform in (0, 1), each right with the probability a known Platt map gives it."""
    rng = random.Random(seed)
    raw, right = [], []
    truth = Calibration(slope, bias, "truth", n)
    for _ in range(n):
        s = rng.uniform(0.01, 0.99)
        raw.append(s)
        right.append(rng.random() < truth(s))
    return raw, right


def test_fit_recovers_a_known_map():
    raw, right = _platt_data(20000, slope=0.6, bias=-0.8)
    cal = fit_platt(raw, right, fitted_on="synthetic")
    assert cal.slope == pytest.approx(0.6, abs=0.05) and cal.bias == pytest.approx(-0.8, abs=0.05)
    assert cal.questions == 20000 and cal.fitted_on == "synthetic"


def test_calibration_lowers_an_overconfident_readers_error():
    from fastqa.plots import expected_calibration_error

    # Right with probability raw**3: a reader that is far less often right than its scores claim.
    rng = random.Random(1)
    raw = [rng.uniform(0.0, 1.0) for _ in range(5000)]
    right = [rng.random() < s ** 3 for s in raw]
    cal = fit_platt(raw, right, fitted_on="synthetic")
    before = expected_calibration_error(raw, right)
    after = expected_calibration_error([cal(s) for s in raw], right)
    assert before > 0.15 and after < 0.05 and after < before / 3


def test_map_is_increasing_bounded_and_round_trips():
    cal = Calibration(0.7, -0.3, "x", 10)
    xs = [0.0, 1e-9, 0.01, 0.2, 0.5, 0.8, 0.99, 1.0]
    ys = [cal(x) for x in xs]
    assert all(0.0 < y < 1.0 for y in ys) and ys == sorted(ys)
    assert cal(0.5) == pytest.approx(1 / (1 + math.exp(0.3)))
    assert Calibration.from_dict(cal.to_dict()) == cal


@pytest.mark.parametrize("bad", [None, [], {"method": "isotonic", "slope": 1, "bias": 0}, {"bias": 0},
                                 {"slope": -1.0, "bias": 0.0}, {"slope": "x", "bias": 0}, {"slope": 1, "bias": math.inf}])
def test_bad_stored_calibration_is_named(bad):
    with pytest.raises(UserError, match="calib"):
        Calibration.from_dict(bad, "run/calibration.json")


def test_fit_needs_right_and_wrong_answers():
    with pytest.raises(UserError, match="right and wrong"):
        fit_platt([0.2, 0.9], [True, True], fitted_on="dev articles 36:40")
    with pytest.raises(ValueError, match="length"):
        fit_platt([0.2], [True, False], fitted_on="x")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        fit_platt([1.5, 0.2], [True, False], fitted_on="x")


def test_exact_matches_use_the_official_normalisation():
    data = {"data": [{"paragraphs": [{"context": "c", "qas": [
        {"id": "a", "answers": [{"text": "The Broncos"}, {"text": "Denver"}]},
        {"id": "b", "answers": [{"text": "1937"}]},
        {"id": "c", "answers": []},                       # v2.0: no answer
        {"id": "d", "answers": [{"text": "x"}]}]}]}]}
    got = exact_matches(data, {"a": "broncos.", "b": "in 1937", "c": ""})
    assert got == {"a": True, "b": False, "c": True}   # "d" unanswered: not counted
