"""Attention kernels by name: the registry, each kernel against a plain implementation
written here, causal and empty-row behaviour, the learnable temperature, attention dropout.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from torch import nn

from taylorshift import naive_taylor_shift_attention
from taylorshift.nn import (
    Attention,
    AttentionKernel,
    create_kernel,
    list_kernels,
    register_kernel,
)
from tests.helpers import assert_rel_close, rel_error
from tests.nn.cases import (
    F64,
    GENERAL_MASK_IDS,
    KERNEL_IDS,
    KERNEL_SPECS,
    KEY_DROPOUT_IDS,
    randn,
    spread_temperature,
)

kernels_module = importlib.import_module("taylorshift.nn.kernels")

RTOL = 1e-10
B, H, D, DV = 2, 3, 4, 5


def build(kernel_id, attn_drop=0.0, seed=0, **extra):
    name, kwargs = KERNEL_SPECS[kernel_id]
    kernel = create_kernel(name, H, D, attn_drop=attn_drop, **{**kwargs, **extra})
    kernel.to(F64)
    spread_temperature(kernel, seed)
    return kernel


def qkv(nq, nk, seed=0, requires_grad=True, b=B, h=H):
    return (
        randn(b, h, nq, D, seed=seed, requires_grad=requires_grad),
        randn(b, h, nk, D, seed=seed + 1, requires_grad=requires_grad),
        randn(b, h, nk, DV, seed=seed + 2, requires_grad=requires_grad),
    )


# ---------------------------------------------------------------------------------------
# Plain implementations, written from the definitions (SPEC §2, §4), not from the library.


def allowed_pairs(mask, causal, nq, nk, b=B, h=H):
    allowed = torch.ones(b, h, nq, nk, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(nq, nk, dtype=torch.bool).tril()
    if mask is not None:
        allowed = allowed & mask
    return allowed


def normalised_average(w, v, allowed):
    """Σ_j w_ij v_j / Σ_j w_ij over attended keys; zeros for a row without keys."""
    w = w * allowed
    den = w.sum(-1, keepdim=True)
    has_keys = allowed.any(-1, keepdim=True)
    return (w @ v) / torch.where(has_keys, den, torch.ones_like(den)) * has_keys


def plain_softmax(q, k, v, allowed):
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~allowed, -math.inf)
    row_max = s.amax(-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    return normalised_average(torch.exp(s - row_max), v, allowed)


def plain_taylorshift(q, k, v, allowed, temperature, normalize=True, order=2):
    d = q.shape[-1]
    if normalize:
        qh = q / q.norm(dim=-1, keepdim=True)
        kh = k / k.norm(dim=-1, keepdim=True)
        s = temperature * (qh @ kh.transpose(-2, -1))
    else:
        s = (q @ k.transpose(-2, -1)) / math.sqrt(d)
    w = sum(s**n / math.factorial(n) for n in range(order + 1))
    y = normalised_average(w, v, allowed)
    if normalize:
        y = y * torch.sqrt(allowed.sum(-1, keepdim=True).to(y.dtype) / d)
    return y


def plain_linear(q, k, v, allowed, eps=1e-6):
    def phi(x):
        return torch.where(x > 0, x + 1.0, torch.exp(x))

    w = (phi(q) @ phi(k).transpose(-2, -1)) * allowed
    return (w @ v) / (w.sum(-1, keepdim=True) + eps)


def plain_holt(q, k, v, allowed, alpha=3.0, subtract_one=False):
    def layer_norm(x):
        mean = x.mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + 1e-5)

    s = layer_norm(q) @ layer_norm(k).transpose(-2, -1) / (alpha * math.sqrt(q.shape[-1]))
    w = s + s * s / 2 + (0.0 if subtract_one else 1.0)
    return normalised_average(w, v, allowed)


def plain(kernel_id, kernel, q, k, v, allowed):
    name, kwargs = KERNEL_SPECS[kernel_id]
    if name == "taylorshift":
        return plain_taylorshift(q, k, v, allowed, kernel.temperature)
    if name.startswith("softmax"):
        return plain_softmax(q, k, v, allowed)
    if name == "linear":
        return plain_linear(q, k, v, allowed)
    return plain_holt(q, k, v, allowed, **kwargs)


# ---------------------------------------------------------------------------------------
# Registry.


def test_list_kernels_names_every_kernel_sorted():
    names = list_kernels()
    assert names == sorted(names)
    assert {"taylorshift", "softmax", "softmax-naive", "linear", "holt"} <= set(names)


@pytest.mark.parametrize("name", ["taylorshift", "softmax", "softmax-naive", "linear", "holt"])
def test_create_kernel_builds_the_named_kernel(name):
    kernel = create_kernel(name, 3, 4, attn_drop=0.25)
    assert isinstance(kernel, AttentionKernel)
    assert (kernel.name, kernel.num_heads, kernel.head_dim, kernel.attn_drop) == (
        name,
        3,
        4,
        0.25,
    )
    assert name in repr(kernel)


def test_unknown_kernel_name_is_refused():
    with pytest.raises(ValueError, match=r"attn_kernel must be one of .*'softmax'.*got 'nope'"):
        create_kernel("nope", 2, 4)


@pytest.mark.parametrize(
    "name, kwargs, exc, pattern",
    [
        ("taylorshift", {"temperature": float("nan")}, ValueError, "temperature must be a fin"),
        ("taylorshift", {"temperature": "1"}, TypeError, "temperature must be a number; got '1'"),
        ("taylorshift", {"learn_temperature": "no"}, TypeError, "learn_temperature must be a b"),
        ("holt", {"alpha": 0}, ValueError, r"alpha must be a number > 0; got 0"),
        ("holt", {"alpha": "3"}, TypeError, r"alpha must be a number > 0; got '3'"),
        ("holt", {"subtract_one": "yes"}, TypeError, r"subtract_one must be a bool; got 'yes'"),
    ],
)
def test_bad_kernel_option_values_are_refused_at_construction(name, kwargs, exc, pattern):
    """(A string learn_temperature was truthy, a NaN temperature trained NaN, alpha = 0 was
    a ZeroDivisionError at the first call.)"""
    with pytest.raises(exc, match=pattern):
        create_kernel(name, 2, 4, **kwargs)


@pytest.mark.parametrize(
    "name, kwargs",
    [("softmax", {"mode": "direct"}), ("holt", {"order": 2}), ("taylorshift", {"alpha": 3.0})],
    ids=["softmax-mode", "holt-order", "taylorshift-alpha"],
)
def test_unknown_kernel_option_is_refused(name, kwargs):
    option = next(iter(kwargs))
    with pytest.raises(TypeError, match=rf"kernel {name!r} has no option {option!r}; its opt"):
        create_kernel(name, 2, 4, **kwargs)


@pytest.mark.parametrize("name", ["taylorshift", "softmax"])
def test_duplicate_registration_is_refused(name):
    before = dict(kernels_module._KERNELS)

    class Impostor(AttentionKernel):
        def attend(self, q, k, v, attn_mask, is_causal):
            return v

    with pytest.raises(ValueError, match=rf"{name!r} is registered already"):
        register_kernel(name)(Impostor)
    registry = kernels_module._KERNELS
    assert registry == before
    assert type(create_kernel(name, 2, 4)) is before[name]


def test_registered_kernel_is_usable_by_name_in_modules(monkeypatch):
    monkeypatch.setattr(kernels_module, "_KERNELS", dict(kernels_module._KERNELS))

    @register_kernel("test-mean")
    class MeanKernel(AttentionKernel):
        """Uniform weights: the mean of the attended values."""

        def attend(self, q, k, v, attn_mask, is_causal):
            allowed = allowed_pairs(attn_mask, is_causal, q.shape[-2], k.shape[-2], *q.shape[:2])
            return normalised_average(torch.ones(allowed.shape, dtype=v.dtype), v, allowed)

    assert "test-mean" in list_kernels()
    assert isinstance(create_kernel("test-mean", 2, 4), MeanKernel)
    module = Attention(8, 2, qkv_bias=True, attn_kernel="test-mean", dtype=F64)
    assert isinstance(module.kernel, MeanKernel)
    x = randn(1, 5, 8)
    y = module(x, is_causal=True)
    v = module._heads(module.v_proj(x))
    expected_heads = v.cumsum(2) / torch.arange(1, 6, dtype=F64)[:, None]  # running mean
    expected = module.proj(expected_heads.transpose(1, 2).reshape(1, 5, 8))
    assert_rel_close(y, expected, 1e-12, "mean kernel")


# ---------------------------------------------------------------------------------------
# Each kernel against its plain implementation.

# name -> (Nq, Nk, causal, mask kind)
MASK_CASES = {
    "plain": (7, 7, False, None),
    "padding": (7, 7, False, "keys"),
    "causal": (7, 7, True, None),
    "causal-padding": (7, 7, True, "keys"),
    "cross": (5, 8, False, "keys"),
    "cross-causal": (8, 5, True, None),
    "general": (6, 7, False, "general"),
}


def make_mask(kind, nq, nk, seed=0):
    g = torch.Generator().manual_seed(seed)
    if kind is None:
        return None
    if kind == "keys":
        mask = torch.rand(B, 1, 1, nk, generator=g) < 0.7
        mask[0] = False  # batch item 0 attends no key
        mask[1:, ..., 0] = True
        return mask
    mask = torch.rand(B, 1, nq, nk, generator=g) < 0.6
    mask[:, :, 1] = False  # query 1 attends no key
    return mask


def mask_cases(kernel_id):
    general = kernel_id in GENERAL_MASK_IDS
    return [c for c in MASK_CASES if general or MASK_CASES[c][3] != "general"]


@pytest.mark.parametrize(
    "kernel_id, case",
    [(kid, case) for kid in KERNEL_IDS for case in mask_cases(kid)],
    ids=lambda x: x,
)
def test_kernel_matches_plain_implementation(kernel_id, case):
    nq, nk, causal, kind = MASK_CASES[case]
    kernel = build(kernel_id)
    q, k, v = qkv(nq, nk)
    mask = make_mask(kind, nq, nk)
    y = kernel(q, k, v, mask, causal)
    allowed = allowed_pairs(mask, causal, nq, nk)
    expected = plain(kernel_id, kernel, q, k, v, allowed)
    assert y.shape == (B, H, nq, DV) and y.dtype == F64
    assert_rel_close(y, expected, RTOL, "output")
    inputs = [q, k, v] + [p for p in kernel.parameters()]
    g_out = randn(*y.shape, seed=9)
    grads = torch.autograd.grad(y, inputs, g_out)
    expected_grads = torch.autograd.grad(expected, inputs, g_out)
    for i, (g, g_ref) in enumerate(zip(grads, expected_grads, strict=True)):
        assert_rel_close(g, g_ref, RTOL, f"grad of {'qkvt'[i]}")


@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain-scores"])
@pytest.mark.parametrize("order", [2, 4, 6])
def test_taylorshift_options_match_plain(order, normalize):
    kernel = build("taylorshift-direct", order=order, normalize=normalize)
    q, k, v = qkv(6, 6, requires_grad=False)
    mask = make_mask("keys", 6, 6)
    y = kernel(q, k, v, mask, True)
    expected = plain_taylorshift(
        q, k, v, allowed_pairs(mask, True, 6, 6), kernel.temperature, normalize, order
    )
    assert_rel_close(y, expected, RTOL, "output")


def test_softmax_and_naive_softmax_agree():
    for case, (nq, nk, causal, kind) in MASK_CASES.items():
        q, k, v = qkv(nq, nk, seed=3, requires_grad=False)
        mask = make_mask(kind, nq, nk, seed=4)
        y_sdpa = build("softmax")(q, k, v, mask, causal)
        y_naive = build("softmax-naive")(q, k, v, mask, causal)
        assert_rel_close(y_sdpa, y_naive, RTOL, case)


@pytest.mark.parametrize("kernel_id", KERNEL_IDS)
def test_rows_without_keys_give_zeros(kernel_id):
    kernel = build(kernel_id)
    masks = [make_mask("keys", 6, 6)]  # batch item 0 fully padded
    if kernel_id in GENERAL_MASK_IDS:
        masks.append(make_mask("general", 6, 6))  # query 1 attends nothing
    for mask in masks:
        q, k, v = qkv(6, 6)
        for causal in (False, True):
            y = kernel(q, k, v, mask, causal)
            empty = ~allowed_pairs(mask, causal, 6, 6).any(-1)  # (B, H, Nq)
            assert empty.any()
            assert torch.equal(y[empty], torch.zeros_like(y[empty]))
            assert y[~empty].abs().sum() > 0
            grads = torch.autograd.grad(y, (q, k, v), torch.ones_like(y))
            for name, g in zip("qkv", grads, strict=True):
                assert torch.isfinite(g).all(), f"grad of {name} is not finite"


@pytest.mark.parametrize("shape", [(9, 9), (6, 9), (9, 6)], ids=lambda s: f"Nq{s[0]}-Nk{s[1]}")
@pytest.mark.parametrize("kernel_id", KERNEL_IDS)
def test_causal_row_ignores_later_keys(kernel_id, shape):
    nq, nk = shape
    kernel = build(kernel_id)
    q, k, v = qkv(nq, nk, requires_grad=False)
    y = kernel(q, k, v, None, True)
    for i in range(min(nq, nk) - 1):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, i + 1 :] = randn(B, H, nk - i - 1, D, seed=50 + i)
        v2[:, :, i + 1 :] = 100 * randn(B, H, nk - i - 1, DV, seed=70 + i)
        y2 = kernel(q, k2, v2, None, True)
        assert_rel_close(y2[:, :, : i + 1], y[:, :, : i + 1], 1e-12, f"rows <= {i}")
        assert rel_error(y2[:, :, i + 1 :], y[:, :, i + 1 :]) > 1e-3  # later rows do see them


# ---------------------------------------------------------------------------------------
# TaylorShift's temperature.


@pytest.mark.parametrize("mode", ["direct", "efficient"])
def test_temperature_is_a_learnable_per_head_parameter(mode):
    kernel = create_kernel("taylorshift", 3, 4, mode=mode, temperature=1.5).to(F64)
    assert isinstance(kernel.temperature, nn.Parameter)
    assert kernel.temperature.shape == (1, 3, 1, 1)
    assert torch.equal(kernel.temperature, torch.full((1, 3, 1, 1), 1.5, dtype=F64))
    assert [n for n, _ in kernel.named_parameters()] == ["temperature"]
    q, k, v = qkv(6, 6)
    y = kernel(q, k, v, None, False)
    y.pow(2).sum().backward()
    g = kernel.temperature.grad
    assert g is not None and g.shape == (1, 3, 1, 1)
    assert torch.isfinite(g).all() and (g != 0).all()


def test_temperature_acts_per_head():
    kernel = build("taylorshift-direct")
    q, k, v = qkv(6, 6, requires_grad=False)
    y = kernel(q, k, v)
    with torch.no_grad():
        kernel.temperature[0, 1] *= 3.0
    y2 = kernel(q, k, v)
    assert torch.equal(y2[:, [0, 2]], y[:, [0, 2]])
    assert rel_error(y2[:, 1], y[:, 1]) > 1e-3


@pytest.mark.parametrize(
    "kwargs",
    [{"learn_temperature": False, "temperature": 2.0}, {"normalize": False}],
    ids=["fixed", "plain-scores"],
)
def test_temperature_is_a_buffer_when_not_learned(kwargs):
    kernel = create_kernel("taylorshift", 2, 4, **kwargs)
    assert not isinstance(kernel.temperature, nn.Parameter)
    assert "temperature" in dict(kernel.named_buffers())
    assert list(kernel.parameters()) == []


def test_temperature_with_plain_scores_is_refused():
    with pytest.raises(ValueError, match="temperature"):
        create_kernel("taylorshift", 2, 4, temperature=2.0, normalize=False)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"mode": "fast"}, r"mode must be one of.*'fast'"),
        ({"order": 3}, r"order must be an even int"),
    ],
    ids=["mode", "order"],
)
def test_bad_taylorshift_options_are_refused_by_name(kwargs, pattern):
    # Refused when the kernel is built, not at the first forward.
    with pytest.raises(ValueError, match=pattern):
        create_kernel("taylorshift", 3, 4, **kwargs)


def test_log_temperature_learns_log_tau_and_computes_the_same():
    plain = create_kernel("taylorshift", 3, 4, mode="direct", temperature=1.5).to(F64)
    logged = create_kernel(
        "taylorshift", 3, 4, mode="direct", temperature=1.5, log_temperature=True
    ).to(F64)
    assert [n for n, _ in logged.named_parameters()] == ["log_temperature"]
    with torch.no_grad():
        logged.log_temperature.copy_(torch.full((1, 3, 1, 1), math.log(1.5), dtype=F64))
    q, k, v = qkv(6, 6)
    assert_rel_close(logged(q, k, v), plain(q, k, v), 1e-14, "output")
    # d/d(log τ) = τ · d/dτ
    plain(q, k, v).pow(2).sum().backward()
    logged(q, k, v).pow(2).sum().backward()
    assert_rel_close(logged.log_temperature.grad, 1.5 * plain.temperature.grad, 1e-12, "grad")


@pytest.mark.parametrize("learn", [True, False], ids=["learned", "fixed"])
def test_log_temperature_fixed_is_a_buffer(learn):
    kernel = create_kernel("taylorshift", 2, 4, log_temperature=True, learn_temperature=learn)
    assert ("log_temperature" in dict(kernel.named_parameters())) == learn
    assert ("log_temperature" in dict(kernel.named_buffers())) != learn


@pytest.mark.parametrize(
    "mode, mask_kind",
    # (the efficient form takes key-padding masks only)
    [("direct", m) for m in ("none", "padding", "general")]
    + [("efficient", m) for m in ("none", "padding")],
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_output_factor_off_gives_the_plain_weighted_mean(mode, mask_kind, causal):
    # Without the factor each output row is Σ w v / Σ w: the reference with normalize=True
    # divided by its own factor sqrt(n_i/d), n_i counted here from the mask.
    b, h, n, d = 2, 3, 7, 4
    kernel = create_kernel("taylorshift", h, d, mode=mode, output_factor=False).to(F64)
    q, k, v = qkv(n, n, requires_grad=False)
    g = torch.Generator().manual_seed(4)
    mask = {
        "none": None,
        "padding": torch.tensor([[1, 1, 1, 1, 0, 0, 0], [0] * 7]).bool()[:, None, None, :],
        "general": torch.rand(b, h, n, n, generator=g) > 0.3,
    }[mask_kind]
    allowed = torch.ones(n, n, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    if mask is not None:
        allowed = allowed & mask
    count = allowed.expand(b, h, n, n).sum(-1, keepdim=True).to(F64)
    want = naive_taylor_shift_attention(q, k, v, mask, causal) / torch.sqrt(count.clamp(min=1) / d)
    assert_rel_close(kernel(q, k, v, mask, causal), want, 1e-12, "output")


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["plain", "grouped"])
def test_output_factor_off_decodes_like_the_parallel_form(kv_heads):
    # grouped: 4 query heads on 2 key/value heads (the state, and its count, per kv head)
    kernel = create_kernel("taylorshift", 4, 4, output_factor=False).to(F64).eval()
    q, k, v = qkv(9, 9, requires_grad=False, h=4)
    k, v = k[:, :kv_heads], v[:, :kv_heads]
    padding = torch.ones(2, 9, dtype=torch.bool)
    padding[1, 6:] = False  # a ragged batch, right-padded
    want = kernel(q, k, v, padding[:, None, None, :], True)
    cache = kernel.new_cache("state")
    rows = [kernel.decode(q[..., :4, :], k[..., :4, :], v[..., :4, :], padding[:, :4], cache)]
    for t in range(4, 9):
        step = slice(t, t + 1)
        rows.append(kernel.decode(q[..., step, :], k[..., step, :], v[..., step, :],
                                  padding[:, step], cache))  # fmt: skip
    got = torch.cat(rows, dim=-2)
    assert_rel_close(got[0], want[0], 1e-12, "full row")
    assert_rel_close(got[1, :, :6], want[1, :, :6], 1e-12, "ragged row")


def test_the_state_cache_steps_without_checks_after_the_first_call(monkeypatch):
    from taylorshift.nn import kernels as kernels_module

    steps = []
    real = kernels_module.decode_token
    monkeypatch.setattr(kernels_module, "decode_token", lambda *a: steps.append(1) or real(*a))
    kernel = create_kernel("taylorshift", 2, 4).to(F64).eval()
    q, k, v = (t[:, :2] for t in qkv(7, 7, requires_grad=False))
    want = kernel(q, k, v, None, True)
    cache = kernel.new_cache("state")
    rows = [kernel.decode(q[..., :4, :], k[..., :4, :], v[..., :4, :], None, cache)]
    for t in range(4, 7):
        step = slice(t, t + 1)
        rows.append(kernel.decode(q[..., step, :], k[..., step, :], v[..., step, :], None, cache))
    assert len(steps) == 3  # the prompt went through the checked op, each token did not
    assert_rel_close(torch.cat(rows, dim=-2), want, 1e-12, "decoded rows")
    # a token with a padding mask goes through the checked op (it validates the mask)
    padding = torch.ones(q.shape[0], 1, dtype=torch.bool)
    kernel.decode(q[..., 6:, :], k[..., 6:, :], v[..., 6:, :], padding, cache)
    assert len(steps) == 3


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        ({"output_factor": "no"}, TypeError, r"output_factor must be a bool; got 'no'"),
        ({"log_temperature": 1}, TypeError, r"log_temperature must be a bool; got 1"),
        (
            {"log_temperature": True, "temperature": 0.0},
            ValueError,
            r"log_temperature needs a temperature > 0",
        ),
    ],
)
def test_bad_temperature_and_factor_options(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        create_kernel("taylorshift", 2, 4, **kwargs)


# ---------------------------------------------------------------------------------------
# Local heads: the first heads a sliding-window softmax, the rest TaylorShift.


def plain_window_softmax(q, k, v, allowed, window):
    """Softmax over the keys within ``window`` positions (query i at i + Nk - Nq)."""
    nq, nk = q.shape[-2], k.shape[-2]
    pos = torch.arange(nq)[:, None] + nk - nq
    j = torch.arange(nk)[None, :]
    near = (j - pos).abs() < window
    return plain_softmax(q, k, v, allowed & near)


@pytest.mark.parametrize("mode", ["direct", "efficient"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("mask_kind", ["none", "padding", "per-head"])
def test_local_heads_are_window_softmax_beside_taylorshift(mode, causal, mask_kind):
    n, window, local = 11, 3, 1
    kernel = build("taylorshift-" + mode, local_heads=local, window=window)
    assert kernel.temperature.shape == (1, H - local, 1, 1)
    q, k, v = qkv(n, n)
    mask = None
    if mask_kind == "padding":
        mask = torch.arange(n)[None, None, None, :] < torch.tensor([7, 11])[:, None, None, None]
    elif mask_kind == "per-head":
        mask = torch.rand(B, H, 1, n, generator=torch.Generator().manual_seed(4)) > 0.3
    allowed = allowed_pairs(mask, causal, n, n)
    y = kernel(q, k, v, mask, causal)
    want = torch.cat(
        [
            plain_window_softmax(q[:, :local], k[:, :local], v[:, :local],
                                 allowed[:, :local], window),
            plain_taylorshift(q[:, local:], k[:, local:], v[:, local:], allowed[:, local:],
                              kernel.temperature),
        ],
        dim=1,
    )  # fmt: skip
    assert_rel_close(y, want, RTOL, "output")
    g = randn(*y.shape, seed=9)
    got = torch.autograd.grad((y * g).sum(), (q, k, v, kernel.temperature))
    ref = torch.autograd.grad((want * g).sum(), (q, k, v, kernel.temperature))
    for name, a, e in zip(["q", "k", "v", "temperature"], got, ref, strict=True):
        assert_rel_close(a, e, RTOL, f"grad of {name}")


@pytest.mark.parametrize("kind", ["kv", "state"])
def test_local_heads_decode_like_the_forward_pass(kind):
    # a window of 4 over 12 tokens in blocks of 3, 2 and 1: the state keeps 3 keys
    kernel = build("taylorshift-direct", local_heads=2, window=4).eval()
    q, k, v = qkv(12, 12, requires_grad=False)
    want = kernel(q, k, v, None, True)
    cache = kernel.new_cache(kind)
    rows, start = [], 0
    for size in (3, 2, 1, 1, 1, 1, 1, 1, 1):
        step = slice(start, start + size)
        rows.append(kernel.decode(q[..., step, :], k[..., step, :], v[..., step, :], None, cache))
        start += size
    assert_rel_close(torch.cat(rows, dim=-2), want, RTOL, f"decoded rows, {kind} cache")
    if kind == "state":
        keys, values, mask = cache.window
        assert keys.shape == (B, 2, 3, D) and values.shape == (B, 2, 3, DV)
        assert mask.shape == (B, 3) and bool(mask.all())


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"local_heads": 3}, ValueError, r"local_heads must be an int < num_heads \(3\).*; got 3"),
        ({"local_heads": -1}, ValueError, r"local_heads must be an int >= 0; got -1"),
        ({"local_heads": True}, TypeError, r"local_heads must be an int >= 0; got True"),
        ({"local_heads": 1, "window": 0}, ValueError, r"window must be a positive int; got 0"),
    ],
)
def test_bad_local_head_options_are_refused_by_name(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        create_kernel("taylorshift", 3, 4, **kwargs)


def test_local_heads_refuse_causal_cross_attention():
    kernel = build("taylorshift-direct", local_heads=1)
    q, k, v = qkv(3, 5)
    with pytest.raises(ValueError, match=r"local_heads with is_causal need self-attention.*3 "):
        kernel(q, k, v, None, True)


# ---------------------------------------------------------------------------------------
# Attention dropout.


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, math.nan], ids=["neg", "one", "big", "nan"])
@pytest.mark.parametrize("name", ["taylorshift", "softmax", "softmax-naive", "linear", "holt"])
def test_attn_drop_outside_unit_interval_is_refused(name, p):
    with pytest.raises(ValueError, match=r"attn_drop must be a number in \[0, 1\); got"):
        create_kernel(name, 2, 4, attn_drop=p)


@pytest.mark.parametrize("kernel_id", KERNEL_IDS)
def test_attn_drop_has_no_effect_in_eval_mode(kernel_id):
    q, k, v = qkv(7, 7, requires_grad=False)
    mask = make_mask("keys", 7, 7)
    reference = build(kernel_id).eval()
    dropping = build(kernel_id, attn_drop=0.5).eval()
    torch.manual_seed(0)
    for causal in (False, True):
        expected = reference(q, k, v, mask, causal)
        assert torch.equal(dropping(q, k, v, mask, causal), expected)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("padding", [False, True], ids=["no-mask", "padding"])
def test_taylorshift_key_dropout_same_in_direct_and_efficient(padding, causal):
    kernel = build("taylorshift-direct", attn_drop=0.3).train()
    q, k, v = qkv(9, 9, requires_grad=False)
    mask = make_mask("keys", 9, 9) if padding else None
    torch.manual_seed(123)
    y_direct = kernel(q, k, v, mask, causal)
    kernel.mode = "efficient"
    torch.manual_seed(123)
    y_efficient = kernel(q, k, v, mask, causal)
    assert_rel_close(y_efficient, y_direct, RTOL, "efficient vs direct under dropout")
    assert rel_error(y_direct, kernel.eval()(q, k, v, mask, causal)) > 1e-3  # keys dropped


@pytest.mark.parametrize("kernel_id", KEY_DROPOUT_IDS)
def test_key_dropout_removes_whole_keys(kernel_id):
    kernel = build(kernel_id, attn_drop=0.4).train()
    nk = 12
    q, k, _ = qkv(10, nk)
    # Values one-hot per key: row i of the output is query i's weights over the keys.
    v = torch.eye(nk, dtype=F64).expand(B, H, nk, nk).clone().requires_grad_()
    torch.manual_seed(7)
    y = kernel(q, k, v, None, False)
    (g_v,) = torch.autograd.grad(y, v, randn(*y.shape, seed=3))
    kept = g_v.abs().sum(-1) > 0  # (B, H, Nk): a dropped key's value gets no gradient
    assert kept.any() and not kept.all()
    weights_zero = y.abs() < 1e-300  # (B, H, Nq, Nk)
    # A dropped key is dropped for every query of its (batch, head); a kept one is used.
    assert torch.equal(weights_zero, (~kept)[:, :, None, :].expand_as(weights_zero))
    # The rest renormalise: the same as the kernel in eval mode with those keys masked.
    expected = kernel.eval()(q, k, v, kept[:, :, None, :], False)
    assert_rel_close(y, expected, RTOL, "dropout through the key mask")


@pytest.mark.parametrize("kernel_id", ["softmax", "softmax-naive"])
def test_softmax_dropout_drops_weights_and_rescales(kernel_id):
    p = 0.4
    kernel = build(kernel_id, attn_drop=p)
    nk = 12
    q, k, _ = qkv(10, nk, requires_grad=False)
    v = torch.eye(nk, dtype=F64).expand(B, H, nk, nk)
    weights = kernel.eval()(q, k, v)
    torch.manual_seed(7)
    dropped = kernel.train()(q, k, v)
    zero = dropped == 0
    assert zero.any() and not zero.all()
    # Weights, not keys: some key is dropped for one query and kept for another.
    assert (zero.any(-2) & ~zero.all(-2)).any()
    assert_rel_close(dropped[~zero], weights[~zero] / (1 - p), 1e-12, "kept weights")
