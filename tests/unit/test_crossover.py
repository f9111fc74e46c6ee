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
    history = [("incremental", 1_000, 3.0), ("incremental", 100_000, 21.0), ("full", 0, 12.0)]
    small = estimate(history, 2_000, CrossoverSettings())
    assert not small.full and small.incremental_s == pytest.approx(3.18, abs=0.01) and small.full_s == 12.0
    large = estimate(history, 500_000, CrossoverSettings())
    assert large.full and large.incremental_s == pytest.approx(93.73, abs=0.01)
    assert "the recompute is cheaper" in large.why
    # a saving below min_saving_seconds keeps it incremental
    assert not estimate(history, 60_000, CrossoverSettings(min_saving_seconds=5)).full  # 13.8 s vs 12 s


def test_newest_full_recompute_counts_and_missing_measurements_stay_incremental():
    history = [("full", 0, 30.0), ("incremental", 10, 34.0), ("full", 0, 5.0)]  # 4 s saved at most
    e = estimate(history, 10, CrossoverSettings())
    assert e.full_s == 30.0 and not e.full
    assert estimate([("full", 0, 1.0)], 10, CrossoverSettings()).why == "no measurement of an incremental refresh yet"
    assert estimate([("incremental", 1, 100.0)], 10, CrossoverSettings()).why == \
        "no measurement of a full recompute yet"
