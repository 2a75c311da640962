"""Transformer blocks: every kernel × projection runs forward and backward, options reach
the attention layer (SPEC §7: Taylor coefficients passed on), stochastic depth, validation.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from taylorshift.nn import Block, DropPath, Mlp
from tests.helpers import assert_rel_close, rel_error
from tests.nn.cases import F64, KERNEL_IDS, KERNEL_SPECS, PROJECTION_IDS, padding, randn

DIM, HEADS = 12, 3


def make_block(kernel_id="taylorshift-direct", projection="standard", seed=0, **kwargs):
    name, kernel_args = KERNEL_SPECS[kernel_id]
    kwargs.setdefault("kernel_args", dict(kernel_args))
    torch.manual_seed(seed)
    return Block(
        DIM,
        HEADS,
        mlp_ratio=2.0,
        attn_kernel=name,
        projection=projection,
        context_len=8 if projection == "super" else None,
        dtype=F64,
        **kwargs,
    )


@pytest.mark.parametrize("projection", PROJECTION_IDS)
@pytest.mark.parametrize("kernel_id", KERNEL_IDS)
def test_forward_backward_shapes(kernel_id, projection):
    block = make_block(kernel_id, projection)
    x = randn(2, 6, DIM, seed=1, requires_grad=True)
    y = block(x, attn_mask=padding([6, 4], 6), is_causal=True)
    assert y.shape == x.shape and y.dtype == F64
    y.pow(2).sum().backward()
    assert x.grad.shape == x.shape and torch.isfinite(x.grad).all()
    for name, p in block.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        assert p.grad.shape == p.shape and torch.isfinite(p.grad).all(), name


def test_block_is_pre_norm_residual():
    # x + attn(norm1(x)), then + mlp(norm2(·)): checked against the parts.
    block = make_block("softmax")
    x = randn(2, 5, DIM, seed=2)
    h = x + block.attn(block.norm1(x))
    expected = h + block.mlp(block.norm2(h))
    assert_rel_close(block(x), expected, 1e-14, "output")


def test_kernel_args_are_passed_on():
    # SPEC §7: "Taylor coefficients accepted by a block but not passed on".
    fourth = make_block(kernel_args={"order": 4, "mode": "direct", "temperature": 0.5})
    assert (fourth.attn.kernel.order, fourth.attn.kernel.mode) == (4, "direct")
    assert torch.equal(fourth.attn.kernel.temperature, torch.full((1, HEADS, 1, 1), 0.5, dtype=F64))
    second = make_block(kernel_args={"order": 2, "mode": "direct"})
    second.load_state_dict(fourth.state_dict())  # the same weights and temperature
    x = randn(2, 7, DIM, seed=3)
    assert rel_error(fourth(x), second(x)) > 1e-6


def test_attention_options_are_passed_on():
    block = make_block("holt-subtract-one", "super", qk_norm=True, attn_drop=0.25)
    attn = block.attn
    assert attn.kernel.name == "holt" and attn.kernel.subtract_one
    assert attn.kernel.attn_drop == 0.25
    assert attn.projection == "super" and attn.context_len == 8
    assert isinstance(attn.q_norm, nn.LayerNorm) and isinstance(attn.k_norm, nn.LayerNorm)
    assert attn.q_proj.bias is not None  # qkv_bias defaults to True in Block


@pytest.mark.parametrize("ratio, hidden", [(1.0, 12), (1.5, 18), (4.0, 48), (0.5, 6)])
def test_mlp_ratio_sets_the_hidden_width(ratio, hidden):
    block = Block(DIM, HEADS, mlp_ratio=ratio)
    assert isinstance(block.mlp, Mlp)
    assert (block.mlp.fc1.in_features, block.mlp.fc1.out_features) == (DIM, hidden)
    assert (block.mlp.fc2.in_features, block.mlp.fc2.out_features) == (hidden, DIM)


@pytest.mark.parametrize("ratio", [0, 0.0, -1.0])
def test_non_positive_mlp_ratio_is_refused(ratio):
    with pytest.raises(ValueError, match=rf"mlp_ratio must be a number > 0; got {ratio}"):
        Block(DIM, HEADS, mlp_ratio=ratio)


def test_an_mlp_ratio_that_leaves_no_width_is_refused():
    with pytest.raises(ValueError, match=rf"at least 1 wide .*; got mlp_ratio=0.05 for dim={DIM}"):
        Block(DIM, HEADS, mlp_ratio=0.05)
    assert Block(DIM, HEADS, mlp_ratio=1 / DIM).mlp.fc1.out_features == 1


def test_model_configs_check_the_mlp_width_and_kernel_options():
    from taylorshift.models import CausalLMConfig, EncoderConfig

    for config in (CausalLMConfig, EncoderConfig):
        with pytest.raises(ValueError, match=r"mlp_ratio must leave the MLP at least 1 wide"):
            config(dim=32, num_heads=2, mlp_ratio=0.01).validate()
        with pytest.raises(TypeError, match=r"kernel 'taylorshift' has no option 'tau'"):
            config(dim=32, num_heads=2, kernel_args={"tau": 2.0}).validate()


@pytest.mark.parametrize("p", [-0.1, 1.0, 2.0])
def test_drop_path_outside_unit_interval_is_refused(p):
    with pytest.raises(ValueError, match=rf"drop_path must be a number in \[0, 1\); got {p}"):
        Block(DIM, HEADS, drop_path=p)
    with pytest.raises(ValueError, match=rf"drop_path must be a number in \[0, 1\); got {p}"):
        DropPath(p)


def test_unknown_block_argument_is_refused():
    with pytest.raises(TypeError, match="bogus"):
        Block(DIM, HEADS, bogus=1)


# ---------------------------------------------------------------------------------------
# Stochastic depth.


def test_drop_path_is_identity_in_eval_mode_and_at_zero():
    x = randn(8, 3, 4)
    assert DropPath(0.5).eval()(x) is x
    assert DropPath(0.0).train()(x) is x


def test_drop_path_drops_whole_samples_and_rescales():
    p, n = 0.25, 4000
    drop = DropPath(p).train()
    x = torch.ones(n, 3, 2, dtype=F64)
    torch.manual_seed(0)
    y = drop(x)
    dropped = (y == 0).all(dim=(1, 2))
    kept = (y == 1 / (1 - p)).all(dim=(1, 2))
    assert torch.equal(dropped | kept, torch.ones(n, dtype=torch.bool))  # whole samples
    # Fixed seed, so not flaky; the bounds are ±4.4 standard deviations of the count.
    assert abs(dropped.double().mean().item() - p) < 0.03
    assert abs(y.mean().item() - 1.0) < 0.04  # the rescaling keeps the expectation
    torch.manual_seed(0)
    assert torch.equal(drop(x), y)  # the draw is from the global generator


def test_block_drop_path_only_acts_in_training():
    x = randn(16, 5, DIM, seed=4)
    plain = make_block("softmax", seed=1)
    dropping = make_block("softmax", seed=1, drop_path=0.5)
    assert torch.equal(dropping.eval()(x), plain.eval()(x))
    torch.manual_seed(2)
    y = dropping.train()(x)
    # A sample whose two branches were both dropped is passed through unchanged.
    unchanged = (y == x).all(dim=(1, 2))
    assert unchanged.any() and not unchanged.all()
