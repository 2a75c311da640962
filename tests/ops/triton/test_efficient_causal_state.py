"""The Triton causal form with a prefix state in and out (prompt prefill on CUDA, a
sequence in segments, sequence parallelism), against the float64 PyTorch causal form from
the same state and the plain reference over the whole sequence (tests/ops/state_cases.py,
the checks the CPU kernel passes too).

Uneven chunks, Nq != Nk both ways, key padding, head dims of one, two and three feature
tiles (the layout change's mirrored pairs), value columns in two blocks; float16 within
SPEC §8's rule; the layout change both ways; gradients asked as a graph; opcheck; a traced
call (torch.compile, fullgraph); grouped heads (key, value and the state repeated); the
routing of ``taylor_shift_attention``. On the CPU the kernels run under Triton's interpreter
(conftest.py), so shapes are small.
"""

from __future__ import annotations

import pytest
import torch

from taylorshift import TaylorShiftState, naive_taylor_shift_attention, taylor_shift_attention
from taylorshift.ops.taylor_shift import fused
from taylorshift.ops.taylor_shift.features import feature_dim, features, state_weights
from taylorshift.ops.taylor_shift.grouped import repeated_heads
from tests.helpers import assert_rel_close
from tests.ops.state_cases import (
    check_graph_gradients,
    check_segments,
    check_sixteen_bit,
    check_state_in_and_out,
    prefix_state,
    state_problem,
)
from tests.ops.triton.conftest import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

from taylorshift.ops.triton import efficient_causal as triton_causal
from taylorshift.ops.triton.efficient_causal import triton_causal_efficient_taylor_shift

# (B, H, Hkv, N before, Nq, Nk, d, dv, chunk, key padding, temperature, normalize)
CASES = [
    (2, 1, 1, 13, 21, 21, 16, 16, 8, True, "tensor", True),
    (1, 1, 1, 7, 12, 19, 17, 12, 8, False, "float", True),  # keys after the last query
    (1, 1, 1, 5, 11, 7, 33, 5, 8, True, "float", False),  # queries after the last key
    (1, 1, 1, 0, 9, 9, 20, 70, 8, False, "float", True),  # no prefix; dv in two blocks
]
IDS = [f"B{c[0]}-H{c[1]}-before{c[3]}-Nq{c[4]}-Nk{c[5]}-d{c[6]}-dv{c[7]}" for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_state_in_and_out_match_the_float64_torch_form(case):
    check_state_in_and_out(triton_causal_efficient_taylor_shift, *case)


def test_grouped_heads_repeat_key_value_and_state():
    # enable_gqa with a state (the router's way for the Triton form): the outputs, the
    # state per key/value head and the gradients of the prefix's sums (summed over each
    # group) as the float64 PyTorch form's, which keeps the state per key/value head
    grouped = repeated_heads(triton_causal_efficient_taylor_shift, 2)
    check_state_in_and_out(grouped, 1, 4, 2, 9, 14, 14, 16, 8, 4, True, "tensor", True)


def test_segments_equal_one_sweep_over_the_whole():
    bounds = ((0, 13), (13, 14), (14, 30))
    check_segments(triton_causal_efficient_taylor_shift, 1, 2, 30, 16, 8, bounds, True, 8)


def test_float16_error_within_reference_error():
    check_sixteen_bit(triton_causal_efficient_taylor_shift, torch.float16, chunk=8)


@pytest.mark.parametrize("d", [5, 16, 33])
def test_layout_change_both_ways(d):
    """``public_sums`` undoes ``kernel_state`` bitwise, and the kernels' layout holds what
    their own state kernel sums: the apply of a state made from the sums gives
    φ(x)ᵀ (c ⊙ sums) for every x, the layout's mirrored pairs and padding included."""
    dv = 3
    sums = torch.randn(2, 3, feature_dim(d), dv + 1)
    state = triton_causal.kernel_state(sums, d)
    assert torch.equal(triton_causal.public_sums(state, 2, 3, d, dv), sums)
    x = torch.randn(6, 7, d)
    lay = triton_causal.layout(d, dv)
    out = torch.empty(6, 7, dv + 1)
    triton_causal._apply_split(x, state, lay, out, 0)
    c = state_weights(d, torch.float32, x.device)
    want = features(x) @ (c * sums.reshape(6, feature_dim(d), dv + 1))
    assert_rel_close(out, want, 1e-5, "readout of the converted state", atol=1e-6)


def test_gradients_asked_as_a_graph():
    check_graph_gradients(triton_causal_efficient_taylor_shift, 16, 4)


def test_custom_op_with_a_state_passes_opcheck():
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 7, 4, generator=g, requires_grad=True) for _ in range(2))
    u = torch.randn(1, 7, 3, generator=g, requires_grad=True)
    size = triton_causal.layout(4, 2).size
    initial = torch.randn(1, size, generator=g).requires_grad_()
    op = torch.ops.taylorshift.triton_causal_forward.default
    torch.library.opcheck(op, (q, k, u, initial, 4, 1, 0, True))  # pieces of one chunk


def test_public_op_routes_state_calls_to_the_kernel(monkeypatch):
    monkeypatch.setenv(fused.TRITON_ENV, "interpret")
    calls = []
    real = fused.load_kernel
    monkeypatch.setattr(fused, "load_kernel", lambda kernel: calls.append(kernel) or real(kernel))
    q, k, v, k0, v0, _, _ = state_problem(1, 2, 2, 6, 24, 24, 16, 16, False, "float")
    start = prefix_state(k0, v0, 2, True)
    q, k, v = (x.to(torch.float16) for x in (q, k, v))
    sums = start.sums.float().requires_grad_()
    out, state = taylor_shift_attention(
        q[:, :, :10], k[:, :, :10], v[:, :, :10], is_causal=True,
        initial_state=TaylorShiftState(sums, start.count.float()), output_final_state=True,
    )  # fmt: skip
    rest = taylor_shift_attention(
        q[:, :, 10:], k[:, :, 10:], v[:, :, 10:], is_causal=True, initial_state=state
    )
    assert calls == ["triton efficient (causal)"] * 2
    assert out.requires_grad and state.count[0, 0] == 16
    whole = naive_taylor_shift_attention(
        torch.cat([torch.zeros_like(k0), q.double()], 2), torch.cat([k0, k.double()], 2),
        torch.cat([v0, v.double()], 2), is_causal=True,
    )[:, :, 6:]  # fmt: skip
    assert_rel_close(torch.cat([out, rest], 2).double(), whole, 2e-3, "segments", atol=1e-4)
    # key and value with fewer heads than the query: the Triton form with them repeated,
    # the state per key/value head as the PyTorch form keeps it
    calls.clear()
    q4 = torch.cat([q, q.flip(2)], 1)
    out, state = taylor_shift_attention(
        q4, k, v, is_causal=True, output_final_state=True, enable_gqa=True
    )
    assert calls == ["triton efficient (causal)"]
    monkeypatch.setenv(fused.TRITON_ENV, "off")
    want, want_state = taylor_shift_attention(
        q4, k, v, is_causal=True, output_final_state=True, enable_gqa=True
    )
    assert_rel_close(out.double(), want.double(), 2e-3, "grouped", atol=1e-4)
    assert state.sums.shape == want_state.sums.shape == (1, 2, feature_dim(16), 17)
    assert_rel_close(state.sums, want_state.sums, 1e-3, "grouped state", atol=1e-3)
    assert torch.equal(state.count, want_state.count)


def test_torch_compile_traces_a_state_call_whole():
    # fullgraph: the layout change's index tables built in the graph, the core's custom
    # op with its initial state; outputs, the state after and every gradient (of a loss on
    # both) as eagerly
    q, k, v, k0, v0, mask, tau = state_problem(1, 2, 2, 5, 13, 13, 16, 8, True, "tensor")
    start = prefix_state(k0, v0, 2, True)
    leaves = [x.float().requires_grad_() for x in (q, k, v, tau, start.sums)]

    def call(q, k, v, tau, sums):
        first = TaylorShiftState.from_sums(sums)
        return triton_causal_efficient_taylor_shift(
            q, k, v, mask, tau, None, True, 8, initial_state=first, output_final_state=True
        )

    (y, after), (y_c, after_c) = (
        call(*leaves),
        torch.compile(call, backend="aot_eager", fullgraph=True)(*leaves),
    )
    assert_rel_close(y_c, y, 1e-6, "output", atol=1e-7)
    assert_rel_close(after_c.sums, after.sums, 1e-6, "state", atol=1e-7)
    g, r = torch.randn_like(y), torch.randn_like(after.sums)  # (the state is differentiable)
    got = torch.autograd.grad((y_c, after_c.sums), leaves, (g, r))
    want = torch.autograd.grad((y, after.sums), leaves, (g, r))
    for name, a, e in zip(["q", "k", "v", "tau", "sums"], got, want, strict=True):
        assert_rel_close(a, e, 1e-5, f"gradient of {name}", atol=1e-6)


@pytest.mark.parametrize("piece", [1, 2])
def test_long_calls_sweep_pieces_within_the_budget(piece, monkeypatch):
    """Where all chunk states would exceed the budget, the form sweeps pieces of as many
    chunks as fit, each from the last one's state: no launch holds more chunks than that,
    and outputs, the state after and every gradient stay those of the float64 PyTorch form,
    with a state in and without, and (pieces of one chunk) with pieces of keys but no query
    (keys after the last query) or of queries but no key."""
    monkeypatch.setattr(fused, "CAUSAL_STATE_BUDGET", piece * fused.chunk_state_bytes(2, 16, 16))
    chunks = []
    real = triton_causal._state

    def spy(x, u, r, r_mode, lay, dot=0):
        chunks.append(x.shape[0] // 2)  # (B·H · chunks, C, d), B·H = 2
        return real(x, u, r, r_mode, lay, dot)

    monkeypatch.setattr(triton_causal, "_state", spy)
    check_state_in_and_out(
        triton_causal_efficient_taylor_shift, 2, 1, 1, 13, 14, 14, 16, 16, 4, True, "tensor", True
    )
    check_state_in_and_out(
        triton_causal_efficient_taylor_shift, 2, 1, 1, 0, 14, 14, 16, 16, 4, False, "float", True
    )
    # pieces of keys but no query, of queries but no key: with one chunk a piece, where
    # there are most pieces (the interpreter takes seconds a call; the suite's budget)
    for nq, nk in ((3, 14), (14, 6)) if piece == 1 else ():
        check_state_in_and_out(
            triton_causal_efficient_taylor_shift, 2, 1, 1, 5, nq, nk, 16, 16, 4, True,
            "float", True,
        )  # fmt: skip
    assert max(chunks) == piece  # (14 tokens: 4 chunks of 4, the last one short)
