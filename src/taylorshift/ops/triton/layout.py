"""Where the fused efficient kernels keep a (batch, head)'s state: its flat float32 layout.

Plain Python (no Triton, no torch), so that the router (``ops/taylor_shift/fused.py``)
sizes the causal kernel's chunk states from the layout they really take, padding included,
without importing Triton.
"""

from __future__ import annotations

from typing import NamedTuple

# Width of a feature tile: tile pairs give T² = 256 quadratic features per token, and every
# tl.dot has all sides >= 16.
TILE = 16


def _pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


class Layout(NamedTuple):
    """How one (b, h) state is laid out in a flat float32 row (offsets in elements).

    [quad: P·T²·DVP][quad_den: P·T²][lin: D_PAD·DVP][lin_den: D_PAD][const: DVP][const_den: 1]
    P = NT(NT+1)/2 tile pairs A <= B in row-major order; the feature (a, b) of pair (A, B)
    sits at row (a - A·T)·T + (b - B·T) of the pair's T² rows.
    """

    d: int
    dv: int
    nt: int  # tiles covering d
    nt_pad: int  # nt rounded up to a power of two (register shapes)
    dvp: int  # dv rounded up to a power of two >= 16
    pairs: int
    off_quad_den: int
    off_lin: int
    off_lin_den: int
    off_const: int
    off_const_den: int
    size: int


def layout(d: int, dv: int) -> Layout:
    t = TILE
    nt = -(-d // t)
    nt_pad = _pow2(nt)
    dvp = max(16, _pow2(dv))
    pairs = nt * (nt + 1) // 2
    off_quad_den = pairs * t * t * dvp
    off_lin = off_quad_den + pairs * t * t
    off_lin_den = off_lin + nt_pad * t * dvp
    off_const = off_lin_den + nt_pad * t
    off_const_den = off_const + dvp
    return Layout(
        d, dv, nt, nt_pad, dvp, pairs, off_quad_den, off_lin, off_lin_den, off_const,
        off_const_den, off_const_den + 1,
    )  # fmt: skip
