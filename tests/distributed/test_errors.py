"""Bad input to the sequence-parallel op, kernel and helpers: each error names the argument,
the expected and the actual value."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from taylorshift.distributed import (
    SequenceParallelKernel,
    convert_sequence_parallel,
    sequence_parallel_taylor_shift,
    sequence_shard,
)
from taylorshift.nn import Attention

Q = torch.zeros(2, 3, 5, 4)
V = torch.zeros(2, 3, 5, 6)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"key_padding_mask": [True] * 5}, TypeError,
         r"key_padding_mask must be a bool tensor broadcastable to \(B, H, 1, Nk\) = "
         r"\(2, 3, 1, 5\) or None; got list"),
        ({"key_padding_mask": torch.zeros(2, 1, 1, 5)}, TypeError,
         r"key_padding_mask must be a bool tensor \(True = attend\); got torch.float32"),
        ({"key_padding_mask": torch.ones(2, 5, dtype=torch.bool)}, ValueError,
         r"key_padding_mask must broadcast to \(B, H, 1, Nk\) = \(2, 3, 1, 5\).*"
         r"m\[:, None, None, :\]\); got shape \(2, 5\)"),
        ({"key_padding_mask": torch.ones(2, 3, 5, 5, dtype=torch.bool)}, ValueError,
         r"key_padding_mask must broadcast to .*got shape \(2, 3, 5, 5\)"),
        ({"key_padding_mask": torch.ones(5, dtype=torch.bool, device="meta")}, ValueError,
         r"key_padding_mask must be on the device of query \(cpu\); got meta"),
        ({"chunk_size": 0}, ValueError, r"chunk_size must be a positive int or None; got 0"),
        ({"chunk_size": 2.5}, TypeError, r"chunk_size must be a positive int or None; got 2.5"),
        ({"chunk_size": True}, TypeError, r"chunk_size must be a positive int or None; got True"),
        ({"group": "world"}, TypeError,
         r"group must be a torch.distributed.ProcessGroup or None; got str"),
        ({"temperature": 2.0, "normalize": False}, ValueError,
         r"temperature applies only with normalize=True"),
    ],
    ids=["mask-list", "mask-float", "mask-2d", "mask-per-query", "mask-device", "chunk-0",
         "chunk-float", "chunk-bool", "group-str", "temperature-plain"],
)  # fmt: skip
def test_bad_arguments_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        sequence_parallel_taylor_shift(Q, Q, V, **kwargs)


def test_grouped_heads_need_enable_gqa_and_one_mask_for_every_head():
    k, v = Q[:, :1], V[:, :1]
    with pytest.raises(ValueError, match=r"fewer key/value heads: pass enable_gqa=True"):
        sequence_parallel_taylor_shift(Q, k, v)
    with pytest.raises(TypeError, match=r"enable_gqa must be a bool; got 1"):
        sequence_parallel_taylor_shift(Q, k, v, enable_gqa=1)
    per_head = torch.ones(2, 3, 1, 5, dtype=torch.bool)
    with pytest.raises(
        ValueError,
        match=r"key_padding_mask: with grouped key/value heads the mask must be the same for "
        r"every head \(\(B, 1, 1, Nk\) = \(2, 1, 1, 5\)\); got shape \(2, 3, 1, 5\)",
    ):
        sequence_parallel_taylor_shift(Q, k, v, per_head, enable_gqa=True)


def test_causal_needs_the_same_positions_for_queries_and_keys():
    with pytest.raises(
        ValueError, match=r"query and key must have the same length; got Nq = 3 and Nk = 5"
    ):
        sequence_parallel_taylor_shift(Q[:, :, :3], Q, V, is_causal=True)


def test_tensor_checks_are_the_ops():
    with pytest.raises(ValueError, match=r"query must be 4-D with shape \(B, H, Nq, d\)"):
        sequence_parallel_taylor_shift(Q[0], Q, V)
    with pytest.raises(ValueError, match=r"value must have as many tokens as key \(Nk = 5\)"):
        sequence_parallel_taylor_shift(Q, Q, V[:, :, :4])


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((5, 2, 2), ValueError, r"rank must be an int in \[0, world_size = 2\); got 2"),
        ((5, -1, 2), ValueError, r"rank must be an int >= 0; got -1"),
        ((5, 0, 0), ValueError, r"world_size must be a positive int; got 0"),
        ((-1, 0, 2), ValueError, r"n must be an int >= 0; got -1"),
        ((5.0, 0, 2), TypeError, r"n must be an int >= 0; got 5\.0"),
        ((5, True, 2), TypeError, r"rank must be an int >= 0; got True"),
    ],
    ids=["rank-high", "rank-negative", "world-0", "n-negative", "n-float", "rank-bool"],
)
def test_sequence_shard_refuses_bad_arguments(args, error, match):
    with pytest.raises(error, match=match):
        sequence_shard(*args)


@pytest.mark.parametrize(
    ("kernel", "kernel_args", "match"),
    [
        ("softmax", {}, r"kernel is the 'softmax' kernel, which cannot attend across ranks"),
        ("linear", {}, r"kernel is the 'linear' kernel"),
        ("taylorshift", {"order": 4, "mode": "direct"},
         r"kernel has Taylor order 4; sequence parallelism .* supports order 2 only"),
    ],
    ids=["softmax", "linear", "order-4"],
)  # fmt: skip
def test_conversion_refuses_kernels_that_cannot_span_ranks(kernel, kernel_args, match):
    module = nn.Sequential(Attention(8, 2, attn_kernel=kernel, kernel_args=kernel_args))
    with pytest.raises(ValueError, match=r"^0\." + match):
        convert_sequence_parallel(module)


def test_a_converted_short_convolution_refuses_cross_attention():
    # (its neighbours' rows are the slice's own sequence: self-attention only)
    module = convert_sequence_parallel(Attention(8, 2, short_conv=3))
    assert module.neighbours is not None
    x = torch.zeros(1, 3, 8)
    with pytest.raises(ValueError, match=r"short convolution needs self-attention; got a context"):
        module(x, context=x)
    assert convert_sequence_parallel(Attention(8, 2, short_conv=1)).neighbours is None


def test_conversion_refuses_the_super_projection():
    module = nn.ModuleDict({"attn": Attention(8, 2, projection="super", context_len=6)})
    with pytest.raises(ValueError, match=r"attn has projection='super', whose W_A mixes values"):
        convert_sequence_parallel(module)


def test_conversion_refuses_an_encoder_classifier_but_takes_its_trunk():
    from taylorshift.models import create_model

    model = create_model("vit-tiny", num_classes=3, img_size=8, patch_size=4, in_chans=1, depth=1)
    with pytest.raises(ValueError, match=r"model is a VisionTransformer, which adds a CLS token"):
        convert_sequence_parallel(model)
    convert_sequence_parallel(model.blocks)
    assert type(model.blocks[0].attn.kernel).__name__ == "SequenceParallelKernel"


def test_conversion_refuses_a_model_without_attention():
    with pytest.raises(ValueError, match=r"model \(Linear\) has no attention kernel"):
        convert_sequence_parallel(nn.Linear(2, 2))


def test_kernel_refuses_a_bad_group():
    with pytest.raises(TypeError, match=r"group must be a torch.distributed.ProcessGroup"):
        SequenceParallelKernel(2, 4, group=0)
