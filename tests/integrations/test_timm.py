"""Our attention inside timm's VisionTransformer (runs where timm imports; skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

timm = pytest.importorskip(
    "timm",
    reason="timm is not importable here (not installed, or the torchvision it imports is "
    "missing: PyPI has none for CPU-only torch); pip install 'taylorshift[timm]'",
)

from taylorshift.integrations.timm import (  # noqa: E402
    split_qkv,
    supports_attn_layer,
    taylorshift_vit,
    timm_kwargs,
)
from taylorshift.nn import Attention, list_kernels  # noqa: E402
from tests.helpers import assert_rel_close  # noqa: E402

TINY = {"img_size": 32, "patch_size": 8, "num_classes": 5, "depth": 2}
NAME = "vit_tiny_patch16_224"
ROUTES = ["block_fn", "attn_layer"] if supports_attn_layer() else ["block_fn"]


def _vit(seed=0, **kwargs):
    torch.manual_seed(seed)
    return taylorshift_vit(NAME, **TINY, **kwargs).double().eval()


def _images():
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)).double()


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("kernel", list_kernels())
def test_every_kernel_runs_in_timms_vit(route, kernel):
    model = _vit(attn_kernel=kernel, route=route).train()
    assert all(isinstance(block.attn, Attention) for block in model.blocks)
    assert all(block.attn.kernel.name == kernel for block in model.blocks)
    out = model(_images())
    assert out.shape == (2, 5)
    out.square().mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_auto_route_uses_attn_layer_where_timm_has_it():
    expected = "attn_layer" if supports_attn_layer() else "block_fn"
    assert list(timm_kwargs()) == [expected]
    if not supports_attn_layer():
        with pytest.raises(ValueError, match=r"route='attn_layer' needs timm >= 1.0.23"):
            timm_kwargs(route="attn_layer")


@pytest.mark.skipif(not supports_attn_layer(), reason="attn_layer= needs timm >= 1.0.23")
def test_both_routes_compute_the_same_function():
    a = _vit(route="attn_layer", kernel_args={"mode": "efficient"})
    b = _vit(seed=1, route="block_fn", kernel_args={"mode": "efficient"})
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(_images()), b(_images()))


def test_direct_equals_efficient_inside_timm():
    direct = _vit(kernel_args={"mode": "direct"})
    efficient = _vit(seed=1, kernel_args={"mode": "efficient"})
    efficient.load_state_dict(direct.state_dict())
    assert_rel_close(efficient(_images()), direct(_images()), 1e-11, "logits")


def test_softmax_kernel_with_split_timm_weights_equals_timms_vit():
    torch.manual_seed(0)
    reference = timm.create_model(NAME, **TINY).double().eval()
    ours = _vit(attn_kernel="softmax")
    result = ours.load_state_dict(split_qkv(reference.state_dict()), strict=False)
    assert (result.missing_keys, result.unexpected_keys) == ([], [])
    assert_rel_close(ours(_images()), reference(_images()), 1e-12, "timm softmax ViT")


def test_taylorshift_from_split_timm_weights_misses_only_the_temperatures():
    reference = timm.create_model(NAME, **TINY)
    result = _vit().load_state_dict(split_qkv(reference.state_dict()), strict=False)
    assert result.unexpected_keys == []
    assert result.missing_keys == [f"blocks.{i}.attn.kernel.temperature" for i in range(2)]
