"""taylorshift.integrations.timm parts that work without timm installed."""

from __future__ import annotations

import importlib
import inspect
import sys

import pytest
import torch

from taylorshift.integrations import timm as ts_timm
from taylorshift.nn import Attention
from tests.helpers import assert_rel_close


def test_attn_layer_class_binds_the_kernel_and_takes_timms_arguments():
    cls = ts_timm.attn_layer_class("holt", {"alpha": 2.0}, projection="optimized")
    assert issubclass(cls, Attention)  # timm calls issubclass on attn_layer
    # the keyword arguments timm's _create_attn passes
    layer = cls(
        32, num_heads=4, qkv_bias=True, qk_norm=True, scale_norm=False, proj_bias=True,
        attn_drop=0.0, proj_drop=0.0, norm_layer=None, device=None, dtype=torch.float64,
    )  # fmt: skip
    assert layer.kernel.name == "holt" and layer.kernel.alpha == 2.0
    assert layer.projection == "optimized" and layer.v_proj is None
    assert layer(torch.randn(2, 5, 32, dtype=torch.float64)).shape == (2, 5, 32)


def test_attn_layer_class_refuses_unknown_kernels_and_arguments():
    with pytest.raises(ValueError, match=r"attn_kernel must be one of .*got 'flash'"):
        ts_timm.attn_layer_class("flash")
    cls = ts_timm.attn_layer_class()
    with pytest.raises(TypeError, match="depth"):
        cls(16, num_heads=2, depth=3)


def test_attn_layer_class_takes_timms_arguments_in_order_and_keeps_its_binding():
    cls = ts_timm.attn_layer_class("linear")
    # timm's positional order: dim, num_heads, qkv_bias, qk_norm, scale_norm, proj_bias, ...
    layer = cls(16, 2, True, False, False, False, dtype=torch.float64)
    assert layer.num_heads == 2 and layer.q_proj.bias is not None and layer.proj.bias is None
    assert layer.kernel.name == "linear"
    with pytest.raises(TypeError, match="attn_kernel"):
        cls(16, num_heads=2, attn_kernel="softmax")
    shown = inspect.signature(cls)
    assert "qkv_bias" in shown.parameters and "attn_kernel" not in shown.parameters


def test_split_qkv_maps_timm_fused_weights_onto_ours():
    torch.manual_seed(0)
    dim, heads = 12, 3
    ours = Attention(dim, heads, qkv_bias=True, attn_kernel="softmax", dtype=torch.float64)
    fused = {
        "blocks.0.attn.qkv.weight": torch.cat(
            [ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]
        ),
        "blocks.0.attn.qkv.bias": torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]),
        "blocks.0.attn.proj.weight": ours.proj.weight,
    }
    split = ts_timm.split_qkv(fused)
    assert sorted(split) == [
        "blocks.0.attn.k_proj.bias",
        "blocks.0.attn.k_proj.weight",
        "blocks.0.attn.proj.weight",
        "blocks.0.attn.q_proj.bias",
        "blocks.0.attn.q_proj.weight",
        "blocks.0.attn.v_proj.bias",
        "blocks.0.attn.v_proj.weight",
    ]
    assert torch.equal(split["blocks.0.attn.v_proj.bias"], ours.v_proj.bias)

    # timm's computation with the fused weights equals ours with the split ones
    x = torch.randn(2, 7, dim, dtype=torch.float64)
    qkv = x @ fused["blocks.0.attn.qkv.weight"].T + fused["blocks.0.attn.qkv.bias"]
    q, k, v = qkv.reshape(2, 7, 3, heads, dim // heads).permute(2, 0, 3, 1, 4).unbind(0)
    y = torch.softmax(q @ k.transpose(-2, -1) / (dim // heads) ** 0.5, -1) @ v
    y = ours.proj(y.transpose(1, 2).reshape(2, 7, dim))
    assert_rel_close(ours(x), y, 1e-13, "timm layout")
    with pytest.raises(ValueError, match=r"3·dim rows; got shape \(4, 2\)"):
        ts_timm.split_qkv({"qkv.weight": torch.zeros(4, 2)})


def test_without_timm_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # makes `import timm` raise ImportError
    with pytest.raises(ImportError, match=r"pip install 'taylorshift\[timm\]'"):
        ts_timm.taylorshift_vit()
    with pytest.raises(ImportError, match=r"pip install 'taylorshift\[timm\]'"):
        ts_timm.block_class()


def test_the_integration_imports_without_timm(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # `import timm` raises ImportError
    importlib.reload(ts_timm)  # fails if the module imported timm at import time


def test_bad_route_is_refused_before_timm_is_needed():
    with pytest.raises(ValueError, match=r"route must be 'auto', 'attn_layer' or 'block_fn'"):
        ts_timm.timm_kwargs(route="fused")
