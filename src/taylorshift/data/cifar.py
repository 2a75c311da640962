"""CIFAR-10 as pixel sequences (LRA "Image"): 1024 gray levels per image, 10 classes.

Files: the python version of CIFAR-10, the folder ``cifar-10-batches-py`` with
``data_batch_1`` .. ``data_batch_5`` (50,000 training images) and ``test_batch`` (10,000).
Each file is a pickle of a dict whose ``b"data"`` is a uint8 array (10000, 3072), every
row the 1024 red, then 1024 green, then 1024 blue values of a 32 x 32 image in row-major
order, and ``b"labels"`` a list of ints 0-9.

Gray levels: ITU-R BT.601 luma, rounded half up, in exact integer arithmetic:
``Y = (299 R + 587 G + 114 B + 500) // 1000`` (0-255; black 0, white 255, pure red 76,
pure green 150, pure blue 29). Tokens are the gray levels in row-major order, so the
vocabulary is 256.

Splits: like LRA (``train[:90%]`` / ``train[90%:]`` / ``test``), "val" is the last
``val_size`` (default 5,000) images of the training batches and "train" the others;
"test" is ``test_batch``. ``val_size=0`` trains on all 50,000 and makes "val" the test set.

Pickles can run code when loaded: the loader accepts only the numpy array classes a CIFAR
batch holds and refuses anything else.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from torch.utils.data import Dataset

from .._validate import check_choice, check_int
from ._common import SPLITS, require_path

__all__ = ["CIFAR_TRAIN_FILES", "CifarPixelDataset", "load_cifar_batch", "rgb_to_gray"]

CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST_FILE = "test_batch"
_FOLDER = "cifar-10-batches-py"

# What numpy arrays (numpy 1 and 2, pickle protocols 2-5) need to be rebuilt.
_ALLOWED = {
    (module, name)
    for module in ("numpy", "numpy.core.multiarray", "numpy._core.multiarray")
    for name in ("_reconstruct", "ndarray", "dtype", "scalar")
} | {(m, "_frombuffer") for m in ("numpy.core.numeric", "numpy._core.numeric")}
_ALLOWED.add(("_codecs", "encode"))  # bytes in protocol-2 pickles written by Python 3


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED and not module.startswith("numpy.dtypes"):
            raise pickle.UnpicklingError(
                f"a CIFAR batch holds only numpy arrays, lists and bytes; refusing to load "
                f"{module}.{name}"
            )
        return super().find_class(module, name)


def rgb_to_gray(rgb: torch.Tensor) -> torch.Tensor:
    """8-bit luma of RGB values: ``(299 R + 587 G + 114 B + 500) // 1000``.

    Args:
        rgb: uint8 or integer tensor (..., 3, P), channels R, G, B.

    Returns:
        uint8 tensor (..., P).
    """
    r, g, b = rgb.to(torch.int32).unbind(-2)
    return ((299 * r + 587 * g + 114 * b + 500) // 1000).to(torch.uint8)


def load_cifar_batch(path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """One CIFAR-10 python batch file: images uint8 (N, 3, 1024) and labels long (N,)."""
    try:
        with open(path, "rb") as f:
            batch = _ArrayUnpickler(f, encoding="bytes").load()
    except ModuleNotFoundError as err:  # pragma: no cover - numpy ships with torch here
        raise ImportError(f"reading {path} needs numpy (pip install numpy): {err}") from err
    except (pickle.UnpicklingError, EOFError) as err:
        raise ValueError(f"{path} must be a CIFAR-10 python batch (a pickle): {err}") from err
    if not isinstance(batch, dict):
        raise ValueError(f"{path} must hold a dict with data and labels, got {type(batch)}")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise ValueError(f"{path} must hold the keys b'data' and b'labels', got {list(batch)}")
    if isinstance(data, (bytes, bytearray)):
        images = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    else:
        images = _integers(path, "data", data, 255).to(torch.uint8)
    labels = _integers(path, "labels", labels, 9).to(torch.long).reshape(-1)
    if images.numel() != labels.numel() * 3072:
        raise ValueError(
            f"{path}: data must hold 3072 values per label, got {images.numel()} values for "
            f"{labels.numel()} labels"
        )
    return images.reshape(-1, 3, 1024), labels


def _integers(path, key: str, values, top: int) -> torch.Tensor:
    """``values`` (an array or a list) as an integer tensor in [0, top], or a ValueError
    naming the file: float pixels or labels would be cut to integers without a word, and
    pixels past 255 wrap around in uint8."""
    try:
        tensor = torch.as_tensor(values)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"{path}: {key} must be integers in 0-{top}; got {err}") from None
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise ValueError(f"{path}: {key} must be integers in 0-{top}; got {tensor.dtype} values")
    if tensor.numel() and not 0 <= int(tensor.min()) <= int(tensor.max()) <= top:
        if key == "labels":
            raise ValueError(f"{path}: labels must be in 0-9, got {tensor.unique().tolist()}")
        low, high = int(tensor.min()), int(tensor.max())
        raise ValueError(f"{path}: {key} must be in 0-{top}, got values from {low} to {high}")
    return tensor


class CifarPixelDataset(Dataset):
    """CIFAR-10 gray pixel sequences: ``(tokens (1024,) long in 0-255, label)``.

    Args:
        path: the ``cifar-10-batches-py`` folder or a folder that contains it.
        split: ``"train"``, ``"val"`` or ``"test"`` (see the module docs).
        val_size: training images held out as "val" (the last ones); 0 makes "val" the
            test set.
    """

    def __init__(self, split: str = "train", *, path=None, val_size: int = 5000) -> None:
        check_choice("split", split, SPLITS)
        folder = require_path("cifar-pixel", path)
        if (folder / _FOLDER).is_dir():
            folder = folder / _FOLDER
        check_int("val_size", val_size, ge=0)
        names = CIFAR_TRAIN_FILES if split == "train" or (split == "val" and val_size) else ()
        names = names or (CIFAR_TEST_FILE,)
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise ValueError(
                f"path must be a cifar-10-batches-py folder holding {', '.join(names)}, got "
                f"{str(folder)!r} without {', '.join(missing)}"
            )
        parts = [load_cifar_batch(folder / n) for n in names]
        images = torch.cat([p[0] for p in parts])
        labels = torch.cat([p[1] for p in parts])
        if names == CIFAR_TRAIN_FILES and val_size:
            if val_size >= len(labels):
                raise ValueError(
                    f"val_size must be smaller than the {len(labels)} training images, got "
                    f"{val_size}"
                )
            keep = slice(len(labels) - val_size, None) if split == "val" else slice(-val_size)
            images, labels = images[keep], labels[keep]
        self.tokens = rgb_to_gray(images)  # (N, 1024) uint8, 1 byte per pixel in memory
        self.labels = labels
        self.num_classes = 10
        self.max_len = 1024

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.tokens[index].long(), int(self.labels[index])
