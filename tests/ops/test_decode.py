"""Decoding with a constant-size state equals the parallel causal form, token by token.

Every case: a prompt prefilled in one call, then tokens one at a time; each output row is
compared with the row of the parallel causal op (float64) over the same real tokens. A
batch of right-padded prompts of different lengths is checked item by item against each
sequence run alone, and so are padded tokens at decoding steps, whose PyTorch step must
leave them out of the state's sums and count.
"""

from __future__ import annotations

import pytest
import torch

from taylorshift import TaylorShiftState, naive_taylor_shift_attention, taylor_shift_decode
from taylorshift.ops.linear_attention import (
    LinearAttentionState,
    linear_attention_decode,
    naive_linear_attention,
)
from taylorshift.ops.taylor_shift.features import feature_dim
from taylorshift.ops.taylor_shift.fused import cpu_kernels_ready
from tests.helpers import assert_rel_close

B, H, D, DV = 3, 2, 5, 4
RTOL = 1e-10


def _qkv(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, x, generator=g, dtype=torch.float64) for x in (D, D, DV)]


def _prompt_mask(lengths, n):
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]  # (B, n)


def _decode_all(decode, q, k, v, lengths, n_prompt, **kwargs):
    """Prefill the (right-padded) prompts, then step through the rest; all outputs."""
    mask = _prompt_mask(lengths, n_prompt)
    out, state = decode(
        q[:, :, :n_prompt], k[:, :, :n_prompt], v[:, :, :n_prompt], None, mask, **kwargs
    )
    outs = [out]
    for t in range(n_prompt, q.shape[2]):
        y, state = decode(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state,
                          None, **kwargs)  # fmt: skip
        outs.append(y)
    return torch.cat(outs, dim=2), state


def _real_positions(lengths, n_prompt, n):
    """Per batch item: the positions of its real tokens in the decode layout."""
    return [list(range(m)) + list(range(n_prompt, n)) for m in lengths]


@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain-scores"])
@pytest.mark.parametrize(
    ("lengths", "n_prompt", "n"),
    [((4, 4, 4), 4, 9), ((1, 6, 3), 6, 11), ((0, 2, 5), 5, 8), ((7, 7, 7), 7, 7)],
    ids=["equal", "ragged", "empty-prompt", "prefill-only"],
)
def test_taylorshift_decode_equals_parallel(lengths, n_prompt, n, normalize):
    q, k, v = _qkv(n)
    tau = torch.tensor([0.7, 1.4], dtype=torch.float64).view(1, H, 1, 1) if normalize else 1.0
    kwargs = dict(temperature=tau, normalize=normalize, chunk_size=3)
    got, state = _decode_all(taylor_shift_decode, q, k, v, lengths, n_prompt, **kwargs)
    for i, pos in enumerate(_real_positions(lengths, n_prompt, n)):
        idx = torch.tensor(pos, dtype=torch.long)
        qi, ki, vi = (x[i : i + 1, :, idx] for x in (q, k, v))
        ref = naive_taylor_shift_attention(
            qi, ki, vi, None, True, temperature=tau, normalize=normalize
        )
        assert_rel_close(got[i : i + 1, :, idx], ref, RTOL, f"item {i}")
        assert state.count[i].tolist() == [float(len(pos))] * H
    assert state.sums.shape == (B, H, feature_dim(D), DV + 1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain-scores"])
def test_grouped_query_decode_keeps_a_state_per_key_value_head(normalize, dtype):
    # enable_gqa: 4 query heads on 2 key/value heads; ragged prompts prefilled in chunks of
    # 3, then tokens one at a time; each row against the parallel op with key and value
    # repeated to the query heads (SDPA's repeat_interleave convention)
    heads, kv_heads, lengths, n_prompt, n = 4, 2, (1, 6, 3), 6, 11
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, heads, n, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, kv_heads, n, x, generator=g, dtype=torch.float64) for x in (D, DV))
    tau = torch.tensor([0.7, 1.4, 1.1, 2.0], dtype=torch.float64).view(1, heads, 1, 1)
    tau = tau if normalize else 1.0
    kwargs = dict(temperature=tau, normalize=normalize, chunk_size=3, enable_gqa=True)
    if dtype == torch.float32:
        kwargs["temperature"] = tau.float() if normalize else 1.0
    low = [x.to(dtype) for x in (q, k, v)]
    got, state = _decode_all(taylor_shift_decode, *low, lengths, n_prompt, **kwargs)
    assert state.sums.shape == (B, kv_heads, feature_dim(D), DV + 1)
    kr, vr = (x.repeat_interleave(2, dim=1) for x in (k, v))
    for i, pos in enumerate(_real_positions(lengths, n_prompt, n)):
        idx = torch.tensor(pos, dtype=torch.long)
        qi, ki, vi = (x[i : i + 1, :, idx] for x in (q, kr, vr))
        ref = naive_taylor_shift_attention(
            qi, ki, vi, None, True, temperature=tau, normalize=normalize
        )
        rtol = RTOL if dtype == torch.float64 else 1e-5
        assert_rel_close(got[i : i + 1, :, idx], ref, rtol, f"item {i}", atol=1e-7)
        assert state.count[i].tolist() == [float(len(pos))] * kv_heads
    with pytest.raises(ValueError, match=r"state must hold sums of shape \(3, 2, 21, 5\)"):
        taylor_shift_decode(*(x[:, :, :1] for x in low), state=TaylorShiftState.zeros(
            B, heads, D, DV, dtype=dtype), enable_gqa=True)  # fmt: skip


@pytest.mark.parametrize("n_prompt", [1, 5], ids=["token", "block"])
def test_padded_token_content_never_reaches_the_state(n_prompt):
    # NaN in the keys and values of padded prompt tokens: the state and the real tokens'
    # outputs equal those of the same prompt with ordinary content there.
    q, k, v = _qkv(n_prompt)
    mask = _prompt_mask((0, n_prompt - 1, n_prompt), n_prompt)
    k_bad, v_bad = (torch.where(mask[:, None, :, None], x, float("nan")) for x in (k, v))
    out, state = taylor_shift_decode(q, k, v, None, mask)
    out_bad, state_bad = taylor_shift_decode(q, k_bad, v_bad, None, mask)
    assert torch.isfinite(state_bad.sums).all()
    assert_rel_close(state_bad.sums, state.sums, 1e-14, "state")
    real = mask[:, None, :, None].expand_as(out)
    assert_rel_close(out_bad[real], out[real], 1e-14, "outputs of real tokens")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_padded_steps_join_no_sum_of_the_pytorch_step(dtype, monkeypatch):
    # Token by token with key_padding_mask False for some rows at some steps, through the
    # PyTorch step: float64 (the CPU step kernel takes float32 only) and float32 with the
    # kernels off. Each real token's output is the causal op over its row's real tokens
    # alone, and after every step the count is the number of real tokens so far.
    monkeypatch.setenv("TAYLORSHIFT_CPU_KERNELS", "off")
    assert not cpu_kernels_ready()
    real = torch.tensor(
        [[1, 1, 0, 1, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 0, 1, 0, 1], [1, 0, 1, 0, 1, 0, 0, 1, 0]],
        dtype=torch.bool,
    )  # (B, N): row 1 starts with two padded tokens (count 0), rows pad at other steps
    q, k, v = (x.to(dtype) for x in _qkv(real.shape[1], seed=6))
    tau = torch.tensor([0.7, 1.4], dtype=torch.float64).view(1, H, 1, 1)
    state, outs = None, []
    for t in range(real.shape[1]):
        step = (x[:, :, t : t + 1] for x in (q, k, v))
        y, state = taylor_shift_decode(*step, state, real[:, t : t + 1], temperature=tau.to(dtype))
        outs.append(y)
        counted = real[:, : t + 1].sum(1, dtype=dtype)[:, None].expand(B, H)
        what = f"step {t}: {counted[:, 0].tolist()} real tokens so far"
        assert torch.equal(state.count, counted), f"{what}, count {state.count.tolist()}"
        # (the sum of the constant feature counts them too)
        assert torch.equal(state.sums[..., -1, -1], counted), f"{what}, sums' constant"
    got = torch.cat(outs, dim=2)
    rtol, atol = (RTOL, 1e-13) if dtype == torch.float64 else (1e-5, 1e-7)
    for i in range(B):
        idx = real[i].nonzero().squeeze(1)
        qi, ki, vi = (x[i : i + 1, :, idx].double() for x in (q, k, v))
        ref = naive_taylor_shift_attention(qi, ki, vi, None, True, temperature=tau)
        assert_rel_close(got[i : i + 1, :, idx], ref, rtol, f"item {i}", atol=atol)


@pytest.mark.parametrize("steps", [1, 3], ids=["token", "block"])
def test_inplace_updates_the_given_state_and_default_keeps_it(steps):
    q, k, v = _qkv(6 + steps)
    _, state = taylor_shift_decode(q[:, :, :6], k[:, :, :6], v[:, :, :6])
    new = (x[:, :, 6:] for x in (q, k, v))
    kept = TaylorShiftState(state.sums.clone(), state.count.clone())
    out, fresh = taylor_shift_decode(*new, state)
    assert torch.equal(state.sums, kept.sums) and torch.equal(state.count, kept.count)
    assert fresh is not state and int(fresh.count[0, 0]) == 6 + steps
    out_inplace, same = taylor_shift_decode(*(x[:, :, 6:] for x in (q, k, v)), state, inplace=True)
    assert same is state and torch.equal(state.count, fresh.count)
    assert_rel_close(state.sums, fresh.sums, 1e-14, "state")
    assert_rel_close(out_inplace, out, 1e-14, "output")


def test_taylorshift_state_size_does_not_grow():
    q, k, v = _qkv(40)
    _, s1 = taylor_shift_decode(q[:, :, :10], k[:, :, :10], v[:, :, :10])
    _, s2 = taylor_shift_decode(q[:, :, 10:], k[:, :, 10:], v[:, :, 10:], s1)
    assert s1.nbytes == s2.nbytes == TaylorShiftState.zeros(B, H, D, DV, dtype=q.dtype).nbytes


def test_taylorshift_decode_float32_inputs_keep_float32_state():
    q, k, v = (x.float() for x in _qkv(6))
    out, state = taylor_shift_decode(q, k, v)
    assert out.dtype == torch.float32 and state.sums.dtype == torch.float32
    ref = naive_taylor_shift_attention(q.double(), k.double(), v.double(), None, True)
    assert_rel_close(out.double(), ref, 1e-5)


def test_linear_decode_equals_parallel():
    n_prompt, n, lengths = 6, 10, (2, 6, 0)
    q, k, v = _qkv(n, seed=1)
    got, state = _decode_all(linear_attention_decode, q, k, v, lengths, n_prompt)
    for i, pos in enumerate(_real_positions(lengths, n_prompt, n)):
        idx = torch.tensor(pos, dtype=torch.long)
        qi, ki, vi = (x[i : i + 1, :, idx] for x in (q, k, v))
        ref = naive_linear_attention(qi, ki, vi, None, True)
        assert_rel_close(got[i : i + 1, :, idx], ref, RTOL, f"item {i}")
    assert isinstance(state, LinearAttentionState) and state.sums.shape == (B, H, D, DV + 1)


def test_decode_rejects_bad_input():
    q, k, v = _qkv(4)
    with pytest.raises(ValueError, match=r"key_padding_mask must be \(B, T\) = \(3, 4\)"):
        taylor_shift_decode(q, k, v, None, torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="key_padding_mask must be a bool tensor"):
        taylor_shift_decode(q, k, v, None, torch.ones(3, 4))
    with pytest.raises(ValueError, match="same new tokens"):
        taylor_shift_decode(q, k[:, :, :3], v[:, :, :3])
    _, state = taylor_shift_decode(q, k, v)
    with pytest.raises(ValueError, match="state must hold sums of shape"):
        taylor_shift_decode(q[:, :1], k[:, :1], v[:, :1], state)
    with pytest.raises(TypeError, match="state must be a TaylorShiftState"):
        taylor_shift_decode(q, k, v, state=(1, 2))
    with pytest.raises(ValueError, match=r"state must be torch\.float32"):
        taylor_shift_decode(q.float(), k.float(), v.float(), state)
    with pytest.raises(ValueError, match=r"state must be a LinearAttentionState"):
        linear_attention_decode(q, k, v, LinearAttentionState(torch.zeros(1)))


@pytest.mark.parametrize(
    "normalize, tensor_tau", [(True, True), (True, False), (False, False)],
    ids=["tensor-tau", "float-tau", "plain"],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_unchecked_token_step_equals_the_checked_one(normalize, tensor_tau, dtype):
    from taylorshift.ops.taylor_shift.decode import decode_token

    q, k, v = (x.to(dtype) for x in _qkv(6, seed=4))
    tau = torch.linspace(0.5, 2.0, H, dtype=dtype).view(1, H, 1, 1) if tensor_tau else 1.7
    if not normalize:  # plain scores take scale (its default here), not a temperature
        tau = 1.0
    kwargs = {"temperature": tau, "normalize": normalize}
    _, checked = taylor_shift_decode(q[:, :, :5], k[:, :, :5], v[:, :, :5], **kwargs)
    unchecked = TaylorShiftState(checked.sums.clone(), checked.count.clone())
    want, _ = taylor_shift_decode(
        q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], checked, inplace=True, **kwargs
    )
    got = decode_token(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], unchecked, tau, normalize)
    assert got.dtype == want.dtype == dtype
    assert torch.equal(got, want)
    assert torch.equal(unchecked.sums, checked.sums)
    assert torch.equal(unchecked.count, checked.count)


def test_decode_rejects_bad_options():
    q, k, v = _qkv(4)
    with pytest.raises(ValueError, match=r"chunk_size must be a positive int or None; got -2"):
        taylor_shift_decode(q, k, v, chunk_size=-2)
    with pytest.raises(TypeError, match=r"chunk_size must be a positive int or None; got 2\.5"):
        taylor_shift_decode(q, k, v, chunk_size=2.5)
    with pytest.raises(TypeError, match=r"inplace must be a bool; got 'yes'"):
        taylor_shift_decode(q, k, v, inplace="yes")
    _, state = taylor_shift_decode(q, k, v)
    counted = TaylorShiftState(state.sums, state.count.long())
    with pytest.raises(ValueError, match=r"state's count must be torch\.float64 on cpu"):
        taylor_shift_decode(q, k, v, counted)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_unchecked_token_step_refuses_a_state_that_does_not_fit(dtype):
    """The layer caches' step checks only its state, and must: a state of another batch
    size or model would have the CPU kernel read and write outside it (a crash, or garbage
    in memory) where the op's checks used to stand."""
    from taylorshift.ops.taylor_shift.decode import decode_token

    q, k, v = (x.to(dtype) for x in _qkv(2, seed=5))
    _, state = taylor_shift_decode(q[:, :, :1], k[:, :, :1], v[:, :, :1])
    one = (q[:, :, 1:], k[:, :, 1:], v[:, :, 1:])
    wider = [torch.cat([x] * 4) for x in one]  # batch 12 against a state of batch 3
    with pytest.raises(ValueError, match=r"state must hold sums of shape \(12, 2, 21, 5\)"):
        decode_token(*wider, state)
    wide_d = [torch.randn(B, H, 1, 2 * D, dtype=dtype) for _ in range(2)]
    with pytest.raises(ValueError, match=r"state must hold sums of shape \(3, 2, 66, 5\)"):
        decode_token(*wide_d, one[2], state)
    wide_v = torch.randn(B, H, 1, 3 * DV, dtype=dtype)
    with pytest.raises(ValueError, match=r"state must hold sums of shape \(3, 2, 21, 13\)"):
        decode_token(*one[:2], wide_v, state)
    other = {torch.float64: torch.float32, torch.float32: torch.float64}[dtype]
    cast = TaylorShiftState(state.sums.to(other), state.count.to(other))
    with pytest.raises(ValueError, match=rf"state must be {dtype}"):
        decode_token(*one, cast)
    narrow_count = TaylorShiftState(state.sums, state.count.to(torch.uint8))
    with pytest.raises(ValueError, match="state's count must be"):
        decode_token(*one, narrow_count)
    with pytest.raises(TypeError, match="state must be a TaylorShiftState"):
        decode_token(*one, (state.sums, state.count))
    before = state.sums.clone()
    decode_token(*one, state)  # (the fitting state still steps, in place)
    assert not torch.equal(state.sums, before)
