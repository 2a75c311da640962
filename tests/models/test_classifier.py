"""TransformerClassifier: input kinds, embeddings, pooling, padding masks end to end, errors."""

from __future__ import annotations

import math

import pytest
import torch

from taylorshift.models import (
    ClassifierConfig,
    ConvTokenEmbedding,
    TransformerClassifier,
    sinusoidal_position_embedding,
)
from taylorshift.models.embedding import sinusoidal_at
from tests.helpers import assert_rel_close
from tests.models.cases import F64, KERNEL_IDS, KERNEL_SPECS, classifier, inputs_for, lengths_mask

LENGTHS = [13, 5, 1, 9]  # batch of 4 padded to 13: one full, one single-token sequence
N = max(LENGTHS)


@pytest.mark.parametrize(
    "settings",
    [
        {"token_embedding": "vocab"},
        {"token_embedding": "linear", "in_features": 5},
        {"token_embedding": "conv"},
        {"token_embedding": "conv", "in_features": 5},
        {"pooling": "mean", "pos_embedding": "learned", "max_len": 32},
    ],
    ids=["vocab", "linear", "conv-ids", "conv-features", "mean-learned"],
)
def test_shapes(settings):
    model = classifier(**settings)
    x = inputs_for(model, batch=3, length=7)
    assert model(x).shape == (3, 3)
    cls = 1 if model.config.pooling == "cls" else 0
    assert model.forward_features(x).shape == (3, 7 + cls, 24)


def test_config_and_settings_build_the_same_model():
    config = ClassifierConfig(vocab_size=7, dim=16, depth=1, num_heads=2)
    a = TransformerClassifier(config)
    b = TransformerClassifier(vocab_size=7, dim=16, depth=1, num_heads=2)
    c = TransformerClassifier.from_config(config.to_dict())
    assert a.config == b.config == c.config == config
    assert TransformerClassifier(config, depth=2).config.depth == 2
    assert config.depth == 1  # the passed config is not modified


def run_unpadded(model, x, lengths):
    return torch.cat([model(x[b : b + 1, :n]) for b, n in enumerate(lengths)])


@pytest.mark.parametrize(("attn_kernel", "kernel_args"), KERNEL_SPECS, ids=KERNEL_IDS)
@pytest.mark.parametrize(
    "settings",
    [
        {"pooling": "cls"},
        {"pooling": "mean", "token_embedding": "conv"},
        {"pooling": "mean", "token_embedding": "linear", "in_features": 4},
    ],
    ids=["cls-vocab", "mean-conv", "mean-linear"],
)
def test_padded_batch_equals_unpadded_sequences(attn_kernel, kernel_args, settings):
    model = classifier(attn_kernel=attn_kernel, kernel_args=kernel_args, **settings)
    x = inputs_for(model, batch=len(LENGTHS), length=N)
    padded = model(x, lengths_mask(LENGTHS, N))
    assert_rel_close(padded, run_unpadded(model, x, LENGTHS), 1e-12, "padded vs unpadded")


@pytest.mark.parametrize(
    "settings",
    [
        {"pos_embedding": "learned", "max_len": 16},
        {"projection": "optimized"},
        {"projection": "query-only"},
        {"projection": "super", "context_len": 16},
        {"token_embedding": "conv", "pos_embedding": "learned", "max_len": 16, "pooling": "mean"},
        {"short_conv": 3},
        {"short_conv": 4, "pooling": "mean"},
    ],
    ids=["learned", "optimized", "query-only", "super", "conv-learned-mean", "short3", "short4"],
)
def test_padded_batch_equals_unpadded_sequences_other_settings(settings):
    model = classifier(kernel_args={"mode": "efficient"}, **settings)
    x = inputs_for(model, batch=len(LENGTHS), length=N)
    padded = model(x, lengths_mask(LENGTHS, N))
    assert_rel_close(padded, run_unpadded(model, x, LENGTHS), 1e-12, "padded vs unpadded")


# each row's real tokens, padding before or between them: (B 3, N 9)
PADDED_INSIDE = {
    "left": [[0, 0, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1, 1, 1], [0] * 8 + [1]],
    "between": [[1, 0, 1, 1, 0, 0, 1, 1, 1], [0, 1, 1, 0, 1, 0, 1, 0, 1], [1] * 9],
}


@pytest.mark.parametrize("place", list(PADDED_INSIDE))
@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"pooling": "mean", "pos_embedding": "learned", "max_len": 9},
        {"token_embedding": "conv", "short_conv": 3, "pooling": "mean"},
        {
            "in_features": 4,
            "token_embedding": "linear",
            "kernel_args": {"local_heads": 1, "window": 2},
        },
    ],
    ids=["cls", "mean-learned", "conv-embedding-short-conv", "features-local-heads"],
)
def test_padding_anywhere_equals_unpadded_sequences(settings, place):
    """Padding before or between real tokens, as after them: the logits, and the features
    at the real tokens, are those of each row's real tokens alone (positions 0, 1, ...)."""
    model = classifier(**settings)
    for p in model.parameters():  # large enough that positions and taps show
        p.data.normal_(0, 0.3, generator=torch.Generator().manual_seed(p.numel()))
    mask = torch.tensor(PADDED_INSIDE[place], dtype=torch.bool)
    x = inputs_for(model, batch=3, length=9)
    logits, features = model(x, mask), model.forward_features(x, mask)
    for b in range(3):
        alone = x[b : b + 1, mask[b]]
        assert_rel_close(logits[b], model(alone)[0], 1e-12, f"row {b}: logits")
        real = torch.cat([torch.tensor([True]), mask[b]])  # CLS first, if any
        real = real[-features.shape[1] :]
        want = model.forward_features(alone)[0]
        assert_rel_close(features[b, real], want, 1e-12, f"row {b}: features")


@pytest.mark.parametrize("token_embedding", ["vocab", "conv"])
def test_garbage_at_padded_positions_changes_nothing(token_embedding):
    model = classifier(token_embedding=token_embedding)
    mask = lengths_mask(LENGTHS, N)
    x = inputs_for(model, batch=len(LENGTHS), length=N)
    reference = model.forward_features(x, mask)
    garbage = x.masked_fill(~mask, -100)  # ids outside the vocabulary, as loss ignore_index
    features = model.forward_features(garbage, mask)
    real = torch.cat([mask.new_ones(len(LENGTHS), 1), mask], dim=1)  # CLS first
    assert torch.equal(features[real], reference[real])
    assert torch.equal(model(garbage, mask), model(x, mask))


@pytest.mark.parametrize("token_embedding", ["linear", "conv"])
def test_nan_features_at_padded_positions_reach_no_output_or_gradient(token_embedding):
    model = classifier(token_embedding=token_embedding, in_features=4, pooling="mean")
    mask = lengths_mask(LENGTHS, N)
    x = inputs_for(model, batch=len(LENGTHS), length=N)
    x_nan = x.masked_fill(~mask[..., None], float("nan")).requires_grad_()
    logits = model(x_nan, mask)
    assert_rel_close(logits, model(x, mask), 1e-13, "NaN padding")
    logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert torch.isfinite(x_nan.grad).all() and (x_nan.grad[~mask] == 0).all()


def test_conv_embedding_does_not_leak_padding_into_real_tokens():
    torch.manual_seed(0)
    conv = ConvTokenEmbedding(6, dtype=F64)
    mask = lengths_mask([4, 7], 7)
    x = torch.randn(2, 7, 6, dtype=F64)
    y = conv(x.masked_fill(~mask[..., None], 1e3), mask)
    assert_rel_close(y[0, :4], conv(x[:1, :4])[0], 1e-13, "short sequence")
    assert_rel_close(y[1], conv(x[1:])[0], 1e-13, "full sequence")
    # without the mask the padding would leak: the test above can fail
    leaked = conv(x.masked_fill(~mask[..., None], 1e3))[0, :4]
    assert (leaked - y[0, :4]).abs().max() > 1e-3


def test_mean_pooling_averages_real_tokens_only():
    model = classifier(pooling="mean")
    mask = lengths_mask([3, 6], 6)
    x = inputs_for(model, batch=2, length=6)
    features = model.forward_features(x, mask)
    pooled = model.head.weight @ features[0, :3].mean(0) + model.head.bias
    assert_rel_close(model(x, mask)[0], pooled, 1e-13, "mean over the real tokens")


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_fully_padded_sequence_gives_the_logits_of_no_tokens(pooling):
    model = classifier(pooling=pooling, kernel_args={"mode": "efficient"})
    with torch.no_grad():  # (zero at initialisation, as a zeroed row would be)
        model.head.bias.copy_(torch.tensor([0.3, -0.2, 0.1], dtype=F64))
    mask = lengths_mask([0, 4], 4)
    x = inputs_for(model, batch=2, length=4)
    out = model(x, mask)
    assert torch.isfinite(out).all()
    if pooling == "mean":
        # no real token to average: pooled features of zeros, the logits the head's bias
        assert torch.equal(out[0], model.head.bias.detach()), f"{out[0]} is not the bias"
    else:
        # the CLS token attends itself alone: the model on an empty sequence
        assert_rel_close(out[0], model(x[:1, :0])[0], 1e-13, "CLS alone")
    assert_rel_close(out[1], model(x[1:])[0], 1e-13, "the full sequence, alone")


def test_cosine_positions_any_length_learned_limited():
    pe = sinusoidal_position_embedding(50, 7)
    assert pe.shape == (50, 7)
    assert torch.equal(sinusoidal_position_embedding(10, 7), pe[:10])
    assert_rel_close(pe[:, 0], torch.arange(50.0).sin(), 1e-6, "sin at frequency 1")
    cosine = classifier()
    assert cosine(inputs_for(cosine, batch=1, length=300)).shape == (1, 3)
    learned = classifier(pos_embedding="learned", max_len=8)
    learned(inputs_for(learned, batch=1, length=8))
    with pytest.raises(ValueError, match=r"cover max_len=8 tokens; got a sequence of 9"):
        learned(inputs_for(learned, batch=1, length=9))


def test_cosine_positions_in_float64_carry_no_float32_rounding():
    # written from the definition with Python's double-precision math, far into a sequence
    # (where a float32 angle is off by ~1e-3 rad)
    positions, dim = [0, 1, 77, 12_345, 1_000_003], 6

    def entry(p: int, i: int) -> float:  # pe[p, 2j] = sin(p / base^(2j/dim)), then cos
        angle = p / 10000.0 ** (2 * (i // 2) / dim)
        return math.sin(angle) if i % 2 == 0 else math.cos(angle)

    want = torch.tensor([[entry(p, i) for i in range(dim)] for p in positions], dtype=F64)
    got = sinusoidal_at(torch.tensor(positions), dim, dtype=torch.float64)
    assert (got - want).abs().max() < 1e-9
    in_float32 = sinusoidal_at(torch.tensor(positions), dim, dtype=torch.float32)
    assert (in_float32.double() - want).abs().max() > 1e-5  # (the check can fail)


def test_learned_positions_are_parameters_cosine_have_none():
    names = {n for n, _ in classifier(pos_embedding="learned", max_len=8).named_parameters()}
    assert "pos_embed.weight" in names
    assert not any("pos_embed" in n for n, _ in classifier().named_parameters())


def test_drop_path_rises_linearly():
    model = classifier(depth=3, drop_path=0.1)
    assert [b.drop_path.p for b in model.blocks] == pytest.approx([0.0, 0.05, 0.1])


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"pooling": "max"}, ValueError, r"pooling must be one of 'cls', 'mean'; got 'max'"),
        ({"pos_embedding": "rope"}, ValueError, r"pos_embedding must be one of .*got 'rope'"),
        ({"dim": 10, "num_heads": 3}, ValueError, r"dim must be divisible by num_heads"),
        ({"depth": 0}, ValueError, r"depth must be a positive int; got 0"),
        ({"mlp_ratio": 0}, ValueError, r"mlp_ratio must be a number > 0; got 0"),
        ({"drop_path": 1.0}, ValueError, r"drop_path must be a number in \[0, 1\); got 1.0"),
        ({"token_embedding": "bpe"}, ValueError, r"token_embedding must be one of"),
        ({"vocab_size": None}, ValueError, r"token_embedding='vocab' takes token ids"),
        ({"token_embedding": "linear"}, ValueError, r"token_embedding='linear' takes features"),
        ({"token_embedding": "conv", "in_features": 3}, ValueError, r"exactly one of"),
        ({"pos_embedding": "learned"}, ValueError, r"'learned' needs max_len"),
        ({"kernel_args": {"t": object()}}, TypeError, r"kernel_args must be JSON-serialisable"),
        ({"qkv_bias": 1}, TypeError, r"qkv_bias must be a bool; got 1"),
        ({"dim": 8.0}, TypeError, r"dim must be a positive int; got 8.0"),
        ({"dropout": "0.1"}, TypeError, r"dropout must be a number in \[0, 1\); got '0.1'"),
        ({"short_conv": -2}, ValueError, r"short_conv must be an int >= 0; got -2"),
        (
            {"short_conv": 3, "projection": "super", "context_len": 8},
            ValueError,
            r"short_conv needs projection 'standard', 'optimized' or 'query-only'",
        ),
    ],
)
def test_bad_settings_are_refused_by_name(settings, error, match):
    base = {"vocab_size": 5, "dim": 8, "depth": 1, "num_heads": 2}
    with pytest.raises(error, match=match):
        ClassifierConfig(**{**base, **settings})


def test_unknown_setting_lists_valid_ones():
    with pytest.raises(TypeError, match=r"has no setting 'vocab'; valid settings: .*vocab_size"):
        TransformerClassifier(vocab=5)
    with pytest.raises(TypeError, match=r"has no setting 'nope'"):
        ClassifierConfig.from_dict({"vocab_size": 5, "nope": 1})


def test_bad_inputs_are_refused_by_name():
    model = classifier()
    with pytest.raises(ValueError, match=r"integer token ids of shape \(B, N\); got dtype"):
        model(torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"token ids must be in \[0, vocab_size=11\); got ids"):
        model(torch.tensor([[0, 11]]))
    with pytest.raises(TypeError, match=r"padding_mask must be a bool tensor"):
        model(torch.zeros(2, 5, dtype=torch.long), torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"padding_mask must be \(B, N\) = \(2, 5\); got \(2, 4\)"):
        model(torch.zeros(2, 5, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool))
    features = classifier(token_embedding="linear", in_features=4)
    with pytest.raises(ValueError, match=r"features of shape \(B, N, in_features=4\); got"):
        features(torch.randn(2, 5, 3, dtype=F64))


def test_super_projection_refuses_more_tokens_than_its_context():
    model = classifier(projection="super", context_len=6)  # 5 tokens + CLS fit
    model(inputs_for(model, batch=1, length=5))
    with pytest.raises(ValueError, match=r"fixed context length of 6 tokens; got a sequence of 7"):
        model(inputs_for(model, batch=1, length=6))


@pytest.mark.parametrize("std", [1.0, 0.02])
def test_token_table_starts_at_token_init_std(std):
    # (1 balances the unit-amplitude cosine positions; 0.02 was the earlier default)
    model = classifier(vocab_size=4000, dim=48, token_init_std=std)
    assert abs(model.embed.weight.std().item() - std) < 0.05 * std
    with pytest.raises(ValueError, match=r"token_init_std must be a number > 0; got 0"):
        classifier(token_init_std=0)
