"""Every fused kernel through the public op, on the GPU: outputs and gradients against the
float64 reference by SPEC §8's rule, awkward shapes, padding with fully masked rows, long
sequences, decoding, a causal state in and out, a compiled model, grouped-query attention
and an exported program in mode="auto" (see conftest.py for the CPU dry run)."""

from __future__ import annotations

import pytest
import torch

from taylorshift import (
    TaylorShiftState,
    naive_taylor_shift_attention,
    taylor_shift_attention,
    taylor_shift_decode,
)
from taylorshift.ops.taylor_shift import fused
from taylorshift.ops.taylor_shift.checks import check_inputs
from taylorshift.ops.taylor_shift.efficient_causal import causal_efficient_taylor_shift
from tests.helpers import assert_rel_close, key_padding, rel_error

from .conftest import CUDA, DEVICE, LOW_DTYPES, size

# (N, d, dv): awkward lengths at d = 64, every head dim the kernels take, dv != d; the dry
# run keeps a few tiny ones (the interpreter runs a kernel program by program).
if CUDA:
    SHAPES = [(n, 64, 64) for n in (1, 63, 1000, 4097)]
    SHAPES += [(1000, d, d) for d in (16, 32, 128)] + [(1000, 64, 32), (257, 32, 128)]
else:
    SHAPES = [(1, 16, 16), (7, 16, 16), (33, 16, 16), (65, 8, 12)]
FLOOR = 1e-4  # absolute slack of the error rule (values that are zero in exact arithmetic)
RMS_BOUND = 5e-3


def _inputs(n, d, dv, dtype, masked, seed=0):
    g = torch.Generator().manual_seed(seed)
    b, h = 2, 2
    exact = [torch.randn(b, h, n, x, generator=g, dtype=torch.float64) for x in (d, d, dv)]
    tau = 0.5 + torch.rand(1, h, 1, 1, generator=g, dtype=torch.float64)
    mask = key_padding(b, n, seed=seed) if masked else None  # batch 0 fully padded
    return exact, tau, mask


def _run(fn, tensors, tau, mask, causal, dtype, device, **kwargs):
    leaves = [t.to(device, dtype).requires_grad_() for t in tensors]
    # the plain reference computes in the inputs' dtype throughout, τ included
    naive = fn is naive_taylor_shift_attention
    t = tau.to(device, dtype if naive or dtype == torch.float64 else torch.float32)
    t.requires_grad_()
    m = None if mask is None else mask.to(device)
    out = fn(*leaves, m, causal, temperature=t, **kwargs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    grads = torch.autograd.grad(out, [*leaves, t], g.to(device, out.dtype))
    return out, grads


def _kernel_taken(tensors, mask, causal, mode, dtype):
    q, k, v = (t.to(DEVICE, dtype) for t in tensors)
    m = None if mask is None else mask.to(DEVICE)
    problem = check_inputs(q, k, v, m, causal, 1.0, None, True, 2, mode)
    return fused.fused_form(q, problem, mode, causal, 2) is not None


@pytest.fixture
def float32_kernels(monkeypatch):
    """The public op on the fused efficient kernels in float32 on CUDA too. It takes the
    PyTorch form there (faster: ``fused.float32_efficient_stays_on_pytorch``, tested in
    tests/ops/test_fused_routing.py), but these tests are about the kernels, which it still
    runs forward with TF32 and the benchmarks time."""
    monkeypatch.setattr(fused, "float32_efficient_stays_on_pytorch", lambda *_: False)


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "padding"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", ["efficient", "direct"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"N{s[0]}-d{s[1]}-dv{s[2]}")
def test_float32_matches_the_float64_reference(shape, mode, causal, masked, float32_kernels):
    tensors, tau, mask = _inputs(*shape, torch.float32, masked)
    if not _kernel_taken(tensors, mask, causal, mode, torch.float32):
        pytest.skip("no fused kernel for this call (e.g. causal states over the budget)")
    exact, g_exact = _run(naive_taylor_shift_attention, tensors, tau, mask, causal,
                          torch.float64, "cpu")  # fmt: skip
    out, grads = _run(taylor_shift_attention, tensors, tau, mask, causal, torch.float32,
                      DEVICE, mode=mode)  # fmt: skip
    assert_rel_close(out.cpu(), exact, 1e-4, "output", atol=1e-6)
    if masked:
        assert not out[0].any(), "a fully masked row must give zeros"
    for name, a, e in zip(("q", "k", "v", "tau"), grads, g_exact, strict=True):
        # (absolute floor: a gradient that is zero in exact arithmetic, q's at N = 1)
        assert_rel_close(a.cpu(), e, 1e-3, f"grad {name}", atol=1e-5)


@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", ["efficient", "direct"])
@pytest.mark.parametrize("shape", SHAPES[2:], ids=lambda s: f"N{s[0]}-d{s[1]}-dv{s[2]}")
def test_low_precision_error_within_the_reference_error(shape, mode, causal, dtype):
    # SPEC §8: the kernel's error against float64 is at most 2x (outputs) and 3x (gradients)
    # the reference's own error in the same dtype, and its relative RMS stays under 5e-3.
    tensors, tau, mask = _inputs(*shape, dtype, masked=True, seed=1)
    if not _kernel_taken(tensors, mask, causal, mode, dtype):
        pytest.skip("no fused kernel for this call (e.g. causal states over the budget)")
    exact, g_exact = _run(naive_taylor_shift_attention, tensors, tau, mask, causal,
                          torch.float64, "cpu")  # fmt: skip
    low, g_low = _run(naive_taylor_shift_attention, tensors, tau, mask, causal, dtype, DEVICE)
    out, grads = _run(taylor_shift_attention, tensors, tau, mask, causal, dtype, DEVICE,
                      mode=mode)  # fmt: skip
    assert out.dtype == dtype
    _check_spec_rule((out, *grads[:3]), (low, *g_low[:3]), (exact, *g_exact[:3]))


def _check_spec_rule(got, reference, exact) -> None:
    """SPEC §8 on (output, gradients of q, k, v): the error against float64 at most 2x (the
    output) and 3x (the gradients) the plain reference's own in the same dtype, plus FLOOR,
    and under RMS_BOUND."""
    for i, (name, a, r, e) in enumerate(zip(("out", "q", "k", "v"), got, reference, exact,
                                            strict=True)):  # fmt: skip
        assert torch.isfinite(a).all(), name
        err, err_ref = rel_error(a.cpu(), e), rel_error(r.cpu(), e)
        assert err <= (3 if i else 2) * err_ref + FLOOR and err < RMS_BOUND, (name, err, err_ref)


@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_long_sequences_stay_finite_and_accurate(causal, dtype):
    # N = 65,536 (dry run: 4,096): the efficient form in low precision against the same
    # form in float64 on the device (the direct reference would need N² memory).
    n, d = size(65536, 512), size(64, 16)
    tensors, tau, mask = _inputs(n, d, d, dtype, masked=True, seed=2)
    exact, _ = _run(taylor_shift_attention, tensors, tau, mask, causal, torch.float64, DEVICE,
                    mode="efficient")  # fmt: skip
    out, grads = _run(taylor_shift_attention, tensors, tau, mask, causal, dtype, DEVICE,
                      mode="efficient")  # fmt: skip
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    assert rel_error(out, exact) < RMS_BOUND


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", ["efficient", "direct"])
def test_gradients_asked_as_a_graph_match_the_float64_reference(mode, causal, float32_kernels):
    # create_graph=True (a gradient penalty) through the kernels: their backward passes
    # recompute the cores' sums in plain ops; the penalty's gradient against float64
    tensors, tau, mask = _inputs(size(200, 9), 16, 16, torch.float32, True)
    assert _kernel_taken(tensors, mask, causal, mode, torch.float32)

    def penalty_grads(fn, dtype, device, **kwargs):
        leaves = [t.to(device, dtype).requires_grad_() for t in (*tensors, tau)]
        m = mask.to(device)
        out = fn(*leaves[:3], m, causal, temperature=leaves[3], **kwargs)
        grads = torch.autograd.grad(out.square().sum(), leaves, create_graph=True)
        return torch.autograd.grad(sum(g.square().sum() for g in grads), leaves)

    want = penalty_grads(naive_taylor_shift_attention, torch.float64, "cpu")
    got = penalty_grads(taylor_shift_attention, torch.float32, DEVICE, mode=mode)
    for name, a, e in zip(("q", "k", "v", "tau"), got, want, strict=True):
        assert_rel_close(a.cpu(), e, 1e-3, f"penalty's grad {name}", atol=1e-5)


def test_decoding_state_on_the_device_equals_the_parallel_form():
    g = torch.Generator().manual_seed(4)
    b, h, n, d = 2, 2, size(300, 20), size(64, 8)
    q, k, v = (torch.randn(b, h, n, d, generator=g).to(DEVICE) for _ in range(3))
    prompt = n // 2
    out, state = taylor_shift_decode(q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt])
    outs = [out]
    for t in range(prompt, n):
        y, state = taylor_shift_decode(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1],
                                       state, inplace=True)  # fmt: skip
        outs.append(y)
    parallel = taylor_shift_attention(q, k, v, is_causal=True, mode="direct")
    assert rel_error(torch.cat(outs, dim=2), parallel) < 1e-5


@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=str)
def test_causal_state_in_and_out_error_within_the_reference_error(dtype, monkeypatch):
    # a segment continuing the state of the keys before it and returning its own (the Triton
    # causal form) against the plain reference over the whole sequence, whose last rows it
    # is: outputs and the gradients of the segment's q, k, v by SPEC §8, the state after
    # against the float64 PyTorch form's over every key
    calls = []
    real = fused.load_kernel
    monkeypatch.setattr(fused, "load_kernel", lambda kernel: calls.append(kernel) or real(kernel))
    g = torch.Generator().manual_seed(8)
    b, h, before, n, d = 2, 2, size(700, 9), size(1000, 20), size(64, 16)
    whole = [torch.randn(b, h, before + n, d, generator=g, dtype=torch.float64) for _ in "qkv"]
    tau = 0.5 + torch.rand(1, h, 1, 1, generator=g, dtype=torch.float64)
    zeros = torch.zeros(b, h, before, d, dtype=torch.float64)
    _, prefix = causal_efficient_taylor_shift(
        zeros, whole[1][:, :, :before], whole[2][:, :, :before], None, 1.0, None, True,
        output_final_state=True,
    )  # fmt: skip
    _, full = causal_efficient_taylor_shift(
        torch.cat([zeros, whole[0][:, :, before:]], 2), *whole[1:], None, 1.0, None, True,
        output_final_state=True,
    )  # fmt: skip
    grad = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)

    def reference(dt, device):
        leaves = [t.to(device, dt).requires_grad_() for t in whole]
        out = naive_taylor_shift_attention(*leaves, is_causal=True, temperature=tau.to(device, dt))
        out = out[:, :, before:]
        grads = torch.autograd.grad(out, leaves, grad.to(device, dt))
        return out, *(x[:, :, before:] for x in grads)

    exact, low = reference(torch.float64, "cpu"), reference(dtype, DEVICE)
    block = [t[:, :, before:].to(DEVICE, dtype).requires_grad_() for t in whole]
    start = TaylorShiftState(prefix.sums.to(DEVICE, torch.float32), prefix.count.float().to(DEVICE))
    out, after = taylor_shift_attention(
        *block, None, True, temperature=tau.to(DEVICE, torch.float32), mode="efficient",
        initial_state=start, output_final_state=True,
    )  # fmt: skip
    assert calls == ["triton efficient (causal)"] and out.dtype == dtype
    grads = torch.autograd.grad(out, block, grad.to(DEVICE, dtype))
    _check_spec_rule((out, *grads), low, exact)
    assert rel_error(after.sums.cpu(), full.sums) < RMS_BOUND
    assert torch.equal(after.count.cpu(), full.count.float())


@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=str)
def test_causal_kernels_in_pieces_error_within_the_reference_error(dtype, monkeypatch):
    # the state budget shrunk to three chunks: the causal kernels sweep the call in pieces,
    # each from the last one's state (fused.causal_piece_chunks); SPEC §8 as unpieced calls,
    # a fully padded batch entry included
    n, d = size(1000, 20), size(64, 16)
    tensors, tau, mask = _inputs(n, d, d, dtype, masked=True, seed=10)
    monkeypatch.setattr(fused, "CAUSAL_STATE_BUDGET", 3 * fused.chunk_state_bytes(4, d, d))
    from taylorshift.ops.triton import efficient_causal

    chunk = size(efficient_causal.DEFAULT_CHUNK, 4)
    monkeypatch.setattr(efficient_causal, "DEFAULT_CHUNK", chunk)  # (dry run: 5 chunks)
    assert fused.causal_piece_chunks(4, n, n, d, d, chunk) == 3
    exact, g_exact = _run(naive_taylor_shift_attention, tensors, tau, mask, True,
                          torch.float64, "cpu")  # fmt: skip
    low, g_low = _run(naive_taylor_shift_attention, tensors, tau, mask, True, dtype, DEVICE)
    out, grads = _run(taylor_shift_attention, tensors, tau, mask, True, dtype, DEVICE,
                      mode="efficient")  # fmt: skip
    _check_spec_rule((out, *grads[:3]), (low, *g_low[:3]), (exact, *g_exact[:3]))


def test_a_compiled_model_trains_like_the_eager_one():
    from taylorshift.models import create_model

    torch.manual_seed(0)
    model = create_model("lm-tiny", attn_kernel="taylorshift").to(DEVICE)
    tokens = torch.randint(0, 200, (2, size(512, 24)), device=DEVICE)
    backend = "inductor" if CUDA else "aot_eager"
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    grads = []
    for net in (model, compiled):
        model.zero_grad()
        net(tokens).float().square().mean().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    for a, b in zip(*grads, strict=True):
        assert rel_error(a, b) < 1e-3


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", ["efficient", "direct"])
def test_grouped_query_attention_matches_the_float64_reference(mode, causal, float32_kernels):
    # enable_gqa=True: non-causal calls reach the kernels as a cross-attention of the
    # stacked G·Nq queries on Hkv heads, causal ones with key and value repeated
    g = torch.Generator().manual_seed(6)
    n, d = size(1000, 9), size(64, 16)
    q = torch.randn(2, 4, n, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 1, n, d, generator=g, dtype=torch.float64) for _ in "kv")
    mask = key_padding(2, n, seed=6)
    leaves = [t.to(DEVICE, torch.float32).requires_grad_() for t in (q, k, v)]
    out = taylor_shift_attention(*leaves, mask.to(DEVICE), causal, mode=mode, enable_gqa=True)
    exact = [t.clone().requires_grad_() for t in (q, k, v)]
    kr, vr = (t.repeat_interleave(4, dim=1) for t in exact[1:])
    want = naive_taylor_shift_attention(exact[0], kr, vr, mask, causal)
    assert_rel_close(out.cpu(), want, 1e-4, "output", atol=1e-6)
    grad = torch.randn(want.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(out, leaves, grad.to(DEVICE, torch.float32))
    for name, a, e in zip("qkv", got, torch.autograd.grad(want, exact, grad), strict=True):
        assert_rel_close(a.cpu(), e, 1e-3, f"grad {name}", atol=1e-5)


def test_auto_exports_with_dynamic_lengths_on_the_device(float32_kernels):
    # torch.export in mode="auto": both forms' kernels in one program (a torch.cond), each
    # length run on the form eager auto picks
    class Op(torch.nn.Module):
        def forward(self, q, k, v):
            return taylor_shift_attention(q, k, v, is_causal=True)

    g = torch.Generator().manual_seed(7)

    def inputs(n):
        return [torch.randn(2, 2, n, 16, generator=g).to(DEVICE) for _ in "qkv"]

    sizes = {2: torch.export.Dim("length", max=1 << 17)}
    program = torch.export.export(Op(), tuple(inputs(size(64, 8))), dynamic_shapes=[sizes] * 3)
    assert any(node.target is torch.ops.higher_order.cond for node in program.graph.nodes)
    for n in (size(64, 5), size(20000, 40)):
        q, k, v = inputs(n)
        # against the eager op on the device (the forms meet float64 in the tests above; a
        # float64 reference at N = 20,000 would hold 4 × N² weights on the host)
        want = taylor_shift_attention(q, k, v, is_causal=True)
        assert_rel_close(program.module()(q, k, v), want, 1e-5, f"N={n}", atol=1e-7)
