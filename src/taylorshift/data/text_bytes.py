"""Byte-level language modelling on real text every machine has: Python's own source files.

By default the text is the standard library of the Python that runs (the ``*.py`` files
directly in ``sysconfig.get_paths()["stdlib"]``: 168 files, 4.7 MB in CPython 3.11), so the
task trains anywhere without a download; ``path`` names any other folder of text files.

Split rule, by file, never inside one: a file whose name has ``zlib.crc32(name) % 20 == 0``
is "test", ``== 1`` is "val", every other file is "train" (about 90 / 5 / 5 % of the files;
in CPython 3.11's stdlib 3.8 MB / 574 kB / 319 kB). The rule depends only on the names, so
the same file always lands in the same split; each split's files are read in sorted name
order and joined, then cut into next-byte windows as task ``lm`` does. Different Python
versions ship different files: compare runs made with the same interpreter (its version is
recorded with every run).

Scores are bits per byte (``loss / ln 2``): :func:`count_baselines` gives the unigram and
bigram bits per byte of a split, counted on the training split, the level a model must
beat before a comparison means anything (SPEC §6.1).
"""

from __future__ import annotations

import math
import os
import sysconfig
import zlib
from pathlib import Path

import torch

from .._validate import check_choice, check_int, check_str
from ._common import SPLITS
from .lm_text import ByteWindows

__all__ = ["TextBytesDataset", "count_baselines", "split_of_file", "stdlib_folder"]

_BUCKETS = 20
_SPLIT_BUCKET = {0: "test", 1: "val"}


def stdlib_folder() -> Path:
    """The running Python's standard library folder (its ``*.py`` files are the default
    text of task ``text-bytes``)."""
    return Path(sysconfig.get_paths()["stdlib"])


def split_of_file(name: str) -> str:
    """``"train"``, ``"val"`` or ``"test"``: the split of a file by its name (module docs)."""
    return _SPLIT_BUCKET.get(zlib.crc32(name.encode("utf-8")) % _BUCKETS, "train")


class TextBytesDataset(ByteWindows):
    """Next-byte windows of the files of one split: ``(tokens (seq_len,), targets (seq_len,))``.

    Args:
        split: ``"train"``, ``"val"`` or ``"test"`` (the file rule of the module docs).
        path: a folder of text files; default: this Python's standard library.
        pattern: which files of the folder (a glob, not recursive).
        seq_len: tokens per window.
        stride: bytes between window starts; default ``seq_len`` (non-overlapping).

    Attributes:
        files: the split's file names, in the order read; ``data``: their bytes, uint8 (L,);
        ``vocab_size`` (258) and ``pad_id`` (256).

    Raises:
        ValueError: a path that is not a folder, no matching file in the split, or a split
            too short for one window.
    """

    def __init__(
        self,
        split: str = "train",
        *,
        path: str | os.PathLike | None = None,
        pattern: str = "*.py",
        seq_len: int = 256,
        stride: int | None = None,
    ) -> None:
        self.split = check_choice("split", split, SPLITS)
        self.seq_len = check_int("seq_len", seq_len, ge=1)
        self.stride = check_int("stride", stride, ge=1, allow_none=True) or seq_len
        check_str("pattern", pattern)
        folder = stdlib_folder() if path is None else Path(path).expanduser()
        if not folder.is_dir():
            raise ValueError(f"path must be a folder of text files, got {str(folder)!r}")
        files = sorted(p for p in folder.glob(pattern) if p.is_file())
        chosen = [p for p in files if split_of_file(p.name) == split]
        if not chosen:
            raise ValueError(
                f"split {split!r} of task 'text-bytes' must hold at least one file, got none of "
                f"the {len(files)} files matching {pattern!r} in {str(folder)!r} (the split of "
                f"a file is crc32(name) % {_BUCKETS}: 0 test, 1 val, else train)"
            )
        self.path, self.files = folder, [p.name for p in chosen]
        raw = b"".join(p.read_bytes() for p in chosen)
        if len(raw) < seq_len + 1:
            raise ValueError(
                f"split {split!r} of task 'text-bytes' must hold at least seq_len + 1 = "
                f"{seq_len + 1} bytes for one window, got {len(raw)} bytes in "
                f"{len(chosen)} file(s); lower seq_len or add files"
            )
        self._set_data(torch.frombuffer(bytearray(raw), dtype=torch.uint8))


def count_baselines(
    train: torch.Tensor, target: torch.Tensor, smoothing: float = 0.5
) -> dict[str, float]:
    """Bits per byte of ``target`` under unigram and bigram byte counts of ``train``.

    The probabilities are add-``smoothing`` estimates over the 256 byte values,
    ``p(b) = (count(b) + a) / (total + 256 a)`` and
    ``p(b | c) = (count(c, b) + a) / (count(c, ·) + 256 a)``; the bigram scores every byte
    of ``target`` but the first.

    Args:
        train, target: uint8 (or integer 0-255) tensors of bytes, 1-D.
        smoothing: the added count ``a`` > 0.

    Returns:
        ``{"unigram_bpb": float, "bigram_bpb": float}``.
    """
    for name, data in (("train", train), ("target", target)):
        if data.ndim != 1 or data.numel() < 2 or data.is_floating_point():
            raise ValueError(
                f"{name} must be a 1-D integer tensor of at least 2 bytes, got "
                f"{data.dtype} of shape {tuple(data.shape)}"
            )
    if not smoothing > 0:
        raise ValueError(f"smoothing must be > 0, got {smoothing!r}")
    train, target = train.long(), target.long()
    unigram = torch.bincount(train, minlength=256).double() + smoothing
    unigram_logp = unigram.log() - unigram.sum().log()
    pairs = torch.bincount(train[:-1] * 256 + train[1:], minlength=256 * 256)
    bigram = pairs.double().view(256, 256) + smoothing
    bigram_logp = bigram.log() - bigram.sum(-1, keepdim=True).log()
    ln2 = math.log(2.0)
    return {
        "unigram_bpb": float(-unigram_logp[target].mean() / ln2),
        "bigram_bpb": float(-bigram_logp[target[:-1], target[1:]].mean() / ln2),
    }
