"""The cost model against the paper's numbers and against independent recomputation."""

from __future__ import annotations

import dataclasses
import itertools
import math
from fractions import Fraction

import pytest

from taylorshift import theory

# The paper's Table 2: d -> (N0, N1).
TABLE_2 = {8: (73, 47), 16: (273, 159), 32: (1057, 574), 64: (4161, 2174), 128: (16513, 8446)}

SMALL_AND_TABLE_DIMS = (1, 2, 3, 5, 7, 8, 12, 16, 31, 32, 64, 100, 128)


def first_length_where(cheaper) -> int:
    """Brute force: the smallest N >= 1 with cheaper(N) true."""
    n = 1
    while not cheaper(n):
        n += 1
    return n


@pytest.mark.parametrize(("d", "expected"), TABLE_2.items(), ids=[f"d{d}" for d in TABLE_2])
def test_table_2_is_reproduced(d, expected):
    n0, n1 = expected
    assert theory.speed_crossover(d) == n0
    assert theory.memory_crossover(d) == n1


def test_crossover_table_default_rows():
    # Every field a literal: N0 and N1 from the paper's Table 2, the symmetric crossovers
    # as in test_symmetric_table_values, the A100 estimate N0 + 18 d worked out by hand.
    rows = [dataclasses.astuple(r) for r in theory.crossover_table()]
    assert [f.name for f in dataclasses.fields(theory.CrossoverRow)] == [
        "d", "n0", "n1", "n0_symmetric", "n1_symmetric", "n0_a100_estimate",
    ]  # fmt: skip
    assert rows == [
        (8, 73, 47, 45, 32, 217),
        (16, 273, 159, 153, 97, 561),
        (32, 1057, 574, 561, 324, 1633),
        (64, 4161, 2174, 2145, 1163, 5313),
        (128, 16513, 8446, 8385, 4379, 18817),
    ]
    assert {d: (n0, n1) for d, n0, n1, *_ in rows} == TABLE_2


def test_crossover_table_custom_dims():
    assert [r.d for r in theory.crossover_table([3, 64])] == [3, 64]
    assert theory.crossover_table(()) == []


@pytest.mark.parametrize("d", range(1, 201, 7), ids=lambda d: f"d{d}")
def test_paper_closed_forms(d):
    # Eq. (7) as an exact fraction, eq. (9) with its square root, computed here from scratch.
    n0 = Fraction(4 * d**3 + 10 * d**2 + 9 * d + 4, 4 * d + 6)
    n1 = (d * d + 2 * d + 1 + math.sqrt(d**4 + 12 * d**3 + 14 * d**2 + 4 * d + 1)) / 4
    assert theory.speed_crossover(d) == math.ceil(n0)
    assert theory.speed_crossover(d, exact=True) == pytest.approx(float(n0), rel=1e-15)
    assert theory.memory_crossover(d) == math.ceil(n1)
    assert theory.memory_crossover(d, exact=True) == pytest.approx(n1, rel=1e-14)


@pytest.mark.parametrize("symmetric", [False, True], ids=["paper", "symmetric"])
@pytest.mark.parametrize("d", SMALL_AND_TABLE_DIMS, ids=lambda d: f"d{d}")
def test_crossovers_are_the_first_length_where_efficient_is_no_costlier(d, symmetric):
    speed = first_length_where(
        lambda n: theory.ops_efficient(n, d, symmetric=symmetric) <= theory.ops_direct(n, d)
    )
    memory = first_length_where(
        lambda n: theory.entries_efficient(n, d, symmetric=symmetric) <= theory.entries_direct(n, d)
    )
    assert theory.speed_crossover(d, symmetric=symmetric) == speed
    assert theory.memory_crossover(d, symmetric=symmetric) == memory


@pytest.mark.parametrize("symmetric", [False, True], ids=["paper", "symmetric"])
def test_exact_crossovers_round_up_to_the_integer_ones(symmetric):
    for d in range(1, 301):
        for fn in (theory.speed_crossover, theory.memory_crossover):
            exact = fn(d, symmetric=symmetric, exact=True)
            assert isinstance(exact, float)
            assert math.ceil(exact) == fn(d, symmetric=symmetric), (fn.__name__, d)


def test_symmetric_crossovers_solve_their_quadratics():
    for d in (1, 8, 64, 128, 1000):
        p = d * (d + 1) / 2
        r0 = theory.speed_crossover(d, symmetric=True, exact=True)
        r1 = theory.memory_crossover(d, symmetric=True, exact=True)
        speed = (4 * d + 6) * r0**2 - (2 * d**3 + 9 * d**2 + 12 * d + 4) * r0 - d * (d + 1) ** 2 / 2
        memory = 2 * r1**2 - (p + 2 * d + 1) * r1 - p * (d + 1)
        assert abs(speed) <= 1e-9 * (4 * d + 6) * r0**2
        assert abs(memory) <= 1e-9 * 2 * r1**2


def test_symmetric_table_values():
    rows = theory.crossover_table()
    assert [(r.n0_symmetric, r.n1_symmetric) for r in rows] == [
        (45, 32),
        (153, 97),
        (561, 324),
        (2145, 1163),
        (8385, 4379),
    ]


@pytest.mark.parametrize("d", [1, 2, 5, 8, 64, 128, 1000])
def test_per_head_counts_match_the_closed_forms(d):
    p = d * (d + 1) // 2
    for n in (1, 3, 1000):
        assert theory.ops_direct(n, d) == 4 * n * n * d + 6 * n * n
        assert theory.ops_efficient(n, d) == n * (4 * d**3 + 10 * d**2 + 9 * d + 4)
        assert theory.ops_efficient(n, d, symmetric=True) == (
            n * (2 * d**3 + 9 * d**2 + 12 * d + 4) + d * (d + 1) ** 2 // 2
        )
        assert theory.entries_direct(n, d) == d * n + 2 * n * n
        assert (
            theory.entries_efficient(n, d) == d * d * (d + 1) + 2 * d * n + (d + 1) * n + d * d * n
        )
        assert theory.entries_efficient(n, d, symmetric=True) == (
            p * (d + 1) + 2 * d * n + (d + 1) * n + p * n
        )


def test_breakdown_follows_the_paper_terms():
    n, d = 10, 4
    paper = theory.efficient_ops_breakdown(n, d)
    assert paper == {
        "feature_maps": 2 * n * d * d,
        "squared_path": 4 * n * d * d * (d + 1),
        "linear_path": 4 * n * d * (d + 1),
        "value_sum": n * (d + 1),
        "combine": 3 * n * (d + 1),
        "normalise": n * d,
        "pair_weights": 0,
    }
    sym = theory.efficient_ops_breakdown(n, d, symmetric=True)
    assert sym["feature_maps"] == 2 * n * 10 and sym["pair_weights"] == 10 * (d + 1)
    assert sum(sym.values()) == theory.ops_efficient(n, d, symmetric=True)
    assert theory.pair_count(d) == 10


@pytest.mark.parametrize("symmetric", [False, True], ids=["paper", "symmetric"])
def test_crossovers_respect_their_bounds(symmetric):
    for d in range(1, 401):
        n0 = theory.speed_crossover(d, symmetric=symmetric, exact=True)
        n1 = theory.memory_crossover(d, symmetric=symmetric, exact=True)
        assert n0 <= theory.speed_crossover_bound(d, symmetric=symmetric), d
        assert n1 <= theory.memory_crossover_bound(d, symmetric=symmetric), d


def test_paper_bounds_are_the_printed_ones():
    for d in (1, 8, 64):
        assert theory.speed_crossover_bound(d) == d * d + d + Fraction(3, 4)
        assert theory.memory_crossover_bound(d) == Fraction(d * d, 2) + 2 * d + Fraction(1, 2)
    # The bounds are tight enough to be useful: N0 within 1 of d² + d + ¾ for large d.
    assert theory.speed_crossover_bound(128) - theory.speed_crossover(128, exact=True) < 0.01


def test_symmetric_form_about_halves_the_crossovers():
    for d in (16, 32, 64, 128):
        assert 0.5 < theory.speed_crossover(d, symmetric=True) / theory.speed_crossover(d) < 0.6
        assert 0.5 < theory.memory_crossover(d, symmetric=True) / theory.memory_crossover(d) < 0.62


D_EMBS = (1, 12, 64, 96, 360, 768)


def test_divisors():
    for n in range(1, 400):
        assert theory.divisors(n) == [k for k in range(1, n + 1) if n % k == 0]


@pytest.mark.parametrize("d_emb", D_EMBS, ids=lambda e: f"E{e}")
def test_mhsa_is_heads_times_per_head_and_the_paper_expansion(d_emb):
    for h in theory.divisors(d_emb):
        d = d_emb // h
        for n in (1, 17, 1024):
            assert theory.ops_direct_mhsa(n, d_emb, h) == h * theory.ops_direct(n, d)
            assert theory.ops_direct_mhsa(n, d_emb, h) == 4 * n * n * d_emb + 6 * h * n * n
            for symmetric in (False, True):
                assert theory.ops_efficient_mhsa(n, d_emb, h, symmetric=symmetric) == (
                    h * theory.ops_efficient(n, d, symmetric=symmetric)
                )
                assert theory.entries_efficient_mhsa(n, d_emb, h, symmetric=symmetric) == (
                    h * theory.entries_efficient(n, d, symmetric=symmetric)
                )
            ops_paper = n * (
                Fraction(4 * d_emb**3, h * h) + Fraction(10 * d_emb**2, h) + 9 * d_emb + 4 * h
            )
            assert theory.ops_efficient_mhsa(n, d_emb, h) == ops_paper
            assert theory.entries_direct_mhsa(n, d_emb, h) == h * theory.entries_direct(n, d)
            assert theory.entries_direct_mhsa(n, d_emb, h) == d_emb * n + 2 * n * n * h
            entries_paper = (
                Fraction(d_emb**3, h * h) + (n + 1) * Fraction(d_emb**2, h) + 3 * n * d_emb + n * h
            )
            assert theory.entries_efficient_mhsa(n, d_emb, h) == entries_paper


def strictly_decreasing(xs) -> bool:
    return all(a > b for a, b in itertools.pairwise(xs))


@pytest.mark.parametrize("n", [1, 16, 1024, 65536], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("d_emb", D_EMBS[1:], ids=lambda e: f"E{e}")
def test_costs_are_monotone_in_heads(d_emb, n):
    rows = theory.heads_analysis(d_emb, n)
    assert [r.heads for r in rows] == theory.divisors(d_emb)
    for field in (
        "ops_efficient",
        "ops_efficient_symmetric",
        "entries_efficient",
        "entries_efficient_symmetric",
    ):
        assert strictly_decreasing([getattr(r, field) for r in rows]), field
    for field in ("ops_direct", "entries_direct"):
        assert strictly_decreasing([getattr(r, field) for r in reversed(rows)]), field


def test_heads_analysis_rows():
    rows = theory.heads_analysis(64, 2048)
    by_heads = {r.heads: r for r in rows}
    r = by_heads[8]
    assert r.head_dim == 8
    assert r.ops_direct == theory.ops_direct_mhsa(2048, 64, 8)
    assert r.ops_efficient_symmetric == theory.ops_efficient_mhsa(2048, 64, 8, symmetric=True)
    assert r.entries_efficient == theory.entries_efficient_mhsa(2048, 64, 8)
    assert (r.n0, r.n1) == TABLE_2[8]
    assert (r.n0_symmetric, r.n1_symmetric) == (45, 32)
    chosen = theory.heads_analysis(64, 2048, heads=[8, 2, 8])
    assert [row.heads for row in chosen] == [2, 8]
    assert chosen[1] == r


def bisect_root(f, lo: float, hi: float) -> float:
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def test_optimal_head_dim_ops_minimises_the_mhsa_flops():
    d = theory.optimal_head_dim_ops()
    assert d == pytest.approx(bisect_root(lambda x: 8 * x**3 + 10 * x**2 - 4, 0, 1), rel=1e-12)
    assert d < 1  # so the optimum ĥ0 = d_emb / d lies past h = d_emb
    # Independent of the derivative: on a fine grid of real h, the paper's MHSA FLOPs are
    # smallest at h = d_emb / d.
    d_emb = 64
    grid = [d_emb * (1 + k / 2000) for k in range(4000)]
    best = min(grid, key=lambda h: 4 * d_emb**3 / h**2 + 10 * d_emb**2 / h + 4 * h)
    assert best == pytest.approx(d_emb / d, rel=1e-3)
    # The paper's eq. (10) reads 9 d³ + 10 d² = 4 (root 0.5217, "≈ 0.52"): close, not equal.
    printed = bisect_root(lambda x: 9 * x**3 + 10 * x**2 - 4, 0, 1)
    assert round(printed, 2) == 0.52 and abs(printed - d) < 0.01


@pytest.mark.parametrize("n", [1, 2, 100, 1024, 10**6])
def test_optimal_head_dim_entries_is_the_root_of_eq_11(n):
    d = theory.optimal_head_dim_entries(n)
    assert 0 < d < 1
    assert 2 * d**3 + (n + 1) * d**2 - n == pytest.approx(0, abs=1e-9 * n)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: theory.ops_direct(0, 8), ValueError, r"n must be a positive int; got 0"),
        (lambda: theory.ops_direct(8, -2), ValueError, r"d must be a positive int; got -2"),
        (
            lambda: theory.ops_efficient(8, 1.5),
            TypeError,
            r"d must be a positive int; got 1.5",
        ),
        (lambda: theory.entries_direct(True, 8), TypeError, r"n must be a positive int; got True"),
        (lambda: theory.entries_efficient("8", 8), TypeError, r"n must be a positive int; got '8'"),
        (
            lambda: theory.ops_efficient(8, 8, symmetric=1),
            TypeError,
            r"symmetric must be a bool; got 1",
        ),
        (lambda: theory.speed_crossover(0), ValueError, r"d must be a positive int; got 0"),
        (lambda: theory.memory_crossover(8, exact="yes"), TypeError, r"exact must be a bool"),
        (lambda: theory.speed_crossover_bound(0), ValueError, r"d must be a positive int"),
        (
            lambda: theory.memory_crossover_bound(2.0),
            TypeError,
            r"d must be a positive int; got 2.0",
        ),
        (lambda: theory.pair_count(0), ValueError, r"d must be a positive int"),
        (lambda: theory.divisors(0), ValueError, r"n must be a positive int"),
        (
            lambda: theory.ops_direct_mhsa(8, 64, 5),
            ValueError,
            r"heads must divide d_emb=64 \(expected one of \[1, 2, 4, 8, 16, 32, 64\]\); got 5",
        ),
        (lambda: theory.ops_efficient_mhsa(8, 0, 1), ValueError, r"d_emb must be .*got 0"),
        (lambda: theory.entries_direct_mhsa(8, 64, 0), ValueError, r"heads must be .*got 0"),
        (
            lambda: theory.entries_efficient_mhsa(8, 12, 8),
            ValueError,
            r"heads must divide d_emb=12",
        ),
        (lambda: theory.heads_analysis(64, 0), ValueError, r"n must be a positive int"),
        (lambda: theory.heads_analysis(64, 8, heads=[3]), ValueError, r"heads must divide"),
        (lambda: theory.crossover_table([8, 0]), ValueError, r"ds\[1\] must be .*got 0"),
        (lambda: theory.optimal_head_dim_entries(0), ValueError, r"n must be a positive int"),
    ],
)
def test_errors_name_argument_expected_and_actual(call, error, match):
    with pytest.raises(error, match=match):
        call()


# Our implementations' counts (what mode="auto" weighs), by hand. d = 2: P = 3 pairs,
# D = 6 features; d = 8: P = 36, D = 45, per token 36 + 2·45·9 = 846, per pair 2·8 + 2·8 + 6
# = 38, causal block 2·8 + 2·9 + 6 = 40; d = 16: per token 136 + 2·153·17 = 5338, per pair 70.


def test_impl_ops_direct():
    assert theory.impl_ops_direct(3, 5, 4, 2) == 15 * (8 + 4 + 4 + 2)
    assert theory.impl_ops_direct(3, 5, 4, 2, order=3) == 15 * (8 + 4 + 6 + 2)


def test_impl_ops_efficient():
    assert theory.impl_ops_efficient(3, 5, 2, 1, False, 4) == 8 * (3 + 2 * 6 * 2)
    # causal: + Nq · min(C, Nk) · (2d + 2(dv + 1) + 6) = 3 · 4 · 14
    assert theory.impl_ops_efficient(3, 5, 2, 1, True, 4) == 216 + 168
    assert theory.impl_ops_efficient(3, 5, 2, 1, True, 64) == 216 + 3 * 5 * 14


@pytest.mark.parametrize(
    ("d", "causal", "chunk", "expected"),
    [
        (8, False, 256, 2 * 846 / 38),  # 44.5
        (16, False, 256, 2 * 5338 / 70),  # 152.5
        (8, True, 256, (2 * 846 + 256 * 40) / 38),  # 314.0
        (8, True, 1000, (2 * 846 + 1000 * 40) / 38),
    ],
)
def test_impl_crossover(d, causal, chunk, expected):
    assert theory.impl_crossover(d, d, causal, chunk) == pytest.approx(expected)
    n = expected
    if not causal:  # the counts agree there
        assert theory.impl_ops_direct(1, 1, d, d) * n * n == pytest.approx(
            theory.impl_ops_efficient(1, 1, d, d, False, chunk) * n
        )
