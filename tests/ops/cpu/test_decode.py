"""The decoding step in the CPU kernel (``ts_decode_step``) against the parallel causal
reference and the PyTorch step.

Prompts prefilled, then tokens one at a time in float32 (and float16 inputs): every row
against the float64 reference of the same real tokens, the state against the PyTorch
step's; padded tokens (a padded first token gives a zero row, NaN content never reaches the
state), awkward head dims, tensor and float temperatures, plain scores; the step bitwise the
same for 1 and 4 threads; routing (which steps take the kernel, which stay on PyTorch); the
custom op under ``torch.compile(fullgraph=True)`` and ``opcheck``.
"""

from __future__ import annotations

import pytest
import torch

from taylorshift import TaylorShiftState, naive_taylor_shift_attention, taylor_shift_decode
from taylorshift.ops.cpu import build
from taylorshift.ops.cpu import decode as cpu_decode
from taylorshift.ops.taylor_shift.decode import decode_token
from tests.helpers import assert_rel_close

RTOL = 2e-5  # float32 sums over a few hundred features and a few dozen tokens


def _qkv(b, h, n, d, dv, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, x, generator=g).to(dtype) for x in (d, d, dv)]


@pytest.fixture
def kernel_calls(monkeypatch) -> list:
    """One entry per step that ran in the kernel."""
    calls = []
    real = cpu_decode.decode_step

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(cpu_decode, "decode_step", spy)
    return calls


def _steps(q, k, v, n_prompt, mask=None, **kwargs):
    """Prefill ``n_prompt`` tokens, then step one token at a time; all outputs, the state."""
    out, state = taylor_shift_decode(q[:, :, :n_prompt], k[:, :, :n_prompt],
                                     v[:, :, :n_prompt], None, mask, **kwargs)  # fmt: skip
    outs = [out]
    for t in range(n_prompt, q.shape[2]):
        y, state = taylor_shift_decode(*(x[:, :, t : t + 1] for x in (q, k, v)), state,
                                       **kwargs)  # fmt: skip
        outs.append(y)
    return torch.cat(outs, dim=2), state


@pytest.mark.parametrize(
    ("b", "h", "d", "dv", "normalize", "tau"),
    [
        (1, 1, 1, 1, True, "float"),
        (2, 3, 5, 4, True, "tensor"),
        (1, 2, 16, 33, True, "float"),
        (2, 2, 17, 8, False, None),
        (1, 8, 32, 32, True, "tensor"),
        (1, 1, 64, 7, True, "float"),
        (2, 1, 3, 23, True, "float"),
        (1, 2, 8, 40, True, "tensor"),
        (1, 1, 4, 128, False, None),
    ],
    ids=lambda x: str(x),
)
def test_steps_match_reference_and_pytorch_step(b, h, d, dv, normalize, tau, kernel_calls,
                                               monkeypatch):  # fmt: skip
    q, k, v = _qkv(b, h, 12, d, dv)
    temperature = 1.0
    if tau == "float":
        temperature = 1.7
    elif tau == "tensor":
        temperature = torch.linspace(0.6, 1.8, h).view(1, h, 1, 1)
    kwargs = dict(temperature=temperature, normalize=normalize)
    got, state = _steps(q, k, v, 3, **kwargs)
    assert len(kernel_calls) == 9  # the prompt runs the chunked sweep, the tokens the kernel
    t64 = temperature.double() if isinstance(temperature, torch.Tensor) else temperature
    ref = naive_taylor_shift_attention(*(x.double() for x in (q, k, v)), None, True,
                                       temperature=t64, normalize=normalize)  # fmt: skip
    assert got.dtype == torch.float32
    assert_rel_close(got, ref, RTOL, "outputs", atol=1e-7)
    monkeypatch.setenv(build.ENV, "off")  # the PyTorch step, on the same inputs
    want, torch_state = _steps(q, k, v, 3, **kwargs)
    assert len(kernel_calls) == 9
    assert_rel_close(got, want, RTOL, "against the PyTorch step", atol=1e-7)
    assert_rel_close(state.sums, torch_state.sums, RTOL, "state", atol=1e-7)
    assert torch.equal(state.count, torch_state.count)


def test_padded_tokens_join_no_sum_and_a_padded_first_token_gives_zeros(kernel_calls):
    b, h, d, dv = 3, 2, 6, 5
    q, k, v = _qkv(b, h, 4, d, dv, seed=1)
    # token 0 padded in item 0 (its state is empty: its row is 0), token 2 in item 1
    mask = torch.tensor([[False, True, True, True], [True, True, False, True], [True] * 4])
    k_bad = torch.where(mask[:, None, :, None], k, float("nan"))
    v_bad = torch.where(mask[:, None, :, None], v, float("nan"))
    state, outs = None, []
    for t in range(4):
        new = (x[:, :, t : t + 1] for x in (q, k_bad, v_bad))
        y, state = taylor_shift_decode(*new, state, mask[:, t : t + 1])
        outs.append(y)
    got = torch.cat(outs, dim=2)
    assert len(kernel_calls) == 4
    assert torch.isfinite(state.sums).all()
    assert torch.equal(got[0, :, 0], torch.zeros(h, dv))
    assert state.count[:, 0].tolist() == [3.0, 3.0, 4.0]
    for i in range(b):
        real = mask[i].nonzero().flatten()
        ref = naive_taylor_shift_attention(*(x[i : i + 1, :, real].double() for x in (q, k, v)),
                                           None, True)  # fmt: skip
        assert_rel_close(got[i : i + 1, :, real], ref, RTOL, f"item {i}", atol=1e-7)


def test_sixteen_bit_inputs_keep_a_float32_state(kernel_calls):
    q, k, v = _qkv(2, 2, 10, 16, 16, dtype=torch.float16, seed=2)
    got, state = _steps(q, k, v, 2)
    assert got.dtype == torch.float16 and state.sums.dtype == torch.float32
    assert len(kernel_calls) == 8
    ref = naive_taylor_shift_attention(*(x.double() for x in (q, k, v)), None, True)
    # the float16 inputs are exact in float32: only the output's rounding is left
    assert_rel_close(got, ref, 1e-3, "float16 outputs", atol=1e-4)


def test_steps_are_bitwise_the_same_for_any_thread_count():
    q, k, v = _qkv(2, 4, 6, 16, 16, seed=3)
    _, state = taylor_shift_decode(q[:, :, :5], k[:, :, :5], v[:, :, :5])
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 4):
            torch.set_num_threads(threads)
            copy = TaylorShiftState(state.sums.clone(), state.count.clone())
            out = decode_token(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], copy)
            results.append((out, copy.sums))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("tau", ["float", "tensor"])
def test_float64_default_dtype_changes_nothing(tau, kernel_calls):
    # the step's output buffer and filled factors stay float32 (the kernel writes float32)
    q, k, v = _qkv(1, 2, 6, 16, 8, seed=4)
    temperature = 1.3 if tau == "float" else torch.tensor([0.8, 1.3]).view(1, 2, 1, 1)
    _, state = taylor_shift_decode(q[:, :, :5], k[:, :, :5], v[:, :, :5])
    before = torch.get_default_dtype()
    results = []
    try:
        for default in (torch.float32, torch.float64):
            torch.set_default_dtype(default)
            copy = TaylorShiftState(state.sums.clone(), state.count.clone())
            out = decode_token(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], copy, temperature)
            results.append((out, copy.sums))
    finally:
        torch.set_default_dtype(before)
    assert len(kernel_calls) == 2
    assert results[0][0].dtype == torch.float32 and torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_other_steps_stay_on_pytorch(kernel_calls, monkeypatch):
    # float64 states, head dims over 128 and a switched-off build run the PyTorch step
    q, k, v = (x.double() for x in _qkv(1, 1, 2, 4, 4))
    _, state = taylor_shift_decode(q[:, :, :1], k[:, :, :1], v[:, :, :1])
    taylor_shift_decode(q[:, :, 1:], k[:, :, 1:], v[:, :, 1:], state)
    taylor_shift_decode(*_qkv(1, 1, 1, 130, 4))
    monkeypatch.setenv(build.ENV, "off")
    taylor_shift_decode(*_qkv(1, 1, 1, 4, 4))
    assert kernel_calls == []
    monkeypatch.delenv(build.ENV)
    taylor_shift_decode(*_qkv(1, 1, 1, 4, 4))
    assert len(kernel_calls) == 1


@pytest.mark.parametrize(
    ("tau", "dv"), [("float", 5), ("tensor", 5), ("tensor", 20), ("float", 65)]
)
def test_grouped_steps_match_reference_and_pytorch_step(tau, dv, kernel_calls, monkeypatch):
    # enable_gqa: 6 query heads read 2 key/value states (3 per group) in one pass; a padded
    # token in the middle of item 1; against the float64 reference with repeated heads and
    # the PyTorch step on the same inputs
    b, h, kv, d, n = 2, 6, 2, 9, 8
    g = torch.Generator().manual_seed(8)
    q = torch.randn(b, h, n, d, generator=g)
    k, v = (torch.randn(b, kv, n, x, generator=g) for x in (d, dv))
    temperature = 1.3 if tau == "float" else torch.linspace(0.6, 1.8, h).view(1, h, 1, 1)
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[1, 5] = False

    def steps():
        kw = dict(temperature=temperature, enable_gqa=True)
        out, state = taylor_shift_decode(q[:, :, :3], k[:, :, :3], v[:, :, :3], None,
                                         mask[:, :3], **kw)  # fmt: skip
        outs = [out]
        for t in range(3, n):
            new = (x[:, :, t : t + 1] for x in (q, k, v))
            y, state = taylor_shift_decode(*new, state, mask[:, t : t + 1], **kw)
            outs.append(y)
        return torch.cat(outs, dim=2), state

    got, state = steps()
    assert len(kernel_calls) == n - 3
    assert state.sums.shape[1] == kv and state.count.tolist() == [[8.0, 8.0], [7.0, 7.0]]
    t64 = temperature.double() if isinstance(temperature, torch.Tensor) else temperature
    for i in range(b):
        real = mask[i].nonzero().flatten()
        qi, ki, vi = (x[i : i + 1, :, real].double() for x in (q, k, v))
        ki, vi = (x.repeat_interleave(h // kv, dim=1) for x in (ki, vi))
        ref = naive_taylor_shift_attention(qi, ki, vi, None, True, temperature=t64)
        assert_rel_close(got[i : i + 1, :, real], ref, RTOL, f"item {i}", atol=1e-7)
    monkeypatch.setenv(build.ENV, "off")  # the PyTorch step, on the same inputs
    want, torch_state = steps()
    assert len(kernel_calls) == n - 3
    assert_rel_close(got, want, RTOL, "against the PyTorch step", atol=1e-7)
    assert_rel_close(state.sums, torch_state.sums, RTOL, "state", atol=1e-7)


def test_compiled_step_matches_eager():
    q, k, v = _qkv(2, 2, 5, 8, 6, seed=5)
    tau = torch.tensor([0.8, 1.3]).view(1, 2, 1, 1)
    _, state = taylor_shift_decode(q[:, :, :4], k[:, :, :4], v[:, :, :4], temperature=tau)
    eager = TaylorShiftState(state.sums.clone(), state.count.clone())
    want = decode_token(q[:, :, 4:], k[:, :, 4:], v[:, :, 4:], eager, tau)
    torch._dynamo.reset()
    step = torch.compile(decode_token, fullgraph=True, backend="aot_eager")
    got = step(q[:, :, 4:], k[:, :, 4:], v[:, :, 4:], state, tau)
    assert_rel_close(got, want, 1e-6, "compiled output", atol=1e-7)
    assert_rel_close(state.sums, eager.sums, 1e-6, "compiled state", atol=1e-7)
    assert torch.equal(state.count, eager.count)


def test_custom_op_registration_passes_opcheck():
    q, k, v = _qkv(1, 2, 1, 8, 6, seed=6)
    _, state = taylor_shift_decode(*_qkv(1, 2, 3, 8, 6, seed=7))
    op = torch.ops.taylorshift.cpu_decode_step.default
    factors = torch.tensor([0.9, 1.1])
    real = torch.tensor([True, False])
    torch.library.opcheck(op, (q, k, v, state.sums.clone(), state.count.clone(), factors, real,
                               True))  # fmt: skip
    torch.library.opcheck(op, (q, k, v, state.sums.clone(), state.count.clone(), factors, None,
                               False))  # fmt: skip
    # grouped: 4 query heads on the 2 states (factors per query head, the mask per state)
    q4 = torch.randn(1, 4, 1, 8, generator=torch.Generator().manual_seed(8))
    factors4 = torch.tensor([0.9, 1.1, 1.2, 0.7])
    torch.library.opcheck(op, (q4, k, v, state.sums.clone(), state.count.clone(), factors4,
                               real, True))  # fmt: skip
