"""Routing to the fused kernels (Triton: ``taylorshift.ops.triton``; CPU:
``taylorshift.ops.cpu``) when they apply.

The public op computes the same function either way; this only picks who computes it.
A CPU call goes to the CPU kernels when it is the direct form or the efficient form
(non-causal, or causal, with an initial or final state too: ``stateful_form``), order 2,
of float32,
float16 or bfloat16 tensors with no mask or a key-padding mask, 1 <= d, dv <=
``MAX_HEAD_DIM``, B·H, Nq, Nk >= 1, and the kernels are available
(``TAYLORSHIFT_CPU_KERNELS`` not ``off``, a C compiler that built them:
``taylorshift.ops.cpu.unavailable_reason()``; warned once when they cannot build). A call
goes to a Triton kernel when all of these hold, else it stays on the PyTorch forms:

- the tensors are on a CUDA device (or ``TAYLORSHIFT_TRITON=interpret``, which also routes
  CPU tensors, for Triton's interpreter in tests: ``TRITON_INTERPRET=1`` must then be set
  before Triton is imported), Triton is installed, and
  ``TAYLORSHIFT_TRITON`` is not ``off``;
- dtype float32, float16 or bfloat16 (float64 stays in PyTorch), order 2,
  1 <= d, dv <= ``MAX_HEAD_DIM``, B·H, Nq, Nk >= 1 (an empty batch or sequence: nothing
  to launch);
- the form has a kernel: efficient or direct (causal or not) with no mask or a key-padding
  mask. Masks that vary over queries stay on the PyTorch path;
- float32 efficient calls on CUDA only where TF32 is allowed and autograd does not record
  the call; the rest take the PyTorch efficient form, faster there
  (``float32_efficient_stays_on_pytorch``);
- causal efficient only: it keeps the prefix states of the chunks it sweeps at once
  (about 3 · B·H states of the kernels' padded layout per chunk, float32, at the peak);
  where all the call's would exceed ``CAUSAL_STATE_BUDGET`` bytes it sweeps pieces of as
  many chunks as fit, each continuing the last one's state (``causal_piece_chunks``);
  calls where not one chunk fits stay on the memory-lean PyTorch form;
- the kernel has not failed before in this process for the same shape class.

A kernel that fails to compile or launch (out of shared memory, an architecture or a Triton
version it does not support) must not break the call: ``run_guarded`` catches the failure,
computes the same answer with the PyTorch form, logs one warning naming the kernel, the
shape class (device, dtype, d, dv, causal, mask) and the reason; that shape class then stays
on PyTorch for the rest of the process. Where the PyTorch form fails too, the call itself
was at fault: its error is raised and the kernel stays on. On a GPU, the first call of a shape
class that autograd records also runs the kernel's backward once on a tiny input
(``probe_backward``), so that a backward kernel that cannot compile is found while the
forward can still fall back. A real out-of-memory error is not a kernel failure and is
raised as usual, and so is ``torch.utils.checkpoint``'s control flow
(``_not_kernel_failures``).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from collections.abc import Callable

import torch
from torch import Tensor

from ..cpu import build
from ..triton.layout import layout
from .checks import Problem
from .grouped import repeated_heads

logger = logging.getLogger("taylorshift.dispatch")

# Shape classes whose kernel failed in this process -> the reason (see run_guarded).
FAILED: dict[tuple, str] = {}
_PROBED: set[tuple] = set()

TRITON_ENV = "TAYLORSHIFT_TRITON"
MAX_HEAD_DIM = 128
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CAUSAL_STATE_BUDGET = 256 << 20
# Tokens per chunk of the Triton causal path (its DEFAULT_CHUNK), here so that the router
# can size its states without importing Triton.
CAUSAL_CHUNK = 256


def chunk_state_bytes(batch_heads: int, d: int, dv: int) -> int:
    """Peak bytes of the Triton causal form's states per chunk it sweeps at once (the
    states, their prefix, a copy), each a float32 row of the kernels' padded layout
    (``ops/triton/layout.py``)."""
    return 3 * batch_heads * layout(d, dv).size * 4


def causal_piece_chunks(
    batch_heads: int, n_query: int, n_key: int, d: int, dv: int, chunk: int = CAUSAL_CHUNK
) -> int | None:
    """How many chunks of ``chunk`` tokens (of the longer of Nq, Nk) the Triton causal form
    sweeps at once: all of them where their states fit ``CAUSAL_STATE_BUDGET``, else pieces
    of as many as fit, each continuing the last one's state; None where not one chunk fits
    (a call for the PyTorch causal form)."""
    per_chunk = chunk_state_bytes(batch_heads, d, dv)
    chunks = -(-max(n_query, n_key) // chunk)
    if chunks * per_chunk <= CAUSAL_STATE_BUDGET:
        return chunks
    fit = CAUSAL_STATE_BUDGET // per_chunk
    return fit if fit >= 1 else None


# (looked up once, at import, without importing it: a functools cache here made Dynamo
# warn when it traced the routing, inside a torch.cond's branches)
_TRITON_FOUND = importlib.util.find_spec("triton") is not None


def triton_importable() -> bool:
    """Whether the optional ``triton`` package is installed."""
    return _TRITON_FOUND


def _setting() -> str:
    value = os.environ.get(TRITON_ENV, "auto").strip().lower()
    return value if value in ("auto", "off", "interpret") else "auto"


def shape_class(kernel: str, query: Tensor, problem: Problem, is_causal: bool) -> tuple:
    """What a kernel's compilation depends on: (kernel, device, dtype, d, dv, causal, mask)."""
    return (
        kernel,
        str(query.device),
        str(query.dtype).replace("torch.", ""),
        problem.head_dim,
        problem.value_dim,
        is_causal,
        problem.key_mask is not None,
    )


def _describe(key: tuple) -> str:
    kernel, device, dtype, d, dv, causal, masked = key
    return (
        f"{kernel} on {device}, {dtype}, d={d}, dv={dv}, "
        f"{'causal' if causal else 'non-causal'}, {'key padding' if masked else 'no mask'}"
    )


def _debug(message: str, *args: object) -> None:
    """The routing log, outside torch.compile's tracing (a logger call breaks its graph)."""
    if not torch.compiler.is_compiling():
        logger.debug(message, *args)


def _not_kernel_failures() -> tuple[type[BaseException], ...]:
    """Exceptions a kernel call can raise that are not the kernel failing: out of memory (the
    PyTorch form would need memory too), a bad argument of the caller's, and the control flow
    of ``torch.utils.checkpoint``, raised by its saved-tensor hook inside the call: non-reentrant
    checkpointing stops its recomputation with ``_StopRecomputationError`` once it has every
    tensor the backward needs. Caught as a kernel failure, that stop had turned into a fall-back
    to the PyTorch form (which saves other tensors: checkpoint's AssertionError) and disabled
    the kernel for the rest of the process."""
    from torch.utils import checkpoint

    flow = (
        getattr(checkpoint, name, None) for name in ("_StopRecomputationError", "CheckpointError")
    )
    return (torch.OutOfMemoryError, MemoryError, TypeError, *(e for e in flow if e is not None))


def kernel_failure(err: BaseException) -> bool:
    """Whether ``err`` is a kernel that could not compile or launch (see
    ``_not_kernel_failures`` for what is not)."""
    return isinstance(err, Exception) and not isinstance(err, _not_kernel_failures())


def disable(key: tuple, err: BaseException) -> None:
    """Keep ``key``'s shape class on the PyTorch form from now on; warn once."""
    if key in FAILED:
        return
    reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
    FAILED[key] = reason[:500]
    logger.warning(
        "%s kernel failed (%s): %s; this shape class uses the PyTorch form from now on "
        "(same result)",
        "CPU" if key[0].startswith("cpu") else "Triton",
        _describe(key),
        FAILED[key],
    )


def run_guarded(key: tuple, call: Callable[[], Tensor], fallback: Callable[[], Tensor]) -> Tensor:
    """``call()`` (the kernel); where it fails, ``fallback()`` (the PyTorch form of the same
    call) and then ``disable(key, ...)``. A fallback that fails as well says that the call
    was at fault, not the kernel (an inference-mode tensor given to autograd, say): its error
    is raised, without the kernel's, and the shape class keeps its kernel. Disabling at the
    kernel's failure alone had turned a caller's one mistake into a slower process."""
    try:
        return call()
    except Exception as err:
        if not kernel_failure(err):
            raise
        failure = err
    out = fallback()  # (outside the handler: its error is not chained to the kernel's)
    disable(key, failure)
    return out


def probe_backward(key: tuple, fused: Callable[..., Tensor], mode: str, query: Tensor) -> bool:
    """Run ``fused``'s forward and backward once on a tiny input of ``key``'s shape class
    (a GPU's first call of it under autograd); False (and the class disabled) if it fails."""
    if key in _PROBED or not query.is_cuda:
        return key not in FAILED
    _PROBED.add(key)
    _, _, _, d, dv, causal, masked = key
    n = 17
    shape = (1, 1, n)
    # Its own graph, shielded from the caller's saved-tensor hooks: inside a region that
    # torch.utils.checkpoint records, the probe's saves would count as the region's and the
    # recomputation, which probes no more, would save fewer tensors (a CheckpointError).
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_as_is, _as_is):
        q, k = (torch.randn(*shape, d, device=query.device, dtype=query.dtype) for _ in range(2))
        v = torch.randn(*shape, dv, device=query.device, dtype=query.dtype)
        for t in (q, k, v):
            t.requires_grad_()
        mask = torch.ones(1, 1, n, dtype=torch.bool, device=query.device) if masked else None
        if mode == "direct":  # the direct forms' signature: key padding as (B, H, 1, Nk)
            args = (q, k, v, None if mask is None else mask.unsqueeze(2), causal, 1.0, None, True)
        else:
            args = (q, k, v, mask, 1.0, None, True)

        try:
            torch.autograd.grad(fused(*args).float().sum(), (q, k, v))
        except Exception as err:  # (fresh inputs of its own: a failure is the kernel's)
            if not kernel_failure(err):
                raise
            disable(key, err)
            return False
        return True


def _as_is(x: Tensor) -> Tensor:
    return x


def cpu_kernels_ready() -> bool:
    """Whether the CPU kernels can run in this process (built on the first call; warns once
    with the reason when they cannot, unless turned off)."""
    reason = build.unavailable_reason()  # (reads the setting first: one read a call)
    if reason is None:
        return True
    if build.setting() != "off":
        _warn_cpu_once(reason)
    return False


# What torch.compiler.assume_constant_result sets (interface.mark_constant): traced code
# takes the answer as a constant instead of tracing a compiler run.
cpu_kernels_ready._dynamo_marked_constant = True


@functools.lru_cache(maxsize=1)
def _warn_cpu_once(reason: str) -> None:
    logger.warning(
        "CPU kernels unavailable (%s); the PyTorch efficient form runs instead (same result, "
        "slower). Set %s=off to silence this.",
        reason,
        "TAYLORSHIFT_CPU_KERNELS",
    )


def float32_efficient_stays_on_pytorch(dtype: torch.dtype, backward: bool) -> bool:
    """Whether a float32 efficient-form call on CUDA takes the PyTorch form, not the
    Triton kernels (benchmarks/gpu_h100/2026-11-28, H100, d = 64, B·H = 32):

    - exact float32 (``torch.backends.cuda.matmul.allow_tf32`` off, torch's default): the
      kernels' dots run in exact float32 on the FMA units and took 4.2-5.7x the PyTorch
      form's time forward (cuBLAS), 3.2-4.3x forward + backward, N = 1,024 to 16,384;
      the causal kernels multiply the same way (not timed in float32);
    - TF32 allowed: the kernels' forward was 5.6-6.3x faster than the PyTorch form in exact
      float32, their forward + backward 2.1-2.5x slower (the PyTorch form in TF32,
      not timed yet, would only gain), so calls that autograd records take the PyTorch form.
    """
    if dtype != torch.float32:
        return False
    return backward or not torch.backends.cuda.matmul.allow_tf32


def fused_form(
    query: Tensor,
    problem: Problem,
    mode: str,
    is_causal: bool,
    order: int,
    *,
    backward: bool = False,
) -> Callable[..., Tensor] | None:
    """The fused kernel for this call (a function with the signature of the matching
    PyTorch form, so that ``interface`` calls either one way), or None to use the PyTorch
    form. ``backward``: whether autograd records the call (float32 on CUDA:
    ``float32_efficient_stays_on_pytorch``). Its name for the
    failure bookkeeping is ``kernel_name(mode, is_causal, query.device)``."""
    setting = _setting()
    if query.device.type == "cpu" and setting != "interpret":
        return _cpu_form(query, problem, mode, is_causal, order)
    if setting == "off" or not (query.is_cuda or setting == "interpret"):
        return None
    if not triton_importable() or order != 2 or query.dtype not in KERNEL_DTYPES:
        return None
    if not (1 <= problem.head_dim <= MAX_HEAD_DIM and 1 <= problem.value_dim <= MAX_HEAD_DIM):
        return None
    if is_empty(problem) or problem.mask_varies_over_queries:
        return None
    kernel = kernel_name(mode, is_causal)
    if kernel is None:
        return None
    if shape_class(kernel, query, problem, is_causal) in FAILED:
        _debug("fused: none (%s failed before in this shape class)", kernel)
        return None
    if (
        mode == "efficient"
        and query.is_cuda
        and float32_efficient_stays_on_pytorch(query.dtype, backward)
    ):
        _debug("fused: none (float32 on CUDA: the PyTorch efficient form is faster)")
        return None
    if kernel == "triton efficient (causal)" and causal_piece_chunks(
        problem.batch * problem.heads, problem.n_query, problem.n_key, problem.head_dim,
        problem.value_dim,
    ) is None:  # fmt: skip
        _debug("fused: none (causal chunk states over budget; PyTorch causal form)")
        return None
    _debug("fused: %s", kernel)
    return load_kernel(kernel)


def stateful_form(
    query: Tensor, problem: Problem, order: int, *, groups: int = 1, backward: bool = False
) -> Callable[..., Tensor] | None:
    """The fused causal kernel for a causal call with a state in or out (``initial_state``,
    ``output_final_state``; both kernels' forms keep them in their signatures), or None for
    the PyTorch form: on the CPU the causal kernel where ``_cpu_form`` gives it (traced by
    torch.compile, its custom ops ``taylorshift::cpu_causal_state_forward`` / ``_backward``;
    it keeps the state per key/value head), elsewhere the Triton causal form where
    ``fused_form`` gives it, with key, value and state repeated for ``groups`` query heads
    per key/value head (``grouped.repeated_heads``). ``backward`` as for ``fused_form``."""
    if query.device.type == "cpu" and _setting() != "interpret":
        return _cpu_form(query, problem, "efficient", True, order)
    form = fused_form(query, problem, "efficient", True, order, backward=backward)
    if form is None or groups == 1:
        return form
    return repeated_heads(form, groups)


def is_empty(problem: Problem) -> bool:
    """No heads (an empty batch: B or H = 0) or no tokens: the PyTorch forms return the
    empty result; the kernels are never launched for it."""
    return problem.batch * problem.heads == 0 or problem.n_query == 0 or problem.n_key == 0


def _cpu_form(
    query: Tensor, problem: Problem, mode: str, is_causal: bool, order: int
) -> Callable[..., Tensor] | None:
    if mode not in ("efficient", "direct") or order != 2 or query.dtype not in KERNEL_DTYPES:
        return None
    if not (1 <= problem.head_dim <= MAX_HEAD_DIM and 1 <= problem.value_dim <= MAX_HEAD_DIM):
        return None
    if is_empty(problem) or problem.mask_varies_over_queries:
        return None
    kernel = kernel_name(mode, is_causal, query.device)
    if shape_class(kernel, query, problem, is_causal) in FAILED or not cpu_kernels_ready():
        return None
    _debug("fused: %s", kernel)
    return load_kernel(kernel)


CPU_EFFICIENT = "cpu efficient (non-causal)"
CPU_EFFICIENT_CAUSAL = "cpu efficient (causal)"
CPU_DIRECT = "cpu direct"  # causal or not: one kernel


def kernel_name(mode: str, is_causal: bool, device: torch.device | None = None) -> str | None:
    """The name of the fused kernel of a form (the key of ``load_kernel``), or None."""
    if device is not None and device.type == "cpu" and _setting() != "interpret":
        if mode == "direct":
            return CPU_DIRECT
        if mode != "efficient":
            return None
        return CPU_EFFICIENT_CAUSAL if is_causal else CPU_EFFICIENT
    if mode == "efficient":
        return "triton efficient (causal)" if is_causal else "triton efficient (non-causal)"
    if mode == "direct":
        return "triton direct (causal)" if is_causal else "triton direct (non-causal)"
    return None


def load_kernel(kernel: str) -> Callable[..., Tensor]:
    """The function of the fused kernel ``kernel`` (imports Triton for a Triton kernel)."""
    if kernel == CPU_EFFICIENT:
        from ..cpu.efficient import cpu_efficient_taylor_shift

        return cpu_efficient_taylor_shift
    if kernel == CPU_EFFICIENT_CAUSAL:
        from ..cpu.efficient_causal import cpu_causal_efficient_taylor_shift

        return cpu_causal_efficient_taylor_shift
    if kernel == CPU_DIRECT:
        from ..cpu.direct import cpu_direct_taylor_shift

        return cpu_direct_taylor_shift
    if kernel == "triton efficient (non-causal)":
        from ..triton.efficient import triton_efficient_taylor_shift

        return triton_efficient_taylor_shift
    if kernel == "triton efficient (causal)":
        from ..triton.efficient_causal import triton_causal_efficient_taylor_shift

        return triton_causal_efficient_taylor_shift
    from ..triton.direct import triton_direct_taylor_shift

    return triton_direct_taylor_shift
