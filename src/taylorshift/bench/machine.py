"""What a result was measured on: hardware, versions, the SDPA backend, the command.

The one description of a machine for every benchmark. It builds on
``taylorshift.ops.taylor_shift.dispatch`` (the CPU model, and the device key under which
``taylorshift bench calibrate`` stores a crossover), so that a result and a calibration name
the same device alike; the op layer does not import the benchmarks.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import torch

import taylorshift
from taylorshift.bench.core import GIB
from taylorshift.ops.taylor_shift.calibration import cpu_model, device_key

__all__ = [
    "command_line",
    "cpu_flags",
    "load_average",
    "machine_info",
    "memory_bytes",
    "sdpa_backend",
]


def _git_revision() -> str | None:
    """The checkout's commit (with a mark when the tracked tree differs), if in a git tree."""
    root = Path(taylorshift.__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        run = lambda *a: subprocess.run(  # noqa: E731
            ["git", "-C", str(root), *a], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        rev = run("rev-parse", "HEAD")
        dirty = run("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return None
    return rev + (" (with uncommitted changes)" if dirty else "") if rev else None


def _sources_hash() -> str:
    """sha256 over the package's Python sources: tells which code was measured."""
    folder = Path(taylorshift.__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _optional_version(name: str) -> str | None:
    try:
        module = __import__(name)
    except ImportError:
        return None
    return getattr(module, "__version__", "unknown")


def cpu_flags() -> str:
    """The CPU's vector-instruction flags (avx*, amx*, fma*) from /proc/cpuinfo, sorted and
    space-separated ("" where unknown)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return " ".join(sorted(f for f in flags if f.startswith(("avx", "amx", "fma"))))
    except OSError:
        pass
    return ""


def load_average() -> tuple[float, float, float] | None:
    """The 1, 5 and 15 minute load averages (the machine may be shared), or None."""
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return None


def memory_bytes(device: torch.device | str = "cpu") -> int | None:
    """The memory of the device: the GPU's, or the machine's RAM (None where unknown)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def machine_info(device: torch.device | str = "cpu") -> dict:
    """Hardware and software of this run, as a flat JSON-able dict."""
    device = torch.device(device)
    ram = memory_bytes("cpu")
    info = {
        "device": str(device),
        "device_key": device_key(device),
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": None if ram is None else round(ram / GIB, 1),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_parallel": torch.__config__.parallel_info().splitlines()[-1].strip(),
        "mkl": torch.backends.mkl.is_available(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "taylorshift": taylorshift.__version__,
        "triton": _optional_version("triton"),
        "cpu_kernels": cpu_kernels_state() if device.type == "cpu" else None,
        "git_revision": _git_revision(),
        "sources_sha256": _sources_hash(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / GIB, 1),
            gpu_capability=f"{props.major}.{props.minor}",
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            nccl=_nccl_version(),
        )
    return info


def cpu_kernels_state() -> str:
    """Whether the efficient form ran on the CPU kernels (taylorshift.ops.cpu): "on", or
    "off: <why>" (turned off, no compiler, a failed build)."""
    from ..ops import cpu

    reason = cpu.unavailable_reason()
    return "on" if reason is None else f"off: {reason}"


def _nccl_version() -> str | None:
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except (AttributeError, RuntimeError):
        return None


def sdpa_backend(query, key, value, *, is_causal: bool = False) -> str:
    """The fused SDPA backend torch picks for these inputs (FLASH_ATTENTION, MATH, ...)."""
    from torch.nn.attention import SDPBackend

    try:
        choice = torch._fused_sdp_choice(query, key, value, is_causal=is_causal)
    except (AttributeError, RuntimeError):  # a private API: say so rather than fail
        return "unknown"
    return SDPBackend(choice).name


#: The argv of the running ``taylorshift`` command, set by ``taylorshift.cli.main`` (so a
#: command run through ``main([...])``, e.g. in tests, records its own arguments).
INVOKED_ARGV: list[str] | None = None


def command_line() -> str:
    """The command as typed, for "how to reproduce": ``taylorshift ARGS`` when run through
    the ``taylorshift`` entry point (console script, ``python -m taylorshift`` or ``main``)."""
    if INVOKED_ARGV is not None:
        argv = ["taylorshift", *INVOKED_ARGV]
    else:
        argv = list(sys.argv)
        if argv and argv[0].endswith(("taylorshift", "taylorshift.exe", "__main__.py")):
            argv[0] = "taylorshift"
    return " ".join(shlex.quote(a) for a in argv)
