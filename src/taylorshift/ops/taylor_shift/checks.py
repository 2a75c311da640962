"""Input validation for ``taylor_shift_attention``: every public form calls this once.

Each error names the argument, what was expected and what came, so that a user can fix the
call without reading our code.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
from torch import Tensor

from ..._validate import check_bool, check_choice, check_int, check_number, is_finite
from ..masks import key_padding_of

MODES = ("auto", "direct", "efficient")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class Problem:
    """A validated call, with the derived facts the forms need.

    ``mask`` is the bool mask broadcast to (B, H, Nq, Nk) or ``None``; ``key_mask`` is the
    same mask reduced to (B, H, Nk) when it does not vary over queries, else ``None``.
    """

    batch: int
    heads: int
    n_query: int
    n_key: int
    head_dim: int
    value_dim: int
    mask: Tensor | None
    key_mask: Tensor | None
    mask_varies_over_queries: bool


def _shape(t: Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def _check_dense(name: str, t: Tensor) -> None:
    if t.is_nested:
        raise TypeError(f"{name} must be a dense (strided) tensor; got a nested tensor")
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor; got layout {t.layout}")


def _check_tensor(name: str, t: object, layout: str) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {layout}; got {type(t).__name__}")
    _check_dense(name, t)
    if t.dim() != 4:
        raise ValueError(
            f"{name} must be 4-D with shape {layout}; got {t.dim()}-D tensor of shape {_shape(t)}"
        )
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must have a floating dtype (float16, bfloat16, float32 or float64); "
            f"got {t.dtype}"
        )
    return t


def key_value_groups(query: object, key: object, value: object) -> int:
    """G = H / Hkv for ``enable_gqa=True``; raises naming the argument where key and value
    do not have one head count that divides the query's, or other batch sizes."""
    q = _check_tensor("query", query, "(B, H, Nq, d)")
    k = _check_tensor("key", key, "(B, Hkv, Nk, d)")
    v = _check_tensor("value", value, "(B, Hkv, Nk, dv)")
    batch, heads = q.shape[:2]
    other = next((name for name, t in (("key", k), ("value", v)) if t.shape[0] != batch), None)
    if other is not None:
        got = _shape(k if other == "key" else v)
        raise ValueError(
            f"{other} must have the batch size of query (B = {batch}); got {other} of shape {got}"
        )
    kv_heads = k.shape[1]
    if v.shape[1] != kv_heads:
        raise ValueError(
            f"value must have the heads of key (Hkv = {kv_heads}); got value of shape {_shape(v)}"
        )
    if kv_heads == heads:  # (no grouping; also no heads at all)
        return 1
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(
            f"key and value heads must divide the query heads (H = {heads}) with "
            f"enable_gqa=True; got key of shape {_shape(k)}"
        )
    return heads // kv_heads


def check_options(normalize: object, order: object, mode: object) -> None:
    """The tensor-free options of the op; modules call this at construction."""
    check_bool("normalize", normalize)
    if check_int("order", order, ge=2) % 2:
        raise ValueError(
            f"order must be an even int >= 2 (odd orders can give negative weights and "
            f"vanishing denominators); got {order}"
        )
    check_choice("mode", mode, MODES)


def check_inputs(
    query: object,
    key: object,
    value: object,
    attn_mask: object,
    is_causal: object,
    temperature: object,
    scale: object,
    normalize: object,
    order: object,
    mode: object,
    enable_gqa: bool = False,
) -> Problem:
    """Validate a call; raise ``TypeError``/``ValueError`` naming the argument on bad input.

    ``enable_gqa``: key and value may have Hkv heads dividing the query's H (checked by
    :func:`key_value_groups`); the problem is then the call's with H heads, its masks
    broadcast over the query's heads."""
    q, k, v, mask = check_attention_inputs(query, key, value, attn_mask, is_causal, enable_gqa)
    b, h, nq, d = q.shape
    nk = k.shape[2]
    check_options(normalize, order, mode)

    _check_temperature_and_scale(temperature, scale, normalize, q)

    key_mask = None
    varies = False
    if mask is not None:
        # A mask whose rows are all equal is a key-padding mask, whatever its shape says.
        # (torch.compile cannot branch on the data while tracing: there a full-shape mask
        # counts as varying, and key padding should come as (B, H, 1, Nk).)
        if nq <= 1 or key_padding_of(mask) is not None:
            key_mask = mask[:, :, 0, :]
        else:
            varies = True
    if mode == "efficient":
        if order != 2:
            raise ValueError(
                f"mode='efficient' supports order=2 only; got order={order} (use mode='direct')"
            )
        if varies:
            traced = (
                " (under torch.compile every mask of shape (B, H, Nq, Nk) counts as varying: "
                "give key padding as (B, H, 1, Nk))"
                if torch.compiler.is_compiling()
                else ""
            )
            raise ValueError(
                "attn_mask varies over queries, which mode='efficient' cannot express (it "
                "supports key-padding masks of shape (B, H, 1, Nk) and is_causal); got "
                f"attn_mask of shape {_shape(attn_mask)}; use mode='direct' for general "
                f"masks{traced}"
            )
    return Problem(b, h, nq, nk, d, v.shape[3], mask, key_mask, varies)


def check_attention_inputs(
    query: object,
    key: object,
    value: object,
    attn_mask: object,
    is_causal: object,
    enable_gqa: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The checks of an attention call that every kernel shares (TaylorShift's and the
    baselines'): query (B, H, Nq, d), key (B, H or Hkv, Nk, d), value (B, H or Hkv, Nk, dv)
    dense floating tensors of one dtype and device, a bool mask broadcasting to
    (B, H, Nq, Nk), a bool ``is_causal``. Returns q, k, v and the mask broadcast to
    (B, H, Nq or 1, Nk) (or None); raises ``TypeError``/``ValueError`` naming the argument."""
    if enable_gqa:
        key_value_groups(query, key, value)
    q = _check_tensor("query", query, "(B, H, Nq, d)")
    k = _check_tensor("key", key, "(B, H, Nk, d)")
    v = _check_tensor("value", value, "(B, H, Nk, dv)")

    b, h, nq, d = q.shape
    if not enable_gqa:  # (else key_value_groups checked the batch and head sizes)
        fewer = k.shape[0] == b and 0 < k.shape[1] < h and h % k.shape[1] == 0
        for name, t in (("key", k), ("value", v)):
            if t.shape[:2] != (b, h):
                raise ValueError(
                    f"{name} must have the batch and head sizes of query, (B, H) = ({b}, {h}); "
                    f"got {name} of shape {_shape(t)}"
                    + (" (fewer key/value heads: pass enable_gqa=True)" if fewer else "")
                )
    nk = k.shape[2]
    if v.shape[2] != nk:
        raise ValueError(
            f"value must have as many tokens as key (Nk = {nk}); got value of shape {_shape(v)}"
        )
    if k.shape[3] != d:
        raise ValueError(
            f"key must have the head dim of query (d = {d}); got key of shape {_shape(k)}"
        )
    if d == 0:
        raise ValueError(
            f"query and key must have a head dim d >= 1; got query of shape {_shape(q)}"
        )
    for name, t in (("key", k), ("value", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have the dtype of query ({q.dtype}); got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on the device of query ({q.device}); got {t.device}")

    check_bool("is_causal", is_causal)
    mask = None if attn_mask is None else _check_mask(attn_mask, b, h, nq, nk, q.device)
    return q, k, v, mask


def _check_temperature_and_scale(
    temperature: object, scale: object, normalize: bool, q: Tensor
) -> None:
    b, h = q.shape[:2]
    if isinstance(temperature, Tensor):
        _check_dense("temperature", temperature)
        if not temperature.is_floating_point():
            raise TypeError(
                f"temperature must be a float or floating tensor; got {temperature.dtype}"
            )
        if temperature.device != q.device:
            raise ValueError(
                f"temperature must be on the device of query ({q.device}); got {temperature.device}"
            )
        if not broadcasts_to(temperature.shape, (b, h, 1, 1)):
            raise ValueError(
                f"temperature must broadcast to (B, H, 1, 1) = ({b}, {h}, 1, 1); "
                f"got shape {_shape(temperature)}"
            )
    elif isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(
            f"temperature must be a float or a tensor; got {type(temperature).__name__}"
        )
    elif not is_finite(float(temperature)):
        raise ValueError(f"temperature must be finite; got {temperature}")

    if check_number("scale", scale, allow_none=True) is not None and normalize:
        raise ValueError(
            f"scale applies only with normalize=False (normalized scores use temperature); "
            f"got scale={scale} with normalize=True"
        )
    if isinstance(temperature, Tensor):
        if not normalize:
            raise ValueError(
                "temperature applies only with normalize=True (unnormalized scores use scale); "
                f"got a temperature tensor of shape {_shape(temperature)} with normalize=False"
            )
    elif not normalize and float(temperature) != 1.0:
        raise ValueError(
            "temperature applies only with normalize=True (unnormalized scores use scale); "
            f"got temperature={temperature} with normalize=False"
        )


def _check_mask(
    attn_mask: object, b: int, h: int, nq: int, nk: int, device: torch.device
) -> Tensor:
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"attn_mask must be a bool tensor or None; got {type(attn_mask).__name__}")
    _check_dense("attn_mask", attn_mask)
    if attn_mask.dtype != torch.bool:
        extra = (
            " (additive float masks have no meaning for weights that are not exponentials; "
            "pass a bool mask, e.g. float_mask == 0)"
            if attn_mask.is_floating_point()
            else ""
        )
        raise TypeError(
            f"attn_mask must be a bool tensor (True = attend); got {attn_mask.dtype}{extra}"
        )
    if attn_mask.device != device:
        raise ValueError(
            f"attn_mask must be on the device of query ({device}); got {attn_mask.device}"
        )
    target = (b, h, nq, nk)
    if not broadcasts_to(attn_mask.shape, target):
        raise ValueError(
            f"attn_mask must broadcast to (B, H, Nq, Nk) = ({b}, {h}, {nq}, {nk}); "
            f"got shape {_shape(attn_mask)}"
        )
    while attn_mask.dim() < 4:
        attn_mask = attn_mask.unsqueeze(0)
    # Keep the query dim at its own size (1 for key padding) so no (Nq, Nk) tensor appears.
    return attn_mask.expand(b, h, attn_mask.shape[2], nk)


def broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts to exactly ``target`` (torch.broadcast_shapes without its
    cost: it takes a tenth of a decoding step)."""
    if len(shape) > len(target):
        return False
    return all(n in (1, t) for n, t in zip(reversed(shape), reversed(target), strict=False))
