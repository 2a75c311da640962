"""When the public op leaves the PyTorch forms for a fused kernel, and when it must not.

The positive routing (kernels actually called) is tested in tests/ops/triton/, where
Triton runs under its interpreter.
"""

import pytest
import torch

from taylorshift.ops.taylor_shift import fused
from taylorshift.ops.taylor_shift.checks import check_inputs
from tests.helpers import tf32_matmuls


def problem_for(q, k, v, mask=None, causal=False, mode="efficient", order=2):
    return check_inputs(q, k, v, mask, causal, 1.0, None, True, order, mode)


def qkv(n=8, d=4, dtype=torch.float32):
    return (torch.randn(1, 2, n, d, dtype=dtype) for _ in range(3))


@pytest.fixture
def triton_installed(monkeypatch):
    monkeypatch.setattr(fused, "triton_importable", lambda: True)


def test_cpu_tensors_go_to_the_cpu_kernels_not_triton_by_default(triton_installed, monkeypatch):
    from taylorshift.ops.cpu import build
    from taylorshift.ops.cpu.efficient import cpu_efficient_taylor_shift

    monkeypatch.delenv(fused.TRITON_ENV, raising=False)
    monkeypatch.delenv(build.ENV, raising=False)
    q, k, v = qkv()
    form = fused.fused_form(q, problem_for(q, k, v), "efficient", False, 2)
    assert form is (cpu_efficient_taylor_shift if build.is_available() else None)
    monkeypatch.setenv(build.ENV, "off")
    assert fused.fused_form(q, problem_for(q, k, v), "efficient", False, 2) is None


@pytest.mark.parametrize("mode", ["efficient", "direct"])
def test_an_empty_batch_stays_on_pytorch_on_the_cpu(mode, monkeypatch):
    from taylorshift.ops.cpu import build

    monkeypatch.delenv(fused.TRITON_ENV, raising=False)
    monkeypatch.delenv(build.ENV, raising=False)
    q, k, v = (x[:0] for x in qkv())  # B = 0
    assert fused.fused_form(q, problem_for(q, k, v, mode=mode), mode, False, 2) is None
    q, k, v = qkv()  # positive control: one sample is routed (where the kernels build)
    routed = fused.fused_form(q, problem_for(q, k, v, mode=mode), mode, False, 2)
    assert (routed is not None) == build.is_available()


@pytest.mark.parametrize(
    "case",
    ["off", "float64", "order4", "varying-mask", "wide-head", "empty", "empty-batch"],
)
def test_calls_without_a_kernel_stay_on_pytorch(case, triton_installed, monkeypatch):
    monkeypatch.setenv("TAYLORSHIFT_CPU_KERNELS", "off")  # the Triton kernels' conditions
    monkeypatch.setenv(fused.TRITON_ENV, "off" if case == "off" else "interpret")
    dtype = torch.float64 if case == "float64" else torch.float32
    d = fused.MAX_HEAD_DIM + 1 if case == "wide-head" else 4
    n = 0 if case == "empty" else 8
    q, k, v = qkv(n, d, dtype)
    if case == "empty-batch":  # B = 0: the Triton kernels divided by zero (ZeroDivisionError)
        q, k, v = (x[:0] for x in (q, k, v))
    mode, causal, order, mask = "efficient", False, 2, None
    if case == "order4":
        mode, order = "direct", 4
    if case == "varying-mask":
        mode, mask = "direct", torch.rand(1, 1, n, n) > 0.5
    problem = problem_for(q, k, v, mask, causal, mode, order)
    assert fused.fused_form(q, problem, mode, causal, order) is None
    # Positive control: the same call without the case's one difference is routed.
    monkeypatch.setenv(fused.TRITON_ENV, "interpret")
    q, k, v = qkv()
    mode = "direct" if case in ("order4", "varying-mask") else "efficient"
    assert fused.fused_form(q, problem_for(q, k, v, mode=mode), mode, False, 2) is not None


def test_without_triton_nothing_is_routed(monkeypatch):
    monkeypatch.setattr(fused, "triton_importable", lambda: False)
    monkeypatch.setenv(fused.TRITON_ENV, "interpret")
    q, k, v = qkv()
    assert fused.fused_form(q, problem_for(q, k, v), "efficient", False, 2) is None


def test_long_causal_efficient_calls_sweep_pieces_or_stay_on_pytorch(triton_installed, monkeypatch):
    # over the budget: pieces of as many chunks (of the longer length) as fit; calls where
    # not one chunk fits stay on the memory-lean PyTorch form
    per_chunk = fused.chunk_state_bytes(2, 4, 4)
    monkeypatch.setattr(fused, "CAUSAL_STATE_BUDGET", 2 * per_chunk)
    assert fused.causal_piece_chunks(2, 4, 4, 4, 4, chunk=2) == 2  # within: all chunks
    assert fused.causal_piece_chunks(2, 8, 8, 4, 4, chunk=2) == 2  # 4 chunks: pieces of 2
    assert fused.causal_piece_chunks(2, 8, 3, 4, 4, chunk=2) == 2  # Nq 8 > Nk 3: pieces
    assert fused.causal_piece_chunks(2, 3, 4, 4, 4, chunk=2) == 2  # within: all
    # the router: one chunk of 256 tokens here, which fits or does not
    monkeypatch.setenv(fused.TRITON_ENV, "interpret")
    q, k, v = qkv(8, 4)
    problem = problem_for(q, k, v, causal=True)
    assert fused.fused_form(q, problem, "efficient", True, 2) is not None
    monkeypatch.setattr(fused, "CAUSAL_STATE_BUDGET", per_chunk - 1)
    assert fused.causal_piece_chunks(2, 8, 8, 4, 4) is None
    assert fused.fused_form(q, problem, "efficient", True, 2) is None


def test_chunk_state_bytes_count_the_kernels_padding():
    # the states are rows of the kernels' layout: dv = 65 pads to 128 value columns, so
    # its states take about twice those of dv = 64 (a count of d(d+1)/2 · (dv + 2) said 1.02x)
    assert 1.9 < fused.chunk_state_bytes(2, 64, 65) / fused.chunk_state_bytes(2, 64, 64) < 2.1


class _SaysCuda(torch.Tensor):
    """A CPU tensor that answers ``is_cuda`` with True: the router's CUDA-only rules on a
    machine without CUDA (with TAYLORSHIFT_TRITON=interpret, which lets CPU tensors reach
    the Triton kernels)."""

    is_cuda = property(lambda self: True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_efficient_calls_on_cuda_take_the_kernels_only_forward_in_tf32(
    causal, triton_installed, monkeypatch
):
    # benchmarks/gpu_h100/2026-11-28: in exact float32 the kernels were 3.2-5.7x slower than
    # the PyTorch efficient form; with TF32 their forward was faster, their backward slower
    monkeypatch.setenv(fused.TRITON_ENV, "interpret")
    q, k, v = (torch.Tensor._make_subclass(_SaysCuda, t) for t in qkv())
    problem = problem_for(q, k, v, causal=causal)

    def routed(dtype=torch.float32, backward=False, mode="efficient"):
        x = q.to(dtype)
        return fused.fused_form(x, problem, mode, causal, 2, backward=backward) is not None

    with tf32_matmuls(False):
        assert not routed() and not routed(backward=True)
        assert routed(torch.float16) and routed(torch.float16, backward=True)  # 16-bit: kernels
        assert routed(mode="direct", backward=True)  # the direct kernel: not this rule
        # CPU tensors under the interpreter (the suite's kernel tests): the rule is CUDA's only
        x = q.as_subclass(torch.Tensor)
        assert fused.fused_form(x, problem, "efficient", causal, 2, backward=True) is not None
    with tf32_matmuls(True):
        assert routed() and not routed(backward=True)
