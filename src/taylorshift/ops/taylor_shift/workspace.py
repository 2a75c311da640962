"""Scratch buffers kept between calls, so that the efficient forms allocate no large tensor
per chunk or per call.

Why: a fresh CPU allocation of a few MiB is served by ``mmap`` and pays a page fault per
4 KiB page on first touch; on the project's 2-core machines filling a fresh 8 MiB tensor
takes 10x as long as filling one that exists (benchmarks/op_cpu/workspace). The efficient
forms build one (B·H, C, D) feature block per chunk, often tens of them per call, so the
faults cost up to half of a call. ``scratch(slot, shape, …)`` hands out a view of a flat
buffer kept per thread, slot, dtype and device, grown when a larger one is asked for.

Rules for callers: a view is valid until the next ``scratch`` call of the same slot on the
same thread; never return one to a user, save it for backward, or keep it across a call.
Under torch.compile a fresh tensor is returned (the compiler plans its own buffers). GPU
tensors get fresh tensors too: the CUDA caching allocator already reuses memory.
``clear_workspace()`` frees every buffer of the calling thread.
"""

from __future__ import annotations

import math
import threading

import torch
from torch import Tensor

# Smaller tensors are allocated fresh: they come from the allocator's heap without page
# faults, and fresh ones measured 3-14 % faster at N <= 1,024, d <= 32
# (benchmarks/op_cpu/workspace).
SCRATCH_MIN_ELEMENTS = 1 << 20

_local = threading.local()


def _buffers() -> dict:
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
    return buffers


def scratch(slot: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialised contiguous tensor of ``shape``: a view of this thread's buffer for
    ``slot`` on the CPU from ``SCRATCH_MIN_ELEMENTS`` elements (see the module's rules), a
    fresh tensor otherwise. ``device`` is a ``torch.device``."""
    size = math.prod(shape)
    if size < SCRATCH_MIN_ELEMENTS or device.type != "cpu" or torch.compiler.is_compiling():
        return torch.empty(shape, dtype=dtype, device=device)
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
