"""Fused Triton kernels for TaylorShift and their autograd wrappers; layout (B, H, N, d).

Importing this package does not import Triton: ``is_available()`` says whether the kernels
can run here (Triton installed, and a CUDA device or ``TRITON_INTERPRET=1`` for the CPU
interpreter) and ``unavailable_reason()`` says why not. The forms themselves are imported
on first use (``from taylorshift.ops.triton import triton_efficient_taylor_shift`` imports
Triton then). Install with ``pip install 'taylorshift[triton]'``.
"""

from __future__ import annotations

import importlib
import os

# Public name -> submodule that defines it; loaded (with Triton) on first access.
_LAZY = {
    "triton_direct_taylor_shift": "direct",
    "triton_efficient_taylor_shift": "efficient",
    "triton_causal_efficient_taylor_shift": "efficient_causal",
}


def unavailable_reason() -> str | None:
    """Why the Triton kernels cannot run in this process, or None when they can."""
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"triton is not installed ({exc}); install it with pip install 'taylorshift[triton]'"
    import torch

    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return (
        "no CUDA device, and TRITON_INTERPRET=1 (Triton's CPU interpreter) was not set before "
        "triton was imported"
    )


def is_available() -> bool:
    """Whether the Triton kernels can run here (see ``unavailable_reason``)."""
    return unavailable_reason() is None


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["is_available", "unavailable_reason", *_LAZY]
