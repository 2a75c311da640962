"""``inference_only``: ``torch.no_grad()`` for the methods a decoding loop calls per token."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch

_F = TypeVar("_F", bound=Callable)


def inference_only(fn: _F) -> _F:
    """Run ``fn`` without autograd, as ``@torch.no_grad()`` does, but enter ``no_grad`` only
    when grad mode is on. The decorator of torch makes and enters a context object on every
    call, a few µs even when grad mode is already off (under ``torch.inference_mode`` or an
    outer ``no_grad``): a decoding step goes through four such methods per layer."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if torch.is_grad_enabled():
            with torch.no_grad():
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    return run  # type: ignore[return-value]
