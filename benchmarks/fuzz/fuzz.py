"""Random edge cases of the public op and of decoding against the float64 reference.

    python benchmarks/fuzz/fuzz.py op --seed 1 --cases 250
    python benchmarks/fuzz/fuzz.py decode --seed 1 --cases 150
    python benchmarks/fuzz/fuzz.py state --seed 1 --cases 300
    python benchmarks/fuzz/fuzz.py model --seed 1 --cases 300
    python benchmarks/fuzz/fuzz.py seqpar --seed 1 --cases 200 --ranks 3

The test suite checks chosen shapes; this draws many at random, with the sizes where
kernels change their tiling or split their work: d in 1..128 (odd, the CPU kernels'
limits), Nq and Nk in {1, 2, 7, 191, 192, 193, 300} (the state update's token threshold is
192), 1-3 heads, 1-2 batch entries, 1, 2, 3 or 8 torch threads, every mode, causal or not,
no mask / key padding / a mask that varies over queries, float or per-head tensor
temperature, plain scores, float32, float64, float16 and bfloat16 inputs.

``op``: ``taylor_shift_attention`` and its gradients (query, key, value, a tensor
temperature) against ``naive_taylor_shift_attention`` run in float64; with 3 query heads,
grouped-query attention on 1 key/value head in about 40 % of the cases (``enable_gqa``;
the reference repeats key and value); only some of query, key and value requiring grad
in a quarter of the cases; the inputs in one of four memory layouts
(``LAYOUTS``: contiguous, heads transposed in from (B, N, H, d) storage as a model's
projections leave them, features strided, rows padded), the reference's contiguous. The
grouping, the layout and the inputs that require grad are drawn from the case's own seed,
so the other draws of a seed are those of earlier runs.
``decode``: a prefix fed through ``taylor_shift_decode`` in one block, then one token at a
time (in place or not, with key padding or not, grouped-query attention and the layouts as
in ``op``) against one causal call over the whole sequence in float64, the rows of real
tokens compared.
``state``: a causal sequence cut at random points into segments (empty ones too), each a
``taylor_shift_attention`` call continuing the state the one before returned
(``initial_state``, ``output_final_state``; the first from None or from
``TaylorShiftState.zeros``, the last returning its state or not), grouped-query attention
(3 query heads on 1 key/value head) or not, key padding or not, inputs in one of the
memory layouts of ``op`` (each segment a slice of them), some inputs frozen as in ``op``:
the outputs and the
gradients through every segment against one causal call of the reference over the whole
sequence in float64, and the last state's sums (a relative bound) and count (exactly)
against one float64 call of the efficient form. ``TAYLORSHIFT_CPU_KERNELS=off`` runs the
PyTorch forms; ``TRITON_INTERPRET=1 TAYLORSHIFT_TRITON=interpret`` the Triton kernels on
the CPU (bfloat16 then left out).
``model``: a random ``CausalLM`` (kernel and its options, projection, grouped key/value
heads, short convolution, q/k norms, positions; ``_model_config``), or an encoder
classifier (pooling, ids or features, conv token embedding, ``super``;
``_classifier_config``), in float64 or float32 on a batch padded on the right, the left or
anywhere: its outputs and every parameter's gradient against each row's real tokens
alone, in float64; then the LM's decoding in random blocks padded anywhere, from the state
and the key/value cache, against the same.
``seqpar``: sequence parallelism on ``--ranks`` gloo processes (one thread each; 1: one
process, no group): a random ``CausalLM`` that ``convert_sequence_parallel`` takes (the
``taylorshift`` kernel in any mode, plain scores or log temperature, local heads;
``_model_config``'s projection, grouped key/value heads, q/k norms, biases, positions; a
short convolution of 0-4 taps, ``SP_CONV``), or in 30 % a non-causal ``Attention`` layer
on features (the same settings), in float64 or float32, padded on the right, the left or
anywhere, its tokens split over the ranks at random cut points (empty slices too): each
rank's outputs at its real tokens and every parameter's
gradient summed over the ranks against the unconverted model on the whole batch in
float64 (the LM given each token's real-token position, as the whole model counts them).

Each result (output, each gradient) has an error budget, SPEC §8's rule: 10x the error of
the float64 reference's own code run in the case's dtype, plus OP_TOLERANCE of the dtype
(2e-5 float32, 1e-11 float64, 2e-3 float16, 2e-2 bfloat16) times the result's size, for a
gradient at least times |∂L/∂out| (1 + |v|), the size of the terms it sums: where they
cancel, the rounding of the output shows (the CPU kernels, as FlashAttention, take
δ = ∂L/∂out · out from the output in its dtype). A gradient that vanishes in exact
arithmetic (d = 1, a single attended key) is held to Nk times that. Decoding, against one
float64 causal call: DECODE_TOLERANCE times its size. A 1e-4 relative error in a float32
or float64 output fails. Every case runs; each one over its budget, non-finite, or raising
is printed with its parameters, and the last line counts them. Exit status 1 when any case
failed.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from taylorshift import (
    TaylorShiftState,
    naive_taylor_shift_attention,
    taylor_shift_attention,
    taylor_shift_decode,
)
from taylorshift.distributed import convert_sequence_parallel
from taylorshift.models import CausalLM, TransformerClassifier
from taylorshift.nn import Attention

LENGTHS = [1, 2, 7, 191, 192, 193, 300]
# float32 drawn twice as often: it is what reaches the CPU kernels' float32 paths; float16
# and bfloat16 reach them too (sums in float32), float64 stays on the PyTorch forms.
# bfloat16 is left out where the Triton interpreter runs the kernels (numpy has no
# bfloat16: what the kernels compute there means nothing)
OP_DTYPES = [torch.float32, torch.float32, torch.float64, torch.float16, torch.bfloat16]
if os.environ.get("TRITON_INTERPRET"):
    OP_DTYPES.remove(torch.bfloat16)
# the budget's share of a result's size, beside 10x the reference's own error in the dtype
OP_TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-11, torch.float16: 2e-3,
                torch.bfloat16: 2e-2}  # fmt: skip
# decoding against one float64 causal call: a relative bound only (about 4x the rounding
# of the result itself in float16 and bfloat16)
DECODE_TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-10, torch.float16: 2e-3,
                    torch.bfloat16: 2e-2}  # fmt: skip


# memory layouts the inputs reach the op in (the reference always gets contiguous ones):
# as a model's projections leave them ((B, N, H, d) storage, heads transposed in), with the
# features strided (d-major storage), or rows padded in a wider buffer
LAYOUTS = ["contiguous", "heads-last", "features-first", "padded-rows"]


# shapes of a tensor temperature, all broadcasting to (B, H, 1, 1): per head, one for all
# heads, 0-d, per batch entry, per batch entry and head
TAU_SHAPES = ["heads", "one", "0-d", "batch", "batch-heads"]


def _shaped(tau: torch.Tensor, shape: str, b: int) -> torch.Tensor:
    """A temperature of ``shape`` from per-head values ``tau`` (1, H, 1, 1)."""
    if shape == "one":
        return tau[:, :1]
    if shape == "0-d":
        return tau[0, 0, 0, 0]
    if shape == "batch":
        return tau[:, :1].repeat(b, 1, 1, 1) * torch.linspace(1, 1.5, b, dtype=tau.dtype).view(
            b, 1, 1, 1
        )
    if shape == "batch-heads":
        return tau.repeat(b, 1, 1, 1)
    return tau


def _laid_out(x: torch.Tensor, layout: str) -> torch.Tensor:
    """``x`` (B, H, N, k) with the same values in ``layout``; differentiable (a copy and
    views), so a gradient reaches the contiguous leaf it came from."""
    if layout == "heads-last":
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "features-first":
        return x.transpose(-2, -1).contiguous().transpose(-2, -1)
    if layout == "padded-rows":
        wide = torch.nn.functional.pad(x, (0, 3))
        return wide[..., : x.shape[-1]]
    return x


# torch.compile's backend for the op under test (``--compile``), None: eager
COMPILE: str | None = None


def _attention_under_test():
    """``taylor_shift_attention`` as the cases call it: eagerly, or with ``--compile`` traced
    whole (fullgraph) by that backend, anew for each case (Dynamo's caches reset: a case's
    shapes never fall back to eager by hitting the recompile limit)."""
    if COMPILE is None:
        return taylor_shift_attention
    torch._dynamo.reset()

    def call(*args, **kwargs):
        return taylor_shift_attention(*args, **kwargs)

    return torch.compile(call, backend=COMPILE, fullgraph=True)


def _used(actual, reference, low, scale: float, tol: float) -> float:
    """The share of its error budget a result uses (over 1: failed). The budget (SPEC §8):
    10x the error of the reference itself run in the same dtype (``low``; none in float64),
    plus ``tol`` times the result's size or ``scale``, whichever is larger. For a gradient,
    ``scale`` is |∂L/∂out| (1 + |v|), the size of the terms it sums: a gradient much smaller
    than that is what is left where they cancel, and the rounding of the output shows there
    (the CPU kernels, as FlashAttention, take δ = ∂L/∂out · out from the output in its
    dtype).
    For a gradient that vanishes in exact arithmetic (the query and key gradients with
    d = 1 or a single attended key) the caller passes Nk times that: it is only rounding,
    of sums over up to Nk such terms."""
    if not reference.numel():
        return 0.0
    diff = (actual.double() - reference).abs().max().item()
    size = reference.abs().max().item()
    budget = 10 * (low.double() - reference).abs().max().item()
    budget += tol * max(size, scale)
    return diff / budget if budget > 0 else (0.0 if diff == 0 else float("inf"))


def _inputs(seed: int, b: int, h: int, kv_heads: int, nq: int, nk: int, d: int, dv: int, dtype):
    """q (B, H, Nq, d), k (B, Hkv, Nk, d), v (B, Hkv, Nk, dv), standard normal in ``dtype``,
    and the generator that drew them, for the case's further draws."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g, dtype=dtype)
    k = torch.randn(b, kv_heads, nk, d, generator=g, dtype=dtype)
    v = torch.randn(b, kv_heads, nk, dv, generator=g, dtype=dtype)
    return q, k, v, g


def _shares_used(got, want, low, grad_out, v, nk: int, dtype) -> list[float]:
    """``_used`` of each result [output, gradients...] (``inf`` when any is not finite):
    the output's budget from its own size; a gradient's at least from the size of the terms
    it sums, |∂L/∂out| (1 + |v|), and Nk times that where it vanishes in exact arithmetic
    (d = 1: q/|q| = ±1 has no direction to move in; or a single attended key: the query and
    key gradients are then sums of up to Nk cancelled terms)."""
    if not all(torch.isfinite(x).all() for x in got):
        return [float("inf")]
    size = grad_out.abs().max().item() * (1 + v.abs().max().item()) if v.numel() else 0.0
    scales = [0.0]
    for r in want[1:]:
        vanishes = r.numel() and r.abs().max().item() < 1e-9 * size
        scales.append(size * nk if vanishes else size)
    tol = OP_TOLERANCE[dtype]
    return [_used(*x, tol) for x in zip(got, want, low, scales, strict=True)]


def op_case(rng: random.Random, seed: int, params: dict) -> float:
    """One random call; its parameters go into ``params`` before it runs (so that a call
    that raises can be reported); returns the share of its error budget used."""
    d = rng.choice([1, 2, 3, 8, 16, 17, 32, 64, 65, 128])
    dv = rng.choice([1, d, 5, 64])
    nq = rng.choice(LENGTHS)
    causal = rng.random() < 0.4
    nk = nq if causal else rng.choice(LENGTHS)
    b, h = rng.choice([1, 2]), rng.choice([1, 3])
    mode = rng.choice(["auto", "efficient", "direct"])
    threads = rng.choice([1, 2, 3, 8])
    normalize = rng.random() < 0.8
    dtype = rng.choice(OP_DTYPES)
    masks = [None, "padding", "general"] if mode != "efficient" else [None, "padding"]
    mask_kind = rng.choice(masks)
    tensor_tau = normalize and rng.random() < 0.5
    # grouped-query attention (3 query heads on 1 key/value head), drawn from the case's own
    # seed so that the draws above stay those of earlier runs of a seed
    own = random.Random(seed)
    kv_heads = 1 if h == 3 and own.random() < 0.4 else h
    layout = own.choice(LAYOUTS)
    tau_shape = own.choice(TAU_SHAPES)
    # which of query, key, value require grad (all in half the cases; a frozen input must
    # not change the others' gradients); a tensor temperature always does
    need = [True] * 3 if own.random() < 0.5 else [own.random() < 0.5 for _ in range(3)]
    need = need if any(need) or tensor_tau else [True] * 3
    wanted = "".join(name for name, n in zip("qkv", need, strict=True) if n)
    params.update(d=d, dv=dv, nq=nq, nk=nk, b=b, h=h, kv_heads=kv_heads, mode=mode,
                  causal=causal, mask=mask_kind, threads=threads, normalize=normalize,
                  dtype=str(dtype).removeprefix("torch."), tensor_tau=tensor_tau,
                  layout=layout, grad=wanted,
                  tau_shape=tau_shape if tensor_tau else None)  # fmt: skip

    torch.set_num_threads(threads)
    q, k, v, g = _inputs(seed, b, h, kv_heads, nq, nk, d, dv, dtype)
    mask = None
    if mask_kind == "padding":
        mask = torch.rand(b, 1, 1, nk, generator=g) < 0.7
    elif mask_kind == "general":
        mask = torch.rand(b, h, nq, nk, generator=g) < 0.7
    tau = 1.0
    if tensor_tau:  # (the values drawn per head, then cut to the drawn shape)
        tau = torch.rand(1, h, 1, 1, generator=g, dtype=dtype) * 3 + 0.5
        tau = _shaped(tau, tau_shape, b)

    attention = _attention_under_test()

    def run(inputs, tau_, out_dtype, mode_):
        leaves = [x.to(out_dtype).requires_grad_(n) for x, n in zip(inputs, need, strict=True)]
        tau_leaf = tau_.detach().to(out_dtype).requires_grad_() if tensor_tau else tau_
        kwargs = {"normalize": normalize}
        if normalize:
            kwargs["temperature"] = tau_leaf
        if mode_ is None:
            ql, kl, vl = leaves
            kl, vl = (x.repeat_interleave(h // kv_heads, 1) for x in (kl, vl))
            out = naive_taylor_shift_attention(ql, kl, vl, mask, causal, **kwargs)
        else:
            kwargs["enable_gqa"] = kv_heads != h
            laid_out = [_laid_out(x, layout) for x in leaves]
            out = attention(*laid_out, mask, causal, mode=mode_, **kwargs)
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1),
                               dtype=torch.float64)  # fmt: skip
        wrt = [x for x in leaves if x.requires_grad] + ([tau_leaf] if tensor_tau else [])
        return [out, *torch.autograd.grad(out, wrt, grad_out.to(out_dtype))], grad_out

    got, grad_out = run((q, k, v), tau, dtype, mode)
    want, _ = run((q, k, v), tau, torch.float64, None)
    low = run((q, k, v), tau, dtype, None)[0] if dtype != torch.float64 else want
    return max(_shares_used(got, want, low, grad_out, v, nk, dtype))


def decode_case(rng: random.Random, seed: int, params: dict) -> float:
    """One random decoding, as ``op_case``."""
    d = rng.choice([1, 2, 5, 16, 17, 32, 64])
    dv = rng.choice([1, 3, d, 64])
    b, h = rng.choice([1, 2]), rng.choice([1, 3])
    n = rng.choice([1, 2, 9, 40, 130, 300])
    prefix = rng.randint(0, n)
    dtype = rng.choice(list(DECODE_TOLERANCE))
    normalize = rng.random() < 0.8
    threads = rng.choice([1, 2, 3])
    padded = rng.random() < 0.3
    inplace = rng.random() < 0.5
    tau_kind = rng.choice(["1", "2.5", "tensor"]) if normalize else "plain"
    # grouped-query attention and the layout, from the case's own seed (as op_case)
    own = random.Random(seed)
    kv_heads = 1 if h == 3 and own.random() < 0.4 else h
    layout = own.choice(LAYOUTS)
    params.update(d=d, dv=dv, b=b, h=h, kv_heads=kv_heads, n=n, prefix=prefix,
                  dtype=str(dtype).removeprefix("torch."), threads=threads, padded=padded,
                  inplace=inplace, tau=tau_kind, layout=layout)  # fmt: skip

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g, dtype=dtype)
    k, v = (torch.randn(b, kv_heads, n, x, generator=g, dtype=dtype) for x in (d, dv))
    pad = torch.rand(b, n, generator=g) < 0.8 if padded else None
    kwargs: dict = {"normalize": normalize}
    if tau_kind == "tensor":
        kwargs["temperature"] = torch.rand(1, h, 1, 1, generator=g, dtype=dtype) + 0.5
    elif normalize:
        kwargs["temperature"] = float(tau_kind)

    as64 = {key: x.double() if isinstance(x, torch.Tensor) else x for key, x in kwargs.items()}
    mask = None if pad is None else pad[:, None, None, :]
    kr, vr = (x.double().repeat_interleave(h // kv_heads, 1) for x in (k, v))
    want = taylor_shift_attention(q.double(), kr, vr, mask, True, mode="direct", **as64)
    q, k, v = (_laid_out(x, layout) for x in (q, k, v))
    kwargs["enable_gqa"] = kv_heads != h
    outs, state = [], None
    if prefix:
        block = None if pad is None else pad[:, :prefix]
        out, state = taylor_shift_decode(
            q[:, :, :prefix], k[:, :, :prefix], v[:, :, :prefix], state, block, **kwargs
        )
        outs.append(out)
    for t in range(prefix, n):
        step = None if pad is None else pad[:, t : t + 1]
        out, state = taylor_shift_decode(
            q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state, step,
            inplace=inplace, **kwargs,
        )  # fmt: skip
        outs.append(out)
    got = torch.cat(outs, 2)
    real = torch.ones(b, n, dtype=torch.bool) if pad is None else pad  # padded rows: unused
    rows = real[:, None, :].expand(b, h, n)
    if not torch.isfinite(got[rows]).all():
        return float("inf")
    # the decoding steps against one causal call: same sums in another order, so the
    # budget is a relative bound only
    tol = DECODE_TOLERANCE[dtype]
    return _used(got[rows], want[rows], want[rows], 0.0, tol)


def state_case(rng: random.Random, seed: int, params: dict) -> float:
    """One causal sequence cut into segments, each a call continuing the state of the one
    before (``initial_state``, ``output_final_state``), as ``op_case``: the outputs and the
    gradients through every segment (query, key, value, a tensor temperature; the states'
    sums carry them back) against one causal call of the reference over the whole sequence
    in float64, and the last state's sums and count against the float64 efficient form's."""
    d = rng.choice([1, 2, 3, 8, 16, 17, 32, 64, 65])
    dv = rng.choice([1, d, 5])
    b, h = rng.choice([1, 2]), rng.choice([1, 3])
    kv_heads = 1 if h == 3 and rng.random() < 0.4 else h  # grouped-query attention
    n = rng.choice([1, 2, 7, 64, 191, 300, 600])
    cuts = sorted(rng.randint(0, n) for _ in range(rng.randint(0, 3)))
    mode = rng.choice(["auto", "efficient"])
    threads = rng.choice([1, 2, 3, 8])
    normalize = rng.random() < 0.8
    dtype = rng.choice(OP_DTYPES)
    padded = rng.random() < 0.3
    zeros_first = rng.random() < 0.3  # the first segment from TaylorShiftState.zeros
    final_state = rng.random() < 0.7  # the last segment returns its state
    tensor_tau = normalize and rng.random() < 0.5
    layout = rng.choice(LAYOUTS)
    tau_shape = rng.choice(TAU_SHAPES)
    need = [True] * 3 if rng.random() < 0.5 else [rng.random() < 0.5 for _ in range(3)]
    need = need if any(need) or tensor_tau else [True] * 3  # (as op_case)
    wanted = "".join(name for name, n in zip("qkv", need, strict=True) if n)
    params.update(d=d, dv=dv, b=b, h=h, kv_heads=kv_heads, n=n, cuts=cuts, mode=mode,
                  threads=threads, normalize=normalize, dtype=str(dtype).removeprefix("torch."),
                  padded=padded, zeros_first=zeros_first, final_state=final_state,
                  tensor_tau=tensor_tau, layout=layout, grad=wanted,
                  tau_shape=tau_shape if tensor_tau else None)  # fmt: skip

    torch.set_num_threads(threads)
    q, k, v, g = _inputs(seed, b, h, kv_heads, n, n, d, dv, dtype)
    pad = torch.rand(b, n, generator=g) < 0.7 if padded else None
    tau = 1.0
    if tensor_tau:  # (the values drawn per head, then cut to the drawn shape)
        tau = torch.rand(1, h, 1, 1, generator=g, dtype=dtype) * 3 + 0.5
        tau = _shaped(tau, tau_shape, b)
    grad_out = torch.randn(b, h, n, dv, generator=g, dtype=torch.float64)
    bounds = list(zip([0, *cuts], [*cuts, n], strict=True))
    grouped = kv_heads != h

    def leaves_of(out_dtype):
        inputs = zip((q, k, v), need, strict=True)
        leaves = [x.detach().to(out_dtype).requires_grad_(n) for x, n in inputs]
        tau_leaf = tau.detach().to(out_dtype).requires_grad_() if tensor_tau else tau
        options = {"normalize": normalize, **({"temperature": tau_leaf} if normalize else {})}
        return leaves, tau_leaf, options

    def grads(out, leaves, tau_leaf):
        wrt = [x for x in leaves if x.requires_grad] + ([tau_leaf] if tensor_tau else [])
        return list(torch.autograd.grad(out, wrt, grad_out.to(out.dtype)))

    def reference(out_dtype):
        (ql, kl, vl), tau_leaf, options = leaves_of(out_dtype)
        mask = None if pad is None else pad[:, None, None, :]
        kr, vr = (x.repeat_interleave(h // kv_heads, 1) for x in (kl, vl))
        out = naive_taylor_shift_attention(ql, kr, vr, mask, True, **options)
        return [out, *grads(out, [ql, kl, vl], tau_leaf)]

    leaves, tau_leaf, options = leaves_of(dtype)
    ql, kl, vl = (_laid_out(x, layout) for x in leaves)
    options.update(mode=mode, enable_gqa=grouped)
    state = TaylorShiftState.zeros(b, kv_heads, d, dv, dtype=dtype) if zeros_first else None
    attention = _attention_under_test()
    outs = []
    for i, (i0, i1) in enumerate(bounds):
        last = i == len(bounds) - 1
        mask = None if pad is None else pad[:, None, None, i0:i1]
        result = attention(
            ql[:, :, i0:i1], kl[:, :, i0:i1], vl[:, :, i0:i1], mask, True,
            initial_state=state, output_final_state=final_state or not last, **options,
        )  # fmt: skip
        out, state = result if final_state or not last else (result, None)
        outs.append(out)
    out = torch.cat(outs, 2)
    got = [out, *grads(out, leaves, tau_leaf)]
    want = reference(torch.float64)
    low = reference(dtype) if dtype != torch.float64 else want
    used = _shares_used(got, want, low, grad_out, v, n, dtype)
    tol = OP_TOLERANCE[dtype]
    if final_state:
        # the last state against one float64 call of the efficient form: the same sums in
        # another order, so a relative bound only
        as64 = {key: x.double() if isinstance(x, torch.Tensor) else x
                for key, x in options.items()}  # fmt: skip
        mask = None if pad is None else pad[:, None, None, :]
        _, exact = taylor_shift_attention(
            q.double(), k.double(), v.double(), mask, True, output_final_state=True,
            **{**as64, "mode": "efficient"},
        )  # fmt: skip
        used.append(_used(state.sums.detach(), exact.sums, exact.sums, 0.0, tol))
        if not torch.equal(state.count.double(), exact.count):
            return float("inf")
    return max(used)


# model: the kernels beside TaylorShift, and the budget's share of a result's size
MODEL_KERNELS = ["linear", "softmax", "holt", "softmax-naive"]
MODEL_TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-11}


def _model_config(rng: random.Random) -> dict:
    """A random ``CausalLMConfig``'s fields: the kernel and its options (TaylorShift in 70 %:
    mode, order 4, plain scores, no output factor, log temperature, local heads), the
    projection, grouped key/value heads, the short convolution, q/k norms, biases,
    positions, tied embeddings; heads of 1-16 features."""
    kernel = "taylorshift" if rng.random() < 0.7 else rng.choice(MODEL_KERNELS)
    h, head_dim = rng.choice([1, 2, 3, 4]), rng.choice([1, 2, 3, 8, 16])
    args: dict = {}
    if kernel == "taylorshift":
        order = 4 if rng.random() < 0.1 else 2
        args["mode"] = rng.choice(["auto", "direct"] + (["efficient"] if order == 2 else []))
        if order == 4:
            args["order"] = 4
        if rng.random() < 0.2:
            args["normalize"] = False
        if rng.random() < 0.3:
            args["output_factor"] = False
        if args.get("normalize", True) and rng.random() < 0.2:
            args["log_temperature"] = True
        if h > 1 and rng.random() < 0.25:
            args.update(local_heads=rng.randint(1, h - 1), window=rng.choice([1, 2, 3, 5]))
    projection = rng.choice(["standard", "optimized", "query-only"])
    kv_heads = None
    if projection == "standard" and "local_heads" not in args and h > 1 and rng.random() < 0.4:
        kv_heads = rng.choice([x for x in range(1, h) if h % x == 0])
    return dict(vocab_size=rng.choice([5, 23]), dim=h * head_dim, depth=rng.choice([1, 2]),
                num_heads=h, mlp_ratio=2, attn_kernel=kernel, kernel_args=args,
                projection=projection, num_kv_heads=kv_heads,
                short_conv=rng.choice([0, 0, 2, 3]), qk_norm=rng.random() < 0.3,
                qkv_bias=rng.random() < 0.5, pos_embedding=rng.choice(["cosine", "learned"]),
                tie_embeddings=rng.random() < 0.2, max_len=400)  # fmt: skip


@torch.no_grad()
def _spread(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its temperatures away from 1 and its biases away from 0."""
    for name, p in model.named_parameters():
        if name.endswith("log_temperature"):
            p.uniform_(-0.7, 0.7)
        elif name.endswith("temperature"):
            p.uniform_(0.5, 2.0)
        elif name.endswith("bias"):
            p.normal_(0, 0.1)
    return model


def _floor(want: torch.Tensor, largest: float) -> float:
    """The size a parameter's gradient ``want`` (float64) is held to at least: 1e-3 of the
    largest gradient's, or the largest's itself where ``want`` vanishes in exact arithmetic
    (at most 1e-9 of it: only rounding is left, e.g. the query projection's with one key,
    whose weight is 1 whatever the scores, or a LayerNorm's over one feature)."""
    return largest if want.abs().max().item() <= 1e-9 * largest else 1e-3 * largest


def _real_positions(mask: torch.Tensor, before: torch.Tensor | int = 0) -> torch.Tensor:
    """Each token's position: the real tokens before it in its row (``before`` more)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0) + torch.as_tensor(before).view(-1, 1)


def _padding(g: torch.Generator, b: int, n: int, kind: str) -> torch.Tensor:
    """(B, N) real-token mask: every token real, or right, left or scattered padding (each
    row at least one real token)."""
    if kind == "none":
        return torch.ones(b, n, dtype=torch.bool)
    lengths = torch.randint(1, n + 1, (b,), generator=g)
    mask = torch.arange(n)[None, :] < lengths[:, None]
    if kind == "left":
        return mask.flip(-1)
    if kind == "scattered":
        mask = torch.rand(b, n, generator=g) < 0.6
        mask[:, 0] |= ~mask.any(-1)
    return mask


def _classifier_config(rng: random.Random, config: dict, n: int) -> dict:
    """``_model_config``'s fields made a ``ClassifierConfig``'s: 3 classes, CLS or mean
    pooling, token ids or 3 features per token through a table, a linear layer or the conv
    embedding, ``super``'s W_A in some cases (context_len from N up)."""
    vocab_size = config.pop("vocab_size")
    del config["tie_embeddings"]
    features = rng.random() < 0.3
    embedding = rng.choice(["linear", "conv"] if features else ["vocab", "conv"])
    config.update(num_classes=3, pooling=rng.choice(["cls", "mean"]), token_embedding=embedding,
                  **({"in_features": 3} if features else {"vocab_size": vocab_size}))  # fmt: skip
    if not config["short_conv"] and config["num_kv_heads"] is None and rng.random() < 0.15:
        config.update(projection="super", context_len=n + 1 + rng.randint(0, 3))
    return config


def model_case(rng: random.Random, seed: int, params: dict) -> float:
    """A random causal LM (``_model_config``), or in 30 % an encoder classifier
    (``_classifier_config``), in float64 or float32 on a batch padded on the right, the left
    or anywhere (positions given, counting real tokens, or left to the model): its outputs
    (the LM's logits at the real tokens, the classifier's) and every parameter's gradient
    against each row's real tokens run alone by the model in float64 (a parameter's
    gradient held to at least 1e-3 of the largest one's size, ``_floor``); then the LM's decoding in
    random blocks, padded anywhere, from each cache the kernel has (state, key/value),
    against the same."""
    config = _model_config(rng)
    dtype = rng.choice([torch.float64, torch.float64, torch.float32])
    b, n = rng.choice([1, 2, 3]), rng.choice([1, 2, 5, 9, 20, 70, 200])
    threads = rng.choice([1, 2])
    pad_kind = rng.choice(["none", "right", "left", "scattered"])
    lm = rng.random() >= 0.3
    given_positions = lm and rng.random() < 0.5
    if not lm:
        config = _classifier_config(rng, config, n)
    params.update(model="lm" if lm else "classifier")
    params.update({k: v for k, v in config.items() if k not in ("mlp_ratio", "max_len")})
    params.update(dtype=str(dtype).removeprefix("torch."), b=b, n=n, threads=threads,
                  padding=pad_kind, positions=given_positions)  # fmt: skip
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    kind = CausalLM if lm else TransformerClassifier
    ref = _spread(kind(kind.config_class(**config), dtype=torch.float64).eval())
    model = copy.deepcopy(ref).to(dtype)
    low = copy.deepcopy(model) if dtype != torch.float64 else ref  # the rows alone, in dtype
    g = torch.Generator().manual_seed(seed)
    if config.get("in_features"):
        inputs = torch.randn(b, n, config["in_features"], generator=g, dtype=torch.float64)
    else:
        inputs = torch.randint(0, config["vocab_size"], (b, n), generator=g)
    mask = _padding(g, b, n, pad_kind)
    outputs = config["vocab_size"] if lm else config["num_classes"]
    w = torch.randn(b, n if lm else 1, outputs, generator=g, dtype=torch.float64)
    tol = MODEL_TOLERANCE[dtype]

    def run(net, x, *extra):  # x float64 features or ids
        return net(x.to(dtype if net is not ref else torch.float64) if x.is_floating_point()
                   else x, *extra)  # fmt: skip

    # the batch, padded, against each row's real tokens alone
    under_test = model
    if COMPILE is not None:
        torch._dynamo.reset()
        under_test = torch.compile(model, backend=COMPILE, fullgraph=True)
    extra = [None if pad_kind == "none" else mask]
    if given_positions:
        extra.append(_real_positions(mask))
    out = run(under_test, inputs, *extra)
    weights = w * mask[..., None] if lm else w[:, 0]
    (out.double() * weights).sum().backward()
    used = 0.0
    for i in range(b):
        real = mask[i].nonzero()[:, 0]
        want, low_out = run(ref, inputs[i : i + 1, real]), run(low, inputs[i : i + 1, real])
        w_row = w[i : i + 1, real] if lm else w[i]
        (want * w_row).sum().backward()
        if low is not ref:
            (low_out.double() * w_row).sum().backward()
        got = out[i : i + 1, real] if lm else out[i : i + 1]
        used = max(used, _used(got, want, low_out, 0.0, tol))
    grads = {name: p.grad for name, p in ref.named_parameters()}
    largest = max(x.abs().max().item() for x in grads.values() if x is not None)
    lows = {name: p.grad for name, p in low.named_parameters()}
    for name, p in model.named_parameters():
        if grads[name] is None or p.grad is None:
            if (grads[name] is None) != (p.grad is None):
                params["gradient"] = f"{name}: one side None"
                return float("inf")
            continue
        if not torch.isfinite(p.grad).all():
            return float("inf")
        used = max(used, _used(p.grad, grads[name], lows[name], _floor(grads[name], largest), tol))
    if not lm:
        return used

    # decoding in random blocks, padded anywhere, from each cache the kernel has
    tokens = inputs
    kinds = ["kv"] + (["state"] if model.blocks[0].attn.kernel.has_state else [])
    with torch.no_grad():
        for kind in kinds:
            caches, t, seen = model.new_caches(kind), 0, torch.zeros(b, dtype=torch.long)
            got = torch.zeros(b, n, config["vocab_size"], dtype=torch.float64)
            real = torch.zeros(b, n, dtype=torch.bool)
            while t < n:
                size = min(n - t, rng.choice([1, 1, 2, 3, 7]) if t else rng.randint(1, n))
                block = torch.ones(b, size, dtype=torch.bool)
                if rng.random() < 0.3:
                    block = torch.rand(b, size, generator=g) < 0.6
                step = tokens[:, t : t + size]
                given = None if bool(block.all()) else block
                got[:, t : t + size] = model.decode(
                    step, caches, _real_positions(block, seen), given
                ).double()
                real[:, t : t + size], seen, t = block, seen + block.sum(-1), t + size
            for i in range(b):
                if not real[i].any():
                    continue
                idx = real[i].nonzero()[:, 0]
                want, low_out = ref(tokens[i : i + 1, idx]), low(tokens[i : i + 1, idx])
                used = max(used, _used(got[i : i + 1, idx], want, low_out, 0.0, tol))
    return used


# seqpar: short convolutions (since 2026-11-28, third session, their taps cross ranks)
SP_CONV = [0, 0, 1, 2, 3, 4]


def _seqpar_config(rng: random.Random) -> dict:
    """``_model_config``'s fields with what ``convert_sequence_parallel`` takes: the
    ``taylorshift`` kernel of order 2 with its output factor (any mode, plain scores or a
    log temperature in some cases, local heads in a quarter where the heads allow them),
    a short convolution of 0-4 taps."""
    config = _model_config(rng)
    args = {"mode": rng.choice(["auto", "direct", "efficient"])}
    if rng.random() < 0.2:
        args["normalize"] = False
    elif rng.random() < 0.2:
        args["log_temperature"] = True
    h = config["num_heads"]
    if h > 1 and config["num_kv_heads"] is None and rng.random() < 0.25:
        args.update(local_heads=rng.randint(1, h - 1), window=rng.choice([1, 2, 3, 5]))
    config.update(attn_kernel="taylorshift", kernel_args=args, short_conv=rng.choice(SP_CONV))
    return config


def seqpar_case(rng: random.Random, seed: int, params: dict, rank: int, world: int) -> float:
    """One random model on this rank's slice (module docs, ``seqpar``); every rank draws the
    same case. Returns this rank's share of the budget (outputs at its real tokens, and every
    parameter's gradient summed over the ranks)."""
    config = _seqpar_config(rng)
    dtype = rng.choice([torch.float64, torch.float64, torch.float32])
    b, n = rng.choice([1, 2, 3]), rng.choice([1, 2, 5, 9, 20, 70, 200])
    pad_kind = rng.choice(["none", "right", "left", "scattered"])
    cuts = [0, *sorted(rng.randint(0, n) for _ in range(world - 1)), n]
    lm = rng.random() >= 0.3
    if not lm:
        for key in ("vocab_size", "depth", "pos_embedding", "tie_embeddings"):
            config.pop(key)
    params.update(model="lm" if lm else "attention-full")
    params.update({k: v for k, v in config.items() if k not in ("mlp_ratio", "max_len")})
    params.update(dtype=str(dtype).removeprefix("torch."), b=b, n=n, padding=pad_kind,
                  cuts=cuts[1:-1])  # fmt: skip
    torch.manual_seed(seed)
    if lm:
        ref = CausalLM(CausalLM.config_class(**config), dtype=torch.float64)
    else:
        h = config["num_heads"]
        ref = Attention(config["dim"], h, qkv_bias=config["qkv_bias"], qk_norm=config["qk_norm"],
                        attn_kernel="taylorshift", kernel_args=config["kernel_args"],
                        projection=config["projection"], num_kv_heads=config["num_kv_heads"],
                        short_conv=config["short_conv"], dtype=torch.float64)  # fmt: skip
    ref = _spread(ref.eval())
    model = convert_sequence_parallel(copy.deepcopy(ref).to(dtype))
    low = copy.deepcopy(ref).to(dtype) if dtype != torch.float64 else ref
    g = torch.Generator().manual_seed(seed)
    if lm:
        inputs = torch.randint(0, config["vocab_size"], (b, n), generator=g)
    else:
        inputs = torch.randn(b, n, config["dim"], generator=g, dtype=torch.float64)
    mask = _padding(g, b, n, pad_kind)
    w = torch.randn(b, n, config["vocab_size"] if lm else config["dim"], generator=g,
                    dtype=torch.float64) * mask[..., None]  # fmt: skip
    given = None if pad_kind == "none" else mask
    mine = slice(cuts[rank], cuts[rank + 1])

    def run(net, part=slice(None)):
        if lm:  # a slice's tokens at their positions in the whole sequence
            extra = [] if net is not model else [_real_positions(mask)[:, part]]
            return net(inputs[:, part], None if given is None else given[:, part], *extra)
        x = inputs[:, part].to(torch.float64 if net is ref else dtype)
        return net(x, attn_mask=None if given is None else given[:, part], is_causal=False)

    want, low_out = run(ref), run(low)
    (want * w).sum().backward()
    if low is not ref:
        (low_out.double() * w).sum().backward()
    got = run(model, mine)
    (got.double() * w[:, mine]).sum().backward()
    grads = {}
    for name, p in model.named_parameters():  # (every rank: the same parameters, in order)
        grad = torch.zeros_like(p) if p.grad is None else p.grad.clone()
        if world > 1:
            dist.all_reduce(grad)
        grads[name] = grad
    tol = MODEL_TOLERANCE[dtype]
    real = mask[:, mine]
    used = _used(got[real], want[:, mine][real], low_out[:, mine][real], 0.0, tol)
    ref_grads = {name: p.grad for name, p in ref.named_parameters()}
    largest = max(x.abs().max().item() for x in ref_grads.values() if x is not None)
    lows = dict(low.named_parameters())
    for name, grad in grads.items():
        want_g = ref_grads[name]
        if want_g is None:
            want_g, low_g = torch.zeros_like(grad, dtype=torch.float64), grad.new_zeros(())
        else:
            low_g = lows[name].grad
        if not torch.isfinite(grad).all():
            return float("inf")
        used = max(used, _used(grad, want_g, low_g, _floor(want_g, largest), tol))
    return used


CASES = {"op": op_case, "decode": decode_case, "state": state_case, "model": model_case,
         "seqpar": None}  # fmt: skip
COLLECTIVE_TIMEOUT_S = 120


def _seqpar_ranks(args) -> int:
    """``--ranks`` processes, each this script as one rank; rank 0's report is the run's."""
    if args.ranks == 1:
        return _seqpar_rank(args.seed, args.cases, 0, 1)
    with tempfile.TemporaryDirectory() as tmp:
        base = [sys.executable, str(Path(__file__).resolve()), "seqpar", "--seed",
                str(args.seed), "--cases", str(args.cases), "--ranks", str(args.ranks),
                "--store", str(Path(tmp) / "store")]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
        ranks = [
            subprocess.Popen([*base, "--rank", str(r)], env=env, **pipe) for r in range(args.ranks)
        ]
        outputs = [p.communicate()[0] for p in ranks]
    print(outputs[0], end="", flush=True)
    for r, (p, out) in enumerate(zip(ranks, outputs, strict=True)):
        if r and p.returncode not in (0, 1):
            print(f"rank {r} ended with status {p.returncode}:\n{out[-3000:]}", flush=True)
    return 0 if all(p.returncode == 0 for p in ranks) else 1


def _seqpar_rank(seed: int, cases: int, rank: int, world: int, store: str = "") -> int:
    """One rank's loop over the cases: each case's largest share over the ranks (an
    all-reduce), printed by rank 0. A case that raises ends the run (the other ranks may
    be waiting in a collective; they stop at the timeout)."""
    torch.set_num_threads(1)
    if world > 1:
        timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        store = dist.FileStore(store, world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    rng = random.Random(seed)
    failed, ran = 0, 0
    worst: dict[str, float] = {}
    for i in range(cases):
        params: dict = {}
        try:
            used = seqpar_case(rng, seed * 100_000 + i, params, rank, world)
            share = torch.tensor([used if used == used else float("inf")], dtype=torch.float64)
            if world > 1:
                dist.all_reduce(share, op=dist.ReduceOp.MAX)
        except Exception as err:  # a crash is a finding; the group may be stuck: stop
            failed += 1
            print(f"case {i}: rank {rank} raised {err!r:.300} {params}", flush=True)
            break
        used, ran = share.item(), ran + 1
        worst[params["dtype"]] = max(worst.get(params["dtype"], 0.0), used)
        if not used <= 1.0:
            failed += 1
            if rank == 0:
                print(f"case {i}: {used:.3g}x its error budget {params}", flush=True)
    if rank == 0 or failed:
        spread = ", ".join(f"{dtype} {value:.3f}" for dtype, value in sorted(worst.items()))
        stopped = f" (stopped after {ran})" if ran < cases else ""
        print(
            f"seqpar: {cases} cases{stopped}, seed {seed}, {world} ranks, {failed} failed; "
            f"largest share of the error budget used: {spread}",
            flush=True,
        )
    if world > 1:  # (gloo's threads may outlive the group; see tests/distributed/spawn.py)
        sys.stdout.flush()
        os._exit(1 if failed else 0)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=list(CASES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument(
        "--compile", metavar="BACKEND", default=None,
        help="op, state and model: the op (the model's forward) under test traced by "
        "torch.compile(fullgraph=True) with this backend (aot_eager, inductor), anew each case",
    )  # fmt: skip
    parser.add_argument("--ranks", type=int, default=3, help="seqpar: processes (default 3)")
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--store", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compile and args.what in ("decode", "seqpar"):
        parser.error("--compile: the op, state and model targets only")
    if args.what == "seqpar":
        if args.ranks < 1:
            parser.error(f"--ranks must be at least 1; got {args.ranks}")
        if args.rank is not None:
            return _seqpar_rank(args.seed, args.cases, args.rank, args.ranks, args.store)
        return _seqpar_ranks(args)
    global COMPILE
    COMPILE = args.compile
    case = CASES[args.what]
    rng = random.Random(args.seed)
    failed = 0
    worst: dict[str, float] = {}
    for i in range(args.cases):
        params: dict = {}
        try:
            used = case(rng, args.seed * 100_000 + i, params)
        except Exception as err:  # a crash is a finding: report it and go on
            failed += 1
            print(f"case {i}: raised {err!r:.300} {params}", flush=True)
            continue
        key = params["dtype"]
        worst[key] = max(worst.get(key, 0.0), used)
        if not used <= 1.0:
            failed += 1
            print(f"case {i}: {used:.3g}x its error budget {params}", flush=True)
    spread = ", ".join(f"{dtype} {value:.3f}" for dtype, value in sorted(worst.items()))
    print(f"{args.what}: {args.cases} cases, seed {args.seed}, {failed} failed; "
          f"largest share of the error budget used: {spread}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
