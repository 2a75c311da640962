"""``mode="auto"``: pick the cheaper form for one call.

Two sources, in this order:

1. **Calibration**: the direct/efficient crossover N̂ that ``taylorshift bench calibrate``
   measured on this device (CPU model or GPU name, with the torch and CUDA versions), for this
   dtype, causal or not, forward only or forward + backward, at a few head dims d: the file
   and its reading are :mod:`.calibration`'s (whose names this module re-exports).
2. **Theory**: an operation count of our implementations (per head, the same accounting as
   the paper's, SPEC §3, generalised to Nq != Nk, dv != d, and the causal chunks):
   ``impl_ops_direct``, ``impl_ops_efficient`` and ``impl_crossover`` of
   :mod:`taylorshift.theory`. This module keeps the decision.

How a calibration answers a call (docs/calibration.md): the measured N̂ at each calibrated d
is turned into a correction ratio ρ(d) = N̂_measured / N̂_theory; ρ is interpolated linearly
in (log d, log ρ) between calibrated head dims (the nearest one's outside their range) and
multiplies the theory's crossover for the call's (d, dv). With direct costing ∝ Nq·Nk and
efficient ∝ Nq + Nk, self-attention at N̂ generalises to: efficient iff
``2·Nq·Nk / (Nq + Nk) >= N̂`` (the harmonic mean of the two lengths reaches N̂).

The decision never raises: a missing file means theory, a corrupt one theory plus one
warning, a file of another format version theory (logged at debug level).
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from ...theory import impl_crossover, impl_ops_direct, impl_ops_efficient
from ...vocab import FORWARD, FORWARD_BACKWARD
from .calibration import (
    _UNSET,
    CACHE_DIR_ENV,
    CALIBRATION_ENV,
    CALIBRATION_FILE,
    CALIBRATION_FORMAT,
    CALIBRATION_VERSION,
    Calibration,
    CalibrationError,
    _calibration_enabled,
    _dtype_text,
    _theory_n,
    _warn_once,
    cache_dir,
    calibration_path,
    device_key,
    entry_key,
    load_calibration,
    parse_calibration,
    reload_calibration,
    upgrade_entries,
)
from .direct import KEEP_ENTRIES
from .efficient import default_chunk_size
from .efficient_causal import DEFAULT_CAUSAL_CHUNK
from .features import feature_dim

__all__ = [
    "CACHE_DIR_ENV",
    "CALIBRATION_ENV",
    "CALIBRATION_FILE",
    "CALIBRATION_FORMAT",
    "CALIBRATION_VERSION",
    "Calibration",
    "CalibrationError",
    "Decision",
    "cache_dir",
    "calibration_path",
    "choose_mode",
    "decide_mode",
    "default_memory_budget",
    "device_key",
    "entry_key",
    "load_calibration",
    "parse_calibration",
    "reload_calibration",
    "switch_length",
    "upgrade_entries",
    "working_set_bytes",
]

logger = logging.getLogger("taylorshift.dispatch")


def _theory_crossover(
    d: int, dv: int, causal: bool, chunk: int = DEFAULT_CAUSAL_CHUNK
) -> float:  # the old signature of dispatch.theory_crossover
    return impl_crossover(d, dv, causal, chunk)


# The counts moved to taylorshift.theory (issue 17); the old names still resolve, with a
# DeprecationWarning that names the new one.
_MOVED = {
    "direct_ops": ("taylorshift.theory.impl_ops_direct", impl_ops_direct),
    "efficient_ops": ("taylorshift.theory.impl_ops_efficient", impl_ops_efficient),
    "theory_crossover": ("taylorshift.theory.impl_crossover", _theory_crossover),
}


def __getattr__(name: str) -> object:
    if name in _MOVED:
        new, value = _MOVED[name]
        warnings.warn(f"{__name__}.{name} is now {new}", DeprecationWarning, stacklevel=2)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Decision(NamedTuple):
    """The form ``mode="auto"`` runs and what decided it (``basis``): ``"order"`` (an order
    other than 2 has no efficient form), ``"mask"`` (a mask that varies over queries),
    ``"memory"`` (only one form's working set fits), ``"calibration"`` (a measured crossover
    of this device), ``"cpu prior"`` (:data:`CPU_PRIOR` and the CPU kernels' priors),
    ``"gpu prior"`` (:data:`GPU_PRIOR`, :data:`GPU_FLOAT32_PRIOR`, :data:`GPU_CAUSAL_PRIOR`)
    or ``"theory"`` (operation counts)."""

    mode: str
    basis: str


def choose_mode(nq: int, nk: int, d: int, dv: int, **options: Any) -> str:
    """'direct' or 'efficient' for ``mode="auto"``: the mode of
    ``decide_mode(nq, nk, d, dv, **options)`` (its keyword-only options)."""
    return decide_mode(nq, nk, d, dv, **options).mode


# The longest sequence switch_length looks for (16M tokens).
SWITCH_SEARCH_LIMIT = 1 << 24


def switch_length(d: int, dv: int, **options: Any) -> int | None:
    """The shortest length L from which ``choose_mode(L, L, d, dv, **options)`` picks the
    efficient form, found by bisection over [1, 2^24] (below L it picks direct: the forms'
    costs cross once); None where it picks direct throughout.

    For calls whose sequence lengths are symbols (``torch.compile`` with dynamic shapes):
    ``mode="auto"`` compares the call's ``2·Nq·Nk/(Nq + Nk)`` with L, which guards the
    graph on the side of the switch where the traced call lies; a call past it compiles
    again and takes the other form. For Nq = Nk this is the decision of ``choose_mode``
    itself, and the rule of every calibrated or prior decision for any Nq, Nk.
    """

    def efficient(n: int) -> bool:
        return choose_mode(n, n, d, dv, **options) == "efficient"

    if not efficient(SWITCH_SEARCH_LIMIT):
        return None
    low, high = 0, SWITCH_SEARCH_LIMIT  # direct at low (or low = 0), efficient at high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if efficient(middle) else (middle, high)
    return high


def decide_mode(
    nq: int,
    nk: int,
    d: int,
    dv: int,
    *,
    causal: bool,
    order: int,
    mask_varies: bool,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    backward: bool = False,
    batch_heads: int = 1,
    memory_budget: int | None = None,
) -> Decision:
    """The form for ``mode="auto"`` and what decided it, logged at debug level with the
    numbers behind it.

    ``device`` and ``dtype`` select a stored calibration (none given: theory only);
    ``backward`` says that a backward pass will follow (the forward + backward crossover
    applies, else the forward one; either stands in for the other when it is missing).

    Memory first: a form whose working set (:func:`working_set_bytes`, for ``batch_heads``
    = B·H) exceeds ``memory_budget`` bytes is not chosen when the other form's fits (default
    budget: :func:`default_memory_budget` of ``device``). Time decides among the forms that
    fit, or when neither does: a calibration of this device, else the CPU or GPU prior, else
    the operation counts.

    Decisions are kept per call shape (the arguments, the calibration read and whether it
    is switched on): a model's layers ask the same question at every step, and answering it
    again made ``auto`` up to 1.1x the direct form it ran at N = 256; kept, it is level
    within the noise (benchmarks/op_cpu/auto-cache). Not kept: decisions that looked up the
    free memory (working sets over 256 MiB and no ``memory_budget``).
    """
    use_calibration = device is not None and dtype is not None and _calibration_enabled()
    # (the CPU prior depends on whether the CPU kernels run, which a process may switch)
    kernels = use_calibration and torch.device(device).type == "cpu" and _cpu_kernels_ready()
    key = (
        nq, nk, d, dv, causal, order, mask_varies, device, dtype, backward, batch_heads,
        memory_budget, use_calibration, kernels,
    )  # fmt: skip
    _forget_decisions_unless_made_with(load_calibration() if use_calibration else None)
    decision = _decisions.get(key)
    if decision is not None:
        logger.debug("auto -> %s (%s, as decided before for this call)", *decision)
        return decision
    decision, keep = _decide(
        nq, nk, d, dv, causal, order, mask_varies, device, dtype, backward, batch_heads,
        memory_budget, use_calibration,
    )  # fmt: skip
    if keep:
        if len(_decisions) >= MAX_KEPT_DECISIONS:  # many shapes (a server): start over
            _decisions.clear()
        _decisions[key] = decision
    return decision


# Decisions of decide_mode by call, valid for the calibration they were made with.
MAX_KEPT_DECISIONS = 4096
_decisions: dict[tuple, Decision] = {}
_decisions_made_with: object = _UNSET


def _forget_decisions_unless_made_with(calibration: object) -> None:
    global _decisions_made_with
    if calibration is not _decisions_made_with:
        _decisions.clear()
        _decisions_made_with = calibration


def _decide(
    nq, nk, d, dv, causal, order, mask_varies, device, dtype, backward, batch_heads,
    memory_budget, use_calibration,
) -> tuple[Decision, bool]:  # fmt: skip
    """decide_mode's decision, and whether it may be kept (no free-memory look-up)."""
    if order != 2 or mask_varies:
        reason = "order != 2" if order != 2 else "the mask varies over queries"
        logger.debug("auto -> direct (%s)", reason)
        return Decision("direct", "order" if order != 2 else "mask"), True
    itemsize = 8 if dtype == torch.float64 else 4
    sizes = {
        m: working_set_bytes(m, nq, nk, d, dv, causal, batch_heads, itemsize)
        for m in ("direct", "efficient")
    }
    # (below 256 MiB memory never decides: no look-up of the free memory per call)
    keep = True
    if memory_budget is None and max(sizes.values()) > 1 << 28:
        memory_budget = default_memory_budget(device)
        keep = False
    fits = [m for m, b in sizes.items() if memory_budget is None or b <= memory_budget]
    if len(fits) == 1:
        logger.debug(
            "auto -> %s (memory: working sets direct %d B, efficient %d B, budget %d B)",
            fits[0], sizes["direct"], sizes["efficient"], memory_budget,
        )  # fmt: skip
        return Decision(fits[0], "memory"), keep
    if use_calibration:
        try:
            mode = _calibrated_mode(nq, nk, d, dv, causal, torch.device(device), dtype, backward)
        except Exception as err:  # the choice of form must never break the op
            _warn_once(f"the calibration lookup failed ({type(err).__name__}: {err})")
            mode = None
        if mode is not None:
            return Decision(mode, "calibration"), keep
        mode = _cpu_prior_mode(
            nq, nk, d, dv, causal, torch.device(device), dtype, batch_heads, backward
        )
        if mode is not None:
            return Decision(mode, "cpu prior"), keep
        mode = _gpu_prior_mode(nq, nk, d, dv, causal, torch.device(device), dtype, backward)
        if mode is not None:
            return Decision(mode, "gpu prior"), keep
    direct = impl_ops_direct(nq, nk, d, dv, order)
    efficient = impl_ops_efficient(nq, nk, d, dv, causal, DEFAULT_CAUSAL_CHUNK)
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
    return Decision(mode, "theory"), keep


# Without a calibration of this CPU, the correction ρ(d) = N̂_measured / N̂_theory, non-causal
# float32, from two runs of ``taylorshift bench calibrate`` on the project's AMD EPYC after the
# efficient form's feature-major chunks and scratch buffers (benchmarks/op_cpu/layout:
# 416 / 1,055 / 2,432 and 431 / 1,009 / 2,672 forward, 431 / 1,060 / 1,917 and
# 458 / 821 / 2,111 forward + backward at d = 16 / 32 / 64). Geometric mean of the four
# ratios at each d. (The earlier prior, 3.4 / 1.6 / 1.0, also had an Intel Xeon, measured
# before those changes.) The efficient form's fixed costs (its feature map row by row,
# narrow products) make the theory's switch, N ≈ 153 at d = 16, choose it ~3x too early.
CPU_PRIOR = {16: 2.85, 32: 1.75, 64: 1.05}
# With the CPU kernels (taylorshift/ops/cpu: the direct and the efficient form in C, float32
# and 16-bit inputs), measured with ``taylorshift bench calibrate --causal no`` on the same
# machine at two head counts, since the costs of the two forms scale differently with B·H.
# ρ is the geometric mean of each d's ratios (forward and forward + backward), refitted after
# the efficient form's one-call passes (benchmarks/op_cpu/efficient-passes, calibrate-*.txt):
# - B·H = 4, three runs: N̂ = 34 / 81 / 89 forward, 107 / 136 / 126 forward + backward at
#   d = 16 (ρ = 0.57: the two forms are within 20 % of each other from N = 19 to 76 forward,
#   so that switch moves with the noise), 269-358 / 356-471 at d = 32 (0.62), 1,474-1,626 /
#   1,319-1,532 at d = 64 (0.70);
# - B·H = 128, two runs (d = 64: one): N̂ = 100-137 / 111-123 at d = 16 (0.77), 451-456 /
#   460-503 at d = 32 (0.83), 1,341 / 1,561 at d = 64 (0.68).
# (Before those passes: 0.95 / 0.68 / 0.67 and 0.88 / 0.84 / 0.69, benchmarks/op_cpu/
# direct-kernel; with the PyTorch direct form the kernels' efficient form won from N = 1 at
# d = 16 and 4 heads, the direct kernel moved every switch up.)
# ρ is interpolated in (log B·H, log ρ) between the two, and held outside them.
CPU_KERNEL_PRIOR = {
    4: {16: 0.57, 32: 0.62, 64: 0.70},
    128: {16: 0.77, 32: 0.83, 64: 0.68},
}
# The same for causal calls (``--causal yes``; the theory's switch N = 416 / 820 / 2,402 counts
# the chunked form's intra-chunk blocks): the causal direct kernel stops at each row's last
# key and beats the chunked efficient form past the counted switch, more so with a backward
# (the direct form's backward is relatively cheaper), so ρ is kept per pass. Refitted after
# the causal chunk loop moved into C (sixth session, benchmarks/op_cpu/efficient-passes,
# calibrate-causal-*.txt; chunks of 128 / 256 / 512 tokens at d = 16 / 32 / 64), geometric
# means of two runs (128 heads, d = 64: one run):
# - B·H = 4: forward N̂ = 196-287 / 736-957 / 2,651-2,765 at d = 16 / 32 / 64, forward +
#   backward 454-584 / 919-1,159 / 3,454-3,621;
# - B·H = 128: forward 325-404 / 1,444-1,693 / 2,781, forward + backward 503-773 /
#   1,608-1,861 / 3,499.
# (Before, with the loop in Python: forward 2.08 / 1.66 / 1.41 and 1.60 / 1.25 / 1.41,
# forward + backward 2.74 / 2.00 / 1.70 and 1.96 / 2.29 / 1.47, benchmarks/op_cpu/
# direct-kernel.)
CPU_KERNEL_CAUSAL_PRIOR = {
    FORWARD: {4: {16: 0.57, 32: 1.03, 64: 1.12}, 128: {16: 0.87, 32: 1.90, 64: 1.16}},
    FORWARD_BACKWARD: {4: {16: 1.24, 32: 1.26, 64: 1.47}, 128: {16: 1.50, 32: 2.11, 64: 1.46}},
}
CPU_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _cpu_prior_mode(
    nq: int,
    nk: int,
    d: int,
    dv: int,
    causal: bool,
    device: torch.device,
    dtype: torch.dtype,
    batch_heads: int,
    backward: bool,
) -> str | None:
    """The choice on a CPU: from :data:`CPU_KERNEL_PRIOR` / :data:`CPU_KERNEL_CAUSAL_PRIOR`
    (per pass) when the CPU kernels run both forms, else from :data:`CPU_PRIOR` (float32,
    non-causal, the PyTorch forms); None where no prior was measured (the operation counts
    decide)."""
    if device.type != "cpu":
        return None
    if dtype in CPU_KERNEL_DTYPES and _cpu_kernels_ready():
        prior = CPU_KERNEL_PRIOR
        if causal:
            prior = CPU_KERNEL_CAUSAL_PRIOR[FORWARD_BACKWARD if backward else FORWARD]
        rho = _head_count_rho(prior, d, batch_heads)
        return _prior_mode(nq, nk, d, dv, causal, rho, f"CPU (kernels, B·H={batch_heads})")
    if dtype == torch.float32 and not causal:
        return _prior_mode(nq, nk, d, dv, causal, _interpolated(CPU_PRIOR, d), "CPU")
    return None


def _head_count_rho(prior: Mapping[int, Mapping[int, float]], d: int, batch_heads: int) -> float:
    """ρ at head dim d and B·H from a prior measured at two head counts: linear in
    (log B·H, log ρ) between them, held outside."""
    counts = sorted(prior)
    lo, hi = counts[0], counts[-1]
    t = (math.log(min(max(batch_heads, lo), hi)) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return math.exp(
        (1 - t) * math.log(_interpolated(prior[lo], d)) + t * math.log(_interpolated(prior[hi], d))
    )


def _interpolated(prior: Mapping[int, float], d: int) -> float:
    """ρ at head dim d: linear in (log d, log ρ) between the measured d, held outside."""
    ds = sorted(prior)
    log_ds = [math.log(x) for x in ds]
    log_rhos = [math.log(prior[x]) for x in ds]
    x = min(max(math.log(d), log_ds[0]), log_ds[-1])
    i = max(1, bisect.bisect_left(log_ds, x))
    t = (x - log_ds[i - 1]) / (log_ds[i] - log_ds[i - 1])
    return math.exp(log_rhos[i - 1] + t * (log_rhos[i] - log_rhos[i - 1]))


def _cpu_kernels_ready() -> bool:
    from .fused import cpu_kernels_ready  # (fused's routing owns the kernels' availability)

    return cpu_kernels_ready()


def _prior_mode(nq: int, nk: int, d: int, dv: int, causal: bool, rho: float, what: str) -> str:
    """Efficient iff 2·Nq·Nk/(Nq + Nk) reaches ρ times the counted switch (logged)."""
    n_hat = rho * _theory_n(d, dv, causal)
    length = 2 * nq * nk / (nq + nk) if nq + nk else 0.0
    mode = "efficient" if length >= n_hat else "direct"
    logger.debug(
        "auto -> %s (theory × %s prior: N̂=%.0f at d=%d dv=%d (ρ=%.2f); "
        "2·Nq·Nk/(Nq+Nk)=%.0f; no calibration of this %s: taylorshift bench calibrate)",
        mode, what, n_hat, d, dv, rho, length, what,
    )  # fmt: skip
    return mode


# Without a calibration of this GPU, calls on CUDA switch at ρ times the counted crossover,
# ρ from the GPU runs (d = 64 unless named, B·H = 32; benchmarks/gpu_h200, gpu_h100):
# - GPU_PRIOR, float16/bfloat16, non-causal (counted switch N ≈ 2,145 at d = 64), the fused
#   kernels: the first H200 run put the real switch in (8,192, 16,384) forward and (4,096,
#   16,384) forward + backward; the second (gpu_h200/2026-11-27) measured it at N ≈ 9,200
#   forward, 7,200 forward + backward (ρ = 4.3, 3.4), and at d = 128 forward at ≈ 26,000
#   (3.1 times the counted 8,385); the H100 (gpu_h100/2026-11-28) at 8,550 and 7,400 (ρ =
#   4.0, 3.5), d = 128 forward ≈ 30,800 (ρ = 3.7). ρ = 4 is within 1.3x of each.
# - GPU_FLOAT32_PRIOR, float32, non-causal: the efficient form is the PyTorch one there
#   (fused.float32_efficient_stays_on_pytorch), the direct form the Triton kernel. On the
#   H100 the PyTorch efficient form passed it at N ≈ 5,600 forward (ρ = 2.6) and was faster
#   forward + backward at every N timed, 2.2x at 1,024 (the direct kernel's float32
#   backward took 23.7 ms there, 345 ms at 4,096): with direct's time growing as N² and
#   efficient's as N below that, the switch is near 1,024 / 2.2 ≈ 470 (ρ ≈ 0.22).
# - GPU_CAUSAL_PRIOR, causal (any kernel dtype; counted switch 2,402 at d = 64), bf16: at N
#   = 16,384 and 65,536 the causal efficient kernels took 4.65x and 1.35x (forward), 2.95x
#   and 0.90x (forward + backward) the causal direct kernel's time on the H100 (the H200:
#   4.1x and 2.6x at 16,384). Interpolated in log-log between the two H100 points (forward
#   + backward) and extrapolated past 65,536 (forward), the switch is near 92,000 and
#   58,000 (ρ ≈ 38 and 24). float32 was not timed causal.
# The counts carry the dependence on d. A calibration of the GPU (taylorshift bench
# calibrate) wins over all three.
GPU_PRIOR = 4.0
GPU_FLOAT32_PRIOR = {FORWARD: 2.6, FORWARD_BACKWARD: 0.22}
GPU_CAUSAL_PRIOR = {FORWARD: 38.0, FORWARD_BACKWARD: 24.0}


def _gpu_prior_mode(
    nq: int, nk: int, d: int, dv: int, causal: bool, device: torch.device, dtype: torch.dtype,
    backward: bool,
) -> str | None:  # fmt: skip
    """The choice from :data:`GPU_PRIOR`, :data:`GPU_FLOAT32_PRIOR` or
    :data:`GPU_CAUSAL_PRIOR` for calls on CUDA in a kernel dtype, else None."""
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return None
    if causal:
        rho = GPU_CAUSAL_PRIOR[FORWARD_BACKWARD if backward else FORWARD]
        return _prior_mode(nq, nk, d, dv, causal, rho, "GPU, causal")
    if dtype == torch.float32:
        rho = GPU_FLOAT32_PRIOR[FORWARD_BACKWARD if backward else FORWARD]
        return _prior_mode(nq, nk, d, dv, causal, rho, "GPU, float32")
    return _prior_mode(nq, nk, d, dv, causal, GPU_PRIOR, "GPU")


MEMORY_BUDGET_ENV = "TAYLORSHIFT_MEMORY_BUDGET"


def working_set_bytes(
    mode: str, nq: int, nk: int, d: int, dv: int, causal: bool, batch_heads: int, itemsize: int
) -> int:
    """A generous estimate of the extra memory a form needs for one call, forward and
    backward, beyond what every form needs alike (the inputs, the output, their gradients).

    direct: blocks of at most 2^18 scores (three live copies: scores, weights, their
    gradient), the row sums, and for calls of at most 2^22 (Nq, Nk) entries in all the
    weights and their derivative kept for the backward (``direct.KEEP_ENTRIES``);
    efficient: the (D, dv + 1) state per batch entry and head three times (state, its
    weighted copy, its gradient) and one chunk of features.
    """
    if mode == "direct":
        entries = batch_heads * nq * nk
        kept = 2 * entries if entries <= KEEP_ENTRIES else 0
        return itemsize * (3 * (1 << 18) + batch_heads * nq + kept)
    chunk = DEFAULT_CAUSAL_CHUNK if causal else default_chunk_size(batch_heads, d, dv)
    chunk = min(max(nq, nk, 1), chunk)
    state = batch_heads * feature_dim(d) * (dv + 1)
    return itemsize * (3 * state + 2 * batch_heads * chunk * feature_dim(d))


def default_memory_budget(device: torch.device | str | None) -> int:
    """Bytes a call may use: ``$TAYLORSHIFT_MEMORY_BUDGET`` if set, else half the memory
    that is free now (CUDA: ``torch.cuda.mem_get_info``; CPU: MemAvailable of
    /proc/meminfo), else unlimited."""
    value = os.environ.get(MEMORY_BUDGET_ENV)
    if value:
        try:
            return int(float(value))
        except ValueError:
            _warn_once(f"{MEMORY_BUDGET_ENV}={value!r} is not a number of bytes; ignored")
    try:
        dev = torch.device(device) if device is not None else torch.device("cpu")
        if dev.type == "cuda":
            return torch.cuda.mem_get_info(dev)[0] // 2
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // 2
    except Exception:  # no way to tell: memory does not decide
        pass
    return 1 << 62


def _calibrated_mode(
    nq: int,
    nk: int,
    d: int,
    dv: int,
    causal: bool,
    device: torch.device,
    dtype: torch.dtype,
    backward: bool,
) -> str | None:
    calibration = load_calibration()
    if calibration is None:
        return None
    dev = device_key(device)
    name = _dtype_text(dtype)
    order = (FORWARD_BACKWARD, FORWARD) if backward else (FORWARD, FORWARD_BACKWARD)
    for passes in order:
        key = (dev, name, causal, passes)
        n_hat = calibration.estimate(key, d, dv)
        if n_hat is not None:
            break
    else:
        return None
    length = 2 * nq * nk / (nq + nk) if nq + nk else 0.0
    mode = "efficient" if length >= n_hat else "direct"
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "auto -> %s (calibration [%s | %s | %s | %s], measured d %s: N̂=%.0f at d=%d dv=%d; "
            "2·Nq·Nk/(Nq+Nk)=%.0f, Nq=%d Nk=%d; %s)",
            mode,
            dev,
            name,
            "causal" if causal else "full",
            passes,
            sorted(calibration.measured[key]),
            n_hat,
            d,
            dv,
            length,
            nq,
            nk,
            calibration.path,
        )
    return mode
