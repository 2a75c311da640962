"""Crossover interpolation on synthetic costs with a known answer."""

import math

import pytest

from taylorshift.bench.crossover import find_crossover

GRID = [64, 128, 256, 512, 1024, 2048, 4096]


def costs(fn):
    return {n: fn(n) for n in GRID}


@pytest.mark.parametrize("true_n", [100.0, 300.0, 1000.0, 3000.0])
def test_power_laws_cross_exactly_where_they_meet(true_n):
    # linear a·N against quadratic N²/true_n·a: equal at N = true_n, straight lines in log-log
    linear = costs(lambda n: 5.0 * n)
    quadratic = costs(lambda n: 5.0 * n * n / true_n)
    c = find_crossover(linear, quadratic)
    assert c.status == "crossed"
    assert c.n == pytest.approx(true_n, rel=1e-12)
    assert c.n_below < true_n < c.n_above
    assert c.sign_changes == 1
    assert c.describe() == f"≈ {true_n:.0f}"


def test_wins_everywhere_and_nowhere():
    below = find_crossover(costs(lambda n: 1.0), costs(lambda n: 2.0))
    assert (below.status, below.n, below.n_above) == ("below", None, 64)
    assert below.describe() == "≤ 64"
    above = find_crossover(costs(lambda n: 3.0), costs(lambda n: 2.0))
    assert (above.status, above.n_below) == ("above", 4096)
    assert above.describe() == "> 4096"


def test_last_crossing_counts_and_noise_is_flagged():
    # wins at 128, loses at 256 and 512, wins from 1024 on: the crossover is in (512, 1024)
    challenger = costs(lambda n: 1.0)
    baseline = {64: 0.5, 128: 2.0, 256: 0.5, 512: 0.5, 1024: 2.0, 2048: 4.0, 4096: 8.0}
    c = find_crossover(challenger, baseline)
    assert c.status == "crossed" and 512 < c.n < 1024
    # log ratios log 2 and -log 2: the midpoint in log N
    assert c.n == pytest.approx(math.sqrt(512 * 1024))
    assert c.sign_changes == 3


def test_missing_and_failed_points_are_ignored():
    challenger = {64: 10.0, 128: None, 256: 10.0, 512: math.nan, 1024: 10.0}
    baseline = {64: 1.0, 128: 100.0, 256: 20.0, 1024: 40.0, 2048: 80.0}
    c = find_crossover(challenger, baseline)
    # only 64 (lose), 256 (win), 1024 (win) count
    assert c.status == "crossed" and (c.n_below, c.n_above) == (64, 256)
    assert c.points == 3
    assert find_crossover({}, baseline).status == "no data"
    assert find_crossover({64: None}, {64: 1.0}).describe() == "n/a"
