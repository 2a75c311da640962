"""Task kinds: what the batches of a task hold and how a model's outputs on them are scored.

A :class:`TaskSpec`'s ``kind`` is a name (``"tokens"``, ``"image"``, ``"lm"``), kept as a
string because configs and checkpoints save it; ``get_kind(name)`` (or ``spec.behaviour``)
gives the :class:`TaskKind` that does what depends on it: the collate function, taking a
collated batch apart (:meth:`TaskKind.unpack`) and the summed loss
(:meth:`TaskKind.losses`). Training and evaluation ask these objects instead of comparing
names, so a new kind is one subclass here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .collate import IGNORE_INDEX, collate_images, collate_lm, collate_tokens

__all__ = ["KINDS", "TaskKind", "get_kind"]


class TaskKind:
    """What depends on a task's kind.

    Attributes:
        name: the kind's name, as ``TaskSpec.kind`` holds it.
        takes_tokens: the model takes token ids and a padding mask (B, N), so a batch has a
            count of real tokens (throughput is also logged in tokens per second).
        per_token: one prediction per target token (B, N) rather than one per sample; the
            loss and accuracy are means over the scored tokens, and the perplexity is given.
        causal_lm: the task trains a causal language model (``CausalLM``); a classifier
            otherwise.
    """

    name: str = ""
    takes_tokens: bool = False
    per_token: bool = False
    causal_lm: bool = False

    def collate(self, pad_id: int | None, pad_to_multiple: int | None = None) -> Callable:
        """The DataLoader ``collate_fn`` (picklable, works with workers)."""
        raise NotImplementedError

    def unpack(
        self, batch, device: torch.device
    ) -> tuple[tuple[Tensor, ...], Tensor, Tensor | None]:
        """(model inputs, labels, count of real tokens or None) of a collated batch, moved
        to ``device``."""
        raise NotImplementedError

    def losses(self, logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(summed cross entropy, correct predictions, scored predictions) of a batch, in
        float32; labels equal to ``IGNORE_INDEX`` are not scored.

        Per sample: logits (B, C), labels (B,). Per token (``per_token``): logits (B, N, V),
        targets (B, N).
        """
        logits = logits.float()
        if self.per_token:
            logits, labels = logits.flatten(0, 1), labels.flatten()
        scored = labels != IGNORE_INDEX
        loss = F.cross_entropy(logits, labels, reduction="sum", ignore_index=IGNORE_INDEX)
        correct = ((logits.argmax(-1) == labels) & scored).sum()
        return loss, correct, scored.sum()

    def __repr__(self) -> str:
        return f"<task kind {self.name!r}>"


class _TokenKind(TaskKind):
    """Batches ``(tokens (B, N), mask (B, N), labels)`` from ``collate_tokens`` /
    ``collate_lm``."""

    takes_tokens = True
    _collate: Callable = staticmethod(collate_tokens)

    def collate(self, pad_id: int | None, pad_to_multiple: int | None = None) -> Callable:
        return functools.partial(self._collate, pad_id=pad_id, pad_to_multiple=pad_to_multiple)

    def unpack(self, batch, device: torch.device):
        tokens, mask, labels = batch
        inputs = (tokens.to(device, non_blocking=True), mask.to(device, non_blocking=True))
        return inputs, labels.to(device, non_blocking=True), mask.sum()


class TokensKind(_TokenKind):
    """Classification of token sequences: items ``(LongTensor (N,), int)``."""

    name = "tokens"


class LMKind(_TokenKind):
    """Causal language modelling: items ``(tokens (N,), targets (N,))``, a target per
    position (``IGNORE_INDEX`` where none is scored)."""

    name = "lm"
    per_token = True
    causal_lm = True
    _collate = staticmethod(collate_lm)


class ImageKind(TaskKind):
    """Classification of images: items ``(FloatTensor (C, H, W), int)``, batches
    ``(images (B, C, H, W), labels)``."""

    name = "image"

    def collate(self, pad_id: int | None, pad_to_multiple: int | None = None) -> Callable:
        return collate_images

    def unpack(self, batch, device: torch.device):
        images, labels = batch
        inputs = (images.to(device, non_blocking=True),)
        return inputs, labels.to(device, non_blocking=True), None


_KINDS: dict[str, TaskKind] = {k.name: k for k in (TokensKind(), ImageKind(), LMKind())}

#: The kind names a ``TaskSpec`` accepts.
KINDS = tuple(_KINDS)


def get_kind(name: str) -> TaskKind:
    """The :class:`TaskKind` named ``name`` (one of :data:`KINDS`)."""
    try:
        return _KINDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"kind must be one of {KINDS}, got {name!r}") from None
