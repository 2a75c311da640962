"""What every benchmark shares: statuses, the pass and dtype options (names from
:mod:`taylorshift.vocab`), units, one markdown table, the device option and the message for a
missing extra.

A benchmark tool (``taylorshift bench``, ``bench models``, ...) is a module or package of
:mod:`taylorshift.bench` with ``HELP``, ``add_arguments(parser)`` and ``run(args, parser)``
for the command line, and, where it writes a folder of results, ``report_markdown(results)``
and ``write_outputs(results, out, *, plots=True)``. Points that fail are results with a
status, never crashes (:mod:`taylorshift.bench.runner`).
"""

from __future__ import annotations

import argparse
import importlib
import math
import warnings
from collections.abc import Callable, Iterable, Sequence

import torch

from ..vocab import DTYPE_ALIASES, PASS_ALIASES, PASSES, dtype_name, torch_dtype

__all__ = [
    "GIB",
    "MIB",
    "OK",
    "OOM",
    "OVER_BUDGET",
    "PASSES",
    "SKIPPED",
    "dtype_option",
    "dtypes",
    "is_oom",
    "markdown_table",
    "mib",
    "missing_modules",
    "ms",
    "parse_device",
    "pass_option",
    "renamed",
    "status_of",
]

# Statuses of a measured point (or metric). Anything else is "error: <exception type>".
OK = "ok"
OOM = "oom"
OVER_BUDGET = "over budget"  # not measured: predicted too slow or too large, or out of time
SKIPPED = "skipped"  # not measured: an earlier point of its series failed, or not asked for
ERROR_CHARS = 300  # how much of an exception's message a result keeps


def is_oom(err: BaseException) -> bool:
    """Whether an exception means "out of memory" (CUDA, CPU allocator or Python)."""
    if isinstance(err, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(err).lower()
    return any(s in text for s in ("out of memory", "can't allocate memory", "failed to allocate"))


def status_of(err: BaseException) -> str:
    """The status of a point whose call raised ``err``: ``"oom"`` or ``"error: <type>"``."""
    return OOM if is_oom(err) else f"error: {type(err).__name__}"


# Passes and dtypes: the package's one vocabulary (taylorshift.vocab). Command-line options
# take the old spellings too (fwd, fwd+bwd, train; fp32, bf16, fp16, fp64).


def dtypes(*names: str) -> dict[str, torch.dtype]:
    """``{name: torch dtype}`` for the dtypes a tool accepts, in the order given, keyed by
    their names in the vocabulary (``"fp32"`` given: key ``"float32"``)."""
    return {dtype_name(name): torch_dtype(name) for name in names}


def dtype_option(text: str) -> str:
    """argparse ``type`` of a dtype option: an old short name (``fp32``) becomes torch's
    (``float32``); anything else is left for the option's ``choices`` to judge."""
    return DTYPE_ALIASES.get(text, text)


def pass_option(text: str) -> str:
    """argparse ``type`` of a pass option: ``fwd``, ``fwd+bwd`` and ``train`` become
    ``forward`` and ``forward+backward``; anything else is left for ``choices`` to judge."""
    return PASS_ALIASES.get(text, text)


# Units.
MIB = 1 << 20
GIB = 1 << 30


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def ms(seconds: float | None, missing: str = "–") -> str:
    """Milliseconds, three significant digits (thousands separated from 1 s on)."""
    if not _finite(seconds):
        return missing
    value = seconds * 1e3
    return f"{value:.3g}" if value < 1000 else f"{value:,.0f}"


def mib(n_bytes: float | None, digits: int = 1, missing: str = "–") -> str:
    """Bytes as MiB with ``digits`` decimals."""
    return missing if n_bytes is None else f"{n_bytes / MIB:.{digits}f}"


def markdown_table(
    headers: Sequence[str], rows: Iterable[Sequence[object]], align: str = ""
) -> str:
    """A markdown table. ``align``: one ``l`` or ``r`` per column; empty for the renderer's
    default alignment."""
    if align:
        marks = "| " + " | ".join(":---" if a == "l" else "---:" for a in align) + " |"
    else:
        marks = "|" + "---|" * len(headers)
    lines = ["| " + " | ".join(headers) + " |", marks]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# Command line.


def parse_device(
    text: str | None, parser: argparse.ArgumentParser, flag: str = "--device"
) -> torch.device:
    """``--device``: cpu, cuda or cuda:i (default: cuda if available, else cpu); anything
    else, or CUDA where there is none, goes through ``parser.error`` (exit status 2)."""
    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        parser.error(f"{flag}: expected cpu, cuda or cuda:<index>; got {text!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(
            f"{flag}: expected an available device; got {text!r} but CUDA is not available"
        )
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        parser.error(
            f"{flag}: expected cuda:0 … cuda:{torch.cuda.device_count() - 1}; got {text!r}"
        )
    return device


INSTALL_HINT = "pip install 'taylorshift[bench]'"


def missing_modules(*names: str) -> list[str]:
    """The modules of ``names`` that cannot be imported (e.g. ``tqdm``, ``matplotlib``)."""
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name.partition(".")[0])
    return missing


def renamed(module: str, names: dict[str, str], space: dict) -> Callable[[str], object]:
    """A module ``__getattr__`` for names that moved: ``old -> new`` warns (a
    ``DeprecationWarning`` naming the new spelling) and returns the new object."""

    def __getattr__(name: str) -> object:
        if name in names:
            new = names[name]
            warnings.warn(
                f"{module}.{name} is now {module}.{new}", DeprecationWarning, stacklevel=2
            )
            return space[new]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
