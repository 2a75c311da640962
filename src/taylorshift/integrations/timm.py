"""Any taylorshift attention kernel inside timm's ``VisionTransformer``.

Two routes, chosen by what the installed timm offers:

- timm >= 1.0.23: ``VisionTransformer(attn_layer=...)``. timm needs a *class* there (it calls
  ``issubclass`` on it, so ``functools.partial`` fails): ``attn_layer_class(...)`` returns a
  subclass of ``taylorshift.nn.Attention`` with the kernel settings bound.
- older timm: ``VisionTransformer(block_fn=...)``: ``block_class(...)`` returns a subclass of
  timm's own ``Block`` whose ``attn`` is ours, so every other part of the block stays timm's.

``timm_kwargs(...)`` returns whichever of ``{"attn_layer": ...}`` / ``{"block_fn": ...}``
fits, and ``taylorshift_vit(name, ...)`` passes it to ``timm.create_model``. Our attention
keeps timm's names for the output projection (``proj``) and norms (``q_norm``, ``k_norm``,
``norm``) but has separate ``q_proj``/``k_proj``/``v_proj`` where timm has a fused ``qkv``:
``split_qkv`` converts a timm state dict (e.g. pretrained softmax weights).

timm is imported only when a function needs it; without it they raise ImportError saying
to ``pip install 'taylorshift[timm]'`` (timm imports torchvision, so that must be
installable for your torch).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from ..nn import Attention, list_kernels
from ..nn.attention import takes_attention_arguments

ATTN_LAYER_MIN_VERSION = "1.0.23"


def import_timm():
    """``import timm`` with an ImportError that says how to install it."""
    try:
        import timm
    except ImportError as err:
        raise ImportError(
            "taylorshift.integrations.timm needs timm (and the torchvision it imports): "
            f"pip install 'taylorshift[timm]'  [{type(err).__name__}: {err}]"
        ) from err
    return timm


def attn_layer_class(
    attn_kernel: str = "taylorshift",
    kernel_args: dict[str, Any] | None = None,
    *,
    projection: str = "standard",
    context_len: int | None = None,
) -> type[Attention]:
    """A ``taylorshift.nn.Attention`` subclass with these settings bound, for ``attn_layer=``.

    The class takes timm's attention arguments (``dim, num_heads, qkv_bias, qk_norm,
    scale_norm, proj_bias, attn_drop, proj_drop, norm_layer, device, dtype``). Does not
    need timm.

    Args:
        attn_kernel: a name from ``taylorshift.nn.list_kernels()``.
        kernel_args: that kernel's options, e.g. ``{"mode": "efficient"}``.
        projection, context_len: as ``taylorshift.nn.Attention`` (``super`` needs
            ``context_len`` ≥ tokens, CLS included).
    """
    if attn_kernel not in list_kernels():
        raise ValueError(f"attn_kernel must be one of {list_kernels()}; got {attn_kernel!r}")
    bound = dict(kernel_args or {})

    class TimmAttention(Attention):
        # Attention's own signature (timm's arguments come first in it), with the bound
        # settings added: a caller that passes one of them again gets Python's TypeError.
        @takes_attention_arguments("attn_kernel", "kernel_args", "projection", "context_len")
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(
                *args,
                **kwargs,
                attn_kernel=attn_kernel,
                kernel_args=dict(bound),
                projection=projection,
                context_len=context_len,
            )

    TimmAttention.__doc__ = (
        f"taylorshift Attention for timm: attn_kernel={attn_kernel!r}, kernel_args={bound}, "
        f"projection={projection!r}, context_len={context_len}"
    )
    return TimmAttention


def block_class(
    attn_kernel: str = "taylorshift",
    kernel_args: dict[str, Any] | None = None,
    *,
    projection: str = "standard",
    context_len: int | None = None,
) -> type[nn.Module]:
    """A subclass of timm's ``Block`` whose attention is ours, for ``block_fn=`` (any timm).

    The block takes exactly timm's ``Block`` arguments (which vary between timm versions),
    builds timm's block, then replaces ``attn`` with ``attn_layer_class(...)`` built from the
    same arguments.
    """
    import_timm()
    from timm.models.vision_transformer import Block as TimmBlock

    attn_cls = attn_layer_class(
        attn_kernel, kernel_args, projection=projection, context_len=context_len
    )

    class TaylorShiftTimmBlock(TimmBlock):
        def __init__(self, dim: int, num_heads: int, **kwargs: Any):
            kwargs.pop("attn_layer", None)  # newer timm passes its default; ours replaces it
            super().__init__(dim, num_heads, **kwargs)
            self.attn = attn_cls(
                dim,
                num_heads,
                qkv_bias=kwargs.get("qkv_bias", False),
                qk_norm=kwargs.get("qk_norm", False),
                scale_norm=kwargs.get("scale_attn_norm", False),
                proj_bias=kwargs.get("proj_bias", True),
                attn_drop=kwargs.get("attn_drop", 0.0),
                proj_drop=kwargs.get("proj_drop", 0.0),
                norm_layer=kwargs.get("norm_layer"),
                device=kwargs.get("device"),
                dtype=kwargs.get("dtype"),
            )

    return TaylorShiftTimmBlock


def supports_attn_layer() -> bool:
    """Whether the installed timm's VisionTransformer takes ``attn_layer=`` (timm >= 1.0.23)."""
    import_timm()
    from timm.models.vision_transformer import VisionTransformer

    return "attn_layer" in inspect.signature(VisionTransformer.__init__).parameters


def timm_kwargs(
    attn_kernel: str = "taylorshift",
    kernel_args: dict[str, Any] | None = None,
    *,
    projection: str = "standard",
    context_len: int | None = None,
    route: str = "auto",
) -> dict[str, Any]:
    """Keyword arguments that put our attention into timm's ``VisionTransformer``.

    Args:
        attn_kernel, kernel_args, projection, context_len: as ``attn_layer_class``.
        route: ``"attn_layer"`` (timm >= 1.0.23), ``"block_fn"`` (any timm) or ``"auto"``
            (``attn_layer`` where supported).

    Returns:
        ``{"attn_layer": cls}`` or ``{"block_fn": cls}``.
    """
    if route not in ("auto", "attn_layer", "block_fn"):
        raise ValueError(f"route must be 'auto', 'attn_layer' or 'block_fn'; got {route!r}")
    settings = {"projection": projection, "context_len": context_len}
    if route == "auto":
        route = "attn_layer" if supports_attn_layer() else "block_fn"
    if route == "attn_layer":
        if not supports_attn_layer():
            timm = import_timm()
            raise ValueError(
                f"route='attn_layer' needs timm >= {ATTN_LAYER_MIN_VERSION}; timm "
                f"{timm.__version__} is installed (use route='block_fn')"
            )
        return {"attn_layer": attn_layer_class(attn_kernel, kernel_args, **settings)}
    return {"block_fn": block_class(attn_kernel, kernel_args, **settings)}


def taylorshift_vit(
    model_name: str = "vit_tiny_patch16_224",
    *,
    attn_kernel: str = "taylorshift",
    kernel_args: dict[str, Any] | None = None,
    projection: str = "standard",
    context_len: int | None = None,
    route: str = "auto",
    **create_kwargs: Any,
) -> nn.Module:
    """``timm.create_model(model_name, ...)`` with our attention in every block.

    Args:
        model_name: a timm VisionTransformer name (``vit_tiny_patch16_224``, ...).
        attn_kernel, kernel_args, projection, context_len, route: as ``timm_kwargs``.
        **create_kwargs: passed to ``timm.create_model`` (``num_classes``, ``img_size``,
            ...). ``pretrained=True`` fails on the fused ``qkv`` weights: load them
            through ``split_qkv`` instead.
    """
    timm = import_timm()
    route_kwargs = timm_kwargs(
        attn_kernel, kernel_args, projection=projection, context_len=context_len, route=route
    )
    return timm.create_model(model_name, **create_kwargs, **route_kwargs)


def split_qkv(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """timm attention weights -> ours: ``<p>.qkv.{weight,bias}`` -> ``<p>.{q,k,v}_proj.*``.

    timm's fused projection stacks q, k, v along the output features (3·dim rows, heads
    contiguous within each), as ours are laid out one by one. Other keys pass unchanged.
    Load the result with ``strict=False``: timm has no TaylorShift ``temperature``.
    """
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        prefix, _, leaf = key.rpartition(".")
        if prefix == "qkv" or prefix.endswith(".qkv"):
            base = prefix[: -len("qkv")]
            if tensor.shape[0] % 3:
                raise ValueError(
                    f"{key}: a fused qkv tensor has 3·dim rows; got shape {tuple(tensor.shape)}"
                )
            parts = tensor.chunk(3, dim=0)  # q, k, v stacked along the output features
            for name, part in zip(("q_proj", "k_proj", "v_proj"), parts, strict=True):
                out[f"{base}{name}.{leaf}"] = part.clone()
        else:
            out[key] = tensor
    return out
