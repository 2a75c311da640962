"""TaylorShift inside Hugging Face ``transformers``: ``attn_implementation="taylorshift"``.

``register()`` adds two entries under one name (default ``"taylorshift"``):

- to ``transformers.AttentionInterface``: the attention function that the model's attention
  modules call in place of SDPA/eager. It receives query, key, value as (B, H, N, d) (key and
  value with the model's key/value heads: grouped-query attention, ``enable_gqa=True``) and
  returns (B, N, H, dv) and ``None`` weights, as every ``transformers`` attention does.
- to ``transformers.AttentionMaskInterface``: ``taylorshift_mask``, the mask builder. Without
  it ``transformers`` builds no mask at all for an unknown implementation, and padding would
  leak. For the common masks it builds nothing of size (Nq, Nk): a key-padding mask
  (B, 1, 1, Nk) for causal models (the attention adds causality), the same mask expanded
  without copying for bidirectional ones, or ``None`` when nothing is padded. Any other
  pattern (sliding windows, packed sequences, overlays, chunked prefill on a cache) falls
  back to ``transformers``' own boolean (B, 1, Nq, Nk) mask, which only the direct form
  (``mode="auto"`` picks it) can take.

How the attention reads the mask it is given (``attention_mask``):

- ``None``: the module's causality (``is_causal`` argument, else ``module.is_causal``)
  applies when Nq > 1, upper-left aligned, as ``transformers``' SDPA path does.
- a mask with a query dim of 1, (B, 1, 1, Nk), or a 2-D (B, Nk) one (1 = attend): key
  padding, *combined* with the module's causality. Unlike SDPA, which would take such a
  mask as complete; ``transformers`` itself never makes one while Nq > 1.
- a mask with Nq rows: the complete pattern; no causality is added.
- bool masks are True = attend; float (additive) masks may hold only 0 (attend) and -inf or
  the dtype's minimum (masked): other biases have no meaning for a polynomial weight.

Scores: with ``normalize=True`` (default, the paper's scheme) query and key are L2-normalised
and scores are ``temperature · q̂·k̂``; the module's ``scaling`` (1/sqrt(d) in most models)
would only rescale τ, so it is not used, and the output is multiplied by sqrt(n_i/d). With
``normalize=False`` scores are ``scaling · q·k``, the plain Taylor softmax in place of the
softmax the model was built for. A module attribute ``taylorshift_temperature`` (a float or
a tensor broadcastable to (B, H, 1, 1), e.g. an ``nn.Parameter`` of shape (1, H, 1, 1) to
learn it) takes precedence over the ``temperature`` option.

Options (``mode``, ``temperature``, ``normalize``, ``order``, ``ignore_dropout``) are set by
``register(...)`` and may be overridden per model by a dict in its config,
``config.taylorshift = {"mode": "direct"}`` (saved with the config; the config the attention
modules hold, which in composite models such as CLIP is a sub-config, ``config.text_config``).

Attention dropout has no counterpart in the linear-time form (dropping entries of the
key-side state is not dropout on attention weights), so a module that asks for it (training
with a nonzero attention dropout in its config) gets a ValueError unless
``ignore_dropout=True``, which skips it.

Only models whose attention modules call ``AttentionInterface`` run TaylorShift; others
accept the name and keep their own attention. ``check_model(model, inputs)`` runs one
forward pass and says which kind a model is.

``transformers`` is imported only when a function needs it; without it they raise ImportError
saying to ``pip install "taylorshift[hf]"``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .._validate import check_bool, check_str
from .._warn import warn_user
from ..ops import taylor_shift_attention
from ..ops.taylor_shift.checks import check_options

TESTED_VERSION = "5.23.0 and 5.24.0"
CONFIG_ATTRIBUTE = "taylorshift"
TEMPERATURE_ATTRIBUTE = "taylorshift_temperature"
DEFAULT_OPTIONS: dict[str, Any] = {
    "mode": "auto",
    "temperature": 1.0,
    "normalize": True,
    "order": 2,
    "ignore_dropout": False,
}
# keyword arguments some transformers models pass that this attention cannot honour
_UNSUPPORTED_KWARGS = {
    "softcap": "logit soft-capping",
    "position_bias": "an additive position bias",
    "s_aux": "attention sinks",
}
_REGISTERED: dict[str, dict[str, Any]] = {}


def import_transformers():
    """``import transformers`` with an ImportError that says how to install it."""
    try:
        import transformers
    except ImportError as err:
        raise ImportError(
            "taylorshift.integrations.huggingface needs transformers: "
            f'pip install "taylorshift[hf]"  [{type(err).__name__}: {err}]'
        ) from err
    if not hasattr(transformers, "AttentionInterface") or not hasattr(
        transformers, "AttentionMaskInterface"
    ):
        raise ImportError(
            "taylorshift.integrations.huggingface needs transformers with AttentionInterface "
            f"and AttentionMaskInterface (tested with {TESTED_VERSION}); got transformers "
            f'{transformers.__version__}: pip install "taylorshift[hf]"'
        )
    return transformers


def check_hf_options(
    options: dict[str, Any], where: str = "options", base: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Validate a (partial) options dict; return it merged over ``base`` (the defaults).

    Raises TypeError/ValueError naming ``where``, the option, the expected and the actual value.
    """
    if not isinstance(options, dict):
        raise TypeError(
            f"{where} must be a dict of TaylorShift options; got {type(options).__name__}"
        )
    unknown = sorted(set(options) - set(DEFAULT_OPTIONS))
    if unknown:
        raise ValueError(
            f"{where} has unknown option(s) {unknown}; expected some of {sorted(DEFAULT_OPTIONS)}"
        )
    merged = {**(DEFAULT_OPTIONS if base is None else base), **options}
    try:
        check_options(merged["normalize"], merged["order"], merged["mode"])
        check_bool("ignore_dropout", merged["ignore_dropout"])
    except (TypeError, ValueError) as err:
        raise type(err)(f"{where}: {err}") from None
    temperature = merged["temperature"]
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(
            f"{where}: temperature must be a float; got {type(temperature).__name__}"
            f" (a per-head tensor goes to the module attribute {TEMPERATURE_ATTRIBUTE})"
        )
    if not math.isfinite(float(temperature)):
        raise ValueError(f"{where}: temperature must be finite; got {temperature}")
    if not merged["normalize"] and float(temperature) != 1.0:
        raise ValueError(
            f"{where}: temperature applies only with normalize=True (normalize=False scores "
            f"with the module's scaling); got temperature={temperature} with normalize=False"
        )
    return merged


def register(
    name: str = "taylorshift",
    *,
    mode: str = "auto",
    temperature: float = 1.0,
    normalize: bool = True,
    order: int = 2,
    ignore_dropout: bool = False,
) -> str:
    """Register TaylorShift with ``transformers`` as ``attn_implementation=name``.

    After ``register()``, ``AutoModel.from_config(config, attn_implementation="taylorshift")``
    (or ``from_pretrained(..., attn_implementation=...)``, or
    ``model.set_attn_implementation(...)``) runs every attention of the model through
    ``taylor_shift_attention``. Registering the same name again replaces its options;
    several names may hold different options.

    Args:
        name: the ``attn_implementation`` string; ``transformers``' own names are refused.
        mode: ``"auto"``, ``"direct"`` or ``"efficient"``, as ``taylor_shift_attention``
            (``"efficient"`` fails on masks that vary over queries, e.g. sliding windows).
        temperature: τ of the normalised scores ``τ · q̂·k̂`` (``normalize=True`` only).
        normalize: the paper's scheme (q, k L2-normalised, output · sqrt(n_i/d)); with False,
            scores are ``module.scaling · q·k``.
        order: even Taylor order (the efficient form supports 2).
        ignore_dropout: skip the module's attention dropout instead of raising.

    Each option may be overridden per model through ``config.taylorshift = {...}``.

    Returns:
        ``name``.
    """
    transformers = import_transformers()
    check_str("name", name)
    attention_interface = transformers.AttentionInterface
    builtin = (set(attention_interface._global_mapping) | {"eager"}) - set(_REGISTERED)
    if name in builtin:
        raise ValueError(
            f"name must not be one of transformers' own attention implementations "
            f"{sorted(builtin)}; got {name!r}"
        )
    options = check_hf_options(
        {
            "mode": mode,
            "temperature": temperature,
            "normalize": normalize,
            "order": order,
            "ignore_dropout": ignore_dropout,
        },
        where="register()",
    )
    _REGISTERED[name] = options
    attention_interface.register(name, make_attention_function(**options))
    transformers.AttentionMaskInterface.register(name, taylorshift_mask)
    return name


def unregister(name: str = "taylorshift") -> None:
    """Remove a name that ``register`` added (models set to it stop working)."""
    if name not in _REGISTERED:
        raise ValueError(
            f"name must be one registered by register(), {sorted(_REGISTERED)}; got {name!r}"
        )
    transformers = import_transformers()
    del _REGISTERED[name]
    transformers.AttentionInterface._global_mapping.pop(name, None)
    transformers.AttentionMaskInterface._global_mapping.pop(name, None)


def check_model(model: nn.Module, *args: Any, **kwargs: Any) -> int:
    """Run ``model(*args, **kwargs)`` once without gradients; return how many attention calls
    went through TaylorShift, or raise ValueError if none did.

    ``transformers`` accepts ``attn_implementation="taylorshift"`` for every model, but only
    models whose attention modules call its ``AttentionInterface`` use it. Others keep their
    own softmax attention without a word (BLOOM, with ALiBi) or fail while being built
    (Falcon, GPT-Neo: ``KeyError: 'taylorshift'``, from ``transformers``). This check tells
    the first kind apart; compare the count with the model's attention layers (one call per
    layer and forward, self- and cross-attention each).

    It also finds per-model options that no attention reads: on a composite model (CLIP,
    LLaVA, ...) the attention modules hold sub-configs (``config.text_config``, ...), so a
    ``model.config.taylorshift`` dict is ignored where a sub-config has none of its own.

    Raises:
        ValueError: the model's ``config._attn_implementation`` is not a name ``register``
            added, no attention call reached TaylorShift, or ``model.config.taylorshift`` is
            set but an attention reads a sub-config without it.
    """
    transformers = import_transformers()
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl not in _REGISTERED:
        raise ValueError(
            f"model: its attn_implementation must be one registered by register(), "
            f"{sorted(_REGISTERED)}; got {impl!r} (pass attn_implementation=... when building "
            "it, or call model.set_attn_implementation(...))"
        )
    mapping = transformers.AttentionInterface._global_mapping
    inner = mapping[impl]
    calls = 0
    configs = {}  # id -> the config each attention module read its options from

    def counting(*call_args: Any, **call_kwargs: Any) -> tuple[Tensor, None]:
        nonlocal calls
        calls += 1
        module = call_args[0] if call_args else call_kwargs.get("module")
        config = getattr(module, "config", None)
        configs[id(config)] = config
        return inner(*call_args, **call_kwargs)

    mapping[impl] = counting
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        mapping[impl] = inner
    if calls == 0:
        raise ValueError(
            f"model: {type(model).__name__} computes its attention without transformers' "
            f"AttentionInterface, so attn_implementation={impl!r} has no effect: no attention "
            "call went through TaylorShift (the model keeps its own attention). TaylorShift "
            "runs in models whose attention modules call the interface (Llama, GPT-2, BERT "
            "and most current ones)"
        )
    _check_options_are_read(model.config, configs.values())
    return calls


def _check_options_are_read(top: Any, configs: Any) -> None:
    """Refuse ``top.taylorshift`` where an attention read a sub-config that has none."""
    if getattr(top, CONFIG_ATTRIBUTE, None) is None:
        return
    unread = [c for c in configs if c is not top and getattr(c, CONFIG_ATTRIBUTE, None) is None]
    if not unread:
        return
    names = [
        f"config.{name}" for name, value in vars(top).items() if any(value is c for c in unread)
    ]
    without = any(c is None for c in unread)  # modules with no config read register()'s
    where = names + (["register()'s options (modules without a config)"] if without else [])
    if names:
        hint = f"model.{names[0]}.{CONFIG_ATTRIBUTE} = {{...}}"
    else:
        hint = "register(...)" if without else f"model.config.<sub_config>.{CONFIG_ATTRIBUTE}"
    raise ValueError(
        f"model: config.{CONFIG_ATTRIBUTE} is set but not read: this model's attention modules "
        f"read their options from {', '.join(where) or 'configs of their own'}; set them "
        f"there (e.g. {hint})"
    )


def make_attention_function(**options: Any) -> Callable[..., tuple[Tensor, None]]:
    """The function ``register`` puts into ``AttentionInterface``, with these default options.

    Its signature is ``transformers``': ``(module, query, key, value, attention_mask,
    dropout=0.0, scaling=None, is_causal=None, **kwargs) -> (output, None)``, query
    (B, H, Nq, d), key and value (B, Hkv, Nk, d|dv), output (B, Nq, H, dv).
    """
    defaults = check_hf_options(dict(options), where="options")

    def taylorshift_attention_forward(
        module: nn.Module,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        **kwargs: Any,
    ) -> tuple[Tensor, None]:
        opts = _module_options(module, defaults)
        if kwargs.get("output_attentions"):
            warn_user(
                "output_attentions=True: the taylorshift attention returns no attention "
                "weights (the linear-time form never forms them), as transformers' sdpa does "
                "not either; use attn_implementation='eager' for softmax weights"
            )
        for arg, what in _UNSUPPORTED_KWARGS.items():
            if kwargs.get(arg) is not None:
                raise ValueError(
                    f"{arg}: the taylorshift attention cannot apply {what}; expected None, "
                    f"got {_describe(kwargs[arg])} (use another attn_implementation)"
                )
        if kwargs.get("cache") is not None:
            raise ValueError(
                "cache: paged caches (continuous batching) are not supported by the "
                f"taylorshift attention; expected None, got {type(kwargs['cache']).__name__}"
            )
        if dropout and not opts["ignore_dropout"]:
            raise ValueError(
                f"dropout: the taylorshift attention has no attention dropout; expected 0.0, "
                f"got {dropout} (set the config's attention dropout to 0, call model.eval(), "
                "or register(..., ignore_dropout=True) to skip it)"
            )
        causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
        attn_mask, causal = _convert_mask(attention_mask, query, key, causal)
        n_query = query.shape[2]
        if causal and key.shape[2] > n_query:
            # Upper-left causal: keys past the last query are never attended (an empty static
            # cache during prefill); dropping them saves their work.
            key, value = key[:, :, :n_query], value[:, :, :n_query]
            if attn_mask is not None:
                attn_mask = attn_mask[..., :n_query]

        if opts["normalize"]:
            temperature = getattr(module, TEMPERATURE_ATTRIBUTE, opts["temperature"])
            score = {"temperature": temperature}
        else:
            score = {"scale": None if scaling is None else float(scaling)}
        out = taylor_shift_attention(
            query,
            key,
            value,
            attn_mask=attn_mask,
            is_causal=causal,
            normalize=opts["normalize"],
            order=opts["order"],
            mode=opts["mode"],
            enable_gqa=True,  # (key and value with the model's key/value heads)
            **score,
        )  # (B, H, Nq, dv)
        return out.transpose(1, 2).contiguous(), None

    return taylorshift_attention_forward


def taylorshift_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | Tensor = 0,
    kv_offset: int = 0,
    mask_function: Callable | None = None,
    attention_mask: Tensor | None = None,
    allow_is_causal_skip: bool = True,
    allow_is_bidirectional_skip: bool = False,
    **kwargs: Any,
) -> Tensor | None:
    """The mask builder ``register`` puts into ``AttentionMaskInterface``.

    ``transformers`` calls it with its mask arguments: the pattern ``mask_function`` (causal,
    bidirectional, or a composition), the 2-D padding ``attention_mask`` (B, ≥ Nk) with True
    = keep, sizes and offsets. Plain causal and bidirectional patterns give a key-padding
    mask without an (Nq, Nk) tensor (see the module docstring); anything else gives
    ``transformers.masking_utils.sdpa_mask``'s bool (B, 1, Nq, Nk) mask.
    """
    from transformers import masking_utils as masking

    if mask_function is None:
        mask_function = masking.causal_mask_function
    causal = mask_function is masking.causal_mask_function
    bidirectional = mask_function is masking.bidirectional_mask_function
    device = kwargs.get("device", "cpu")
    if (causal or bidirectional) and kwargs.get("local_size") is None:
        padding = _key_padding(attention_mask, batch_size, kv_length, kv_offset)
        if bidirectional:
            if padding is None or (allow_is_bidirectional_skip and _all_kept(padding)):
                if allow_is_bidirectional_skip:
                    return None
                padding = torch.ones(batch_size, 1, 1, kv_length, dtype=torch.bool, device=device)
            # a complete mask (Nq rows) that shares one row in memory
            return padding.expand(batch_size, 1, q_length, kv_length)
        q_start, kv_start = int(q_offset), int(kv_offset)
        upper_left = q_start == kv_start
        decoding = q_length == 1 and q_start - kv_start == kv_length - 1  # the query is last
        if allow_is_causal_skip and (upper_left or decoding):
            if padding is None or _all_kept(padding):
                return None
            return padding
    return masking.sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function,
        attention_mask=attention_mask,
        allow_is_causal_skip=allow_is_causal_skip,
        allow_is_bidirectional_skip=allow_is_bidirectional_skip,
        **kwargs,
    )


def _all_kept(padding: Tensor) -> bool:
    """Whether no key is padded, so that the mask can be dropped. Under torch.compile the
    answer would need the mask's values (a graph break): there the mask is kept, which
    computes the same attention."""
    return not torch.compiler.is_compiling() and bool(padding.all())


def _key_padding(
    attention_mask: Tensor | None, batch_size: int, kv_length: int, kv_offset: int
) -> Tensor | None:
    """The 2-D padding mask cut to this layer's keys, as (B, 1, 1, Nk) bool (True = keep)."""
    if attention_mask is None:
        return None
    mask = attention_mask.to(torch.bool)
    missing = kv_offset + kv_length - mask.shape[-1]
    if missing > 0:  # keys past the given mask are empty cache slots
        mask = torch.nn.functional.pad(mask, (0, missing), value=False)
    mask = mask[:, kv_offset : kv_offset + kv_length]
    return mask.reshape(mask.shape[0], 1, 1, kv_length).expand(batch_size, 1, 1, kv_length)


def _module_options(module: nn.Module, defaults: dict[str, Any]) -> dict[str, Any]:
    """The registered defaults, overridden by ``module.config.taylorshift`` if present."""
    overrides = getattr(getattr(module, "config", None), CONFIG_ATTRIBUTE, None)
    if overrides is None:
        return defaults
    return check_hf_options(overrides, where=f"config.{CONFIG_ATTRIBUTE}", base=defaults)


def _convert_mask(
    attention_mask: Tensor | None, query: Tensor, key: Tensor, causal: bool
) -> tuple[Tensor | None, bool]:
    """transformers' ``attention_mask`` -> (our bool ``attn_mask``, ``is_causal``)."""
    n_query, n_key = query.shape[2], key.shape[2]
    if attention_mask is None:
        return None, causal and n_query > 1
    if not isinstance(attention_mask, Tensor):
        raise TypeError(
            "attention_mask: expected a torch.Tensor or None (the taylorshift attention takes "
            f"no flex BlockMask); got {type(attention_mask).__name__}"
        )
    if attention_mask.dim() == 2:  # (B, Nk), transformers' 1 = attend
        mask = (attention_mask != 0)[:, None, None, :]
    elif attention_mask.dim() == 4:
        mask = _as_bool(attention_mask)
    else:
        raise ValueError(
            "attention_mask: expected a 2-D (B, Nk) or 4-D (B, 1|H, Nq|1, Nk) mask; got shape "
            f"{tuple(attention_mask.shape)}"
        )
    if mask.shape[-1] != n_key:
        raise ValueError(
            f"attention_mask: expected a last dim of Nk = {n_key} keys; got shape "
            f"{tuple(attention_mask.shape)}"
        )
    if mask.shape[-2] == 1:  # key padding, on top of the module's causality
        return mask, causal and n_query > 1
    if mask.stride(-2) == 0:  # rows shared in memory: key padding after all, and complete
        mask = mask[:, :, :1]
    return mask, False


def _as_bool(mask: Tensor) -> Tensor:
    """A 4-D transformers mask as bool, True = attend."""
    if mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        raise TypeError(
            "attention_mask: a 4-D mask must be bool (True = attend) or float additive "
            f"(0 / -inf); got dtype {mask.dtype}"
        )
    keep = mask == 0
    blocked = mask <= torch.finfo(mask.dtype).min / 2  # -inf, or the dtype's minimum
    if not bool((keep | blocked).all()):
        bad = mask[~(keep | blocked)].flatten()[:3].tolist()
        raise ValueError(
            "attention_mask: an additive float mask may hold only 0 (attend) and -inf or the "
            f"dtype's minimum (masked); biases have no meaning for a polynomial weight; got "
            f"values such as {bad}"
        )
    return keep


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return repr(value)
