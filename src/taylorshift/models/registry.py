"""Model registry: ``create_model(name, **overrides)``, ``list_models()``, ``@register_model``.

A registered entry point is a function ``fn(*, device=None, dtype=None, **overrides)`` that
returns a model; ``create_model`` looks it up by name. Model *classes* are registered too
(``register_model_class``) so that ``load_model`` can rebuild one from the class name saved
in a weights file.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

_MODELS: dict[str, Callable[..., nn.Module]] = {}
_MODEL_CLASSES: dict[str, type[nn.Module]] = {}

F = TypeVar("F", bound=Callable[..., nn.Module])
C = TypeVar("C", bound=type)


def register_model(name: str | F | None = None) -> Any:
    """Register a model entry point, as ``@register_model`` or ``@register_model("name")``.

    Without a name the function's name is used with ``_`` turned into ``-``
    (``def listops_small`` -> ``"listops-small"``). A name can be registered once.
    """

    def wrap(fn: F, key: str | None = None) -> F:
        key = key or fn.__name__.replace("_", "-")
        if key in _MODELS:
            raise ValueError(f"model {key!r} is registered already")
        _MODELS[key] = fn
        return fn

    if callable(name):
        return wrap(name)
    return lambda fn: wrap(fn, name)


def list_models(pattern: str | None = None) -> list[str]:
    """Sorted names accepted by ``create_model``; ``pattern`` filters (fnmatch, ``"listops*"``)."""
    names = sorted(_MODELS)
    return names if pattern is None else [n for n in names if fnmatch.fnmatchcase(n, pattern)]


def create_model(name: str, *, device=None, dtype=None, **overrides: Any) -> nn.Module:
    """Build the registered model ``name`` with config ``overrides``.

    Args:
        name: one of ``list_models()``.
        device, dtype: where and in which dtype parameters are created.
        **overrides: config fields to change, e.g. ``attn_kernel="softmax", depth=1``. An
            unknown field raises TypeError naming it and listing the valid ones.

    Example::

        model = create_model("listops", attn_kernel="softmax", depth=1)
    """
    check_placement(device, dtype)
    if name not in _MODELS:
        base, kernel = _kernel_suffix(str(name))
        if base is not None and "attn_kernel" not in overrides:
            # the old registry names "<model>-<kernel>": the kernel is an argument now
            return _MODELS[base](device=device, dtype=dtype, attn_kernel=kernel, **overrides)
        close = difflib.get_close_matches(str(name), _MODELS, n=3)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown model {name!r}{hint} (see taylorshift.models.list_models())")
    return _MODELS[name](device=device, dtype=dtype, **overrides)


def check_placement(device, dtype, *, device_arg: str = "device") -> None:
    """A device torch knows and a floating dtype (torch's own errors name neither);
    ``device_arg``: the caller's name of the device argument."""
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch.dtype or None; got {dtype!r}")
    if device is not None:
        try:
            torch.device(device)
        except (RuntimeError, TypeError, ValueError):
            raise ValueError(
                f"{device_arg} must be a torch device such as 'cpu', 'cuda' or 'cuda:1'; "
                f"got {device!r}"
            ) from None


def _kernel_suffix(name: str) -> tuple[str | None, str | None]:
    """("listops", "softmax") for "listops-softmax" (the longest kernel suffix that leaves
    a registered model), else (None, None)."""
    from ..nn import list_kernels

    for kernel in sorted(list_kernels(), key=len, reverse=True):
        base = name.removesuffix(f"-{kernel}")
        if base != name and base in _MODELS:
            return base, kernel
    return None, None


def register_model_class(cls: C) -> C:
    """Class decorator: let ``load_model`` rebuild ``cls`` from a weights file."""
    if _MODEL_CLASSES.get(cls.__name__, cls) is not cls:
        raise ValueError(f"a different model class named {cls.__name__!r} is registered already")
    _MODEL_CLASSES[cls.__name__] = cls
    return cls


def get_model_class(name: str) -> type[nn.Module]:
    if name not in _MODEL_CLASSES:
        raise ValueError(
            f"unknown model class {name!r}; known classes: {', '.join(sorted(_MODEL_CLASSES))}"
        )
    return _MODEL_CLASSES[name]
