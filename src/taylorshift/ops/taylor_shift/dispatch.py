"""``mode="auto"``: pick the cheaper form for one call.

Now from an operation count of our implementations (per head, the same accounting as the
paper's, SPEC §3, generalised to Nq != Nk, dv != d, and the causal chunks). A measured
per-device calibration replaces it once ``taylorshift bench calibrate`` exists.
"""

from __future__ import annotations

import logging

from .efficient_causal import DEFAULT_CAUSAL_CHUNK
from .features import feature_dim

logger = logging.getLogger("taylorshift.dispatch")


def direct_ops(nq: int, nk: int, d: int, dv: int, order: int = 2) -> int:
    """Scores 2d, weights 2·order (Horner), row sum 2, weights × values 2dv; per (i, j) pair."""
    return nq * nk * (2 * d + 2 * dv + 2 * order + 2)


def efficient_ops(nq: int, nk: int, d: int, dv: int, causal: bool, chunk: int) -> int:
    """Feature maps and the two (·, D) × (D, dv + 1) products; causal adds the C-token blocks."""
    pairs = d * (d + 1) // 2
    per_token = pairs + 2 * feature_dim(d) * (dv + 1)
    ops = (nq + nk) * per_token
    if causal:
        ops += nq * min(chunk, max(nk, 1)) * (2 * d + 2 * (dv + 1) + 6)
    return ops


def choose_mode(
    nq: int, nk: int, d: int, dv: int, *, causal: bool, order: int, mask_varies: bool
) -> str:
    """'direct' or 'efficient' for ``mode="auto"``, logged at debug level with the reason."""
    if order != 2 or mask_varies:
        reason = "order != 2" if order != 2 else "the mask varies over queries"
        logger.debug("auto -> direct (%s)", reason)
        return "direct"
    direct = direct_ops(nq, nk, d, dv, order)
    efficient = efficient_ops(nq, nk, d, dv, causal, DEFAULT_CAUSAL_CHUNK)
    mode = "efficient" if efficient < direct else "direct"
    logger.debug(
        "auto -> %s (theory: direct %d ops, efficient %d ops per head; Nq=%d Nk=%d d=%d dv=%d)",
        mode,
        direct,
        efficient,
        nq,
        nk,
        d,
        dv,
    )
    return mode
