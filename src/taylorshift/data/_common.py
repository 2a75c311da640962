"""Small helpers shared by the task loaders: the split names, the ``path`` option, held-out
parts, bytes as token ids. Scalar arguments are checked with ``taylorshift._validate``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch

SPLITS = ("train", "val", "test")


def require_path(task: str, path: object) -> Path:
    """The ``path`` option as an existing ``Path``."""
    if path is None:
        raise ValueError(
            f"task {task!r} needs the option path (a file or folder; `taylorshift train "
            f"--data PATH`), got None"
        )
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path must be a str or os.PathLike, got {path!r}")
    resolved = Path(path).expanduser()
    if not resolved.exists():
        raise ValueError(f"path must be an existing file or folder, got {str(resolved)!r}")
    return resolved


def split_file(task: str, path: Path, split: str, names: Sequence[str]) -> Path:
    """A file given directly, or the first of ``names`` (one per split) inside folder ``path``."""
    if path.is_file():
        return path
    for name in names:
        if (path / name).is_file():
            return path / name
    raise ValueError(
        f"path for task {task!r}, split {split!r} must be a file or a folder holding "
        f"{' or '.join(names)}, got the folder {str(path)!r} without them"
    )


def holdout(num: int, val_size: int, seed: int, split: str) -> torch.Tensor:
    """Indices (sorted) of the ``split`` part when ``val_size`` of ``num`` items are held out.

    A seeded random permutation picks the ``val_size`` held-out items ("val"); "train" gets
    the rest. The same (num, val_size, seed) always gives the same parts.
    """
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(num, generator=generator)
    part = order[num - val_size :] if split == "val" else order[: num - val_size]
    return part.sort().values


def bytes_to_tokens(data: bytes, max_len: int | None) -> torch.Tensor:
    """Byte values 0-255 as a LongTensor (N,), cut to ``max_len``."""
    if max_len is not None:
        data = data[:max_len]
    if not data:
        return torch.zeros(0, dtype=torch.long)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
