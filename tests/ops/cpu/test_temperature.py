"""A per-head float32 temperature with float16 / bfloat16 inputs in the CPU kernels: the
direct form (full and causal), the efficient forms (non-causal, causal, causal with a state)
and the decoding step, the temperature's gradient included.

The plain reference cannot mix a float32 τ with 16-bit inputs, so the yardstick is the same
kernel on float32 inputs (the 16-bit values upcast) with the same τ, itself held to the
float64 reference. The temperatures lie ≥ 3.3e-3 (relative) from the nearest bfloat16
number and ≥ 4.1e-4 from the nearest float16 one (0.84 of each dtype's unit roundoff u,
2^-8 and 2^-11): a τ rounded to either dtype for 16-bit inputs on its way to C fails the
comparison with the float32 run (the outputs, and the per-head gradient scales, bound
u/4), a τ rounded whatever the inputs' dtype the float32 run's comparison with float64.
``check_temperature`` serves the Triton kernels as well (tests/ops/triton/test_temperature.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from taylorshift import naive_taylor_shift_attention, taylor_shift_decode
from taylorshift.ops.cpu import decode as cpu_decode
from taylorshift.ops.cpu.direct import cpu_direct_taylor_shift
from taylorshift.ops.cpu.efficient import cpu_efficient_taylor_shift
from taylorshift.ops.cpu.efficient_causal import cpu_causal_efficient_taylor_shift
from tests.helpers import assert_rel_close, key_padding, rel_error

# each ≥ 0.84 u from both grids (bfloat16 -3.45e-3, -3.37e-3, -3.30e-3; float16 +4.1e-4,
# +4.3e-4, +4.5e-4); the second set with centred values (below) moves the float16 output
# by ~10x its own rounding when rounded to bfloat16
NEAR_ONE = (1.0113, 1.0269, 1.0425)
LARGER = (2.0226, 4.0451, 4.1076)
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
FLOOR = 1e-5  # the float32 kernels' own agreement with float64 (check_float32's 1e-5)
CHUNK = 8  # tokens per chunk of the causal form: 33 tokens cut it unevenly


@dataclass(frozen=True)
class Problem:
    b: int
    h: int
    n: int  # queries and keys
    d: int
    dv: int
    tau: tuple[float, ...]  # one per head
    centred: bool = False  # values minus their mean over the keys
    padded: bool = False  # random key padding (no batch item fully padded)

    @property
    def id(self) -> str:
        kind = "near-one" if self.tau == NEAR_ONE else "larger"
        extras = ("-centred" if self.centred else "") + ("-padded" if self.padded else "")
        return f"B{self.b}-H{self.h}-N{self.n}-d{self.d}-dv{self.dv}-{kind}-tau{extras}"


PROBLEMS = [
    Problem(2, 3, 33, 16, 8, NEAR_ONE, padded=True),
    Problem(1, 3, 40, 16, 8, LARGER, centred=True),
]


def inputs(problem: Problem, dtype: torch.dtype, seed: int = 0):
    """16-bit query, key, value, the (B, 1, 1, N) key padding or None, and a 16-bit ∂L/∂y."""
    p = problem
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(p.b, p.h, p.n, x, generator=g) for x in (p.d, p.d, p.dv))
    if p.centred:  # y then follows the differences of the weights: ∝ τ to first order
        v = v - v.mean(dim=2, keepdim=True)
    grad = torch.randn(p.b, p.h, p.n, p.dv, generator=g).to(dtype)
    mask = key_padding(p.b, p.n, seed=seed, empty_row=False) if p.padded else None
    return [x.to(dtype) for x in (q, k, v)], mask, grad


def run(form, low, mask, tau, grad, dtype):
    """form(q, k, v, mask, τ) on ``low`` cast to ``dtype``, τ (1, H, 1, 1) float32 (float64
    for float64 inputs): the output and the gradients of q, k, v and τ."""
    leaves = [x.to(dtype).requires_grad_() for x in low]
    tau_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    t = torch.tensor(tau, dtype=tau_dtype, device=low[0].device).view(1, -1, 1, 1)
    t.requires_grad_()
    out = form(*leaves, mask, t)
    return out, torch.autograd.grad(out, [*leaves, t], grad.to(out.dtype))


def head_scale_error(actual, expected) -> float:
    """max over heads |<actual, expected> / <expected, expected> - 1|: the per-head scale of
    actual along expected, which independent rounding errors barely move."""
    a, e = actual.double(), expected.double()
    dims = (0, *range(2, e.dim()))
    return ((a * e).sum(dims) / (e * e).sum(dims) - 1).abs().max().item()


def check_temperature(
    form, problem: Problem, dtype: torch.dtype, *, is_causal: bool, exact_output: bool,
    scale_bound: float, tau_grad_bound: float, device: str = "cpu",
) -> None:  # fmt: skip
    """``form`` with 16-bit inputs and a per-head float32 τ against itself on float32 inputs.

    - the float32 run against the float64 reference: output within 1e-5, gradients (q, k,
      v, τ) within 2e-5 (check_float32's bounds);
    - output: ``exact_output``, the float32 run rounded to ``dtype`` (a kernel that converts
      its inputs and rounds only its result), else SPEC §8's 2x the float32 run's own
      rounding error + FLOOR;
    - ∂L/∂q, ∂L/∂k, ∂L/∂v: SPEC §8's 3x the rounding error of the float32 run's + FLOOR;
    - ∂L/∂q, ∂L/∂k per head, their scale along the float32 run's within ``scale_bound``:
      q' = τ q/‖q‖, so a τ off by a relative δ scales both by about 1 + δ, which the
      norms above lose in bfloat16's rounding; rounding errors, independent across the
      n = B·N·d entries of a head, move the scale by about u/sqrt(n) each (u/32 to u/23
      here; measured up to u/10);
    - ∂L/∂τ (float32 in both runs): relative error within ``tau_grad_bound``.
    """
    low, mask, grad = inputs(problem, dtype)
    low, grad = [x.to(device) for x in low], grad.to(device)
    mask = None if mask is None else mask.to(device)
    tau = torch.tensor(problem.tau)
    rounded = tau.to(torch.bfloat16).float() / tau - 1
    assert rounded.abs().min() > 3 * scale_bound  # what the scale check must see

    out, grads = run(form, low, mask, problem.tau, grad, dtype)
    out32, grads32 = run(form, low, mask, problem.tau, grad, torch.float32)
    exact, grads64 = run(naive_form(is_causal), low, mask, problem.tau, grad, torch.float64)
    assert_rel_close(out32, exact, 1e-5, "float32 output vs reference", atol=1e-7)
    for name, a, e in zip(["q", "k", "v", "τ"], grads32, grads64, strict=True):
        assert_rel_close(a, e, 2e-5, f"float32 grad {name} vs reference", atol=1e-6)

    assert out.dtype == dtype
    if exact_output:
        err = rel_error(out, out32.to(dtype))
        assert torch.equal(out, out32.to(dtype)), f"output: {err:.2e} from the float32 run's"
    else:
        err, own = rel_error(out, out32), rel_error(out32.to(dtype), out32)
        assert err <= 2 * own + FLOOR, f"output: error {err:.2e} > 2 x {own:.2e} + {FLOOR}"
    for name, a, e in zip("qkv", grads[:3], grads32[:3], strict=True):
        assert a.dtype == dtype, name
        err, own = rel_error(a, e), rel_error(e.to(dtype), e)
        assert err <= 3 * own + FLOOR, f"grad {name}: error {err:.2e} > 3 x {own:.2e} + {FLOOR}"
    for name, a, e in zip("qk", grads[:2], grads32[:2], strict=True):
        err = head_scale_error(a, e)
        assert err <= scale_bound, f"grad {name}: scale off by {err:.2e} > {scale_bound:.2e}"
    g_tau, g_tau32 = grads[3], grads32[3]
    assert g_tau.dtype == torch.float32
    err = rel_error(g_tau, g_tau32)
    assert err <= tau_grad_bound, f"grad τ: error {err:.2e} > {tau_grad_bound:.2e}"


def naive_form(is_causal: bool):
    """The float64 reference with the kernel forms' signature."""

    def form(q, k, v, mask, tau):
        return naive_taylor_shift_attention(q, k, v, mask, is_causal, temperature=tau)

    return form


def kernel_key_mask(mask, q, k):
    """(B, 1, 1, Nk) -> the efficient kernels' (B, H, Nk) view, or None."""
    return None if mask is None else mask[:, :, 0, :].expand(q.shape[0], q.shape[1], k.shape[2])


def direct(q, k, v, mask, tau):
    return cpu_direct_taylor_shift(q, k, v, mask, False, tau, None, True)


def direct_causal(q, k, v, mask, tau):
    return cpu_direct_taylor_shift(q, k, v, mask, True, tau, None, True)


def efficient(q, k, v, mask, tau):
    return cpu_efficient_taylor_shift(q, k, v, kernel_key_mask(mask, q, k), tau, None, True)


def causal(q, k, v, mask, tau):
    key_mask = kernel_key_mask(mask, q, k)
    return cpu_causal_efficient_taylor_shift(q, k, v, key_mask, tau, None, True, CHUNK)


def causal_state(q, k, v, mask, tau):
    """The prefill's path: the state after the block kept (StateFunction, not KernelFunction)."""
    key_mask = kernel_key_mask(mask, q, k)
    out, _ = cpu_causal_efficient_taylor_shift(
        q, k, v, key_mask, tau, None, True, CHUNK, output_final_state=True
    )
    return out


FORMS = {  # name: (form(q, k, v, mask (B, 1, 1, Nk) or None, τ), is_causal)
    "direct": (direct, False),
    "direct-causal": (direct_causal, True),
    "efficient": (efficient, False),
    "causal": (causal, True),
    "causal-state": (causal_state, True),
}
# The kernels convert 16-bit inputs to float32 and round their results, so the 16-bit run
# differs from the float32 one only where its backward reads the 16-bit output it saved:
# ∂L/∂τ measured within 3.2e-4 (float16) and 2.3e-3 (bfloat16) of the float32 run's on
# these problems; the bounds, 2u, leave 3x.
TAU_GRAD_BOUND = {dtype: 2 * u for dtype, u in UNIT_ROUNDOFF.items()}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.id)
@pytest.mark.parametrize("name", list(FORMS))
def test_sixteen_bit_inputs_take_the_float32_temperature(name, problem, dtype):
    form, is_causal = FORMS[name]
    check_temperature(
        form, problem, dtype, is_causal=is_causal, exact_output=True,
        scale_bound=UNIT_ROUNDOFF[dtype] / 4, tau_grad_bound=TAU_GRAD_BOUND[dtype],
    )  # fmt: skip


@pytest.mark.parametrize("tau", [NEAR_ONE, LARGER], ids=["near-one-tau", "larger-tau"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_decode_step_takes_the_float32_temperature(dtype, tau, monkeypatch):
    # A prompt prefilled (the causal kernel with a state), then tokens one at a time (the
    # step kernel), 16-bit and float32 inputs with the same per-head τ: the step converts
    # its inputs to float32 and rounds only its result, so the 16-bit outputs are the
    # float32 run's rounded to 16 bits, which hold the float64 reference's within 1e-5
    # (no gradient here: the equality is what shows a τ rounded to bfloat16 there).
    steps = []
    real_step = cpu_decode.decode_step

    def spy(*args, **kwargs):
        steps.append(args[0].dtype)
        return real_step(*args, **kwargs)

    monkeypatch.setattr(cpu_decode, "decode_step", spy)
    n, n_prompt = 12, 5
    low, _, _ = inputs(Problem(2, 3, n, 16, 8, tau), dtype, seed=3)
    tau = torch.tensor(tau).view(1, -1, 1, 1)

    def decode(q, k, v, t):
        out, state = taylor_shift_decode(
            q[:, :, :n_prompt], k[:, :, :n_prompt], v[:, :, :n_prompt], temperature=t
        )
        outs = [out]
        for i in range(n_prompt, q.shape[2]):
            one = (x[:, :, i : i + 1] for x in (q, k, v))
            y, state = taylor_shift_decode(*one, state, temperature=t, inplace=True)
            outs.append(y)
        return torch.cat(outs, dim=2)

    out = decode(*low, tau)
    out32 = decode(*(x.float() for x in low), tau)
    assert steps == [dtype] * (n - n_prompt) + [torch.float32] * (n - n_prompt)
    exact = naive_taylor_shift_attention(
        *(x.double() for x in low), None, True, temperature=tau.double()
    )
    assert_rel_close(out32, exact, 1e-5, "float32 output vs reference", atol=1e-7)
    assert out.dtype == dtype
    err = rel_error(out, out32.to(dtype))
    assert torch.equal(out, out32.to(dtype)), f"output: {err:.2e} from the float32 run's"
