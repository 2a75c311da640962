"""Batching: pad token sequences (and LM targets) to a common length with a mask; stack
images."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._validate import check_int

__all__ = ["IGNORE_INDEX", "collate_images", "collate_lm", "collate_tokens"]

#: The target of positions without a loss (``torch.nn.functional.cross_entropy``'s default
#: ``ignore_index``): LM targets hold it where nothing is predicted and in the padding.
IGNORE_INDEX = -100


def _labels(batch: Sequence, what: str) -> torch.Tensor:
    try:
        return torch.tensor([int(item[1]) for item in batch], dtype=torch.long)
    except (TypeError, ValueError, IndexError) as err:
        raise ValueError(f"batch items must be ({what}, int label) pairs: {err}") from err


def _id_column(batch: Sequence, column: int, form: str, name: str) -> list[torch.Tensor]:
    """Element ``column`` of every pair in ``batch``, checked to be a 1-D integer tensor."""
    seqs = []
    for i, item in enumerate(batch):
        pair = isinstance(item, (tuple, list)) and len(item) == 2
        seq = item[column] if pair else None
        if not isinstance(seq, torch.Tensor) or seq.dim() != 1:
            got = seq.shape if isinstance(seq, torch.Tensor) else type(seq if pair else item)
            raise ValueError(f"batch items must be {form} with 1-D {name}, got {got} at {i}")
        if seq.is_floating_point() or seq.is_complex():
            raise ValueError(f"batch {name} must be integer ids, got {seq.dtype} at {i}")
        seqs.append(seq)
    return seqs


def _check_batch(batch: Sequence, pad_id: object, pad_to_multiple: object) -> None:
    if len(batch) == 0:
        raise ValueError("batch must hold at least one item, got an empty batch")
    check_int("pad_id", pad_id)
    if pad_to_multiple is not None:
        check_int("pad_to_multiple", pad_to_multiple, ge=1)


def _padded_length(seqs: list[torch.Tensor], pad_to_multiple: int | None) -> int:
    length = max(len(s) for s in seqs)
    if pad_to_multiple is not None:
        length = -(-length // pad_to_multiple) * pad_to_multiple
    return length


def _pad(seqs: list[torch.Tensor], length: int, value: int) -> torch.Tensor:
    """``seqs`` left-aligned in a long (B, length) tensor filled with ``value``."""
    out = torch.full((len(seqs), length), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out


def _mask(seqs: list[torch.Tensor], length: int) -> torch.Tensor:
    """bool (B, length), True at the real tokens."""
    lengths = torch.tensor([len(s) for s in seqs])
    return torch.arange(length) < lengths[:, None]


def collate_tokens(
    batch: Sequence[tuple[torch.Tensor, int]],
    pad_id: int,
    *,
    pad_to_multiple: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad a list of ``(tokens (N_i,), label)`` to the longest sequence of the batch.

    Args:
        batch: items of a token dataset.
        pad_id: id written into the padding (the task's ``TaskSpec.pad_id``).
        pad_to_multiple: round the padded length up to a multiple of this (e.g. 8 for
            tensor cores, or a chunk size).

    Returns:
        ``tokens`` long (B, N_max), ``mask`` bool (B, N_max) with True = real token, and
        ``labels`` long (B,).

    Use in a DataLoader with ``functools.partial(collate_tokens, pad_id=spec.pad_id)``
    or ``spec.collate()``.
    """
    _check_batch(batch, pad_id, pad_to_multiple)
    seqs = _id_column(batch, 0, "(tokens (N,), label)", "tokens")
    labels = _labels(batch, "tokens")
    length = _padded_length(seqs, pad_to_multiple)
    return _pad(seqs, length, pad_id), _mask(seqs, length), labels


def collate_lm(
    batch: Sequence[tuple[torch.Tensor, torch.Tensor]],
    pad_id: int,
    *,
    pad_to_multiple: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad a list of language-model items ``(tokens (N_i,), targets (N_i,))``.

    ``targets[i]`` is the id to predict at position i (the next token), or ``IGNORE_INDEX``
    (-100) where no loss is taken.

    Args:
        batch: items of an ``"lm"`` task.
        pad_id: id written into the padding of ``tokens`` (the task's ``TaskSpec.pad_id``);
            the padding of ``targets`` is ``IGNORE_INDEX``.
        pad_to_multiple: round the padded length up to a multiple of this.

    Returns:
        ``tokens`` long (B, N_max), ``mask`` bool (B, N_max) with True = real token, and
        ``targets`` long (B, N_max), ready for
        ``F.cross_entropy(logits.flatten(0, 1), targets.flatten())``.
    """
    _check_batch(batch, pad_id, pad_to_multiple)
    form = "(tokens (N,), targets (N,))"
    seqs = _id_column(batch, 0, form, "tokens")
    targets = _id_column(batch, 1, form, "targets")
    for i, (s, t) in enumerate(zip(seqs, targets, strict=True)):
        if len(s) != len(t):
            raise ValueError(
                f"batch targets must have the length of their tokens, got {len(t)} targets "
                f"for {len(s)} tokens at {i}"
            )
    length = _padded_length(seqs, pad_to_multiple)
    return _pad(seqs, length, pad_id), _mask(seqs, length), _pad(targets, length, IGNORE_INDEX)


def collate_images(
    batch: Sequence[tuple[torch.Tensor, int]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack ``(image (C, H, W), label)`` items into ``images`` (B, C, H, W) and ``labels``
    long (B,)."""
    if len(batch) == 0:
        raise ValueError("batch must hold at least one item, got an empty batch")
    images = [item[0] if isinstance(item, (tuple, list)) else None for item in batch]
    for i, image in enumerate(images):
        if not isinstance(image, torch.Tensor) or image.dim() != 3:
            got = image.shape if isinstance(image, torch.Tensor) else type(batch[i])
            raise ValueError(f"batch items must be (image (C, H, W), label), got {got} at {i}")
        if image.shape != images[0].shape:
            raise ValueError(
                f"batch images must share one shape, got {tuple(images[0].shape)} and "
                f"{tuple(image.shape)} at {i}"
            )
    return torch.stack(images), _labels(batch, "image")
