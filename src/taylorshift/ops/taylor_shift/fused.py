"""Routing to the fused Triton kernels (``taylorshift.ops.triton``) when they apply.

The public op computes the same function either way; this only picks who computes it.
A call goes to a fused kernel when all of these hold, else it stays on the PyTorch forms:

- the tensors are on a CUDA device (or ``TAYLORSHIFT_TRITON=interpret``, which also routes
  CPU tensors, for Triton's interpreter in tests: ``TRITON_INTERPRET=1`` must then be set
  before Triton is imported), Triton is installed, and
  ``TAYLORSHIFT_TRITON`` is not ``off``;
- dtype float32, float16 or bfloat16 (float64 stays in PyTorch), order 2,
  1 <= d, dv <= ``MAX_HEAD_DIM``, Nq, Nk >= 1;
- the form has a kernel: efficient or direct (causal or not) with no mask or a key-padding
  mask. Masks that vary over queries stay on the PyTorch path;
- causal efficient only: its first version keeps every chunk's prefix state at once (about
  3 · B·H · Nk/C · D · (dv + 2) float32 at the peak), so calls whose states would exceed
  ``CAUSAL_STATE_BUDGET`` bytes stay on the memory-lean PyTorch form.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from collections.abc import Callable

import torch
from torch import Tensor

from .checks import Problem
from .features import feature_dim

logger = logging.getLogger("taylorshift.dispatch")

TRITON_ENV = "TAYLORSHIFT_TRITON"
MAX_HEAD_DIM = 128
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CAUSAL_STATE_BUDGET = 256 << 20
CAUSAL_CHUNK = 256  # ops.triton.efficient_causal.DEFAULT_CHUNK, without importing Triton


def causal_state_bytes(problem: Problem) -> int:
    """Peak bytes of the causal kernel's chunk states (the states, their prefix, a copy)."""
    chunks = -(-problem.n_key // CAUSAL_CHUNK)
    per_state = feature_dim(problem.head_dim) * (problem.value_dim + 2) * 4
    return 3 * problem.batch * problem.heads * chunks * per_state


@functools.lru_cache(maxsize=1)
def triton_importable() -> bool:
    """Whether the optional ``triton`` package is installed (checked once, without import)."""
    return importlib.util.find_spec("triton") is not None


def _setting() -> str:
    value = os.environ.get(TRITON_ENV, "auto").strip().lower()
    return value if value in ("auto", "off", "interpret") else "auto"


def fused_form(
    query: Tensor, problem: Problem, mode: str, is_causal: bool, order: int
) -> Callable[..., Tensor] | None:
    """The fused kernel for this call (a function with the signature of the matching
    PyTorch form, see ``interface``), or None to use the PyTorch form."""
    setting = _setting()
    if setting == "off" or not (query.is_cuda or setting == "interpret"):
        return None
    if not triton_importable() or order != 2 or query.dtype not in KERNEL_DTYPES:
        return None
    if not (1 <= problem.head_dim <= MAX_HEAD_DIM and 1 <= problem.value_dim <= MAX_HEAD_DIM):
        return None
    if problem.n_query == 0 or problem.n_key == 0 or problem.mask_varies_over_queries:
        return None
    if mode == "efficient" and not is_causal:
        from ..triton.efficient import triton_efficient_taylor_shift

        logger.debug("fused: triton efficient (non-causal)")
        return triton_efficient_taylor_shift
    if mode == "efficient" and causal_state_bytes(problem) > CAUSAL_STATE_BUDGET:
        logger.debug("fused: none (causal chunk states over budget; PyTorch causal form)")
        return None
    if mode == "efficient":
        from ..triton.efficient_causal import triton_causal_efficient_taylor_shift

        logger.debug("fused: triton efficient (causal)")
        return triton_causal_efficient_taylor_shift
    if mode == "direct":
        from ..triton.direct import triton_direct_taylor_shift

        logger.debug("fused: triton direct (%s)", "causal" if is_causal else "non-causal")
        return triton_direct_taylor_shift
    return None
