"""Attention layers: parameter counts of the projection variants (SPEC §4), padded batches,
``super``'s fixed context, cross-attention, masks, constructor checks, timm's signature.
"""

from __future__ import annotations

import copy
import inspect
import math

import pytest
import torch
from torch import nn

from taylorshift import naive_taylor_shift_attention
from taylorshift.nn import PROJECTIONS, Attention, TaylorShiftAttention
from tests.helpers import assert_rel_close, rel_error
from tests.nn.cases import (
    F64,
    KERNEL_IDS,
    PROJECTION_IDS,
    make_attention,
    padding,
    param_grads,
    randn,
    spread_temperature,
)

RTOL = 1e-10
DIM, HEADS = 12, 3


def projection_params(module: nn.Module) -> int:
    """Parameters of the projections around the kernel (the kernel's own excluded)."""
    return sum(p.numel() for n, p in module.named_parameters() if not n.startswith("kernel."))


# ---------------------------------------------------------------------------------------
# Parameter counts (Hosseini et al., SPEC §4).

# (d_m, heads, ℓ, projection, parameters of one layer with biases)
PAPER_COUNTS = [
    (128, 8, 64, "standard", 66_048),
    (128, 8, 64, "optimized", 49_536),
    (128, 8, 64, "query-only", 33_024),
    (128, 8, 64, "super", 37_184),
    (32, 4, 32, "standard", 4_224),
    (32, 4, 32, "optimized", 3_168),
    (32, 4, 32, "query-only", 2_112),
    (32, 4, 32, "super", 3_168),
    (768, 12, None, "standard", 2_362_368),
]


@pytest.mark.parametrize(
    "dim, heads, ell, projection, expected",
    PAPER_COUNTS,
    ids=[f"dm{c[0]}-l{c[2]}-{c[3]}" for c in PAPER_COUNTS],
)
def test_parameter_counts_match_the_paper(dim, heads, ell, projection, expected):
    context_len = ell if projection == "super" else None
    kwargs = dict(qkv_bias=True, projection=projection, context_len=context_len)
    taylor = Attention(dim, heads, **kwargs)
    assert projection_params(taylor) == expected
    # The taylorshift kernel adds one temperature per head, nothing else.
    assert sum(p.numel() for p in taylor.kernel.parameters()) == heads
    assert sum(p.numel() for p in taylor.parameters()) == expected + heads
    softmax = Attention(dim, heads, attn_kernel="softmax", **kwargs)
    assert sum(p.numel() for p in softmax.parameters()) == expected


def test_formula_counts_for_other_widths():
    for dim, ell in [(48, 20), (96, 7)]:
        counts = {
            p: projection_params(
                Attention(
                    dim, 4, qkv_bias=True, projection=p, context_len=ell if p == "super" else None
                )
            )
            for p in PROJECTIONS
        }
        base = dim * dim + dim
        assert counts == {
            "standard": 4 * base,
            "optimized": 3 * base,
            "query-only": 2 * base,
            "super": 2 * base + ell * ell + ell,
        }


# ---------------------------------------------------------------------------------------
# A padded batch equals its sequences run one by one.


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("projection", PROJECTION_IDS)
@pytest.mark.parametrize("kernel_id", KERNEL_IDS)
def test_padded_batch_equals_sequences_one_by_one(kernel_id, projection, causal):
    module = make_attention(kernel_id, projection, DIM, HEADS, context_len=10)
    lengths = [7, 3, 9]
    x = randn(3, 9, DIM, seed=1)  # the padded positions hold random tokens
    y = module(x, attn_mask=padding(lengths, 9), is_causal=causal)
    assert y.shape == x.shape
    for b, n in enumerate(lengths):
        alone = module(x[b : b + 1, :n], is_causal=causal)
        assert_rel_close(y[b, :n], alone[0], RTOL, f"sequence {b} (length {n})")


@pytest.mark.parametrize("kernel_id", KERNEL_IDS)
def test_a_mask_that_does_not_broadcast_is_refused_by_every_kernel(kernel_id):
    """(SDPA and the baselines reached torch's own shape errors, or broadcast a 5-D mask.)"""
    module = make_attention(kernel_id, "standard", DIM, HEADS)
    x = randn(2, 5, DIM, seed=1)
    for shape in [(2, 1, 5, 4), (2, HEADS + 1, 5, 5), (1, 2, 1, 1, 5)]:
        with pytest.raises(ValueError, match=r"attn_mask must be \(B, Nk\) key padding or"):
            module(x, attn_mask=torch.ones(shape, dtype=torch.bool))
    assert module(x, attn_mask=torch.ones(2, 1, 5, 5, dtype=torch.bool)).shape == x.shape


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("taps", [1, 2, 3, 4])
@pytest.mark.parametrize("kernel_id", ["taylorshift-efficient", "softmax"])
def test_short_conv_padded_batch_equals_sequences_one_by_one(kernel_id, taps, causal):
    conv = make_attention(kernel_id, "standard", DIM, HEADS, short_conv=taps)
    lengths = [7, 3, 9]
    x = randn(3, 9, DIM, seed=1)
    y = conv(x, attn_mask=padding(lengths, 9), is_causal=causal)
    for b, n in enumerate(lengths):
        alone = conv(x[b : b + 1, :n], is_causal=causal)
        assert_rel_close(y[b, :n], alone[0], RTOL, f"sequence {b} (length {n})")


@pytest.mark.parametrize("form", ["per-head", "per-query", "3-D"])
def test_short_conv_reads_no_padding_whatever_form_the_mask_takes(form):
    """Key padding given in the kernels' broadcast form, (B, H, 1, N), (B, 1, N, N) or
    (1, 1, N) (every batch item the same) keeps padded tokens out of the taps as (B, N)
    does (they leaked through the convolution, or the 3-D mask raised IndexError)."""
    conv = make_attention("taylorshift-efficient", "standard", DIM, HEADS, short_conv=3)
    lengths = [7, 3, 9] if form != "3-D" else [6, 6, 6]
    x = randn(3, 9, DIM, seed=1)
    keys = padding(lengths, 9)  # (B, N)
    mask = {
        "per-head": keys[:, None, None, :].expand(3, HEADS, 1, 9),
        "per-query": keys[:, None, None, :].expand(3, 1, 9, 9),
        "3-D": keys[:1, None, :],
    }[form]
    y = conv(x, attn_mask=mask)
    for b, n in enumerate(lengths):
        alone = conv(x[b : b + 1, :n])
        assert_rel_close(y[b, :n], alone[0], RTOL, f"sequence {b} (length {n})")


# Layers where a token's result depends on where the other real tokens sit: the short
# convolution, the local heads' windows, W_A. (name, kernel id, projection, layer settings)
POSITIONAL = [
    ("conv-taylor", "taylorshift-efficient", "standard", {"short_conv": 3}),
    ("conv-softmax", "softmax", "optimized", {"short_conv": 2}),
    ("local-heads", "taylorshift-direct", "standard", {}),
    ("super", "taylorshift-direct", "super", {}),
]
# each row's real tokens: padding before them, between them, after them
PLACES = {
    "left": [[0, 0, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1, 1, 1]],
    "between": [[1, 0, 1, 1, 0, 0, 1, 1, 1], [0, 1, 1, 0, 1, 0, 1, 0, 1]],
    "right": [[1, 1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0, 0]],
}


def positional_layer(name: str) -> Attention:
    _, kernel_id, projection, settings = next(c for c in POSITIONAL if c[0] == name)
    module = make_attention(kernel_id, projection, DIM, HEADS, **settings)
    if name == "local-heads":  # the first head a sliding window of 2 tokens
        torch.manual_seed(0)
        module = Attention(DIM, HEADS, qkv_bias=True, dtype=F64,
                           kernel_args={"local_heads": 1, "window": 2})  # fmt: skip
    for p in module.parameters():  # large enough that every tap and row shows
        p.data.normal_(0, 0.5, generator=torch.Generator().manual_seed(p.numel()))
    return module


@pytest.mark.parametrize("place", list(PLACES))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", [c[0] for c in POSITIONAL])
def test_padding_anywhere_equals_the_real_tokens_alone(name, causal, place):
    """Padding before or between real tokens counts as absent, as after them: the output
    and the input gradient at the real tokens are those of the real tokens run alone."""
    module = positional_layer(name)
    mask = torch.tensor(PLACES[place], dtype=torch.bool)
    x = randn(2, 9, DIM, seed=3, requires_grad=True)
    g = randn(2, 9, DIM, seed=4) * mask[..., None]  # (padded rows' outputs are not used)
    y = module(x, attn_mask=mask, is_causal=causal)
    (gx,) = torch.autograd.grad(y, x, g)
    for b in range(2):
        real = mask[b].nonzero()[:, 0]
        xb = x[b : b + 1, real].detach().requires_grad_()
        alone = module(xb, is_causal=causal)
        (g_alone,) = torch.autograd.grad(alone, xb, g[b : b + 1, real])
        assert_rel_close(y[b, real], alone[0], RTOL, f"row {b}: output")
        assert_rel_close(gx[b, real], g_alone[0], RTOL, f"row {b}: input gradient")


# The same key padding in the mask forms that broadcast to (B, H, Nq, Nk) like (B, N):
# only (B, N) and (B, 1, 1, N) put the real tokens first; the others left the taps, W_A and
# the windows reading padding slots.
PADDING_FORMS = {
    "(B,H,1,N)": lambda keys: keys[:, None, None, :].expand(-1, HEADS, 1, -1),
    "(B,1,N,N)": lambda keys: keys[:, None, None, :].expand(-1, 1, keys.shape[1], -1),
    "(1,N,N) 3-D": lambda keys: keys[:1, None, :].expand(-1, keys.shape[1], -1),
    "(1,1,N) 3-D": lambda keys: keys[:1, None, :],
}


@pytest.mark.parametrize("form", list(PADDING_FORMS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", [c[0] for c in POSITIONAL])
def test_padding_inside_in_any_mask_form_equals_the_real_tokens_alone(name, causal, form):
    module = positional_layer(name)
    keys = torch.tensor(PLACES["between"][:1], dtype=torch.bool)  # (1, N): one row
    x = randn(1, 9, DIM, seed=3)
    y = module(x, attn_mask=PADDING_FORMS[form](keys), is_causal=causal)
    real = keys[0].nonzero()[:, 0]
    alone = module(x[:, real], is_causal=causal)
    assert_rel_close(y[0, real], alone[0], RTOL, "real rows")


@pytest.mark.parametrize("fill", [math.inf, math.nan], ids=["inf", "nan"])
@pytest.mark.parametrize(
    "name", [c[0] for c in POSITIONAL if c[0] != "conv-softmax"] + ["linear", "holt"]
)
def test_an_inf_or_nan_in_padding_reaches_no_real_token(name, fill):
    # Zeroing padding by a multiplication gave 0 · inf = NaN in every real row (the short
    # convolution, W_A, the local heads' windows, linear attention's sums).
    if name in ("linear", "holt"):
        module = make_attention(name, "standard", DIM, HEADS)
    else:
        module = positional_layer(name)
    mask = torch.tensor(PLACES["between"], dtype=torch.bool)
    x = randn(2, 9, DIM, seed=3).masked_fill(~mask[..., None], fill)
    for causal in (False, True):
        y = module(x, attn_mask=mask, is_causal=causal)
        for b in range(2):
            real = mask[b].nonzero()[:, 0]
            alone = module(x[b : b + 1, real], is_causal=causal)
            assert_rel_close(y[b, real], alone[0], RTOL, f"row {b}, causal={causal}")


def test_padding_inside_reads_cpu_masks_only():
    from taylorshift.ops.masks import padding_inside

    right, left = (torch.tensor(PLACES[p], dtype=torch.bool) for p in ("right", "left"))
    assert not padding_inside(right) and padding_inside(left)
    # elsewhere it reads nothing (no device sync per layer) and says True: the caller
    # permutes, the identity for right padding (meta stands in for an accelerator)
    assert padding_inside(right.to("meta"))


# positional layers and the decoding caches they take
DECODING = [("conv-taylor", "state"), ("conv-taylor", "kv"), ("conv-softmax", "kv"),
            ("local-heads", "state"), ("local-heads", "kv")]  # fmt: skip


@pytest.mark.parametrize(("name", "kind"), DECODING)
def test_decoding_after_a_prompt_padded_anywhere_equals_the_real_tokens_alone(name, kind):
    """A prompt block padded on the left or between its tokens, then two more blocks: each
    real token's row equals the causal forward over the real tokens so far (the short
    convolution's cache keeps the last real tokens, not the block's last slots)."""
    module = positional_layer(name).eval()
    mask = torch.tensor(PLACES["left"] + PLACES["between"], dtype=torch.bool)[[0, 2, 3]]
    x = randn(3, 13, DIM, seed=5)
    cache = module.new_cache(kind)
    steps = [module.decode(x[:, :9], cache, mask)]
    steps.append(module.decode(x[:, 9:11], cache, torch.tensor([[1, 0], [1, 1], [0, 1]]) > 0))
    steps.append(module.decode(x[:, 11:], cache))
    got = torch.cat(steps, dim=1)
    full = torch.cat([mask, torch.tensor([[1, 0], [1, 1], [0, 1]]) > 0,
                      torch.ones(3, 2, dtype=torch.bool)], dim=1)  # fmt: skip
    for b in range(3):
        real = full[b].nonzero()[:, 0]
        alone = module(x[b : b + 1, real], is_causal=True)
        assert_rel_close(got[b, real], alone[0], RTOL, f"row {b}")


@pytest.mark.parametrize(("name", "kind"), DECODING)
def test_decode_refuses_a_bad_mask_or_another_batch_before_the_cache_changes(name, kind):
    # Each raised from deep inside torch (or, a float mask of ones, passed), and a key/value
    # cache of three rows stepped with one took the token into every row before failing.
    module = positional_layer(name).eval()
    x = randn(3, 5, DIM, seed=5)
    cache = module.new_cache(kind)
    module.decode(x, cache)
    before = copy.deepcopy(cache)
    bad = {
        "shape": (x, torch.ones(3, 4, dtype=torch.bool), ValueError,
                  r"key_padding_mask must be \(B, T\) = \(3, 5\); got \(3, 4\)"),
        "dtype": (x, torch.ones(3, 5), TypeError,
                  r"key_padding_mask must be a bool tensor \(B, T\).*got torch.float32"),
        "batch": (x[:1], None, ValueError,
                  r"cache holds tokens of a batch of 3 sequences; got a batch of 1"),
    }  # fmt: skip
    for what, (tokens, mask, error, match) in bad.items():
        with pytest.raises(error, match=match):
            module.decode(tokens, cache, mask)
        for was, now in zip(_held(before), _held(cache), strict=True):  # nothing written
            assert type(was) is type(now), what
            assert torch.equal(was, now) if isinstance(was, torch.Tensor) else was == now, what
    module.decode(x, cache)  # the cache still serves its batch


def _held(cache) -> list:
    """What a decoding cache holds (not the unused room of its buffers)."""
    if hasattr(cache, "keys"):
        return [cache.length, cache.keys, cache.values, cache.mask, cache.conv]
    return [cache.state.sums, cache.conv, *(cache.window or ())]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_short_conv_mixes_the_tokens_it_should(causal):
    # Taps (a, b, c) over channels: causal q'_i = a q_{i-2} + b q_{i-1} + c q_i, centred
    # q'_i = a q_{i-1} + b q_i + c q_{i+1}; written out here from the projections.
    module = Attention(DIM, HEADS, attn_kernel="softmax", short_conv=3).double()
    x = randn(2, 6, DIM, seed=3)
    with torch.no_grad():
        q, k, v = module.q_proj(x), module.k_proj(x), module.v_proj(x)
    mixed = []
    for part, t in enumerate((q, k, v)):
        w = module.conv.weight[part * DIM : (part + 1) * DIM, 0].detach()  # (dim, 3)
        bias = module.conv.bias[part * DIM : (part + 1) * DIM].detach()
        z = torch.zeros_like(t[:, :1])
        padded = torch.cat([z, z, t], 1) if causal else torch.cat([z, t, z], 1)
        mixed.append(sum(w[:, j] * padded[:, j : j + 6] for j in range(3)) + bias)
    want = module.kernel(*(module._heads(t) for t in mixed), None, causal)
    want = module.proj(want.transpose(1, 2).reshape(2, 6, DIM))
    assert_rel_close(module(x, is_causal=causal), want, 1e-12, "output")


@pytest.mark.parametrize("taps", [1, 3])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_short_conv_takes_an_empty_sequence(taps, causal):
    """N = 0 (a rank's empty slice under sequence parallelism): an empty output, and the
    convolution's weights in the graph with zero gradients (DDP waits for every one)."""
    module = Attention(DIM, HEADS, short_conv=taps).double()
    y = module(randn(2, 0, DIM), is_causal=causal)
    assert y.shape == (2, 0, DIM)
    y.sum().backward()
    assert module.conv.weight.grad is not None and not module.conv.weight.grad.any()


def test_old_projection_name_works_with_a_warning_naming_the_new_one():
    with pytest.warns(FutureWarning, match=r"projection='efficient' is now called 'query-only'"):
        old = Attention(DIM, HEADS, projection="efficient")
    new = Attention(DIM, HEADS, projection="query-only")
    assert old.projection == "query-only"
    assert [n for n, _ in old.named_parameters()] == [n for n, _ in new.named_parameters()]


@pytest.mark.parametrize("short_conv", [0, 3])
def test_kernel_inputs_have_unit_stride_features(short_conv):
    # SDPA's fused CPU kernel needs the feature axis at stride 1; a strided view after the
    # short convolution sent softmax to its 2.5x slower math path (benchmarks/short_conv_cpu).
    module = Attention(DIM, HEADS, attn_kernel="softmax", short_conv=short_conv).double()
    x = randn(2, 6, DIM, seed=3)
    for name, t in zip("qkv", module.heads_in(x, x, None, True), strict=True):
        assert t.stride(-1) == 1, f"{name} has feature stride {t.stride(-1)}"


# ---------------------------------------------------------------------------------------
# super: the fixed context length.


@pytest.mark.parametrize("kernel_id", ["taylorshift-efficient", "softmax"])
def test_super_refuses_sequences_longer_than_the_context(kernel_id):
    module = make_attention(kernel_id, "super", DIM, HEADS, context_len=6)
    module(randn(2, 6, DIM))  # exactly ℓ tokens is fine
    with pytest.raises(ValueError, match=r"fixed context length of 6 tokens; got .* 7 tokens"):
        module(randn(2, 7, DIM))
    with pytest.raises(ValueError, match=r"fixed context length of 6 tokens; got .* 8 tokens"):
        module(randn(2, 3, DIM), context=randn(2, 8, DIM))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kernel_id", KERNEL_IDS)
def test_super_short_sequence_equals_values_zero_padded_to_context(kernel_id, causal):
    # Documented: a sequence of N < ℓ tokens is the same as padding the values with zeros
    # to ℓ, mixing them with W_A (ℓ × ℓ, plus its bias) and reading the first N rows.
    ell, n = 10, 6
    module = make_attention(kernel_id, "super", DIM, HEADS, context_len=ell)
    with torch.no_grad():
        module.align_bias.copy_(randn(ell, seed=5))
    x = randn(2, n, DIM, seed=2)
    y = module(x, is_causal=causal)

    heads = x.view(2, n, HEADS, DIM // HEADS).transpose(1, 2)  # keys and values: slices
    v_padded = torch.cat([heads, torch.zeros(2, HEADS, ell - n, DIM // HEADS, dtype=F64)], 2)
    w = module.align_weight.tril() if causal else module.align_weight
    aligned = (w @ v_padded + module.align_bias[:, None])[:, :, :n]
    q = module.q_proj(x).view(2, n, HEADS, DIM // HEADS).transpose(1, 2)
    out = module.kernel(q, heads, aligned, None, causal)
    expected = module.proj(out.transpose(1, 2).reshape(2, n, DIM))
    assert_rel_close(y, expected, RTOL, "output")


@pytest.mark.parametrize("kernel_id", KERNEL_IDS)
def test_causal_super_is_lower_triangular(kernel_id):
    module = make_attention(kernel_id, "super", DIM, HEADS, context_len=10)
    x = randn(2, 8, DIM, seed=3, requires_grad=True)
    y = module(x, is_causal=True)
    for i in range(7):
        x2 = x.detach().clone()
        x2[:, i + 1 :] = randn(2, 7 - i, DIM, seed=40 + i)
        y2 = module(x2, is_causal=True)
        assert_rel_close(y2[:, : i + 1], y[:, : i + 1], 1e-12, f"outputs <= {i}")
        # Without the causal flag W_A mixes later tokens into earlier values.
        assert rel_error(module(x2)[:, : i + 1], module(x)[:, : i + 1]) > 1e-4
    y.sum().backward()
    assert torch.equal(module.align_weight.grad.triu(1), torch.zeros(10, 10, dtype=F64).triu(1))


# ---------------------------------------------------------------------------------------
# Cross-attention.


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "padding"])
def test_standard_cross_attention_with_other_context_dim(masked, causal):
    module = make_attention("taylorshift-efficient", "standard", DIM, HEADS, context_dim=10)
    assert module.k_proj.in_features == module.v_proj.in_features == 10
    x, context = randn(2, 7, DIM, seed=1), randn(2, 5, 10, seed=2)
    mask = padding([5, 2], 5) if masked else None
    y = module(x, attn_mask=mask, is_causal=causal, context=context)
    assert y.shape == (2, 7, DIM)

    def heads(t):
        return t.view(2, -1, HEADS, DIM // HEADS).transpose(1, 2)

    q, k, v = heads(module.q_proj(x)), heads(module.k_proj(context)), heads(module.v_proj(context))
    out = naive_taylor_shift_attention(
        q,
        k,
        v,
        None if mask is None else mask[:, None, None, :],
        causal,
        temperature=module.kernel.temperature,
    )
    expected = module.proj(out.transpose(1, 2).reshape(2, 7, DIM))
    assert_rel_close(y, expected, RTOL, "output")


@pytest.mark.parametrize(
    "settings",
    [{"short_conv": 3}, {"projection": "super", "context_len": 8}],
    ids=["conv3", "super"],
)  # fmt: skip
def test_cross_attention_context_padded_anywhere_equals_its_real_tokens_alone(settings):
    """Non-causal cross-attention moves the context's real tokens first, as self-attention
    does its own: a row's output is that of its context's real tokens alone."""
    module = Attention(DIM, HEADS, **settings).double()
    for p in module.parameters():  # large enough that positions and taps show
        p.data.normal_(0, 0.3, generator=torch.Generator().manual_seed(p.numel()))
    x, context = randn(2, 4, DIM, seed=1), randn(2, 7, DIM, seed=2)
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 1], [0, 0, 0, 1, 1, 0, 1]], dtype=torch.bool)
    y = module(x, attn_mask=mask, context=context)
    for b in range(2):
        alone = module(x[b : b + 1], context=context[b : b + 1, mask[b]])
        assert_rel_close(y[b : b + 1], alone, 1e-12, f"row {b}")


@pytest.mark.parametrize("projection", PROJECTION_IDS)
def test_cross_attention_with_a_context_of_another_length(projection):
    module = make_attention("softmax", projection, DIM, HEADS, context_len=10)
    x = randn(2, 4, DIM, seed=1)
    context, other = randn(2, 9, DIM, seed=2), randn(2, 9, DIM, seed=3)
    y = module(x, context=context)
    assert y.shape == (2, 4, DIM)
    assert rel_error(module(x, context=other), y) > 1e-3
    # Queries come from x only: a row of the output depends on its own token of x.
    x2 = x.clone()
    x2[:, 0] += 1.0
    y2 = module(x2, context=context)
    assert torch.equal(y2[:, 1:], y[:, 1:]) and rel_error(y2[:, 0], y[:, 0]) > 1e-3


@pytest.mark.parametrize("projection", ["optimized", "query-only", "super"])
def test_context_dim_must_equal_dim_for_sliced_projections(projection):
    context_len = 8 if projection == "super" else None
    with pytest.raises(ValueError, match=r"context_dim must equal dim \(12\); got context_dim=10"):
        Attention(DIM, HEADS, projection=projection, context_len=context_len, context_dim=10)


@pytest.mark.parametrize(
    "shape", [(3, 5, DIM), (5, DIM), (2, 5, DIM, 1)], ids=["batch", "2d", "4d"]
)
def test_context_of_wrong_shape_is_refused(shape):
    module = make_attention("softmax", "standard", DIM, HEADS)
    with pytest.raises(ValueError, match=r"context must be \(B=2, M, context_dim"):
        module(randn(2, 4, DIM), context=randn(*shape))


@pytest.mark.parametrize("projection", ["standard", "query-only"])
def test_context_of_wrong_width_is_refused_by_name(projection):
    module = make_attention("softmax", projection, DIM, HEADS)
    with pytest.raises(ValueError, match=r"context.*12.*got.*\(2, 5, 9\)"):
        module(randn(2, 4, DIM), context=randn(2, 5, 9))


# ---------------------------------------------------------------------------------------
# Masks and input checks.

MASK_FORMS = {
    "B11N": lambda pad, n: pad[:, None, None, :],
    "BH1N": lambda pad, n: pad[:, None, None, :].expand(-1, HEADS, 1, -1),
    "B1NN": lambda pad, n: pad[:, None, None, :].expand(-1, 1, n, -1),
}


@pytest.mark.parametrize(
    "form, projection",
    [(form, proj) for form in MASK_FORMS for proj in PROJECTION_IDS],
)
@pytest.mark.parametrize("kernel_id", ["taylorshift-efficient", "softmax", "holt"])
def test_2d_key_padding_equals_4d_mask(kernel_id, form, projection):
    module = make_attention(kernel_id, projection, DIM, HEADS, context_len=10)
    x = randn(2, 7, DIM, seed=4)
    pad = padding([7, 4], 7)
    for causal in (False, True):
        y2 = module(x, attn_mask=pad, is_causal=causal)
        y4 = module(x, attn_mask=MASK_FORMS[form](pad, 7), is_causal=causal)
        assert_rel_close(y4, y2, RTOL, f"causal={causal}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int64, torch.uint8])
def test_non_bool_mask_is_refused(dtype):
    module = make_attention("taylorshift-direct")
    mask = torch.zeros(2, 5, dtype=dtype)
    with pytest.raises(TypeError, match=rf"attn_mask must be a bool tensor.*got {dtype}"):
        module(randn(2, 5, DIM), attn_mask=mask)


def test_2d_mask_of_wrong_shape_is_refused():
    module = make_attention("taylorshift-direct")
    with pytest.raises(
        ValueError, match=r"key padding of shape \(B, Nk\) = \(2, 5\); got \(2, 4\)"
    ):
        module(randn(2, 5, DIM), attn_mask=torch.ones(2, 4, dtype=torch.bool))


@pytest.mark.parametrize(
    "shape", [(5, DIM), (2, 5, DIM + 1), (2, 5, DIM, 1)], ids=["2d", "width", "4d"]
)
def test_bad_x_shape_is_refused(shape):
    module = make_attention("taylorshift-direct")
    with pytest.raises(ValueError, match=rf"x must be \(B, N, dim={DIM}\); got shape"):
        module(randn(*shape))


# ---------------------------------------------------------------------------------------
# Constructor.


@pytest.mark.parametrize("cls", [Attention, TaylorShiftAttention])
def test_unknown_constructor_argument_is_refused(cls):
    with pytest.raises(TypeError, match="bogus"):
        cls(DIM, HEADS, bogus=1)


def test_taylorshift_attention_takes_no_kernel_choice():
    with pytest.raises(TypeError, match="attn_kernel"):
        TaylorShiftAttention(DIM, HEADS, attn_kernel="softmax")


CONSTRUCTOR_ERRORS = {
    "projection": (dict(projection="fast"), r"projection must be one of .*got 'fast'"),
    "dim-zero": (dict(dim=0), r"dim must be a positive int; got 0"),
    "dim-negative": (dict(dim=-12), r"dim must be a positive int; got -12"),
    "dim-float": (dict(dim=12.0), r"dim must be a positive int; got 12\.0"),
    "heads-zero": (dict(num_heads=0), r"num_heads must be a positive int; got 0"),
    "heads-bool": (dict(num_heads=True), r"num_heads must be a positive int; got True"),
    "heads-divisor": (
        dict(num_heads=5),
        r"dim must be divisible by num_heads; got dim=12, num_heads=5",
    ),
    "super-no-context-len": (
        dict(projection="super"),
        r"needs context_len, a positive int; got None",
    ),
    "super-context-len-zero": (
        dict(projection="super", context_len=0),
        r"needs context_len.*got 0",
    ),
    "super-context-len-float": (
        dict(projection="super", context_len=8.0),
        r"needs context_len.*got 8\.0",
    ),
    "super-context-len-bool": (
        dict(projection="super", context_len=True),
        r"needs context_len.*got True",
    ),
    "context-len-without-super": (
        dict(context_len=8),
        r"context_len applies to projection='super' only; got context_len=8",
    ),
    "attn-drop": (dict(attn_drop=1.0), r"attn_drop must be a number in \[0, 1\); got 1\.0"),
    "short-conv-negative": (
        dict(short_conv=-1),
        r"short_conv must be an int >= 0; got -1",
    ),
    "short-conv-float": (
        dict(short_conv=2.0),
        r"short_conv must be an int >= 0; got 2\.0",
    ),
    "short-conv-super": (
        dict(short_conv=3, projection="super", context_len=8),
        r"short_conv applies to projections 'standard', 'optimized' and 'query-only'",
    ),
    "attn-kernel": (dict(attn_kernel="nope"), r"attn_kernel must be one of .*got 'nope'"),
    "attn-kernel-none": (dict(attn_kernel=None), r"attn_kernel must be one of .*got None"),
    "projection-none": (dict(projection=None), r"projection must be one of .*got None"),
    # each of these was torch's error without the argument's name, or no error at all
    "context-dim-negative": (dict(context_dim=-3), r"context_dim must be a positive int or "
                             r"None; got -3"),
    "context-dim-zero": (dict(context_dim=0), r"context_dim must be a positive int .*got 0"),
    "proj-drop": (dict(proj_drop=-1), r"proj_drop must be a number in \[0, 1\); got -1"),
    "qk-norm-text": (dict(qk_norm="yes"), r"qk_norm must be a bool; got 'yes'"),
    "qkv-bias-int": (dict(qkv_bias=1), r"qkv_bias must be a bool; got 1"),
}  # fmt: skip
# A wrong Python type is a TypeError, a wrong value of the right type a ValueError.
CONSTRUCTOR_TYPE_ERRORS = {
    "dim-float", "heads-bool", "short-conv-float", "attn-kernel-none", "projection-none",
    "qk-norm-text", "qkv-bias-int",
}  # fmt: skip


@pytest.mark.parametrize("case", list(CONSTRUCTOR_ERRORS))
def test_invalid_constructor_arguments_are_named(case):
    kwargs, pattern = CONSTRUCTOR_ERRORS[case]
    args = dict(dim=DIM, num_heads=HEADS)
    args.update(kwargs)
    error = TypeError if case in CONSTRUCTOR_TYPE_ERRORS else ValueError
    with pytest.raises(error, match=pattern):
        Attention(**args)


TIMM_ATTENTION = [
    ("dim", inspect.Parameter.empty),
    ("num_heads", 8),
    ("qkv_bias", False),
    ("qk_norm", False),
    ("scale_norm", False),
    ("proj_bias", True),
    ("attn_drop", 0.0),
    ("proj_drop", 0.0),
    ("norm_layer", None),
    ("device", None),
    ("dtype", None),
]


@pytest.mark.parametrize("cls", [Attention, TaylorShiftAttention])
def test_signature_starts_with_timms_attention(cls):
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    head = params[: len(TIMM_ATTENTION)]
    assert [(p.name, p.default) for p in head] == TIMM_ATTENTION
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in head)
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[len(TIMM_ATTENTION) :])


def test_positional_construction_as_timm_calls_it():
    module = TaylorShiftAttention(DIM, 4, True, True, True, False, 0.0, 0.0, None, None, F64)
    assert module.num_heads == 4 and module.head_dim == 3
    assert module.q_proj.bias is not None and module.k_proj.bias is not None
    assert isinstance(module.q_norm, nn.LayerNorm) and isinstance(module.norm, nn.LayerNorm)
    assert module.proj.bias is None
    assert all(p.dtype == F64 for p in module.parameters())


def test_taylorshift_attention_passes_its_options_to_the_kernel():
    module = TaylorShiftAttention(
        DIM, HEADS, mode="direct", order=4, temperature=0.7, normalize=True
    )
    kernel = module.kernel
    assert (kernel.name, kernel.mode, kernel.order, kernel.normalize) == (
        "taylorshift",
        "direct",
        4,
        True,
    )
    assert torch.equal(kernel.temperature, torch.full((1, HEADS, 1, 1), 0.7))
    local = TaylorShiftAttention(DIM, HEADS, local_heads=1, window=5).kernel
    assert (local.local_heads, local.window) == (1, 5)
    assert local.temperature.shape == (1, HEADS - 1, 1, 1)


@pytest.mark.parametrize("projection", PROJECTION_IDS)
@pytest.mark.parametrize("kernel_id", ["taylorshift-direct", "holt"])
def test_device_and_dtype_create_float64_parameters(kernel_id, projection):
    module = make_attention(
        kernel_id, projection, qk_norm=True, scale_norm=True, device=torch.device("cpu")
    )
    tensors = list(module.parameters()) + list(module.buffers())
    assert tensors and all(t.dtype == F64 for t in tensors)
    assert all(t.device.type == "cpu" for t in tensors)
    y = module(randn(2, 5, DIM))
    assert y.dtype == F64


def test_qk_norm_and_scale_norm_add_layer_norms():
    base = make_attention("taylorshift-direct")
    normed = make_attention("taylorshift-direct", qk_norm=True, scale_norm=True)
    assert isinstance(base.q_norm, nn.Identity) and isinstance(base.norm, nn.Identity)
    for m, width in (
        (normed.q_norm, DIM // HEADS),
        (normed.k_norm, DIM // HEADS),
        (normed.norm, DIM),
    ):
        assert isinstance(m, nn.LayerNorm) and m.normalized_shape == (width,)
    extra = sum(p.numel() for p in normed.parameters()) - sum(p.numel() for p in base.parameters())
    assert extra == 2 * 2 * (DIM // HEADS) + 2 * DIM
    y = normed(randn(2, 5, DIM))
    y.pow(2).sum().backward()
    for m in (normed.q_norm, normed.k_norm, normed.norm):
        assert m.weight.grad is not None and m.weight.grad.abs().sum() > 0


def test_norm_layer_is_used_for_both_norms():
    module = Attention(DIM, HEADS, qk_norm=True, scale_norm=True, norm_layer=nn.RMSNorm)
    assert isinstance(module.q_norm, nn.RMSNorm) and isinstance(module.norm, nn.RMSNorm)


# ---------------------------------------------------------------------------------------
# Direct and efficient TaylorShift in one module.


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_direct_and_efficient_forms_agree_in_one_module(causal):
    torch.manual_seed(0)
    module = TaylorShiftAttention(
        DIM, HEADS, qkv_bias=True, qk_norm=True, scale_norm=True, dtype=F64, mode="direct"
    )
    spread_temperature(module)
    x = randn(3, 11, DIM, seed=2, requires_grad=True)
    mask = padding([11, 6, 0], 11)  # the last item attends no key
    g_out = randn(3, 11, DIM, seed=3)
    results = {}
    for mode in ("direct", "efficient"):
        module.kernel.mode = mode
        y = module(x, attn_mask=mask, is_causal=causal)
        results[mode] = (y, param_grads(module, y, g_out, x))
    (y_d, g_d), (y_e, g_e) = results["direct"], results["efficient"]
    assert_rel_close(y_e, y_d, RTOL, "output")
    assert g_d.keys() == g_e.keys() and "kernel.temperature" in g_d and "input0" in g_d
    for name in g_d:
        assert_rel_close(g_e[name], g_d[name], RTOL, f"grad of {name}")


def test_head_split_matches_manual_reshape():
    # dim = heads × head_dim: head h of the projected queries is columns h·d .. (h+1)·d.
    module = make_attention("softmax-naive", "standard", DIM, HEADS)
    x = randn(1, 5, DIM)
    y = module(x)
    d = DIM // HEADS
    q, k, v = module.q_proj(x), module.k_proj(x), module.v_proj(x)
    outs = []
    for h in range(HEADS):
        cols = slice(h * d, (h + 1) * d)
        a = torch.softmax(q[0, :, cols] @ k[0, :, cols].T / math.sqrt(d), dim=-1)
        outs.append(a @ v[0, :, cols])
    expected = module.proj(torch.cat(outs, dim=-1))[None]
    assert_rel_close(y, expected, 1e-12, "output")


@pytest.mark.parametrize("projection", PROJECTION_IDS)
def test_non_contiguous_input(projection):
    module = make_attention("taylorshift-efficient", projection, DIM, HEADS)
    x = randn(6, 2, DIM, seed=8).transpose(0, 1)  # (B, N, dim) in (N, B, dim) storage
    assert not x.is_contiguous()
    mask = padding([6, 4], 6)
    assert_rel_close(module(x, mask), module(x.contiguous(), mask), 0.0, "output")


@pytest.mark.parametrize("kernel_id", KERNEL_IDS)
def test_float32_module_matches_its_float64_copy(kernel_id):
    module = make_attention(kernel_id, "standard", DIM, HEADS).float()
    x = randn(2, 7, DIM, seed=9)
    y32 = module(x.float(), attn_mask=padding([7, 5], 7), is_causal=True)
    assert y32.dtype == torch.float32
    y64 = module.double()(x, attn_mask=padding([7, 5], 7), is_causal=True)
    assert_rel_close(y32, y64, 1e-5, "float32 against float64")
