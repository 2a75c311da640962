"""Cost model of TaylorShift attention (paper §4 and Appendix A) and of our symmetric form.

Every count is for one attention head with sequence length ``n`` and head dim ``d`` (queries,
keys and values all ``d``-dimensional, as in the paper), unless the name ends in ``_mhsa``.
"Ops" are floating-point operations, "entries" the number of tensor entries that must be
held at the same time (the paper's memory measure; model parameters excluded).

Direct form (one N × N score matrix)::

    ops_direct      = 4 n² d + 6 n²
    entries_direct  = d n + 2 n²

Efficient form as counted by the paper (feature dimension d² for ``K ⊠ K``)::

    ops_efficient      = n (4 d³ + 10 d² + 9 d + 4)
    entries_efficient  = d² (d+1) + 2 d n + (d+1) n + d² n

Symmetric efficient form (SPEC §2.2): ``k ⊠ k`` is symmetric, so only the
P = d(d+1)/2 pairs k ≤ l are kept. The same accounting as the paper's with P in place of d²
on the squared path, plus one pass over the (P, d+1) key-side state that applies the pair
weights (½ on the diagonal pairs, 1 on the others, which folds in the ½ of the Taylor term)::

    ops_efficient(symmetric)      = n (2 d³ + 9 d² + 12 d + 4) + d (d+1)² / 2
    entries_efficient(symmetric)  = P (d+1) + 2 d n + (d+1) n + P n

:func:`efficient_ops_breakdown` lists the terms one by one. The crossovers are the lengths
where the two forms cost the same; past them the efficient form is cheaper. The paper's
Table 2 is reproduced by :func:`crossover_table`.

Our implementations' counts, which ``mode="auto"`` weighs (:mod:`taylorshift.ops.taylor_shift.
dispatch` imports them): :func:`impl_ops_direct` and :func:`impl_ops_efficient` for a call
of any shape (Nq != Nk, dv != d, the causal chunks, the order of the Taylor term), and
:func:`impl_crossover`, the self-attention N from which the efficient form needs fewer.
Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from ._validate import check_bool, check_int

__all__ = [
    "DEFAULT_TABLE_DIMS",
    "CrossoverRow",
    "HeadsRow",
    "crossover_table",
    "divisors",
    "efficient_ops_breakdown",
    "entries_direct",
    "entries_direct_mhsa",
    "entries_efficient",
    "entries_efficient_mhsa",
    "heads_analysis",
    "impl_crossover",
    "impl_ops_direct",
    "impl_ops_efficient",
    "memory_crossover",
    "memory_crossover_bound",
    "ops_direct",
    "ops_direct_mhsa",
    "ops_efficient",
    "ops_efficient_mhsa",
    "optimal_head_dim_entries",
    "optimal_head_dim_ops",
    "pair_count",
    "speed_crossover",
    "speed_crossover_bound",
]

DEFAULT_TABLE_DIMS: tuple[int, ...] = (8, 16, 32, 64, 128)

# Paper §5.1: on an A100 (plain PyTorch, fp32, one head) the measured speed crossover of the
# efficient form lay about 18 d above N0, attributed to memory traffic, not arithmetic.
A100_SPEED_OFFSET_PER_DIM = 18


def _head_dim(d_emb: object, heads: object) -> tuple[int, int]:
    """Validate a multi-head split; return (heads, d) with d = d_emb / heads."""
    d_emb = check_int("d_emb", d_emb, ge=1)
    heads = check_int("heads", heads, ge=1)
    if d_emb % heads:
        raise ValueError(
            f"heads must divide d_emb={d_emb} (expected one of {divisors(d_emb)}); got {heads}"
        )
    return heads, d_emb // heads


def pair_count(d: int) -> int:
    """P = d (d+1) / 2, the number of index pairs k ≤ l kept by the symmetric form."""
    d = check_int("d", d, ge=1)
    return d * (d + 1) // 2


def _squared_features(d: int, symmetric: bool) -> int:
    # Columns of the squared feature map: d² for K ⊠ K, P for its upper triangle.
    return d * (d + 1) // 2 if symmetric else d * d


def ops_direct(n: int, d: int) -> int:
    """FLOPs of direct TaylorShift, one head: ``4 n² d + 6 n²`` (paper eq. 5).

    2 n² d for Q Kᵀ, 4 n² for x ↦ ½x² + x + 1 elementwise, 2 n² for the row normalisation,
    2 n² d for the product with V.
    """
    n, d = check_int("n", n, ge=1), check_int("d", d, ge=1)
    return n * n * (4 * d + 6)


def efficient_ops_breakdown(n: int, d: int, *, symmetric: bool = False) -> dict[str, int]:
    """FLOPs of efficient TaylorShift, one head, term by term (the paper's accounting, §4.1).

    With F the squared-feature width (F = d² in the paper, F = P = d(d+1)/2 when symmetric)
    and V' = [1, V] of width d+1:

    - ``feature_maps``: 2 n F, the row-wise products Q ⊠ Q and K ⊠ K;
    - ``squared_path``: 4 n F (d+1), the products (K⊠K)ᵀ V' and (Q⊠Q) · state;
    - ``linear_path``: 4 n d (d+1), Kᵀ V' and Q · (Kᵀ V');
    - ``value_sum``: n (d+1), the column sums of V';
    - ``combine``: 3 n (d+1), the sums and the scalar multiplication combining the three terms;
    - ``normalise``: n d, dividing the numerator by the denominator column;
    - ``pair_weights``: F (d+1) when symmetric (the ½ / 1 pair weights, applied once to the
      (P, d+1) state), else 0.

    ``combine`` keeps the paper's 3 n (d+1) in the symmetric form too, although the ½ of the
    Taylor term is then already in the pair weights; the symmetric count is conservative by
    n (d+1) there, so that the two forms are counted by one rule.

    The terms sum to ``n (4d³ + 10d² + 9d + 4)`` for the paper's form and to
    ``n (2d³ + 9d² + 12d + 4) + d (d+1)² / 2`` for the symmetric one.
    """
    n, d = check_int("n", n, ge=1), check_int("d", d, ge=1)
    symmetric = check_bool("symmetric", symmetric)
    f = _squared_features(d, symmetric)
    return {
        "feature_maps": 2 * n * f,
        "squared_path": 4 * n * f * (d + 1),
        "linear_path": 4 * n * d * (d + 1),
        "value_sum": n * (d + 1),
        "combine": 3 * n * (d + 1),
        "normalise": n * d,
        "pair_weights": f * (d + 1) if symmetric else 0,
    }


def ops_efficient(n: int, d: int, *, symmetric: bool = False) -> int:
    """FLOPs of efficient TaylorShift, one head.

    Paper (eq. 6): ``n (4 d³ + 10 d² + 9 d + 4)``. Symmetric (P = d(d+1)/2 pair features):
    ``n (2 d³ + 9 d² + 12 d + 4) + d (d+1)² / 2``. See :func:`efficient_ops_breakdown`.
    """
    return sum(efficient_ops_breakdown(n, d, symmetric=symmetric).values())


def entries_direct(n: int, d: int) -> int:
    """Entries held at once by direct TaylorShift, one head: ``d n + 2 n²`` (V, Q Kᵀ, result)."""
    n, d = check_int("n", n, ge=1), check_int("d", d, ge=1)
    return d * n + 2 * n * n


def entries_efficient(n: int, d: int, *, symmetric: bool = False) -> int:
    """Entries held at once by efficient TaylorShift, one head (paper eq. 8).

    Paper: ``d² (d+1) + 2 d n + (d+1) n + d² n`` for the state, Q and K, V' and K ⊠ K.
    Symmetric: ``P (d+1) + 2 d n + (d+1) n + P n`` with P = d(d+1)/2.
    """
    n, d = check_int("n", n, ge=1), check_int("d", d, ge=1)
    f = _squared_features(d, check_bool("symmetric", symmetric))
    return f * (d + 1) + 2 * d * n + (d + 1) * n + f * n


def _positive_root(a: int, b: int, c: int) -> tuple[int, float]:
    """For a N² − b N − c = 0 with a > 0, b > 0, c ≥ 0: (ceil of the positive root, root).

    The ceiling is found in integers: the smallest positive N with a N² − b N − c ≥ 0 (the
    other root is ≤ 0, so for N > 0 that holds exactly when N ≥ root).
    """
    disc = b * b + 4 * a * c
    s = math.isqrt(disc)
    if s * s == disc:  # rational root: exact value, exact ceiling
        root = Fraction(b + s, 2 * a)
        return math.ceil(root), float(root)
    n = max(1, (b + s) // (2 * a))  # (b + s) / 2a < root
    while a * n * n - b * n - c < 0:
        n += 1
    return n, (b + math.sqrt(disc)) / (2 * a)


def _speed_coefficients(d: int, symmetric: bool) -> tuple[int, int, int]:
    # ops_direct − ops_efficient = a N² − b N − c
    a = 4 * d + 6
    if symmetric:
        return a, 2 * d**3 + 9 * d**2 + 12 * d + 4, d * (d + 1) ** 2 // 2
    return a, 4 * d**3 + 10 * d**2 + 9 * d + 4, 0


def _memory_coefficients(d: int, symmetric: bool) -> tuple[int, int, int]:
    # entries_direct − entries_efficient = 2 N² − (F + 2d + 1) N − F (d+1)
    f = _squared_features(d, symmetric)
    return 2, f + 2 * d + 1, f * (d + 1)


def speed_crossover(d: int, *, symmetric: bool = False, exact: bool = False) -> int | float:
    """Sequence length N0 at which both forms need the same FLOPs (one head).

    Paper (eq. 7): ``N0 = (4d³ + 10d² + 9d + 4) / (4d + 6)``. Symmetric: the positive root of
    ``(4d + 6) N² − (2d³ + 9d² + 12d + 4) N − d (d+1)² / 2 = 0``.

    Returns ``ceil(N0)`` as an int, the smallest length at which the efficient form needs no
    more FLOPs than the direct one (computed in integers, so exact for any d), or the root
    itself as a float with ``exact=True``. ``speed_crossover(64) == 4161``.
    """
    d = check_int("d", d, ge=1)
    symmetric, exact = check_bool("symmetric", symmetric), check_bool("exact", exact)
    ceil, root = _positive_root(*_speed_coefficients(d, symmetric))
    return root if exact else ceil


def memory_crossover(d: int, *, symmetric: bool = False, exact: bool = False) -> int | float:
    """Sequence length N1 at which both forms hold the same number of entries (one head).

    Paper (eq. 9): ``N1 = ¼ [d² + 2d + 1 + sqrt(d⁴ + 12d³ + 14d² + 4d + 1)]``, the positive
    root of ``2 N² − (d+1)² N − d² (d+1) = 0``. Symmetric: the positive root of
    ``2 N² − (P + 2d + 1) N − P (d+1) = 0`` with P = d(d+1)/2.

    Returns ``ceil(N1)`` as an int (exact integer arithmetic), or the root as a float with
    ``exact=True``. ``memory_crossover(64) == 2174``.
    """
    d = check_int("d", d, ge=1)
    symmetric, exact = check_bool("symmetric", symmetric), check_bool("exact", exact)
    ceil, root = _positive_root(*_memory_coefficients(d, symmetric))
    return root if exact else ceil


def speed_crossover_bound(d: int, *, symmetric: bool = False) -> Fraction:
    """An upper bound on the speed crossover, exact rational.

    Paper (eq. 7, Appendix A.1): ``N0 ≤ d² + d + 3/4``. Symmetric: ``N0 ≤ ½ d² + 3/2 d + 1``
    (the root r satisfies r = b/a + c/(a r) ≤ b/a + c/b, with
    b/a = ½d² + 3/2 d + 3/4 − 1/(8d + 12) and c/b < ¼).
    """
    d = check_int("d", d, ge=1)
    if check_bool("symmetric", symmetric):
        return Fraction(d * d, 2) + Fraction(3 * d, 2) + 1
    return Fraction(d * d + d) + Fraction(3, 4)


def memory_crossover_bound(d: int, *, symmetric: bool = False) -> Fraction:
    """An upper bound on the memory crossover, exact rational.

    Paper (eq. 9, Appendix A.4): ``N1 ≤ ½ d² + 2d + ½``. Symmetric: ``N1 ≤ ¼ (d² + 9d + 6)``
    (r ≤ b/a + c/b = (P + 2d + 1)/2 + P (d+1) / (P + 2d + 1) < (P + 2d + 1)/2 + d + 1).
    """
    d = check_int("d", d, ge=1)
    if check_bool("symmetric", symmetric):
        return Fraction(d * d + 9 * d + 6, 4)
    return Fraction(d * d, 2) + 2 * d + Fraction(1, 2)


@dataclass(frozen=True)
class CrossoverRow:
    """One column of the paper's Table 2, with our symmetric form beside it.

    ``n0``/``n1``: the paper's speed and memory crossovers, rounded up;
    ``n0_symmetric``/``n1_symmetric``: the same for the symmetric form;
    ``n0_a100_estimate``: ``n0 + 18 d``, the paper's *empirical* speed crossover of its plain
    PyTorch efficient form on an A100 (§5.1) — a measured rule of thumb, not part of the model.
    """

    d: int
    n0: int
    n1: int
    n0_symmetric: int
    n1_symmetric: int
    n0_a100_estimate: int


def crossover_table(ds: Iterable[int] = DEFAULT_TABLE_DIMS) -> list[CrossoverRow]:
    """Table 2 of the paper for each head dim in ``ds``, plus the symmetric crossovers."""
    rows = []
    for i, d in enumerate(ds):
        d = check_int(f"ds[{i}]", d, ge=1)
        n0 = speed_crossover(d)
        rows.append(
            CrossoverRow(
                d=d,
                n0=n0,
                n1=memory_crossover(d),
                n0_symmetric=speed_crossover(d, symmetric=True),
                n1_symmetric=memory_crossover(d, symmetric=True),
                n0_a100_estimate=n0 + A100_SPEED_OFFSET_PER_DIM * d,
            )
        )
    return rows


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n`` in increasing order (the allowed head counts)."""
    n = check_int("n", n, ge=1)
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in reversed(small) if k * k != n]


def ops_direct_mhsa(n: int, d_emb: int, heads: int) -> int:
    """FLOPs of direct multi-head TaylorShift: ``h · ops_direct(n, d_emb/h) = 4n²d_emb + 6hn²``.

    Grows with the number of heads h.
    """
    heads, d = _head_dim(d_emb, heads)
    return heads * ops_direct(n, d)


def ops_efficient_mhsa(n: int, d_emb: int, heads: int, *, symmetric: bool = False) -> int:
    """FLOPs of efficient multi-head TaylorShift: ``h · ops_efficient(n, d_emb/h)``.

    Paper: ``n (4 d_emb³/h² + 10 d_emb²/h + 9 d_emb + 4h)``; falls as h grows over the
    divisors of d_emb (see :func:`optimal_head_dim_ops`).
    """
    heads, d = _head_dim(d_emb, heads)
    return heads * ops_efficient(n, d, symmetric=symmetric)


def entries_direct_mhsa(n: int, d_emb: int, heads: int) -> int:
    """Entries of direct multi-head TaylorShift, heads in parallel: ``d_emb n + 2 n² h``."""
    heads, d = _head_dim(d_emb, heads)
    return heads * entries_direct(n, d)


def entries_efficient_mhsa(n: int, d_emb: int, heads: int, *, symmetric: bool = False) -> int:
    """Entries of efficient multi-head TaylorShift, heads in parallel: ``h · entries_efficient``.

    Paper: ``d_emb³/h² + (n+1) d_emb²/h + 3 n d_emb + n h``; falls as h grows over the
    divisors of d_emb (see :func:`optimal_head_dim_entries`).
    """
    heads, d = _head_dim(d_emb, heads)
    return heads * entries_efficient(n, d, symmetric=symmetric)


@dataclass(frozen=True)
class HeadsRow:
    """Costs of one head count h for a layer of width d_emb at sequence length n.

    Ops and entries are for the whole multi-head layer (all h heads in parallel); the
    crossovers are per head (they depend on d = d_emb / h only, since both forms scale by h).
    """

    heads: int
    head_dim: int
    ops_direct: int
    ops_efficient: int
    ops_efficient_symmetric: int
    entries_direct: int
    entries_efficient: int
    entries_efficient_symmetric: int
    n0: int
    n1: int
    n0_symmetric: int
    n1_symmetric: int


def heads_analysis(d_emb: int, n: int, *, heads: Iterable[int] | None = None) -> list[HeadsRow]:
    """Costs of every head count h dividing ``d_emb`` (or only those in ``heads``), h ascending.

    As the paper shows (§4.3), the efficient costs fall and the direct costs grow with h over
    the divisors of d_emb; the symmetric form behaves the same way.
    """
    d_emb, n = check_int("d_emb", d_emb, ge=1), check_int("n", n, ge=1)
    chosen = divisors(d_emb) if heads is None else sorted({_head_dim(d_emb, h)[0] for h in heads})
    rows = []
    for h in chosen:
        d = d_emb // h
        rows.append(
            HeadsRow(
                heads=h,
                head_dim=d,
                ops_direct=ops_direct_mhsa(n, d_emb, h),
                ops_efficient=ops_efficient_mhsa(n, d_emb, h),
                ops_efficient_symmetric=ops_efficient_mhsa(n, d_emb, h, symmetric=True),
                entries_direct=entries_direct_mhsa(n, d_emb, h),
                entries_efficient=entries_efficient_mhsa(n, d_emb, h),
                entries_efficient_symmetric=entries_efficient_mhsa(n, d_emb, h, symmetric=True),
                n0=speed_crossover(d),
                n1=memory_crossover(d),
                n0_symmetric=speed_crossover(d, symmetric=True),
                n1_symmetric=memory_crossover(d, symmetric=True),
            )
        )
    return rows


def optimal_head_dim_ops() -> float:
    """The head dim d = d_emb / h minimising the paper's efficient multi-head FLOPs (≈ 0.530).

    ∂/∂h of ``n (4 d_emb³/h² + 10 d_emb²/h + 9 d_emb + 4h)`` is
    ``n (4 − 8 d³ − 10 d²)``, which vanishes when ``8 d³ + 10 d² = 4``. Its one positive root,
    by Cardano (substituting d = x − 5/12), is
    ``[cbrt(307 + 12 sqrt(546)) + cbrt(307 − 12 sqrt(546)) − 5] / 12 ≈ 0.5301``.

    The paper's eq. (10) and Appendix A.2 write ``9 d³ + 10 d² = 4`` (the derivative of
    4 d_emb³/h² is −8 d_emb³/h³, not −9) and obtain ≈ 0.52; its root is 0.5217, and the
    closed form printed in A.2, α/27 + 100/(729 α) − 10/27, should read 100/(27 α). None of
    this changes the conclusion: the root is below 1, so the optimum ĥ0 = d_emb / 0.53 lies
    past h = d_emb and over the allowed head counts the efficient cost only falls as h grows.
    """
    r = 12 * math.sqrt(546)
    return ((307 + r) ** (1 / 3) + (307 - r) ** (1 / 3) - 5) / 12  # both radicands > 0


def optimal_head_dim_entries(n: int) -> float:
    """The head dim d = d_emb / h minimising the paper's efficient multi-head entries at length n.

    ∂/∂h of ``d_emb³/h² + (n+1) d_emb²/h + 3 n d_emb + n h`` vanishes when
    ``2 d³ + (n+1) d² = n`` (paper eq. 11, Appendix A.3). The left side increases for d > 0
    and exceeds n at d = 1, so the one positive root lies below 1 and the optimum ĥ1 lies
    past h = d_emb. Found by bisection to float precision.
    """
    n = check_int("n", n, ge=1)
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        if 2 * mid**3 + (n + 1) * mid**2 < n:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# Our implementations, per head, as mode="auto" weighs them (SPEC §3's accounting generalised
# to Nq != Nk, dv != d, the order of the Taylor term and the causal form's chunks).


def _feature_dim(d: int) -> int:
    """D = P + d + 1: the length of the symmetric feature vector [x_a x_b (a <= b), x, 1]."""
    return pair_count(d) + d + 1


def impl_ops_direct(nq: int, nk: int, d: int, dv: int, order: int = 2) -> int:
    """Scores 2d, weights 2·order (Horner), row sum 2, weights × values 2dv; per (i, j) pair."""
    return nq * nk * (2 * d + 2 * dv + 2 * order + 2)


def impl_ops_efficient(nq: int, nk: int, d: int, dv: int, causal: bool, chunk: int) -> int:
    """Feature maps and the two (·, D) × (D, dv + 1) products; causal adds the C-token blocks
    (``chunk`` = C) computed directly."""
    per_token = pair_count(d) + 2 * _feature_dim(d) * (dv + 1)
    ops = (nq + nk) * per_token
    if causal:
        ops += nq * min(chunk, max(nk, 1)) * (2 * d + 2 * (dv + 1) + 6)
    return ops


@lru_cache(maxsize=256)
def impl_crossover(d: int, dv: int, causal: bool, chunk: int) -> float:
    """The self-attention N from which :func:`impl_ops_efficient` < :func:`impl_ops_direct`
    (order 2; continuous).

    Non-causal: 2N·P = N²·c, so N = 2P/c (P the per-token efficient cost, c the per-pair
    direct cost). Causal adds N·min(C, N)·e with e > c: below C the efficient form never wins,
    above it N = (2P + C·e)/c.
    """
    per_token = pair_count(d) + 2 * _feature_dim(d) * (dv + 1)
    per_pair = impl_ops_direct(1, 1, d, dv)
    if not causal:
        return 2 * per_token / per_pair
    block = 2 * d + 2 * (dv + 1) + 6
    return max(float(chunk), (2 * per_token + chunk * block) / per_pair)
