"""Shared cases of the efficient-form kernel tests (Triton and CPU, non-causal and causal):
the problem description, its inputs in a low precision and in float64, the calls, and the
two checks every fused form passes (float32 against float64 and the PyTorch form; 16-bit
against the reference's own error)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from taylorshift import naive_taylor_shift_attention
from tests.helpers import assert_rel_close, key_padding, rel_error


@dataclass(frozen=True)
class Case:
    b: int
    h: int
    nq: int
    nk: int
    d: int
    dv: int
    mask: str | None = None  # None, "padding" (random lengths) or "empty" (batch 0 all padded)
    normalize: bool = True
    temperature: str = "tensor"  # "tensor" (per head, requires grad) or "float"

    @property
    def id(self) -> str:
        parts = [f"B{self.b}-H{self.h}-Nq{self.nq}-Nk{self.nk}-d{self.d}-dv{self.dv}"]
        parts.append(self.mask or "nomask")
        parts.append(f"norm-{self.temperature}-temp" if self.normalize else "plain-scores")
        return "-".join(parts)


def make_problem(case: Case, dtype: torch.dtype, seed: int = 0):
    """Low-precision leaves, float64 leaves with the same values, the mask and the options."""
    g = torch.Generator().manual_seed(seed)
    shapes = [
        (case.b, case.h, case.nq, case.d),
        (case.b, case.h, case.nk, case.d),
        (case.b, case.h, case.nk, case.dv),
    ]
    low = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    if case.normalize and case.temperature == "tensor":
        low.append(1.0 + torch.rand(1, case.h, 1, 1, generator=g))  # float32, per head
    high = [x.double().requires_grad_() for x in low]
    low = [x.requires_grad_() for x in low]

    mask = None
    if case.mask is not None:
        mask = key_padding(case.b, case.nk, seed=seed, empty_row=case.mask == "empty")
    if case.normalize:
        opts = dict(normalize=True, temperature=1.5 if case.temperature == "float" else None)
    else:
        opts = dict(normalize=False, temperature=1.0)
    return low, high, mask, opts


def temperature_of(inputs, opts):
    return inputs[3] if opts["temperature"] is None else opts["temperature"]


def call_reference(inputs, mask, opts, *, is_causal: bool = False):
    return naive_taylor_shift_attention(
        *inputs[:3],
        mask,
        is_causal=is_causal,
        temperature=temperature_of(inputs, opts),
        normalize=opts["normalize"],
    )


def key_mask_of(mask, case: Case):
    """The validated key mask: (B, H, Nk) bool, a broadcast view as check_inputs makes it."""
    return None if mask is None else mask[:, :, 0, :].expand(case.b, case.h, case.nk)


def call_form(form, inputs, mask, opts, case: Case, **kwargs):
    """A form (Triton or torch) on validated inputs."""
    key_mask = key_mask_of(mask, case)
    return form(
        *inputs[:3], key_mask, temperature_of(inputs, opts), None, opts["normalize"], **kwargs
    )


def grads(y, inputs, g):
    return torch.autograd.grad(y, inputs, g.to(y.dtype))


def check_float32(form, torch_form, case: Case, *, is_causal: bool = False, **kwargs) -> None:
    """A fused form against the float64 reference and the PyTorch form, float32 inputs:
    outputs within 1e-5 and gradients (query, key, value, a tensor temperature) within 2e-5,
    relative; a batch with no attended key ("empty") gives zeros. ``kwargs`` go to both
    forms (e.g. ``chunk_size``)."""
    low, high, mask, opts = make_problem(case, torch.float32)
    exact = call_reference(high, mask, opts, is_causal=is_causal)
    fast = call_form(form, low, mask, opts, case, **kwargs)
    torch_out = call_form(torch_form, low, mask, opts, case, **kwargs)
    assert fast.dtype == torch.float32 and fast.shape == exact.shape
    assert_rel_close(fast, exact, 1e-5, "output vs reference", atol=1e-7)
    assert_rel_close(fast, torch_out, 1e-5, "output vs torch form", atol=1e-7)
    if case.mask == "empty":
        assert (fast[0] == 0).all(), "a query with no attended key must return zeros"

    g = torch.randn(exact.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    g_exact = grads(exact, high, g)
    g_fast = grads(fast, low, g)
    g_torch = grads(torch_out, low, g)
    names = ["query", "key", "value", "temperature"]
    for name, a, e, t in zip(names, g_fast, g_exact, g_torch, strict=False):
        assert a.dtype == torch.float32, name
        assert_rel_close(a, e, 2e-5, f"grad {name} vs reference", atol=1e-6)
        assert_rel_close(a, t, 2e-5, f"grad {name} vs torch form", atol=1e-6)


def check_low_precision(
    form, case: Case, dtype: torch.dtype, *, is_causal: bool = False, floor: float = 1e-4,
    rms_bound: float = 5e-3, **kwargs,
) -> None:  # fmt: skip
    """SPEC §8's rule for 16-bit inputs: the form's relative RMS error against float64 at
    most 2× (output) / 3× (gradients of q, k, v) the reference's own error in ``dtype``, plus
    ``floor`` (the level of the float64 check itself), and below ``rms_bound``."""
    low, high, mask, opts = make_problem(case, dtype, seed=1)
    exact = call_reference(high, mask, opts, is_causal=is_causal)
    ref_low = call_reference(low, mask, opts, is_causal=is_causal)
    fast = call_form(form, low, mask, opts, case, **kwargs)
    assert fast.dtype == dtype
    err_fast, err_ref = rel_error(fast, exact), rel_error(ref_low, exact)
    assert err_fast <= 2 * err_ref + floor, (err_fast, err_ref)
    assert err_fast < rms_bound

    g = torch.randn(exact.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    g_exact = grads(exact, high, g)
    g_ref = grads(ref_low, low, g)
    g_fast = grads(fast, low, g)
    for name, a, r, e in zip("qkv", g_fast, g_ref, g_exact, strict=True):
        assert a.dtype == dtype and torch.isfinite(a).all()
        err_fast, err_ref = rel_error(a, e), rel_error(r, e)
        assert err_fast <= 3 * err_ref + floor, (name, err_fast, err_ref)
        assert err_fast < rms_bound, (name, err_fast)


def check_fully_masked(form, nq: int = 5, **kwargs) -> None:
    """Key padding that leaves whole heads with no key: their outputs are zeros, every
    gradient finite, and masked keys and values get zero gradients."""
    case = Case(2, 2, nq, 9, 16, 16)
    q, k, v, t = make_problem(case, torch.float32)[0]
    key_mask = torch.zeros(2, 2, 9, dtype=torch.bool)
    key_mask[1, 0, :4] = True  # one head of one batch attends its first 4 keys, the rest none
    y = form(q, k, v, key_mask, t, None, True, **kwargs)
    assert (y[0] == 0).all() and (y[1, 1] == 0).all()
    gq, gk, gv, gt = torch.autograd.grad(y.sum(), (q, k, v, t))
    assert all(torch.isfinite(x).all() for x in (gq, gk, gv, gt))
    assert (gq[0] == 0).all()
    assert (gk[1, 0, 4:] == 0).all() and (gv[1, 0, 4:] == 0).all()


def check_nan_in_padded_keys(form, n: int = 40, **kwargs) -> None:
    """NaN in the content of padded keys and their values changes nothing the padding
    hides: outputs and the query's gradient equal those with zeros there, the values'
    gradients are zero at padded keys and finite elsewhere. ``n`` keys (and queries), the
    last ``n - 25`` of head 1 padded."""
    case = Case(1, 2, n, n, 16, 12)
    q, k, v, t = make_problem(case, torch.float32)[0]
    key_mask = torch.ones(1, 2, n, dtype=torch.bool)
    key_mask[0, 1, 25:] = False
    results = []
    for fill in (0.0, float("nan")):
        kf, vf = k.detach().clone(), v.detach().clone()
        kf[~key_mask], vf[~key_mask] = fill, fill
        leaves = [q.detach().clone().requires_grad_(), kf.requires_grad_(), vf.requires_grad_()]
        y = form(*leaves, key_mask, t.detach(), None, True, **kwargs)
        gq, _, gv = torch.autograd.grad(y.sum(), leaves)
        results.append((y, gq, gv))
    (y0, gq0, gv0), (y1, gq1, gv1) = results
    assert torch.equal(y1, y0) and torch.equal(gq1, gq0)
    assert (gv1[~key_mask] == 0).all() and torch.equal(gv1, gv0)


def check_non_contiguous(form, rtol: float = 1e-6) -> None:
    """(B, N, H, d) storage seen as (B, H, N, d), the layout of a fused projection, gives
    the result of contiguous copies (within ``rtol``; 0: bitwise), gradients included."""
    g = torch.Generator().manual_seed(5)
    leaves = [torch.randn(2, n, 2, d, generator=g).requires_grad_() for n, d in
              ((6, 16), (11, 16), (11, 12))]  # fmt: skip
    key_mask = (torch.arange(11) < 8).expand(2, 2, 11)  # one shared padding, broadcast
    views = [x.transpose(1, 2) for x in leaves]
    copies = [x.detach().transpose(1, 2).contiguous().requires_grad_() for x in leaves]
    y = form(*views, key_mask, 1.3, None, True)
    y_ref = form(*copies, key_mask, 1.3, None, True)
    g_out = torch.randn(y.shape, generator=g)
    grads = torch.autograd.grad(y, leaves, g_out)
    grads_ref = torch.autograd.grad(y_ref, copies, g_out)
    pairs = [("output", y, y_ref)]
    named = zip("qkv", grads, grads_ref, strict=True)
    pairs += [(f"grad {n}", a.transpose(1, 2), e) for n, a, e in named]
    for name, a, e in pairs:
        if rtol == 0:
            assert torch.equal(a, e), name
        else:
            assert_rel_close(a, e, rtol, name, atol=rtol / 10)


def check_compiles(form) -> None:
    """``torch.compile(fullgraph=True)`` (aot_eager) traces the form whole, forward and
    backward, with key padding and a tensor temperature, and agrees with the eager call."""
    case = Case(2, 2, 9, 11, 16, 8, mask="padding")
    low, _, mask, _ = make_problem(case, torch.float32)
    key_mask = key_mask_of(mask, case)

    def f(q, k, v, t):
        return form(q, k, v, key_mask, t, None, True)

    eager = f(*low)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(*low)
    assert_rel_close(compiled, eager, 1e-6, "compiled output", atol=1e-7)
    g = torch.randn_like(eager)
    grads = zip(
        "qkvt", torch.autograd.grad(compiled, low, g), torch.autograd.grad(eager, low, g),
        strict=True,
    )  # fmt: skip
    for name, a, e in grads:
        assert_rel_close(a, e, 1e-6, f"compiled grad {name}", atol=1e-7)


def check_thread_counts(form, case: Case) -> None:
    """The form with 1 and 4 threads: outputs and q, k, v gradients bitwise the same (no sum
    of the CPU kernels changes order with the thread count), the temperature's gradient
    (partial sums per work item) to rounding."""
    low, _, mask, opts = make_problem(case, torch.float32, seed=2)
    g = torch.randn(case.b, case.h, case.nq, case.dv, generator=torch.Generator().manual_seed(4))
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 4):
            torch.set_num_threads(threads)
            y = call_form(form, low, mask, opts, case)
            results.append([y, *torch.autograd.grad(y, low, g)])
    finally:
        torch.set_num_threads(before)
    one, four = results
    for name, a, b in zip(["output", "query", "key", "value"], one, four, strict=False):
        assert torch.equal(a, b), name
    assert_rel_close(four[4], one[4], 1e-6, "temperature")


def check_broadcast_output_grad(form) -> None:
    """y.sum() hands the backward an expanded (stride 0) gradient, which a CPU kernel's
    wrapper copies to a dense one before passing its address to C: the copy must outlive
    the call, so the gradients equal those of a dense gradient of ones bitwise."""
    case = Case(1, 2, 40, 33, 16, 16, mask="padding")
    low, _, mask, opts = make_problem(case, torch.float32, seed=6)
    y = call_form(form, low, mask, opts, case)
    expanded = torch.autograd.grad(y.sum(), low, retain_graph=True)
    dense = torch.autograd.grad(y, low, torch.ones(y.shape))
    for name, a, b in zip(["query", "key", "value", "temperature"], expanded, dense, strict=True):
        assert torch.equal(a, b), name


def check_default_dtype(form, **kwargs) -> None:
    """Float32 inputs while torch's default dtype is float64: the wrappers' buffers and
    per-head factors must still be float32 (the kernels write and read float32), so outputs
    and gradients equal those under the float32 default bitwise; with a tensor and a float
    temperature (the float one is a scalar or a filled factor tensor, by form)."""
    before = torch.get_default_dtype()
    for temperature in ("tensor", "float"):
        case = Case(1, 2, 30, 30, 16, 8, mask="padding", temperature=temperature)
        low, _, mask, opts = make_problem(case, torch.float32, seed=8)
        g = torch.randn(
            case.b, case.h, case.nq, case.dv, generator=torch.Generator().manual_seed(9)
        )
        results = []
        try:
            for default in (torch.float32, torch.float64):
                torch.set_default_dtype(default)
                y = call_form(form, low, mask, opts, case, **kwargs)
                results.append([y, *torch.autograd.grad(y, low, g)])
        finally:
            torch.set_default_dtype(before)
        names = ["output", "query", "key", "value", "temperature"]
        for name, a, b in zip(names, *results, strict=False):
            assert a.dtype == torch.float32 and torch.equal(a, b), f"{name}, {temperature} τ"
