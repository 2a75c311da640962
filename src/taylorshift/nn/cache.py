"""Decoding caches of an attention layer: a key/value cache, or a constant-size state.

``AttentionKernel.new_cache(kind)`` makes one per layer and ``AttentionKernel.decode``
fills it as tokens arrive:

- ``KVCache``: every key and value so far and which of them are real, (B, H, N, ·), in
  buffers that grow by an eighth (and 64 tokens) when full. Works for every kernel;
  memory and the work per token grow with the context.
- ``StateCache``: the kernel's causal prefix state (``TaylorShiftState``,
  ``LinearAttentionState``), whose size does not depend on the context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

CACHE_KINDS = ("auto", "state", "kv")


@dataclass
class KVCache:
    """Keys (B, H, N, d), values (B, H, N, dv) and real-token mask (B, N) of the tokens so far.

    They live in buffers with room for more tokens: ``extend`` writes new tokens in place
    and, when a buffer is full, moves it to one with room for an eighth more tokens plus
    ``KV_CACHE_ROOM``. A step so copies O(1) tokens amortised instead of the
    whole cache (as ``torch.cat`` per token would: at 16,384 tokens that copy cost more than
    attending to the cache, benchmarks/decode_cpu/kv-buffers). ``keys``, ``values`` and
    ``mask`` are views of the first ``length`` tokens; ``nbytes`` counts them,
    ``reserved_nbytes`` the buffers.
    """

    length: int = 0
    padded: bool = False  # some cached token is padding (checked once per given mask)
    conv: Tensor | None = None  # a layer's short convolution: its last k - 1 inputs
    key_buffer: Tensor | None = None  # (B, H, capacity, d)
    value_buffer: Tensor | None = None  # (B, H, capacity, dv)
    mask_buffer: Tensor | None = None  # (B, capacity)

    @property
    def keys(self) -> Tensor | None:
        return None if self.key_buffer is None else self.key_buffer[:, :, : self.length]

    @property
    def values(self) -> Tensor | None:
        return None if self.value_buffer is None else self.value_buffer[:, :, : self.length]

    @property
    def mask(self) -> Tensor | None:
        return None if self.mask_buffer is None else self.mask_buffer[:, : self.length]

    def extend(
        self, key: Tensor, value: Tensor, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Append T new tokens; returns all keys, values and the mask, past first."""
        b, _, t, _ = key.shape
        if self.key_buffer is not None:  # (before anything is written)
            for name, new, buffer in (
                ("key", key, self.key_buffer),
                ("value", value, self.value_buffer),
            ):
                if (new.shape[:2], new.shape[3]) != (buffer.shape[:2], buffer.shape[3]):
                    raise ValueError(
                        f"cache holds {name}s of shape (B, H, ·, d) = ({buffer.shape[0]}, "
                        f"{buffer.shape[1]}, ·, {buffer.shape[3]}); got {tuple(new.shape)} "
                        "(a cache of another model or batch: new_cache() for this one)"
                    )
        new_mask = key_padding_mask
        if new_mask is None:
            new_mask = torch.ones((b, t), dtype=torch.bool, device=key.device)
        elif not self.padded:
            self.padded = not bool(new_mask.all())
        start, end = self.length, self.length + t
        if self.key_buffer is None or end > self.key_buffer.shape[2]:
            room = end + end // 8 + KV_CACHE_ROOM  # (no max(): one branch less when traced)
            self.key_buffer = _moved(self.key_buffer, key, start, room, 2)
            self.value_buffer = _moved(self.value_buffer, value, start, room, 2)
            self.mask_buffer = _moved(self.mask_buffer, new_mask, start, room, 1)
        self.key_buffer[:, :, start:end] = key
        self.value_buffer[:, :, start:end] = value
        self.mask_buffer[:, start:end] = new_mask
        self.length = end
        return self.keys, self.values, self.mask

    @property
    def nbytes(self) -> int:
        """Bytes of the cached tokens (keys, values, mask) and the convolution's inputs."""
        parts = (self.keys, self.values, self.mask)
        conv = 0 if self.conv is None else self.conv.nbytes
        return conv + sum(t.numel() * t.element_size() for t in parts if t is not None)

    @property
    def reserved_nbytes(self) -> int:
        """Bytes held: the buffers with their room, and the convolution's inputs."""
        parts = (self.key_buffer, self.value_buffer, self.mask_buffer, self.conv)
        return sum(t.nbytes for t in parts if t is not None)


def check_decode_step(cache: object, batch: int, tokens: int, key_padding_mask: object) -> None:
    """Refuse, before ``cache`` changes, a ``key_padding_mask`` that is not a (B, T) bool
    tensor and a cache that holds tokens of another batch size (each raised from deep
    inside, or not at all: a float mask of ones passed, and a key/value cache of three rows
    stepped with one took the token into every row before its error)."""
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, Tensor) or key_padding_mask.dtype != torch.bool:
            what = getattr(key_padding_mask, "dtype", type(key_padding_mask).__name__)
            raise TypeError(
                f"key_padding_mask must be a bool tensor (B, T), True = real token; got {what}"
            )
        if tuple(key_padding_mask.shape) != (batch, tokens):
            raise ValueError(
                f"key_padding_mask must be (B, T) = ({batch}, {tokens}); got "
                f"{tuple(key_padding_mask.shape)}"
            )
    held = _held_batch(cache)
    if held is not None and held != batch:
        raise ValueError(
            f"cache holds tokens of a batch of {held} sequences; got a batch of {batch} "
            "(a cache serves the batch it was filled with: new_cache() for another)"
        )


def _held_batch(cache: object) -> int | None:
    """The batch size of the tokens in a cache (None while it holds none)."""
    if isinstance(cache, StateCache):
        if cache.state is not None:  # (a kernel's state: TaylorShiftState, LinearAttentionState)
            return cache.state.sums.shape[0]
        held = cache.conv if cache.conv is not None else cache.window and cache.window[0]
    elif isinstance(cache, KVCache):
        held = cache.key_buffer if cache.key_buffer is not None else cache.conv
    else:
        return None
    return None if held is None else held.shape[0]


# Tokens of room a key/value cache's buffers add when they grow, besides an eighth.
KV_CACHE_ROOM = 64


def _moved(old: Tensor | None, like: Tensor, length: int, room: int, dim: int) -> Tensor:
    """A buffer shaped as ``like`` with ``room`` entries along ``dim``, holding the first
    ``length`` entries of ``old``."""
    shape = list(like.shape)
    shape[dim] = room
    buffer = like.new_empty(shape)
    if old is not None and length:
        buffer.narrow(dim, 0, length).copy_(old.narrow(dim, 0, length))
    if not torch.compiler.is_compiling():
        # a compiled decoding step then takes the room as a symbol from its first call, and
        # a buffer that grows does not trace it again
        torch._dynamo.maybe_mark_dynamic(buffer, dim)
    return buffer


@dataclass
class StateCache:
    """A kernel's constant-size causal state (None before the first token)."""

    state: Any = None
    conv: Tensor | None = None  # a layer's short convolution: its last k - 1 inputs
    # local heads (TaylorShift's local_heads): keys (B, L, W - 1, d), values and real-token
    # mask (B, W - 1) of the last W - 1 real tokens, all a window of W needs
    window: tuple[Tensor, Tensor, Tensor] | None = None

    @property
    def nbytes(self) -> int:
        conv = 0 if self.conv is None else self.conv.nbytes
        window = 0 if self.window is None else sum(t.nbytes for t in self.window)
        return conv + window + (0 if self.state is None else self.state.nbytes)
