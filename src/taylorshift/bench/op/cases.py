"""The op sweep's cases: a registry of attention implementations, plain callables on
(B, H, N, d) tensors, and the calls the sweep times (one forward, or one forward and the
gradients of q, k, v). :func:`build_call` is the recipe of the fresh-process memory worker.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ... import vocab
from ...ops import taylor_shift_attention
from ...ops.taylor_shift.direct import direct_taylor_shift
from ...ops.taylor_shift.efficient import efficient_taylor_shift
from ...theory import impl_ops_direct, impl_ops_efficient
from ...vocab import FORWARD, FORWARD_BACKWARD
from ..core import dtypes

__all__ = [
    "FAMILIES",
    "IMPLEMENTATIONS",
    "Implementation",
    "build_call",
    "make_call",
    "make_inputs",
    "model_flops",
    "register_implementation",
]

RECIPE = "taylorshift.bench.op.cases:build_call"
DTYPES = dtypes("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Implementation:
    """An attention implementation the sweep can measure.

    Attributes:
        name: the registry key, used on the command line (``--impl``) and in the results.
        label: the name in tables and plot legends.
        fn: ``fn(q, k, v) -> out``, all (B, H, N, d), non-causal, no mask.
        family: ``"softmax"``, ``"taylorshift-direct"`` or ``"taylorshift-efficient"``.
            Crossovers compare each efficient implementation with the fastest (leanest) of
            the direct ones and of the softmax ones at each N.
        time_exponent: call time grows at most like N**time_exponent; predicts the next
            point of a series from the previous one (skip what would take too long).
        n2_matrices: (fwd, fwd+bwd) estimates of the N × N float32 matrices held at the
            peak per (batch, head); predicts memory (skip what would not fit). 0 for
            implementations that never hold one.
        devices: device types it runs on (a Triton kernel would say ``("cuda",)``).
        module: imported by the fresh memory-worker process when it does not know ``name``:
            the module whose import registers the implementation.
        default: measured when ``--impl`` is not given (the compiled implementations are
            not: each point would cost seconds of compilation).
        default_devices: the device types where ``default`` holds (None: all of
            ``devices``).
    """

    name: str
    label: str
    fn: Callable[[Tensor, Tensor, Tensor], Tensor]
    family: str
    time_exponent: float
    n2_matrices: tuple[float, float] = (0.0, 0.0)
    devices: tuple[str, ...] = ("cpu", "cuda")
    module: str = ""
    default: bool = True
    default_devices: tuple[str, ...] | None = None

    def is_default_on(self, device_type: str) -> bool:
        """Measured on ``device_type`` when ``--impl`` is not given."""
        if device_type not in self.devices or not self.default:
            return False
        return self.default_devices is None or device_type in self.default_devices

    def describe(self) -> dict:
        """The JSON-ready part (no callable), stored in results.json for the report."""
        return {
            "label": self.label,
            "family": self.family,
            "time_exponent": self.time_exponent,
            "n2_matrices": list(self.n2_matrices),
        }


FAMILIES = ("softmax", "taylorshift-direct", "taylorshift-efficient")
IMPLEMENTATIONS: dict[str, Implementation] = {}


def register_implementation(impl: Implementation, *, replace: bool = False) -> Implementation:
    """Add ``impl`` to :data:`IMPLEMENTATIONS` (``--impl`` accepts its name from then on)."""
    if impl.family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}; got {impl.family!r}")
    if impl.name in IMPLEMENTATIONS and not replace:
        raise ValueError(f"implementation {impl.name!r} is registered already")
    if not impl.module:
        impl = dataclasses.replace(impl, module=getattr(impl.fn, "__module__", "") or "")
    IMPLEMENTATIONS[impl.name] = impl
    return impl


def sdpa(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """torch's fused ``scaled_dot_product_attention`` (backend chosen by torch)."""
    return F.scaled_dot_product_attention(q, k, v)


def softmax_naive(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(Q Kᵀ / √d) V with the (N, N) weights materialised: the paper's baseline."""
    weights = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v  # (B, H, N, N) @ (B, H, N, d)


def taylorshift_direct(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return taylor_shift_attention(q, k, v, mode="direct")


def taylorshift_efficient(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return taylor_shift_attention(q, k, v, mode="efficient")


def pytorch_direct(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The PyTorch direct form, never routed to a fused kernel (to compare with one)."""
    return direct_taylor_shift(q, k, v, None, False, 1.0, None, True, 2)


def pytorch_efficient(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The PyTorch efficient form, never routed to a fused kernel (to compare with one)."""
    return efficient_taylor_shift(q, k, v, None, 1.0, None, True)


def triton_direct(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    from ...ops.triton.direct import triton_direct_taylor_shift

    return triton_direct_taylor_shift(q, k, v, None, False, 1.0, None, True)


def triton_efficient(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    from ...ops.triton.efficient import triton_efficient_taylor_shift

    return triton_efficient_taylor_shift(q, k, v, None, 1.0, None, True)


_COMPILED: dict[tuple, Callable] = {}


def _compiled(mode: str, q: Tensor) -> Callable:
    """``taylor_shift_attention(mode=mode)`` under ``torch.compile(fullgraph=True)`` for the
    shape, dtype and pass of ``q``, built on first use (importing the compiler costs
    seconds), so that a point's warm-up calls absorb its compilation. A sweep visits many
    shapes: one graph each would pass torch's recompile limit, so a new point starts from a
    reset compiler (only the current point's function is kept)."""
    key = (mode, tuple(q.shape), q.dtype, q.device, q.requires_grad)
    if key not in _COMPILED:
        _COMPILED.clear()
        torch._dynamo.reset()

        def op(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return taylor_shift_attention(q, k, v, mode=mode)

        _COMPILED[key] = torch.compile(op, fullgraph=True, dynamic=False)
    return _COMPILED[key]


def compiled_direct(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return _compiled("direct", q)(q, k, v)


def compiled_efficient(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return _compiled("efficient", q)(q, k, v)


# n2_matrices of the direct form: measured with the memory worker on a CPU at d = 64,
# N = 4096..16384 (4.0 forward, 6.1 forward+backward), rounded up.
for _impl in (
    Implementation("sdpa", "SDPA", sdpa, "softmax", 2),
    Implementation("softmax-naive", "softmax (naive)", softmax_naive, "softmax", 2, (3.0, 5.0)),
    Implementation(
        "direct", "TaylorShift direct", taylorshift_direct, "taylorshift-direct", 2, (4.5, 7.0)
    ),
    Implementation(
        "efficient", "TaylorShift efficient", taylorshift_efficient, "taylorshift-efficient", 1
    ),
    # torch.compile(fullgraph=True) of the public op, to set beside the eager calls
    Implementation(
        "direct-compiled",
        "TaylorShift direct (compiled)",
        compiled_direct,
        "taylorshift-direct",
        2,
        (4.5, 7.0),
        default=False,
    ),
    Implementation(
        "efficient-compiled",
        "TaylorShift efficient (compiled)",
        compiled_efficient,
        "taylorshift-efficient",
        1,
        default=False,
    ),
    # On CUDA the public op ("direct", "efficient") runs the fused Triton kernels where they
    # apply, on the CPU the CPU kernels; these name each path explicitly, so both can be
    # measured in one sweep (on the CPU with --impl only).
    Implementation(
        "direct-pytorch",
        "TaylorShift direct (PyTorch)",
        pytorch_direct,
        "taylorshift-direct",
        2,
        (4.5, 7.0),
        default_devices=("cuda",),
    ),
    Implementation(
        "efficient-pytorch",
        "TaylorShift efficient (PyTorch)",
        pytorch_efficient,
        "taylorshift-efficient",
        1,
        default_devices=("cuda",),
    ),
    Implementation(
        "direct-triton",
        "TaylorShift direct (Triton)",
        triton_direct,
        "taylorshift-direct",
        2,
        devices=("cuda",),
    ),
    Implementation(
        "efficient-triton",
        "TaylorShift efficient (Triton)",
        triton_efficient,
        "taylorshift-efficient",
        1,
        devices=("cuda",),
    ),
):
    register_implementation(_impl)
del _impl

COLOURS = {
    "sdpa": "tab:blue",
    "softmax-naive": "tab:purple",
    "direct": "tab:orange",
    "efficient": "tab:green",
    "direct-compiled": "tab:pink",
    "efficient-compiled": "tab:gray",
    "direct-pytorch": "tab:brown",
    "efficient-pytorch": "tab:olive",
    "direct-triton": "tab:red",
    "efficient-triton": "tab:cyan",
}


def _implementation(name: str, module: str | None = None) -> Implementation:
    if name not in IMPLEMENTATIONS and module:
        importlib.import_module(module)
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"impl must be one of {sorted(IMPLEMENTATIONS)}; got {name!r}")
    return IMPLEMENTATIONS[name]


def make_inputs(
    n: int,
    d: int,
    *,
    heads: int = 1,
    batch: int = 1,
    dtype: str = "float32",
    device: str = "cpu",
    backward: bool = False,
    seed: int = 0,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """q, k, v and the fixed output gradient, each (B, H, N, d), standard normal."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, heads, n, d)
    dt = DTYPES[vocab.dtype_name(dtype)]
    q, k, v, grad = (torch.randn(shape, generator=g).to(device=device, dtype=dt) for _ in range(4))
    if backward:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v, grad


def model_flops(family: str, n: int, d: int, pass_name: str, rows: int = 1) -> int:
    """Model FLOPs of one call on ``rows`` = B·H rows of N tokens, dv = d.

    Forward per row: softmax 4N²d (Q Kᵀ and the weights times V; the softmax itself is not
    counted), direct the paper's 4N²d + 6N² (``theory.impl_ops_direct``), efficient 2N
    times the per-token cost of the symmetric features (``theory.impl_ops_efficient``). A
    forward and
    backward counts 3 forwards (the backward ≈ two).
    """
    if family == "softmax":
        forward = 4 * n * n * d
    elif family == "taylorshift-direct":
        forward = impl_ops_direct(n, n, d, d)
    else:
        forward = impl_ops_efficient(n, n, d, d, causal=False, chunk=n)
    return forward * rows * (3 if vocab.pass_name(pass_name) == FORWARD_BACKWARD else 1)


def make_call(
    impl: Implementation, q: Tensor, k: Tensor, v: Tensor, grad: Tensor, pass_name: str
) -> Callable[[], object]:
    """One forward, or one forward and the gradients of q, k, v (not accumulated)."""
    if vocab.pass_name(pass_name) == FORWARD:
        return lambda: impl.fn(q, k, v)

    def forward_backward():
        out = impl.fn(q, k, v)
        return torch.autograd.grad(out, (q, k, v), grad)

    return forward_backward


def build_call(
    impl: str,
    n: int,
    d: int,
    heads: int = 1,
    batch: int = 1,
    dtype: str = "float32",
    device: str = "cpu",
    pass_name: str = FORWARD,
    seed: int = 0,
    module: str | None = None,
    warmup_n: int | None = None,
) -> Callable[[], object]:
    """The memory recipe (``RECIPE``, ``"taylorshift.bench.op.cases:build_call"``): inputs
    built, one call.

    With ``warmup_n`` the first call runs on small (``warmup_n``-token) inputs and every
    later call on the real ones. The memory worker calls once to initialise lazily, then
    measures the next call; a full-size first call would leave its freed blocks in the
    process's heap (glibc keeps blocks below its dynamic mmap threshold, up to 32 MiB), and
    the measured call would reuse them without raising the resident-set high-water mark.
    """
    implementation = _implementation(impl, module)

    def call_at(length: int, seed: int) -> Callable[[], object]:
        inputs = make_inputs(
            length,
            d,
            heads=heads,
            batch=batch,
            dtype=dtype,
            device=device,
            backward=vocab.pass_name(pass_name) == FORWARD_BACKWARD,
            seed=seed,
        )
        return make_call(implementation, *inputs, pass_name)

    first = call_at(warmup_n, seed + 1) if warmup_n else None
    call = call_at(n, seed)
    if first is None:
        return call
    pending = [first]

    def warm_then_real() -> object:
        return pending.pop()() if pending else call()

    return warm_then_real
