"""Batching: pad token sequences to a common length with a mask; stack images."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._common import check_int

__all__ = ["collate_images", "collate_tokens"]


def _labels(batch: Sequence, what: str) -> torch.Tensor:
    try:
        return torch.tensor([int(item[1]) for item in batch], dtype=torch.long)
    except (TypeError, ValueError, IndexError) as err:
        raise ValueError(f"batch items must be ({what}, int label) pairs: {err}") from err


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
    if len(batch) == 0:
        raise ValueError("batch must hold at least one item, got an empty batch")
    check_int("pad_id", pad_id)
    if pad_to_multiple is not None:
        check_int("pad_to_multiple", pad_to_multiple, 1)
    seqs = []
    for i, item in enumerate(batch):
        tokens = item[0] if isinstance(item, (tuple, list)) and len(item) == 2 else None
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1:
            got = tokens.shape if isinstance(tokens, torch.Tensor) else type(item)
            raise ValueError(
                f"batch items must be (tokens (N,), label) with 1-D tokens, got {got} at {i}"
            )
        if tokens.is_floating_point() or tokens.is_complex():
            raise ValueError(f"batch tokens must be integer ids, got {tokens.dtype} at {i}")
        seqs.append(tokens)
    labels = _labels(batch, "tokens")
    length = max(len(s) for s in seqs)
    if pad_to_multiple is not None:
        length = -(-length // pad_to_multiple) * pad_to_multiple
    tokens = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.bool)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
        mask[i, : len(s)] = True
    return tokens, mask, labels


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
