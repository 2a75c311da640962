"""Grouped-query attention in the layers and models (``num_kv_heads``): a grouped layer is
the full layer whose key/value projections (and short-convolution channels) repeat each
key/value head's weights for the query heads of its group; decoding keeps every cache per
key/value head; bad settings are refused by name."""

from __future__ import annotations

import pytest
import torch

from taylorshift.models import CausalLM, CausalLMConfig, load_model, save_model
from taylorshift.nn import Attention, TaylorShiftAttention, create_kernel
from tests.helpers import assert_rel_close
from tests.nn.cases import KERNEL_IDS, make_attention, padding, randn

RTOL = 1e-10
DIM, HEADS, KV_HEADS, HEAD_DIM = 16, 4, 2, 4


def full_twin(grouped: Attention, kernel_id: str) -> Attention:
    """The layer with H key/value heads that computes what ``grouped`` does: its key/value
    weights (rows of W_K, W_V, their biases, and the short convolution's k and v channels)
    repeated for each query head of a group."""
    conv = grouped.short_conv
    full = make_attention(kernel_id, "standard", DIM, HEADS, short_conv=conv)
    groups = HEADS // grouped.num_kv_heads

    def repeat(t: torch.Tensor) -> torch.Tensor:  # rows per key/value head, repeated
        heads = t.reshape(grouped.num_kv_heads, HEAD_DIM, *t.shape[1:])
        return heads.repeat_interleave(groups, dim=0).reshape(HEADS * HEAD_DIM, *t.shape[1:])

    with torch.no_grad():
        state = dict(grouped.state_dict())
        for name in ("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias"):
            state[name] = repeat(state[name])
        if conv:
            kv = grouped.kv_dim
            for name in ("conv.weight", "conv.bias"):
                t = state[name]
                q, k, v = t[:DIM], t[DIM : DIM + kv], t[DIM + kv :]
                state[name] = torch.cat([q, repeat(k), repeat(v)])
        full.load_state_dict(state)
    return full


def make_grouped(kernel_id: str, **kwargs) -> Attention:
    return make_attention(kernel_id, "standard", DIM, HEADS, num_kv_heads=KV_HEADS, **kwargs)


# The kernels that take grouped heads themselves (the ops' enable_gqa) in every combination;
# the others, which repeat key and value before their usual path, in two that between them
# set and clear every flag.
GROUPED_IDS = ["taylorshift-direct", "taylorshift-efficient", "softmax"]
CASES = [
    pytest.param(kernel_id, causal, masked, conv,
                 id=f"{kernel_id}-{'causal' if causal else 'full'}-"
                    f"{'padding' if masked else 'nomask'}-{'short-conv' if conv else 'plain'}")
    for kernel_id in KERNEL_IDS
    for causal in (False, True) for masked in (False, True) for conv in (0, 3)
    if kernel_id in GROUPED_IDS or causal == masked == bool(conv)
]  # fmt: skip


@pytest.mark.parametrize(("kernel_id", "causal", "masked", "short_conv"), CASES)
def test_grouped_layer_equals_the_full_layer_with_repeated_kv_weights(
    kernel_id, causal, masked, short_conv
):
    grouped = make_grouped(kernel_id, short_conv=short_conv)
    full = full_twin(grouped, kernel_id)
    assert grouped.k_proj.out_features == grouped.v_proj.out_features == KV_HEADS * HEAD_DIM
    x = randn(3, 9, DIM, seed=1, requires_grad=True)
    mask = padding([9, 4, 7], 9) if masked else None
    y = grouped(x, attn_mask=mask, is_causal=causal)
    want = full(x, attn_mask=mask, is_causal=causal)
    assert_rel_close(y, want, RTOL, "output")
    # x, and the parameters of the query side and the kernel, get the same gradients
    names = [n for n, _ in full.named_parameters() if n.startswith(("q_proj", "proj", "kernel"))]
    ours, theirs = dict(grouped.named_parameters()), dict(full.named_parameters())
    g = randn(*y.shape, seed=2)
    got = torch.autograd.grad((y * g).sum(), [x, *(ours[n] for n in names)])
    ref = torch.autograd.grad((want * g).sum(), [x, *(theirs[n] for n in names)])
    for name, a, e in zip(["x", *names], got, ref, strict=True):
        assert_rel_close(a, e, RTOL, f"grad of {name}")


@pytest.mark.parametrize(
    ("kernel_id", "kind"),
    [("taylorshift-direct", "state"), ("taylorshift-direct", "kv"), ("softmax", "kv"),
     ("linear", "state"), ("linear", "kv")],
)  # fmt: skip
def test_grouped_layer_decodes_like_its_forward_pass_with_caches_per_kv_head(kernel_id, kind):
    layer = make_grouped(kernel_id, short_conv=3).eval()
    x = randn(2, 10, DIM, seed=4)
    want = layer(x, is_causal=True)
    cache = layer.new_cache(kind)
    rows, start = [], 0
    for size in (4, 1, 3, 1, 1):
        rows.append(layer.decode(x[:, start : start + size], cache))
        start += size
    assert_rel_close(torch.cat(rows, dim=1), want, RTOL, f"decoded rows, {kind} cache")
    if kind == "kv":
        assert cache.keys.shape[1] == cache.values.shape[1] == KV_HEADS
    elif kernel_id.startswith("taylorshift"):
        assert cache.state.sums.shape[1] == KV_HEADS  # the state G = 2 times smaller


def test_grouped_padded_prompt_decodes_like_its_rows():
    layer = make_grouped("taylorshift-efficient").eval()
    x = randn(2, 6, DIM, seed=5)
    mask = padding([6, 3], 6)
    cache = layer.new_cache("state")
    out = layer.decode(x, cache, key_padding_mask=mask)
    for b, n in enumerate((6, 3)):
        alone = layer(x[b : b + 1, :n], is_causal=True)
        assert_rel_close(out[b, :n], alone[0], RTOL, f"row {b}")


def test_taylorshift_attention_takes_num_kv_heads():
    layer = TaylorShiftAttention(DIM, HEADS, num_kv_heads=1, mode="efficient")
    assert layer.k_proj.out_features == HEAD_DIM and layer.num_kv_heads == 1
    x = torch.randn(2, 5, DIM)
    assert layer(x).shape == x.shape


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"num_kv_heads": 3}, ValueError, r"num_kv_heads must divide num_heads \(4\); got .*=3"),
        ({"num_kv_heads": 0}, ValueError, r"num_kv_heads must be a positive int; got 0"),
        ({"num_kv_heads": 2.0}, TypeError, r"num_kv_heads must be a positive int; got 2.0"),
        ({"num_kv_heads": 2, "projection": "optimized"}, ValueError,
         r"num_kv_heads < num_heads needs projection='standard'.*got projection='optimized'"),
        ({"num_kv_heads": 2, "attn_kernel": "taylorshift", "kernel_args": {"local_heads": 1}},
         ValueError, r"num_kv_heads < num_heads does not combine with local_heads.*=1"),
    ],
)  # fmt: skip
def test_bad_kv_heads_are_refused_by_name(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        Attention(DIM, HEADS, **kwargs)


def test_a_kernel_with_local_heads_refuses_grouped_key_value_heads():
    kernel = create_kernel("taylorshift", 4, HEAD_DIM, local_heads=1)
    q, k = torch.randn(1, 4, 5, HEAD_DIM), torch.randn(1, 2, 5, HEAD_DIM)
    with pytest.raises(ValueError, match=r"local_heads need as many key/value heads as query "
                       r"heads; got 2 key/value heads for 4 query heads"):  # fmt: skip
        kernel(q, k, k, None, True)


def test_as_many_kv_heads_as_heads_is_the_plain_layer():
    torch.manual_seed(0)
    plain = Attention(DIM, HEADS, projection="optimized")
    torch.manual_seed(0)
    same = Attention(DIM, HEADS, projection="optimized", num_kv_heads=HEADS)
    x = torch.randn(2, 5, DIM)
    assert torch.equal(plain(x), same(x))


def test_causal_lm_with_kv_heads_saves_loads_and_generates(tmp_path):
    config = CausalLMConfig(depth=2, dim=DIM, num_heads=HEADS, mlp_ratio=2, num_kv_heads=1)
    torch.manual_seed(0)
    model = CausalLM(config).eval()
    assert all(block.attn.num_kv_heads == 1 for block in model.blocks)
    ids = torch.randint(0, 256, (2, 7))
    path = tmp_path / "lm.safetensors"
    save_model(model, path)
    loaded = load_model(path).eval()
    assert loaded.config.num_kv_heads == 1
    assert torch.equal(loaded(ids), model(ids))
    # greedy: the per-key/value-head state and key/value cache continue alike
    by_state = model.generate(ids, 4, top_k=1, cache="state")
    assert by_state.shape == (2, 4)
    assert torch.equal(by_state, model.generate(ids, 4, top_k=1, cache="kv"))


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        ({"num_kv_heads": 3}, r"num_kv_heads must divide num_heads \(4\); got num_kv_heads=3"),
        ({"num_kv_heads": 2, "projection": "query-only"},
         r"num_kv_heads < num_heads needs projection='standard'"),
        ({"num_kv_heads": 2, "kernel_args": {"local_heads": 1}},
         r"num_kv_heads < num_heads does not combine with local_heads.*local_heads=1"),
    ],
)  # fmt: skip
def test_bad_kv_heads_in_a_model_config_are_refused_by_name(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        CausalLMConfig(dim=DIM, num_heads=HEADS, **overrides)
