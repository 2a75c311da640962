"""Argument checks and small helpers shared by the task loaders.

Every check raises ``ValueError`` naming the argument, what it accepts and what it got.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch

SPLITS = ("train", "val", "test")


def check_split(split: object) -> str:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(map(repr, SPLITS))}, got {split!r}")
    return split  # type: ignore[return-value]


def check_int(name: str, value: object, minimum: int | None = None) -> int:
    """``value`` as an int (bools refused), at least ``minimum`` when given."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_optional_int(name: str, value: object, minimum: int) -> int | None:
    return None if value is None else check_int(name, value, minimum)


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_str(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty str, got {value!r}")
    return value


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
