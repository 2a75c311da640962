"""VisionTransformer: shapes, patch embeddings, position embeddings, errors."""

from __future__ import annotations

import pytest
import torch

from taylorshift.models import PatchEmbedding, VisionTransformer, ViTConfig
from tests.helpers import assert_rel_close
from tests.models.cases import F64

TINY = {"dim": 16, "depth": 1, "num_heads": 2, "img_size": 16, "patch_size": 4, "num_classes": 7}


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"patch_embedding": "conv"},
        {"pooling": "mean", "pos_embedding": "cosine"},
        {"attn_kernel": "softmax", "in_chans": 1},
    ],
    ids=["linear", "conv-stem", "mean-cosine", "softmax-gray"],
)
def test_shapes(settings):
    model = VisionTransformer(**TINY, **settings)
    images = torch.randn(2, model.config.in_chans, 16, 16)
    assert model(images).shape == (2, 7)
    cls = 1 if model.config.pooling == "cls" else 0
    assert model.forward_features(images).shape == (2, 16 + cls, 16)


@pytest.mark.parametrize("patch_size", [1, 2, 3, 4, 6, 8, 16])
def test_conv_stem_reaches_the_patch_grid(patch_size):
    embed = PatchEmbedding(patch_size, 3, 8, conv_stem=True)
    side = 2 * patch_size
    assert embed(torch.randn(1, 3, side, side + patch_size)).shape == (1, 6, 8)
    convs = [m for m in embed.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 3


def test_linear_patch_embedding_is_a_linear_map_of_each_patch():
    torch.manual_seed(0)
    embed = PatchEmbedding(4, 3, 8, dtype=F64)
    images = torch.randn(1, 3, 8, 8, dtype=F64)
    tokens = embed(images)
    # token 1 is the patch in row 0, column 1 (row-major order)
    patch = images[0, :, 0:4, 4:8].reshape(-1)
    expected = embed.proj.weight.reshape(8, -1) @ patch + embed.proj.bias
    assert_rel_close(tokens[0, 1], expected, 1e-13, "patch (0, 1)")


def test_cosine_positions_take_other_image_sizes_learned_do_not():
    cosine = VisionTransformer(**TINY, pos_embedding="cosine")
    assert cosine(torch.randn(1, 3, 24, 8)).shape == (1, 7)
    learned = VisionTransformer(**TINY)
    with pytest.raises(ValueError, match=r"fix the image size to 16 x 16; got \(24, 8\)"):
        learned(torch.randn(1, 3, 24, 8))


def test_bad_images_and_settings_are_refused_by_name():
    model = VisionTransformer(**TINY)
    with pytest.raises(ValueError, match=r"images must be \(B, in_chans=3, H, W\); got shape"):
        model(torch.randn(1, 1, 16, 16))
    with pytest.raises(ValueError, match=r"multiples of patch_size=4; got 18 x 16"):
        VisionTransformer(**TINY, pos_embedding="cosine")(torch.randn(1, 3, 18, 16))
    with pytest.raises(ValueError, match=r"img_size must be a multiple of patch_size"):
        ViTConfig(img_size=30, patch_size=4)
    with pytest.raises(ValueError, match=r"patch_embedding must be one of"):
        ViTConfig(patch_embedding="pixel")
    with pytest.raises(TypeError, match=r"ViTConfig has no setting 'max_len'"):
        VisionTransformer(**TINY, max_len=20)
