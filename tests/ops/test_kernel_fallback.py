"""A fused kernel that fails to compile or launch never breaks the call: one warning naming
the kernel, the shape class and the reason, the PyTorch form's answer, and that shape class
stays on PyTorch afterwards. Failures are made on purpose by replacing the kernel."""

from __future__ import annotations

import logging
import types

import pytest
import torch

from taylorshift import naive_taylor_shift_attention, taylor_shift_attention
from taylorshift.ops.taylor_shift import fused
from tests.helpers import assert_rel_close


class OutOfResources(RuntimeError):
    """Stands in for triton.runtime.errors.OutOfResources."""


@pytest.fixture
def failing_kernel(monkeypatch):
    """Route CPU calls to a 'kernel' that raises like a launch out of shared memory."""
    monkeypatch.setattr(fused, "triton_importable", lambda: True)
    monkeypatch.setenv(fused.TRITON_ENV, "interpret")
    monkeypatch.setattr(fused, "FAILED", {})
    monkeypatch.setattr(fused, "_PROBED", set())
    calls = []

    def kernel(*args, **kwargs):
        calls.append(args[0].shape)
        raise OutOfResources(
            "out of resource: shared memory, Required: 232448, Hardware limit: 232448"
        )

    monkeypatch.setattr(fused, "load_kernel", lambda name: kernel)
    return calls


@pytest.mark.parametrize(
    "mode, causal", [("efficient", False), ("efficient", True), ("direct", True)]
)
def test_a_failing_kernel_falls_back_once_with_one_warning(failing_kernel, caplog, mode, causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 4, generator=g) for _ in range(3))
    with caplog.at_level(logging.WARNING, logger="taylorshift.dispatch"):
        first = taylor_shift_attention(q, k, v, is_causal=causal, mode=mode)
        second = taylor_shift_attention(q, k, v, is_causal=causal, mode=mode)
    want = naive_taylor_shift_attention(q.double(), k.double(), v.double(), is_causal=causal)
    assert_rel_close(first, want, 1e-5)
    assert torch.equal(first, second)
    assert len(failing_kernel) == 1  # tried once, then the shape class stays on PyTorch
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "Triton kernel failed (triton" in message and "d=4, dv=4" in message
    assert ("causal" if causal else "non-causal") in message
    assert "OutOfResources: out of resource: shared memory" in message
    # another shape class tries the kernel again
    taylor_shift_attention(q[..., :2], k[..., :2], v[..., :2], is_causal=causal, mode=mode)
    assert len(failing_kernel) == 2


def _inference_tensors(*shape: int, count: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        return [torch.randn(*shape, generator=g) for _ in range(count)]


@pytest.mark.parametrize(
    "mode, causal", [("efficient", False), ("efficient", True), ("direct", True)]
)
def test_a_call_that_fails_in_the_pytorch_form_too_keeps_the_kernel(
    failing_kernel, caplog, mode, causal
):
    # Inference-mode tensors cannot be saved for autograd: the kernel fails, and so does the
    # PyTorch form. That is the caller's mistake; it once disabled the shape class for the
    # rest of the process, with a warning that blamed the kernel.
    k, v = _inference_tensors(2, 3, 9, 4, count=2)
    q = torch.randn(2, 3, 9, 4, requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="taylorshift.dispatch"):
        with pytest.raises(RuntimeError, match="Inference tensors cannot be saved"):
            taylor_shift_attention(q, k, v, is_causal=causal, mode=mode)
        assert fused.FAILED == {} and not caplog.records
        assert len(failing_kernel) == 1  # (the kernel was tried)
        # positive control: a call of the same shape class that the PyTorch form can
        # compute disables the failing kernel, as a kernel failure should
        taylor_shift_attention(q, k.clone(), v.clone(), is_causal=causal, mode=mode)
    assert len(fused.FAILED) == 1 and len(caplog.records) == 1


@pytest.mark.parametrize(
    "mode, causal, kv_heads",
    [("efficient", False, 4), ("efficient", True, 4), ("direct", True, 4), ("efficient", True, 2)],
    ids=["efficient", "efficient-causal", "direct-causal", "grouped-causal"],
)
def test_inference_tensors_under_autograd_leave_the_cpu_kernels_on(mode, causal, kv_heads):
    # The same mistake with the real CPU kernels (the grouped causal call takes its own
    # path to the kernel): torch's error, and every kernel stays on.
    fused.FAILED.clear()
    q = torch.randn(1, 4, 40, 8, requires_grad=True)
    k, v = _inference_tensors(1, kv_heads, 40, 8, count=2)
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved"):
        taylor_shift_attention(q, k, v, is_causal=causal, mode=mode, enable_gqa=kv_heads != 4)
    assert fused.FAILED == {}


def test_a_failing_grouped_causal_kernel_falls_back_to_the_pytorch_form(monkeypatch, caplog):
    # Grouped causal calls reach the CPU causal kernel by a path of their own (the kernel
    # keeps its state per key/value head); where it fails, the PyTorch causal form computes
    # the same call, with the key/value heads as they are.
    monkeypatch.setattr(fused, "FAILED", {})
    calls = []

    def kernel(*args, **kwargs):
        calls.append(args[1].shape)
        raise RuntimeError("the kernel could not launch")

    monkeypatch.setattr(fused, "load_kernel", lambda name: kernel)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 30, 8, generator=g)
    k, v = (torch.randn(2, 2, 30, 8, generator=g) for _ in range(2))
    pad = torch.ones(2, 1, 1, 30, dtype=torch.bool)
    pad[1, ..., 25:] = False
    with caplog.at_level(logging.WARNING, logger="taylorshift.dispatch"):
        got = taylor_shift_attention(
            q, k, v, pad, is_causal=True, mode="efficient", enable_gqa=True
        )
    want = naive_taylor_shift_attention(
        q.double(), *(t.double().repeat_interleave(2, 1) for t in (k, v)), pad, is_causal=True
    )
    assert_rel_close(got, want, 1e-5)
    assert calls == [(2, 2, 30, 8)]  # the grouped kernel was tried, once
    assert len(fused.FAILED) == 1 and len(caplog.records) == 1
    assert "cpu efficient (causal)" in caplog.records[0].getMessage()


@pytest.mark.parametrize(
    "error",
    [torch.OutOfMemoryError("CUDA out of memory"), MemoryError("the CPU kernels could not")],
    ids=["cuda", "cpu-scratch"],
)
def test_out_of_memory_is_not_a_kernel_failure(monkeypatch, error):
    monkeypatch.setattr(fused, "FAILED", {})

    def oom():
        raise error

    with pytest.raises(type(error)):
        fused.run_guarded(("k",) * 7, oom, lambda: pytest.fail("no fallback for memory"))
    assert fused.FAILED == {}


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize(
    "mode, causal", [("direct", True), ("efficient", False), ("efficient", True)]
)
def test_activation_checkpointing_recomputes_through_the_kernels(
    monkeypatch, caplog, mode, causal, reentrant
):
    # torch.utils.checkpoint runs the forward again in the backward; non-reentrant, it stops
    # that run by raising from its saved-tensor hook once it has what the backward needs.
    # When the op saves the region's last tensors (attention checkpointed alone, as in
    # selective recomputation), that stop once passed for a failing kernel: the PyTorch
    # form ran instead, checkpoint raised an AssertionError, and the kernel was off for the
    # process. (A whole checkpointed transformer layer ends with other saves: it worked.)
    monkeypatch.setattr(fused, "FAILED", {})
    runs = []
    load = fused.load_kernel

    def spied_load(name):
        kernel = load(name)

        def run(*args, **kwargs):
            runs.append(name)
            return kernel(*args, **kwargs)

        return run

    monkeypatch.setattr(fused, "load_kernel", spied_load)
    g = torch.Generator().manual_seed(3)
    inputs = [torch.randn(2, 3, 40, 8, generator=g) for _ in "qkv"]

    def gradients(checkpointed: bool) -> list[torch.Tensor]:
        q, k, v = (t.clone().requires_grad_() for t in inputs)

        def attend(q, k, v):
            return taylor_shift_attention(q, k, v, is_causal=causal, mode=mode)

        if checkpointed:
            out = torch.utils.checkpoint.checkpoint(attend, q, k, v, use_reentrant=reentrant)
        else:
            out = attend(q, k, v)
        out.square().sum().backward()
        return [out, q.grad, k.grad, v.grad]

    with caplog.at_level(logging.WARNING, logger="taylorshift.dispatch"):
        for got, want in zip(gradients(True), gradients(False), strict=True):
            assert torch.equal(got, want)  # the same kernel's answer, bitwise
    assert len(runs) == 3 and runs[0].startswith("cpu")  # forward, its re-run, the plain run
    assert fused.FAILED == {} and not caplog.records


def test_a_backward_kernel_that_fails_is_found_by_the_probe(monkeypatch, caplog):
    # On a GPU the first call under autograd runs forward and backward on a tiny input.
    monkeypatch.setattr(fused, "FAILED", {})
    monkeypatch.setattr(fused, "_PROBED", set())

    class ForwardOnly(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            return q @ k.transpose(-2, -1) @ v

        @staticmethod
        def backward(ctx, grad):
            raise OutOfResources("out of resource: shared memory (backward)")

    def kernel(q, k, v, mask, temperature, scale, normalize):
        return ForwardOnly.apply(q, k, v)

    gpu_like = types.SimpleNamespace(is_cuda=True, device=torch.device("cpu"), dtype=torch.float32)
    key = ("triton efficient (non-causal)", "cuda:0", "float32", 4, 4, False, False)
    with caplog.at_level(logging.WARNING, logger="taylorshift.dispatch"):
        assert fused.probe_backward(key, kernel, "efficient", gpu_like) is False
        assert fused.probe_backward(key, kernel, "efficient", gpu_like) is False  # remembered
    assert "backward" in fused.FAILED[key]
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 1


def test_the_backward_probe_saves_nothing_through_the_callers_hooks(monkeypatch):
    # The GPU probe may run inside a region torch.utils.checkpoint records (its pack hook
    # counts the region's saved tensors); the probe's own saves must not reach that hook.
    monkeypatch.setattr(fused, "FAILED", {})
    monkeypatch.setattr(fused, "_PROBED", set())

    def kernel(q, k, v, mask, temperature, scale, normalize):
        return (q @ k.transpose(-2, -1)).square() @ v  # saves tensors for its backward

    gpu_like = types.SimpleNamespace(is_cuda=True, device=torch.device("cpu"), dtype=torch.float32)
    key = ("triton efficient (non-causal)", "cuda:0", "float32", 4, 4, False, False)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: packed.append(x) or x, lambda x: x):
        q = torch.randn(3, 4, requires_grad=True)
        (q * q).sum()  # positive control: the hook sees the caller's saves
        assert len(packed) == 2
        assert fused.probe_backward(key, kernel, "efficient", gpu_like) is True
    assert len(packed) == 2 and fused.FAILED == {}
