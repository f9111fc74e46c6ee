"""`--mode auto`'s crossover estimate (ivm.maintain.crossover) over measured histories."""

from __future__ import annotations

import pytest

from ivm.config import CrossoverSettings
from ivm.maintain.crossover import estimate, fit


def test_fit_is_the_least_squares_line():
    a, b = fit([(100, 3.0), (1_000, 12.0), (10_000, 102.0)])
    assert b == pytest.approx(0.01, rel=1e-3)
    assert a == pytest.approx(2.0, abs=0.05)


def test_fit_of_one_size_is_the_mean_and_a_negative_intercept_goes_through_the_origin():
    assert fit([(5, 2.0), (5, 4.0)]) == (3.0, 0.0)
    a, b = fit([(10, 1.0), (20, 10.0)])  # the line would cross at -8 s
    assert a == 0.0 and b == pytest.approx((10 * 1 + 20 * 10) / (10 ** 2 + 20 ** 2))


def test_full_recompute_past_the_crossover_only():
    history = [(1_000, 3.0), (100_000, 21.0)]
    small = estimate(history, 12.0, 2_000, CrossoverSettings())
    assert not small.full and small.incremental_s == pytest.approx(3.18, abs=0.01) and small.full_s == 12.0
    large = estimate(history, 12.0, 500_000, CrossoverSettings())
    assert large.full and large.incremental_s == pytest.approx(93.73, abs=0.01)
    assert "the recompute is cheaper" in large.why
    # a saving below min_saving_seconds keeps it incremental
    assert not estimate(history, 12.0, 60_000, CrossoverSettings(min_saving_seconds=5)).full  # 13.8 s vs 12 s


def test_the_history_setting_bounds_the_points_and_missing_measurements_stay_incremental():
    # the newest point alone (history 1): 10 rows in 34 s, against 30 s full: 4 s saved at most
    e = estimate([(10, 34.0), (10, 500.0)], 30.0, 10, CrossoverSettings(history=1))
    assert e.points == 1 and e.incremental_s == 34.0 and not e.full
    assert estimate([], 1.0, 10, CrossoverSettings()).why == "no measurement of an incremental refresh yet"
    assert estimate([(1, 100.0)], None, 10, CrossoverSettings()).why == "no measurement of a full recompute yet"

