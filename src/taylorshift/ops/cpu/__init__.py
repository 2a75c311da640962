"""Fused CPU kernels for TaylorShift (C, built on first use) and their autograd wrappers;
layout (B, H, N, d).

``taylorshift.taylor_shift_attention`` routes CPU calls of the direct and the efficient
form, causal and non-causal, to them (float32, float16, bfloat16; no mask or key padding), and
``taylor_shift_decode`` its single-token steps on float32 states (``decode.py``); both use
the PyTorch forms wherever the kernels do not apply or cannot build; ``unavailable_reason()``
says why they cannot run here (``TAYLORSHIFT_CPU_KERNELS=off``, no C compiler, a failed
build). The unchecked forms themselves are ``efficient.cpu_efficient_taylor_shift``,
``efficient_causal.cpu_causal_efficient_taylor_shift`` and ``direct.cpu_direct_taylor_shift``.
Design and measurements: docs/cpu-kernel.md.
"""

from __future__ import annotations

from .build import is_available, unavailable_reason

__all__ = ["is_available", "unavailable_reason"]
