"""Decoding caches of an attention layer: a key/value cache, or a constant-size state.

``AttentionKernel.new_cache(kind)`` makes one per layer and ``AttentionKernel.decode``
fills it as tokens arrive:

- ``KVCache``: every key and value so far and which of them are real, (B, H, N, ·). Works
  for every kernel; memory and the work per token grow with the context.
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
    """Keys (B, H, N, d), values (B, H, N, dv) and real-token mask (B, N) of the tokens so far."""

    keys: Tensor | None = None
    values: Tensor | None = None
    mask: Tensor | None = None
    padded: bool = False  # some cached token is padding (checked once per given mask)
    conv: Tensor | None = None  # a layer's short convolution: its last k - 1 inputs

    def extend(
        self, key: Tensor, value: Tensor, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Append T new tokens; returns all keys, values and the mask, past first."""
        b, _, t, _ = key.shape
        new_mask = key_padding_mask
        if new_mask is None:
            new_mask = torch.ones((b, t), dtype=torch.bool, device=key.device)
        elif not self.padded:
            self.padded = not bool(new_mask.all())
        if self.keys is None:
            self.keys, self.values, self.mask = key, value, new_mask
        else:
            self.keys = torch.cat([self.keys, key], dim=2)
            self.values = torch.cat([self.values, value], dim=2)
            self.mask = torch.cat([self.mask, new_mask], dim=1)
        return self.keys, self.values, self.mask

    @property
    def nbytes(self) -> int:
        parts = (self.keys, self.values, self.mask, self.conv)
        return sum(t.nbytes for t in parts if t is not None)


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
