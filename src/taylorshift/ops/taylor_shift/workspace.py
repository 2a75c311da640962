"""Scratch buffers kept between calls, so that the efficient forms allocate no large tensor
per chunk or per call.

Why: a fresh CPU allocation of a few MiB is served by ``mmap`` and pays a page fault per
4 KiB page on first touch; on the project's 2-core machines filling a fresh 8 MiB tensor
took 11x as long as filling one that exists, and the efficient form's backward faulted up to
11,640 times per call at d = 64 (benchmarks/op_cpu/workspace). ``scratch(slot, shape, …)``
hands out a view of a flat buffer kept per thread, slot and dtype, grown when a larger one
is asked for, or None where a fresh tensor is the better choice: below
``SCRATCH_MIN_ELEMENTS``, off the CPU (the CUDA caching allocator already reuses memory)
and under torch.compile (the compiler plans its own buffers).

Rules for callers: a view is valid until the next ``scratch`` call of the same slot on the
same thread; never return one to a user, save it for backward, or keep it across a call.
``clear_workspace()`` frees every buffer of the calling thread.
"""

from __future__ import annotations

import math
import threading

import torch
from torch import Tensor

# Smaller tensors are allocated fresh: the allocator's heap serves them without faults, and a
# first version with buffers at every size (and an in-place baddbmm_) measured 5-15 %
# slower at N <= 512, d <= 32 (benchmarks/op_cpu/workspace).
SCRATCH_MIN_ELEMENTS = 1 << 20

_local = threading.local()


def _buffers() -> dict:
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
    return buffers


def scratch(
    slot: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> Tensor | None:
    """An uninitialised contiguous tensor of ``shape``, a view of this thread's buffer for
    ``slot`` (see the module's rules), or None: allocate a fresh tensor (or compute out of
    place) below ``SCRATCH_MIN_ELEMENTS``, off the CPU and under torch.compile."""
    size = math.prod(shape)
    if size < SCRATCH_MIN_ELEMENTS or device.type != "cpu" or torch.compiler.is_compiling():
        return None
    buffers = _buffers()
    key = (slot, dtype)
    buffer = buffers.get(key)
    if buffer is None or buffer.numel() < size:
        with torch.inference_mode(False):  # usable in and out of inference mode
            buffer = buffers[key] = torch.empty(size, dtype=dtype)
    return buffer[:size].view(shape)


def clear_workspace() -> None:
    """Free the scratch buffers of the calling thread (they are rebuilt when next needed)."""
    _buffers().clear()
