"""Scratch buffers of the efficient forms: reused, never shared between threads, and never
visible in a result (a later call must not change an earlier call's output or state)."""

from __future__ import annotations

import threading

import pytest
import torch

from taylorshift import taylor_shift_attention
from taylorshift.ops.taylor_shift import clear_workspace
from taylorshift.ops.taylor_shift.state import TaylorShiftState
from taylorshift.ops.taylor_shift.workspace import SCRATCH_MIN_ELEMENTS, scratch


def test_scratch_reuses_and_grows_one_buffer_per_slot():
    clear_workspace()
    cpu, big = torch.device("cpu"), SCRATCH_MIN_ELEMENTS
    a = scratch("test-slot", (4, big // 4), torch.float32, cpu)
    b = scratch("test-slot", (2, big // 2), torch.float32, cpu)
    assert b.data_ptr() == a.data_ptr()  # the same memory, no new allocation
    other = scratch("test-other", (4, big // 4), torch.float32, cpu)
    assert other.data_ptr() != a.data_ptr()
    wider = scratch("test-slot", (2, big), torch.float32, cpu)
    assert wider.shape == (2, big) and wider.is_contiguous()
    doubles = scratch("test-slot", (4, big // 4), torch.float64, cpu)
    assert doubles.dtype == torch.float64 and doubles.data_ptr() != wider.data_ptr()
    clear_workspace()
    assert scratch("test-slot", (2, big), torch.float32, cpu).data_ptr() != wider.data_ptr()


def test_scratch_declines_small_tensors_and_other_devices():
    cpu, meta, big = torch.device("cpu"), torch.device("meta"), SCRATCH_MIN_ELEMENTS
    assert scratch("test-slot", (big - 1,), torch.float32, cpu) is None  # fresh is better
    assert scratch("test-slot", (big,), torch.float32, meta) is None  # not the CPU
    assert scratch("test-slot", (big,), torch.float32, cpu) is not None


def test_threads_get_their_own_buffers():
    pointers = {}

    def take(name):
        shape = (SCRATCH_MIN_ELEMENTS,)
        buffer = scratch("test-thread", shape, torch.float32, torch.device("cpu"))
        pointers[name] = buffer.data_ptr()

    take("main")
    worker = threading.Thread(target=take, args=("worker",))
    worker.start()
    worker.join()
    assert pointers["main"] != pointers["worker"]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_later_calls_do_not_change_earlier_results(causal):
    gen = torch.Generator().manual_seed(0)
    # (B·H, C, D) = (8, 256 or 600, 561) features: large enough for the scratch buffers
    q, k, v = (torch.randn(2, 4, 600, 32, generator=gen, requires_grad=True) for _ in range(3))
    y = taylor_shift_attention(q, k, v, is_causal=causal, mode="efficient")
    y.backward(torch.ones_like(y))
    first = [t.detach().clone() for t in (y, q.grad, k.grad, v.grad)]
    # other shapes and dtypes through the same buffers, then the first call again
    others = [(1000, 32, torch.float32), (700, 24, torch.float64), (3000, 16, torch.float32)]
    for n, d, dtype in others:
        x = torch.randn(2, 4, n, d, dtype=dtype, requires_grad=True)
        taylor_shift_attention(x, x, x, is_causal=causal, mode="efficient").sum().backward()
    assert torch.equal(first[0], y)  # the output is not a view of a scratch buffer
    for p in (q, k, v):
        p.grad = None
    again = taylor_shift_attention(q, k, v, is_causal=causal, mode="efficient")
    again.backward(torch.ones_like(again))
    for before, now in zip(first, (again, q.grad, k.grad, v.grad), strict=True):
        assert torch.equal(before, now)


def test_causal_form_leaves_the_initial_state_alone():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 600, 8, generator=gen, requires_grad=True) for _ in range(3))
    _, state = taylor_shift_attention(
        q[:, :, :300],
        k[:, :, :300],
        v[:, :, :300],
        is_causal=True,
        mode="efficient",
        output_final_state=True,
    )
    sums = state.sums.detach().clone().requires_grad_()  # (a leaf: the state has a graph)
    before = sums.detach().clone()
    initial = TaylorShiftState(sums, state.count)
    y = taylor_shift_attention(
        q[:, :, 300:],
        k[:, :, 300:],
        v[:, :, 300:],
        is_causal=True,
        mode="efficient",
        initial_state=initial,
    )
    y.sum().backward()
    assert torch.equal(sums.detach(), before)
    assert sums.grad is not None and sums.grad.abs().sum() > 0


def test_efficient_form_runs_in_and_out_of_inference_mode():
    clear_workspace()
    x = torch.randn(1, 8, 600, 32)
    with torch.inference_mode():  # the buffers are created here first
        inside = taylor_shift_attention(x, x, x, mode="efficient")
    outside = taylor_shift_attention(x, x, x, mode="efficient")
    assert torch.equal(inside, outside)
