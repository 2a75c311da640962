"""The fused Triton direct form against the float64 reference and the torch direct form.

Outputs and gradients (query, key, value, tensor temperature) under every flag combination,
awkward shapes, key padding with a fully padded batch, in float32 and float16 (SPEC §8). On
the CPU the kernels run in Triton's interpreter (conftest), which has no bfloat16.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_rel_close, key_padding, rel_error
from tests.ops.triton.conftest import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

from taylorshift import naive_taylor_shift_attention
from taylorshift.ops.taylor_shift.direct import direct_taylor_shift
from taylorshift.ops.triton import direct as triton_direct

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = ("out", "dq", "dk", "dv", "dtemperature")


def _problem(b, h, nq, nk, d, dv, *, masked, tensor_temperature, normalize, seed=0):
    """Float64 inputs, the (B, 1, 1, Nk) key-padding mask (batch 0 fully padded), τ, ∂L/∂out."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, h, nk, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, h, nk, dv, generator=g, dtype=torch.float64)
    grad = torch.randn(b, h, nq, dv, generator=g, dtype=torch.float64)
    mask = key_padding(b, nk, seed=seed) if masked else None
    if not normalize:
        temperature = 1.0
    elif tensor_temperature:
        # Exactly representable in float16, so the float16 yardstick sees the same τ.
        temperature = torch.tensor([0.75, 1.5, 2.25][:h], dtype=torch.float64).view(1, h, 1, 1)
    else:
        temperature = 1.5
    return q, k, v, mask, temperature, grad


def _run(fn, inputs, temperature, grad, dtype, temperature_dtype):
    """fn(q, k, v, τ) in ``dtype`` with leaves; -> dict of output and gradients (float64)."""
    leaves = [t.to(DEVICE, dtype, copy=True).requires_grad_() for t in inputs]
    tau = temperature
    if isinstance(temperature, torch.Tensor):
        tau = temperature.to(DEVICE, temperature_dtype, copy=True).requires_grad_()
    out = fn(*leaves, tau)
    out.backward(grad.to(DEVICE, dtype))
    grads = [t.grad for t in leaves] + ([tau.grad] if isinstance(tau, torch.Tensor) else [])
    values = [out, *grads]
    return {n: t.detach().double().cpu() for n, t in zip(NAMES[: len(values)], values, strict=True)}


def _compare(
    b, h, nq, nk, d, dv, dtype, *, normalize, causal, masked, tensor_temperature=True,
    scale=None, layout=None,
):  # fmt: skip
    q, k, v, mask, temperature, grad = _problem(
        b, h, nq, nk, d, dv, masked=masked, tensor_temperature=tensor_temperature,
        normalize=normalize,
    )  # fmt: skip
    attn_mask = None if mask is None else mask.to(DEVICE)

    def fast(q_, k_, v_, tau):
        if layout is not None:  # the same values in (B, N, H, d) memory: non-contiguous views
            q_, k_, v_ = (layout(t) for t in (q_, k_, v_))
        return triton_direct.triton_direct_taylor_shift(
            q_, k_, v_, attn_mask, causal, tau, scale, normalize
        )

    def naive(q_, k_, v_, tau):
        return naive_taylor_shift_attention(
            q_, k_, v_, attn_mask, causal, temperature=tau, scale=scale, normalize=normalize
        )

    def torch_direct(q_, k_, v_, tau):  # the same signature as the fused form
        return direct_taylor_shift(q_, k_, v_, attn_mask, causal, tau, scale, normalize)

    inputs = (q, k, v)
    ref = _run(naive, inputs, temperature, grad, torch.float64, torch.float64)
    got = _run(fast, inputs, temperature, grad, dtype, torch.float32)
    other = _run(torch_direct, inputs, temperature, grad, dtype, torch.float32)
    assert got.keys() == ref.keys() and len(got) == 4 + isinstance(temperature, torch.Tensor)

    if masked and b > 1:  # batch 0 attends no key: zeros, and zero gradients, never NaN
        assert torch.equal(got["out"][0], torch.zeros_like(got["out"][0]))
        assert torch.equal(got["dq"][0], torch.zeros_like(got["dq"][0]))

    if dtype == torch.float32:
        for name in got:
            rtol = 2e-5 if name == "out" else 1e-4
            assert_rel_close(got[name], ref[name], rtol, f"{name} vs float64 reference", 1e-7)
            assert_rel_close(got[name], other[name], rtol, f"{name} vs torch direct", 1e-7)
        return

    # SPEC §8: the error against float64 is at most 2× (outputs) or 3× (gradients) that of
    # the plain reference run in float16, plus the rounding of the result to float16 itself;
    # and the relative RMS error stays small.
    low = _run(naive, inputs, temperature, grad, dtype, dtype)
    for name in got:
        assert torch.isfinite(got[name]).all(), f"{name}: non-finite values"
        err = (got[name] - ref[name]).abs().max().item()
        yardstick = (low[name] - ref[name]).abs().max().item()
        rounding = (ref[name].to(dtype).double() - ref[name]).abs().max().item()
        factor = 2.0 if name == "out" else 3.0
        assert err <= factor * yardstick + 2 * rounding + 1e-6, (
            f"{name}: max error {err:.3e} > {factor}× float16 reference error {yardstick:.3e} "
            f"+ 2× rounding {rounding:.3e}"
        )
        # Relative RMS, with an absolute floor for gradients that vanish in exact arithmetic
        # (dq with a single attended key): there the float16 output rounding in δ = g · out
        # leaves noise of order 1e-4.
        assert_rel_close(got[name], ref[name], 5e-3, f"{name} vs float64 reference", 1e-4)
        assert_rel_close(got[name], other[name], 5e-3, f"{name} vs torch direct", 1e-4)


DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16")]
FLAG = {True: "", False: "no"}


# every flag combination in float32; float16 (the same kernels, its own error rule) on two
# that between them set and clear every flag
FLAGS = [
    pytest.param(torch.float32, normalize, causal, masked,
                 id=f"{'keypad' if masked else 'nomask'}-{'causal' if causal else 'full'}-"
                    f"{'normalize' if normalize else 'plain'}-fp32")
    for masked in (False, True) for causal in (False, True) for normalize in (True, False)
] + [
    pytest.param(torch.float16, True, True, True, id="keypad-causal-normalize-fp16"),
    pytest.param(torch.float16, False, False, False, id="nomask-full-plain-fp16"),
]  # fmt: skip


@pytest.mark.parametrize(("dtype", "normalize", "causal", "masked"), FLAGS)
def test_flags(dtype, normalize, causal, masked):
    """Flag combinations, Nq ≠ Nk (Nq > Nk: late causal rows see every key), dv ≠ d; two
    heads (a per-head temperature), and with key padding two batch entries (the first fully
    padded). Each program costs the interpreter about as much as a whole call on a GPU: no
    larger grid than the case needs."""
    b = 2 if masked else 1
    _compare(b, 2, 65, 47, 33, 20, dtype, normalize=normalize, causal=causal, masked=masked)


SHAPES = [
    pytest.param((2, 2, 1, 1, 16, 16), id="B2-H2-Nq1-Nk1-D16-Dv16"),
    pytest.param((2, 2, 7, 65, 16, 33), id="B2-H2-Nq7-Nk65-D16-Dv33"),
    pytest.param((2, 2, 65, 7, 33, 16), id="B2-H2-Nq65-Nk7-D33-Dv16"),
    pytest.param((1, 3, 17, 17, 5, 9), id="B1-H3-Nq17-Nk17-D5-Dv9"),
    pytest.param((2, 2, 65, 65, 64, 64), id="B2-H2-Nq65-Nk65-D64-Dv64"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_shapes(shape, dtype):
    """Awkward sizes with causal and key padding, a float temperature."""
    _compare(*shape, dtype, normalize=True, causal=True, masked=True, tensor_temperature=False)


def test_non_contiguous_and_scale():
    """(B, N, H, d) memory seen as (B, H, N, d), a broadcast key-mask view, a given scale."""
    _compare(
        2, 3, 33, 20, 16, 24, torch.float32, normalize=False, causal=True, masked=True,
        scale=0.3, layout=lambda t: t.transpose(1, 2).contiguous().transpose(1, 2),
    )  # fmt: skip


def test_query_blocks_smaller_than_key_blocks(monkeypatch):
    """BLOCK_M < BLOCK_N: the causal loop bounds must not assume square tiles."""
    monkeypatch.setattr(triton_direct, "_INTERPRET_BLOCKS", (16, 32, 1))
    if not triton_direct.interpreting():
        pytest.skip("block sizes are fixed by the GPU configuration")
    _compare(2, 2, 65, 50, 33, 20, torch.float32, normalize=True, causal=True, masked=True)


def test_float32_backward_on_its_own_blocks(monkeypatch):
    """FLOAT32_BACKWARD_BLOCKS (what a tuning run sets): the backward kernels on blocks other
    than the forward's (here square-free both ways round) give the same gradients."""
    monkeypatch.setattr(triton_direct, "FLOAT32_BACKWARD_BLOCKS", (16, 32, 1))
    launched = []
    for name in ("_direct_bwd_dq_kernel", "_direct_bwd_dkv_kernel"):
        monkeypatch.setattr(triton_direct, name, _Spy(getattr(triton_direct, name), launched))
    _compare(2, 2, 65, 50, 33, 20, torch.float32, normalize=True, causal=True, masked=True)
    assert launched and set(launched) == {(16, 32, 1)}, launched


class _Spy:
    """A kernel whose launches record (BLOCK_M, BLOCK_N, num_warps), then run."""

    def __init__(self, kernel, launched):
        self.kernel, self.launched = kernel, launched

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launched.append((kwargs["BLOCK_M"], kwargs["BLOCK_N"], kwargs["num_warps"]))
            return self.kernel[grid](*args, **kwargs)

        return launch


def test_large_scores_stay_finite_in_float16():
    """s up to τ = 1000 (keys near the queries): w = 1 + s + s²/2 ≈ 5e5 would overflow float16
    weights without the per-row bound c_i = 1 / w(‖q'_i‖ max_j ‖k'_j‖) applied before the
    rounding."""
    g = torch.Generator().manual_seed(3)
    q, noise, v = (torch.randn(1, 2, 20, 16, generator=g, dtype=torch.float64) for _ in range(3))
    k = q + 0.1 * noise
    tau = 1000.0
    ref = naive_taylor_shift_attention(q, k, v, temperature=tau)
    got = triton_direct.triton_direct_taylor_shift(
        q.half().to(DEVICE), k.half().to(DEVICE), v.half().to(DEVICE), None, False, tau, None,
        True,
    )  # fmt: skip
    assert torch.isfinite(got).all()
    assert rel_error(got.cpu(), ref) < 1e-2


def test_gradcheck_float64():
    """Analytical gradients equal finite differences (float64 kernels, tiny shapes)."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(1, 2, n, c, generator=g, dtype=torch.float64, device="cpu")
        .to(DEVICE)
        .requires_grad_()
        for n, c in ((5, 4), (4, 4), (4, 3))
    )
    tau = torch.tensor([0.5, 2.0], dtype=torch.float64, device=DEVICE).view(1, 2, 1, 1)
    tau.requires_grad_()
    mask = torch.tensor([True, False, True, True], device=DEVICE).expand(1, 2, 1, 4)

    def fn(q_, k_, v_, t_):
        return triton_direct.triton_direct_taylor_shift(q_, k_, v_, mask, True, t_, None, True)

    # fast_mode: the gradient along random directions against finite differences, not
    # every entry (each entry costs two interpreted kernel calls)
    assert torch.autograd.gradcheck(fn, (q, k, v, tau), fast_mode=True)


def test_opcheck():
    """Schema, fake (meta) kernels and autograd registration of the custom op (torch.compile)."""
    g = torch.Generator().manual_seed(2)
    b, h, nq, nk, d, dv = 1, 2, 9, 6, 8, 5
    q = torch.randn(b, h, nq, d, generator=g).to(DEVICE).requires_grad_()
    k = torch.randn(b, h, nk, d, generator=g).to(DEVICE).requires_grad_()
    v = torch.randn(b, h, nk, dv, generator=g).to(DEVICE).requires_grad_()
    f = torch.ones(b, h, nq, device=DEVICE)
    kmax = k.detach().norm(dim=-1).amax(-1)
    key_mask = (torch.arange(nk, device=DEVICE) < 4).expand(b, h, nk)
    torch.library.opcheck(
        torch.ops.taylorshift.triton_direct_forward.default,
        (q, k, v, f, key_mask, kmax, True),
    )
