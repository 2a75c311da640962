"""Bad input to ``taylor_shift_attention`` and the edge cases that must still work.

Every refused call must raise ``TypeError`` or ``ValueError`` with a message that names the
argument, what was expected and what came (SPEC §8); each case below matches the argument
name and the actual value or shape. The edge cases (empty sequences, dv = 0, fully masked
rows, zero vectors) must give finite outputs and gradients, never NaN (SPEC §2).
"""

from __future__ import annotations

import re

import pytest
import torch

from taylorshift import naive_taylor_shift_attention, taylor_shift_attention
from tests.helpers import assert_rel_close

# query (B, H, Nq, d) = (2, 3, 4, 5); key (2, 3, 6, 5); value (2, 3, 6, 2).
B, H, NQ, NK, D, DV = 2, 3, 4, 6, 5, 2
F64 = torch.float64
# 'meta' tensors have shapes and dtypes but no data: a second device on any machine.
META = torch.device("meta")


def _qkv(nq=NQ, nk=NK, d=D, dv=DV, b=B, h=H, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g, dtype=F64)
    k = torch.randn(b, h, nk, d, generator=g, dtype=F64)
    v = torch.randn(b, h, nk, dv, generator=g, dtype=F64)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def _call(**overrides):
    """taylor_shift_attention on valid defaults, with the named arguments replaced."""
    q, k, v = _qkv()
    args = dict(query=q, key=k, value=v, attn_mask=None, is_causal=False)
    args.update(overrides)
    return taylor_shift_attention(**args)


def _q():
    return _qkv()[0]


def _k():
    return _qkv()[1]


def _v():
    return _qkv()[2]


def _shape(*dims):
    """The regex for a shape as the messages print it: (2, 3, 6, 5)."""
    return re.escape("(" + ", ".join(str(s) for s in dims) + ")")


def _query_varying_mask():
    # Lower-triangular: row i attends keys 0..i, so the rows differ.
    return torch.ones(NQ, NK, dtype=torch.bool).tril()


# (id, overrides as a function so that each case builds fresh tensors, type, pattern)
CASES = [
    # Not tensors.
    ("query-list", lambda: dict(query=[[1.0]]), TypeError, r"query must be a torch\.Tensor.*list"),
    ("key-float", lambda: dict(key=1.5), TypeError, r"key must be a torch\.Tensor.*float"),
    ("value-none", lambda: dict(value=None), TypeError, r"value must be a torch\.Tensor.*NoneType"),
    # Wrong number of dims.
    (
        "query-3d",
        lambda: dict(query=_q()[0]),
        ValueError,
        rf"query must be 4-D.*\(B, H, Nq, d\).*3-D tensor of shape {_shape(3, 4, 5)}",
    ),
    (
        "key-5d",
        lambda: dict(key=_k()[None]),
        ValueError,
        rf"key must be 4-D.*\(B, H, Nk, d\).*5-D tensor of shape {_shape(1, 2, 3, 6, 5)}",
    ),
    (
        "value-2d",
        lambda: dict(value=_v()[0, 0]),
        ValueError,
        rf"value must be 4-D.*\(B, H, Nk, dv\).*2-D tensor of shape {_shape(6, 2)}",
    ),
    # Batch and heads.
    (
        "key-batch",
        lambda: dict(key=_k()[:1]),
        ValueError,
        rf"key must have the batch and head sizes of query.*{_shape(2, 3)}.*{_shape(1, 3, 6, 5)}",
    ),
    (
        "key-heads",
        lambda: dict(key=_k()[:, :2]),
        ValueError,
        rf"key must have the batch and head sizes of query.*{_shape(2, 3)}.*{_shape(2, 2, 6, 5)}",
    ),
    (
        "value-batch",
        lambda: dict(value=_v()[:1]),
        ValueError,
        rf"value must have the batch and head sizes.*{_shape(2, 3)}.*{_shape(1, 3, 6, 2)}",
    ),
    (
        "value-heads",
        lambda: dict(value=_v()[:, :1]),
        ValueError,
        rf"value must have the batch and head sizes.*{_shape(2, 3)}.*{_shape(2, 1, 6, 2)}",
    ),
    # Tokens and head dims.
    (
        "value-tokens",
        lambda: dict(value=_v()[:, :, :5]),
        ValueError,
        rf"value must have as many tokens as key \(Nk = 6\).*{_shape(2, 3, 5, 2)}",
    ),
    (
        "key-head-dim",
        lambda: dict(key=_k()[..., :4]),
        ValueError,
        rf"key must have the head dim of query \(d = 5\).*{_shape(2, 3, 6, 4)}",
    ),
    (
        "head-dim-zero",
        lambda: dict(query=_q()[..., :0], key=_k()[..., :0]),
        ValueError,
        rf"head dim d >= 1.*query of shape {_shape(2, 3, 4, 0)}",
    ),
    # Dtypes.
    (
        "query-int",
        lambda: dict(query=_q().to(torch.int64)),
        TypeError,
        r"query must have a floating dtype.*torch\.int64",
    ),
    (
        "value-int",
        lambda: dict(value=_v().to(torch.int32)),
        TypeError,
        r"value must have a floating dtype.*torch\.int32",
    ),
    (
        "key-dtype",
        lambda: dict(key=_k().float()),
        TypeError,
        r"key must have the dtype of query \(torch\.float64\).*torch\.float32",
    ),
    (
        "value-dtype",
        lambda: dict(value=_v().half()),
        TypeError,
        r"value must have the dtype of query \(torch\.float64\).*torch\.float16",
    ),
    # Devices.
    (
        "key-device",
        lambda: dict(key=_k().to(META)),
        ValueError,
        r"key must be on the device of query \(cpu\).*meta",
    ),
    (
        "value-device",
        lambda: dict(value=_v().to(META)),
        ValueError,
        r"value must be on the device of query \(cpu\).*meta",
    ),
    # Flags.
    ("is_causal-int", lambda: dict(is_causal=1), TypeError, r"is_causal must be a bool; got 1"),
    (
        "is_causal-str",
        lambda: dict(is_causal="yes"),
        TypeError,
        r"is_causal must be a bool; got 'yes'",
    ),
    ("normalize-int", lambda: dict(normalize=0), TypeError, r"normalize must be a bool; got 0"),
    (
        "normalize-none",
        lambda: dict(normalize=None),
        TypeError,
        r"normalize must be a bool; got None",
    ),
    # Order.
    ("order-float", lambda: dict(order=2.0), TypeError, r"order must be an int >= 2; got 2\.0"),
    ("order-bool", lambda: dict(order=True), TypeError, r"order must be an int >= 2; got True"),
    ("order-odd", lambda: dict(order=3), ValueError, r"order must be an even int >= 2.*got 3"),
    ("order-zero", lambda: dict(order=0), ValueError, r"order must be an int >= 2; got 0"),
    ("order-negative", lambda: dict(order=-2), ValueError, r"order must be an int >= 2; got -2"),
    # Mode.
    ("mode-unknown", lambda: dict(mode="fast"), ValueError, r"mode must be one of.*'fast'"),
    ("mode-case", lambda: dict(mode="Direct"), ValueError, r"mode must be one of.*'Direct'"),
    (
        "efficient-order-4",
        lambda: dict(mode="efficient", order=4),
        ValueError,
        r"mode='efficient' supports order=2 only; got order=4.*mode='direct'",
    ),
    (
        "efficient-query-mask",
        lambda: dict(mode="efficient", attn_mask=_query_varying_mask()),
        ValueError,
        r"attn_mask varies over queries.*mode='efficient'"
        r".*got attn_mask of shape \(.*\).*use mode='direct'",
    ),
    # Masks.
    (
        "mask-float",
        lambda: dict(attn_mask=torch.zeros(NQ, NK, dtype=F64)),
        TypeError,
        r"attn_mask must be a bool tensor.*torch\.float64.*additive",
    ),
    (
        "mask-int",
        lambda: dict(attn_mask=torch.ones(NQ, NK, dtype=torch.int64)),
        TypeError,
        r"attn_mask must be a bool tensor.*torch\.int64",
    ),
    ("mask-list", lambda: dict(attn_mask=[True]), TypeError, r"attn_mask must be a bool.*list"),
    (
        "mask-not-broadcastable",
        lambda: dict(attn_mask=torch.ones(B, 1, 1, NK - 1, dtype=torch.bool)),
        ValueError,
        rf"attn_mask must broadcast to \(B, H, Nq, Nk\) = {_shape(2, 3, 4, 6)}.*"
        rf"{_shape(2, 1, 1, 5)}",
    ),
    (
        "mask-wrong-batch",
        lambda: dict(attn_mask=torch.ones(3, 1, 1, NK, dtype=torch.bool)),
        ValueError,
        rf"attn_mask must broadcast.*{_shape(2, 3, 4, 6)}.*{_shape(3, 1, 1, 6)}",
    ),
    (
        "mask-5d",
        lambda: dict(attn_mask=torch.ones(1, B, H, NQ, NK, dtype=torch.bool)),
        ValueError,
        rf"attn_mask must broadcast.*{_shape(2, 3, 4, 6)}.*{_shape(1, 2, 3, 4, 6)}",
    ),
    (
        "mask-device",
        lambda: dict(attn_mask=torch.ones(NK, dtype=torch.bool, device=META)),
        ValueError,
        r"attn_mask must be on the device of query \(cpu\).*meta",
    ),
    # Temperature.
    ("temperature-str", lambda: dict(temperature="2"), TypeError, r"temperature.*float.*str"),
    ("temperature-bool", lambda: dict(temperature=True), TypeError, r"temperature.*float.*bool"),
    ("temperature-none", lambda: dict(temperature=None), TypeError, r"temperature.*NoneType"),
    (
        "temperature-inf",
        lambda: dict(temperature=float("inf")),
        ValueError,
        r"temperature must be finite.*inf",
    ),
    (
        "temperature-nan",
        lambda: dict(temperature=float("nan")),
        ValueError,
        r"temperature must be finite.*nan",
    ),
    (
        "temperature-per-query",
        lambda: dict(temperature=torch.ones(B, H, NQ, 1, dtype=F64)),
        ValueError,
        rf"temperature must broadcast to \(B, H, 1, 1\) = {_shape(2, 3, 1, 1)}.*"
        rf"{_shape(2, 3, 4, 1)}",
    ),
    (
        "temperature-heads-last",
        lambda: dict(temperature=torch.ones(H, dtype=F64)),
        ValueError,
        rf"temperature must broadcast.*{_shape(2, 3, 1, 1)}.*shape \(3\)",
    ),
    (
        "temperature-5d",
        lambda: dict(temperature=torch.ones(1, 1, 1, 1, 1, dtype=F64)),
        ValueError,
        rf"temperature must broadcast.*{_shape(1, 1, 1, 1, 1)}",
    ),
    (
        "temperature-int-tensor",
        lambda: dict(temperature=torch.ones(1, H, 1, 1, dtype=torch.int64)),
        TypeError,
        r"temperature must be a float or floating tensor.*torch\.int64",
    ),
    (
        "temperature-device",
        lambda: dict(temperature=torch.ones(1, H, 1, 1, dtype=F64, device=META)),
        ValueError,
        r"temperature must be on the device of query \(cpu\).*meta",
    ),
    # Scale, and which of scale / temperature goes with normalize.
    (
        "scale-with-normalize",
        lambda: dict(scale=0.5),
        ValueError,
        r"scale applies only with normalize=False.*scale=0\.5 with normalize=True",
    ),
    (
        "scale-inf",
        lambda: dict(scale=float("inf"), normalize=False),
        ValueError,
        r"scale must be a finite number or None; got inf",
    ),
    (
        "scale-nan",
        lambda: dict(scale=float("nan"), normalize=False),
        ValueError,
        r"scale must be a finite number or None; got nan",
    ),
    (
        "scale-bool",
        lambda: dict(scale=True, normalize=False),
        TypeError,
        r"scale must be a number or None; got True",
    ),
    (
        "scale-tensor",
        lambda: dict(scale=torch.tensor(0.5), normalize=False),
        TypeError,
        r"scale must be a number or None; got tensor\(0\.5000\)",
    ),
    (
        "temperature-without-normalize",
        lambda: dict(temperature=2.0, normalize=False),
        ValueError,
        r"temperature applies only with normalize=True.*temperature=2\.0 with normalize=False",
    ),
    (
        "temperature-tensor-without-normalize",
        lambda: dict(temperature=torch.ones(1, H, 1, 1, dtype=F64), normalize=False),
        ValueError,
        rf"temperature applies only with normalize=True.*{_shape(1, 3, 1, 1)}.*normalize=False",
    ),
]


@pytest.mark.parametrize(
    "overrides, exc, pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_refused_with_a_clear_message(overrides, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _call(**overrides())


# Sparse (non-strided) tensors would otherwise fail deep inside torch ("Could not run
# 'aten::linalg_vector_norm' with arguments from the 'SparseCPU' backend") without naming
# the argument.
SPARSE_CASES = [
    ("query", lambda: dict(query=_q().to_sparse())),
    ("key", lambda: dict(key=_k().to_sparse())),
    ("value", lambda: dict(value=_v().to_sparse())),
    ("attn_mask", lambda: dict(attn_mask=torch.ones(B, 1, 1, NK, dtype=torch.bool).to_sparse())),
    ("temperature", lambda: dict(temperature=torch.ones(1, H, 1, 1, dtype=F64).to_sparse())),
]


@pytest.mark.parametrize("mode", ["direct", "efficient"])
@pytest.mark.parametrize(
    "name, overrides", SPARSE_CASES, ids=[f"sparse-{c[0]}" for c in SPARSE_CASES]
)
def test_sparse_tensors_are_refused(name, overrides, mode):
    with pytest.raises(TypeError, match=rf"{name} must be a dense.*torch\.sparse_coo"):
        _call(mode=mode, **overrides())


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_nested_tensors_are_refused():
    """A nested tensor has the strided layout, so the layout test let it through to a torch
    internal error."""
    for layout in (torch.strided, torch.jagged):
        rows = torch.nested.nested_tensor([_q()[0], _q()[1]], layout=layout)
        with pytest.raises(TypeError, match=r"query must be a dense \(strided\) tensor; got a"):
            _call(query=rows)


# The baselines check their inputs as the op does (they reached torch's own errors, or
# accepted a float mask as a multiplier, a 5-D mask, a string is_causal).
def _baselines():
    from taylorshift.ops.holt import holt_attention
    from taylorshift.ops.linear_attention import linear_attention

    return [
        ("linear", linear_attention),
        ("holt", holt_attention),
        ("holt-subtract-one", lambda *a, **k: holt_attention(*a, subtract_one=True, **k)),
    ]


@pytest.mark.parametrize("which", ["linear", "holt", "holt-subtract-one"])
def test_baselines_refuse_bad_input_naming_the_argument(which):
    op = dict(_baselines())[which]
    q, k, v = _qkv()
    ones = torch.ones(B, 1, 1, NK, dtype=torch.bool)
    cases = [
        ((q, k, v, ones.double()), {}, TypeError, r"attn_mask must be a bool tensor"),
        ((q, k, v, ones[None]), {}, ValueError, r"attn_mask must broadcast to \(B, H, Nq, Nk\)"),
        ((q, k, v, ones[..., :3]), {}, ValueError, r"attn_mask must broadcast to"),
        ((q, k, v, None, "yes"), {}, TypeError, r"is_causal must be a bool; got 'yes'"),
        ((q, k[..., :3], v), {}, ValueError, r"key must have the head dim of query"),
        ((q, k.float(), v), {}, TypeError, r"key must have the dtype of query"),
        ((q[0], k, v), {}, ValueError, r"query must be 4-D"),
        ((q, k, v), {"eps": 0.0}, ValueError, r"eps must be a number > 0; got 0\.0"),
    ]
    for args, kwargs, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            op(*args, **kwargs)


def test_holt_options_are_checked():
    from taylorshift.ops.holt import holt_attention

    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"alpha must be a number > 0; got 0"):
        holt_attention(q, k, v, alpha=0)
    with pytest.raises(TypeError, match=r"subtract_one must be a bool; got 'no'"):
        holt_attention(q, k, v, subtract_one="no")


@pytest.mark.parametrize("mode", ["direct", "efficient", "auto"])
def test_checks_run_in_every_mode(mode):
    # The validation is shared: a bad call fails the same way whichever form was asked for.
    with pytest.raises(TypeError, match=r"key must have the dtype of query.*torch\.float32"):
        _call(key=_k().float(), mode=mode)
    with pytest.raises(ValueError, match=r"order must be an even int >= 2.*got 3"):
        _call(order=3, mode=mode)


def test_float_one_temperature_is_accepted_without_normalize():
    # temperature=1 (the default, also as an int) means "no temperature", so it is no error.
    q, k, v = _qkv()
    ref = naive_taylor_shift_attention(q, k, v, normalize=False)
    for t in (1.0, 1):
        y = taylor_shift_attention(q, k, v, temperature=t, normalize=False)
        assert_rel_close(y, ref, 1e-12, f"temperature={t!r}")


# ---- Edge cases that must work ------------------------------------------------------------

MODES = ["direct", "efficient"]


def _grads(y, inputs):
    """Gradients of a random projection of y; a projection by ones hides cancellations."""
    g_out = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=y.dtype)
    return torch.autograd.grad(y, inputs, g_out)


def _temperature():
    return torch.tensor([0.7, 1.3, 2.0], dtype=F64).view(1, H, 1, 1).requires_grad_()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", MODES)
def test_no_queries_gives_empty_output(mode, causal):
    q, k, v = _qkv(nq=0, requires_grad=True)
    t = _temperature()
    y = taylor_shift_attention(q, k, v, None, causal, temperature=t, mode=mode)
    assert y.shape == (B, H, 0, DV)
    assert y.dtype == F64
    for x, g in zip((q, k, v, t), _grads(y, [q, k, v, t]), strict=True):
        assert g.shape == x.shape
        assert torch.equal(g, torch.zeros_like(x))


@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain-scores"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", MODES)
def test_no_keys_gives_zeros_and_finite_gradients(mode, causal, normalize):
    q, k, v = _qkv(nk=0, requires_grad=True)
    inputs = [q, k, v]
    kwargs = dict(normalize=normalize, mode=mode)
    if normalize:
        kwargs["temperature"] = t = _temperature()
        inputs.append(t)
    y = taylor_shift_attention(q, k, v, None, causal, **kwargs)
    assert y.shape == (B, H, NQ, DV)
    assert torch.equal(y, torch.zeros_like(y))
    for x, g in zip(inputs, _grads(y, inputs), strict=True):
        assert g.shape == x.shape
        assert torch.equal(g, torch.zeros_like(x)), "nothing depends on the inputs"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", MODES)
def test_no_keys_with_a_key_mask(mode, causal):
    q, k, v = _qkv(nk=0)
    y = taylor_shift_attention(q, k, v, torch.ones(B, 1, 1, 0, dtype=torch.bool), causal, mode=mode)
    assert torch.equal(y, torch.zeros(B, H, NQ, DV, dtype=F64))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", MODES)
def test_value_dim_zero(mode, causal):
    q, k, v = _qkv(dv=0, requires_grad=True)
    y = taylor_shift_attention(q, k, v, None, causal, mode=mode)
    assert y.shape == (B, H, NQ, 0)
    assert y.dtype == F64
    for name, x, g in zip("qkv", (q, k, v), _grads(y, [q, k, v]), strict=True):
        assert g.shape == x.shape
        # an output of no elements depends on nothing: exact zeros, not merely finite
        assert torch.equal(g, torch.zeros_like(x)), f"gradient of {name}"


def _degenerate_problem(seed=0):
    """Fully masked rows and zero query and key vectors, (B, H) = (2, 3), N = 6.

    Batch 0 attends nothing (every row empty); batch 1 has its first two keys padded, so
    under is_causal its rows 0 and 1 are empty as well. Zero vectors: query 1 and key 2 of
    (batch, head) (0, 0), and in batch 1, which attends, query 4 of head 1 and key 3 of head 2.
    """
    q, k, v = _qkv(nq=NK, seed=seed)
    q[0, 0, 1] = 0.0
    k[0, 0, 2] = 0.0
    k[1, 2, 3] = 0.0
    q[1, 1, 4] = 0.0
    mask = torch.ones(B, 1, 1, NK, dtype=torch.bool)
    mask[0] = False
    mask[1, :, :, :2] = False
    return [x.requires_grad_() for x in (q, k, v)], mask


@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain-scores"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_masked_rows_and_zero_vectors_give_no_nan(causal, normalize):
    (q, k, v), mask = _degenerate_problem()
    inputs = [q, k, v]
    kwargs = dict(normalize=normalize)
    if normalize:
        kwargs["temperature"] = t = _temperature()
        inputs.append(t)

    ref = naive_taylor_shift_attention(q, k, v, mask, causal, **kwargs)
    ref_grads = _grads(ref, inputs)
    results = {}
    for mode in MODES:
        y = taylor_shift_attention(q, k, v, mask, causal, mode=mode, **kwargs)
        results[mode] = (y, _grads(y, inputs))

    for mode, (y, grads) in results.items():
        assert torch.isfinite(y).all(), f"{mode}: output"
        # Batch 0 attends nothing: its rows are zeros.
        assert torch.equal(y[0], torch.zeros_like(y[0])), f"{mode}: empty rows"
        if causal:
            assert torch.equal(y[1, :, :2], torch.zeros_like(y[1, :, :2])), mode
        assert_rel_close(y, ref, 1e-10, f"{mode} output")
        for name, g, g_ref in zip("qkvt", grads, ref_grads, strict=False):
            assert torch.isfinite(g).all(), f"{mode}: gradient of {name}"
            assert_rel_close(g, g_ref, 1e-9, f"{mode} gradient of {name}")
        # Padded keys get no gradient, exactly: they are excluded from every sum (batch 0:
        # all keys, batch 1: keys 0 and 1). The queries of empty rows (batch 0; under
        # is_causal batch 1's rows 0 and 1) give zeros whatever they hold: no gradient.
        g_q, g_k, g_v = grads[:3]
        for name, g in (("key", g_k), ("value", g_v)):
            assert torch.equal(g[0], torch.zeros_like(g[0])), f"{mode}: grad of {name}, batch 0"
            padded = g[1, :, :2]
            assert torch.equal(padded, torch.zeros_like(padded)), f"{mode}: grad of {name}"
            assert g[1, :, 2:].abs().amax() > 0, f"{mode}: {name}s attended get a gradient"
        assert torch.equal(g_q[0], torch.zeros_like(g_q[0])), f"{mode}: grad of query, batch 0"
        early = g_q[1, :, :2]
        if causal:
            assert torch.equal(early, torch.zeros_like(early)), f"{mode}: grad of empty rows"
        else:
            assert early.abs().amax() > 0, f"{mode}: rows 0, 1 attend keys 2-5"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", MODES)
def test_all_keys_masked_everywhere(mode, causal):
    q, k, v = _qkv(requires_grad=True)
    t = _temperature()
    mask = torch.zeros(NK, dtype=torch.bool)
    y = taylor_shift_attention(q, k, v, mask, causal, temperature=t, mode=mode)
    assert torch.equal(y, torch.zeros_like(y))
    for name, g in zip("qkvt", _grads(y, [q, k, v, t]), strict=True):
        assert torch.equal(g, torch.zeros_like(g)), f"gradient of {name}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_expanded_key_padding_mask_is_accepted_by_efficient(causal):
    # A key-padding mask given as (B, 1, Nq, Nk) with equal rows, as code written for SDPA
    # often passes it, is still a key-padding mask.
    q, k, v = _qkv(nq=NK, requires_grad=True)
    lengths = torch.tensor([4, 6])
    pad = torch.arange(NK)[None, :] < lengths[:, None]  # (B, Nk)
    expanded = pad[:, None, None, :].expand(B, 1, NK, NK)
    y = taylor_shift_attention(q, k, v, expanded, causal, mode="efficient")
    ref = naive_taylor_shift_attention(q, k, v, pad[:, None, None, :], causal)
    assert_rel_close(y, ref, 1e-10, "output")
    for name, g, g_ref in zip("qkv", _grads(y, [q, k, v]), _grads(ref, [q, k, v]), strict=True):
        assert_rel_close(g, g_ref, 1e-9, f"gradient of {name}")
    # The same mask materialised per head (B, H, Nq, Nk) is also accepted.
    full = expanded.expand(B, H, NK, NK).contiguous()
    y_full = taylor_shift_attention(q, k, v, full, causal, mode="efficient")
    assert_rel_close(y_full, ref, 1e-10, "output, (B, H, Nq, Nk) mask")


# normalize=False: unbounded scores whose Taylor sums would overflow float32 are refused.


@pytest.mark.parametrize("mode", ["direct", "efficient"])
def test_plain_scores_that_would_overflow_are_refused(mode):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 16, generator=g) for _ in range(3))
    big = 3e9  # float32 gives NaN here without the check
    with pytest.raises(ValueError, match=r"normalize=False give scores up to .* overflow"):
        taylor_shift_attention(q * big, k * big, v, normalize=False, mode=mode)
    # a huge key under a tiny query: moderate scores, but k_a k_b overflows the state
    with pytest.raises(ValueError, match=r"key norms up to"):
        taylor_shift_attention(q * 1e-20, k * 1e20, v, normalize=False, mode=mode)


@pytest.mark.parametrize("mode", ["direct", "efficient"])
def test_large_plain_scores_below_the_bound_are_computed_right(mode):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 64, 16, generator=g) for _ in range(3))
    q, k = q * 1e8, k * 1e8
    out = taylor_shift_attention(q, k, v, normalize=False, mode=mode)
    want = naive_taylor_shift_attention(q.double(), k.double(), v.double(), normalize=False)
    assert_rel_close(out, want, 1e-5)


@pytest.mark.parametrize("forms", ["kernels", "pytorch"])
@pytest.mark.parametrize("mode", MODES)
def test_plain_score_bound_ignores_masked_keys_and_float64(mode, forms, monkeypatch):
    if forms == "pytorch":  # (as well: the efficient CPU kernel skips masked keys by itself)
        monkeypatch.setenv("TAYLORSHIFT_CPU_KERNELS", "off")
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 1, 8, 4, generator=g) for _ in range(3))
    keep = torch.ones(1, 1, 1, 8, dtype=torch.bool)
    keep[..., -1] = False
    real = [t.double() for t in (k[..., :7, :], v[..., :7, :])]
    want = naive_taylor_shift_attention(q.double(), *real, normalize=False)
    # Padding content never counts: a key of norm 1e30 (past the bound, were it counted),
    # other random content, NaN and inf in the padded key and value all give the same
    # output, that of the seven real keys alone.
    outputs = {}
    for name, padded_k, padded_v in [
        ("1e30", 1e30, 1.0),
        ("random", torch.randn(4, generator=g), torch.randn(4, generator=g)),
        ("zero", 0.0, 0.0),
        ("nan", float("nan"), float("nan")),
        ("inf", float("inf"), float("-inf")),
    ]:
        k_pad, v_pad = k.clone(), v.clone()
        k_pad[..., -1, :], v_pad[..., -1, :] = padded_k, padded_v
        outputs[name] = taylor_shift_attention(q, k_pad, v_pad, keep, normalize=False, mode=mode)
        assert_rel_close(outputs[name], want, 1e-5, f"padded content {name}")
    for name, out in outputs.items():
        assert torch.equal(out, outputs["zero"]), f"padded content {name} changed the output"
    # float64 has the range: scores of order 1e18 are computed (not refused), and right
    q64, k64, v64 = q.double() * 1e9, k.double() * 1e9, v.double()
    huge = taylor_shift_attention(q64, k64, v64, normalize=False, mode=mode)
    want = naive_taylor_shift_attention(q64, k64, v64, normalize=False)
    assert_rel_close(huge, want, 1e-10, "float64 plain scores of order 1e18")
