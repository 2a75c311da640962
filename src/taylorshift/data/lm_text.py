"""Byte-level ("character-level") language modelling on any text file.

Tokens are the file's bytes (ids 0-255 of the byte vocabulary, pad 256;
``data/vocab.py``), so any file works, UTF-8 text or not. The file is read once and
split contiguously: the first ``1 - val_fraction - test_fraction`` of its bytes train, the
next ``val_fraction`` validate and the last ``test_fraction`` test (each part's size rounded
down; train gets the remainder). Each part is cut into windows of ``seq_len`` tokens every
``stride`` bytes (non-overlapping by default); a window's targets are its tokens shifted
by one: ``tokens = part[s : s + seq_len]``, ``targets = part[s + 1 : s + seq_len + 1]``.
Bytes after the last full window are not used.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch.utils.data import Dataset

from .._validate import check_choice, check_int, check_probability
from ._common import SPLITS, require_path
from .text import encode_bytes
from .vocab import BYTE_PAD_ID, BYTE_VOCAB_SIZE

__all__ = ["ByteWindows", "LMTextDataset", "decode_bytes", "encode_text"]


def encode_text(text: str) -> torch.Tensor:
    """Byte ids (LongTensor (N,), values 0-255) of ``text`` in UTF-8: a prompt for a model
    trained on task ``lm``."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    return encode_bytes(text)


def decode_bytes(ids: torch.Tensor | Sequence[int]) -> str:
    """The text of byte ids: UTF-8 with ``errors="replace"``; ids outside 0-255 (pad 256,
    cls 257, -100) are dropped."""
    if isinstance(ids, torch.Tensor):
        if ids.is_floating_point() or ids.is_complex():
            raise ValueError(f"ids must be integer ids, got {ids.dtype}")
        values = ids.flatten().tolist()
    else:
        values = [int(i) for i in ids]
    return bytes(v for v in values if 0 <= v < 256).decode("utf-8", errors="replace")


class ByteWindows(Dataset):
    """Next-byte windows of a uint8 tensor ``data``: item i is ``(data[s : s + seq_len],
    data[s + 1 : s + seq_len + 1])`` as long tensors, ``s = i * stride``; bytes after the last
    full window are not used. Subclasses set ``seq_len`` and ``stride``, then call
    ``_set_data``."""

    seq_len: int
    stride: int

    def _set_data(self, data: torch.Tensor) -> None:
        self.data = data
        self.vocab_size, self.pad_id = BYTE_VOCAB_SIZE, BYTE_PAD_ID
        self._len = (len(self.data) - self.seq_len - 1) // self.stride + 1

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not -self._len <= index < self._len:
            raise IndexError(f"index must be in [0, {self._len}), got {index}")
        start = (index % self._len) * self.stride
        window = self.data[start : start + self.seq_len + 1].long()
        return window[:-1], window[1:]


class LMTextDataset(ByteWindows):
    """Windows of a text file's bytes: ``(tokens (seq_len,) long, targets (seq_len,) long)``,
    targets = the next byte of each token.

    Args:
        split: ``"train"``, ``"val"`` or ``"test"``: which contiguous part of the file.
        path: the text file (required).
        seq_len: tokens per window.
        val_fraction, test_fraction: the shares of the file's bytes for val and test,
            taken from its end (test last); each in [0, 1), together below 1.
        stride: bytes between window starts; default ``seq_len`` (non-overlapping).

    Attributes:
        data: the split's bytes, uint8 (L,); ``vocab_size`` (258) and ``pad_id`` (256).

    Raises:
        ValueError: a missing path or a folder, a bad option, or a split too short for one
            window (``seq_len + 1`` bytes).
    """

    def __init__(
        self,
        split: str = "train",
        *,
        path: str | os.PathLike | None = None,
        seq_len: int = 256,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        stride: int | None = None,
    ) -> None:
        self.split = check_choice("split", split, SPLITS)
        self.path = require_path("lm", path)
        if not self.path.is_file():
            raise ValueError(f"path must be a text file for task 'lm', got the folder {path!r}")
        self.seq_len = check_int("seq_len", seq_len, ge=1)
        self.stride = check_int("stride", stride, ge=1, allow_none=True) or seq_len
        val_fraction = check_probability("val_fraction", val_fraction)
        test_fraction = check_probability("test_fraction", test_fraction)
        if val_fraction + test_fraction >= 1:
            raise ValueError(
                f"val_fraction + test_fraction must be < 1 (train needs a share), got "
                f"{val_fraction} + {test_fraction}"
            )
        raw = self.path.read_bytes()
        total = len(raw)
        num_val, num_test = int(total * val_fraction), int(total * test_fraction)
        bounds = {
            "train": (0, total - num_val - num_test),
            "val": (total - num_val - num_test, total - num_test),
            "test": (total - num_test, total),
        }
        start, end = bounds[split]
        if end - start < seq_len + 1:
            share = {"train": 1 - val_fraction - test_fraction, "val": val_fraction}
            raise ValueError(
                f"split {split!r} of {str(self.path)!r} must hold at least seq_len + 1 = "
                f"{seq_len + 1} bytes for one window, got {end - start} bytes (its share "
                f"{share.get(split, test_fraction):g} of {total}); lower seq_len or use a "
                f"longer file or a larger share"
            )
        self._set_data(torch.frombuffer(bytearray(raw[start:end]), dtype=torch.uint8))
