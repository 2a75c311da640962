"""Fused Triton kernels for TaylorShift and their autograd wrappers; layout (B, H, N, d).

Importing this package does not import Triton: ``is_available()`` says whether the kernels
can run here (Triton installed, and a CUDA device or ``TRITON_INTERPRET=1`` for the CPU
interpreter) and ``unavailable_reason()`` says why not. Install with
``pip install 'taylorshift[triton]'``.

The public way to run the kernels is ``taylorshift.taylor_shift_attention``: it checks its
inputs and routes CUDA tensors to them (falling back to PyTorch where a kernel cannot run).
The forms themselves skip input checks, like the PyTorch forms of
``taylorshift.ops.taylor_shift``, and are imported from their modules:
``taylorshift.ops.triton.direct.triton_direct_taylor_shift``,
``.efficient.triton_efficient_taylor_shift``,
``.efficient_causal.triton_causal_efficient_taylor_shift`` (importing one imports Triton).
"""

from __future__ import annotations

import importlib
import os
import warnings

# Old package-level names of the unchecked forms -> the submodule that defines them; they
# still resolve (loading Triton), with a FutureWarning naming the new spelling.
_MOVED = {
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
    if name in _MOVED:
        warnings.warn(
            f"taylorshift.ops.triton.{name} skips input checks and is no longer exported "
            f"here: call taylorshift.taylor_shift_attention (checked; it runs this kernel on "
            f"CUDA tensors) or import it from taylorshift.ops.triton.{_MOVED[name]}",
            FutureWarning,
            stacklevel=2,
        )
        module = importlib.import_module(f".{_MOVED[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["is_available", "unavailable_reason"]
