"""One name per pass and per dtype, for the whole package.

Benchmarks, their reports and ``results.json``, the calibration file and ``mode="auto"``'s
look-up all spell a pass and a dtype the same way:

- passes: ``"forward"`` (one forward) and ``"forward+backward"`` (one forward and the
  gradients of the inputs); full words, so that a table, a figure title and a file key need
  no second, longer spelling;
- dtypes: torch's names, ``"float32"``, ``"bfloat16"``, ``"float16"``, ``"float64"``.

Earlier spellings are still understood where a user or an old file may give them (command
line options, calibration files and ``results.json`` written before): ``fwd``, ``fwd+bwd``,
``train`` (the calibration's old name for forward + backward) and ``fp32``, ``bf16``,
``fp16``, ``fp64``. :func:`pass_name` and :func:`dtype_name` map any of them onto the one
name. Nothing here imports torch at import time (ops, bench and the docs all use it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "DTYPES",
    "DTYPE_ALIASES",
    "FORWARD",
    "FORWARD_BACKWARD",
    "PASSES",
    "PASS_ALIASES",
    "dtype_name",
    "pass_name",
    "torch_dtype",
]

FORWARD = "forward"
FORWARD_BACKWARD = "forward+backward"
PASSES = (FORWARD, FORWARD_BACKWARD)
PASS_ALIASES = {"fwd": FORWARD, "fwd+bwd": FORWARD_BACKWARD, "train": FORWARD_BACKWARD}

DTYPES = ("float32", "bfloat16", "float16", "float64")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp64": "float64"}


def pass_name(name: str) -> str:
    """The one name of a pass: ``"forward"`` or ``"forward+backward"`` (old spellings
    ``fwd``, ``fwd+bwd`` and ``train`` accepted); ``ValueError`` for anything else."""
    if name in PASSES:
        return name
    if isinstance(name, str) and name in PASS_ALIASES:
        return PASS_ALIASES[name]
    raise ValueError(f"pass must be one of {', '.join(map(repr, PASSES))}; got {name!r}")


def dtype_name(dtype: str | torch.dtype) -> str:
    """The one name of a dtype: torch's (``"float32"``, ...), from a ``torch.dtype``, its
    name, ``"torch.float32"`` or a short name (``fp32``, ``bf16``, ``fp16``, ``fp64``);
    ``ValueError`` for anything else."""
    text = str(dtype).removeprefix("torch.")
    text = DTYPE_ALIASES.get(text, text)
    if text not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(map(repr, DTYPES))}; got {dtype!r}")
    return text


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """The ``torch.dtype`` of a name :func:`dtype_name` accepts."""
    import torch

    return getattr(torch, dtype_name(name))
