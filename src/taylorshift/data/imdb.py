"""IMDB reviews as bytes (LRA "Text"): 2 classes, sequences cut to 4000 bytes.

Files: the ``aclImdb`` folder of the Large Movie Review Dataset, with
``train/pos``, ``train/neg``, ``test/pos`` and ``test/neg``, one review per ``*.txt`` file
(``train/unsup`` is ignored). Labels: pos = 1, neg = 0. Tokens: the file's bytes (UTF-8
text; ids 0-255, pad 256), cut to ``max_len`` (default 4000 as in the TaylorShift paper;
LRA's code uses 1000).

Splits: like LRA, which trains on train and evaluates on test, "val" is the test set by
default (``val_size=0``); ``val_size > 0`` holds out that many training reviews, chosen by
a permutation seeded with ``seed``, as "val" and trains on the rest.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

from .._validate import check_choice, check_int
from ._common import SPLITS, bytes_to_tokens, holdout, require_path

__all__ = ["IMDB_LABELS", "ImdbByteDataset"]

#: Label id of each class folder.
IMDB_LABELS = {"neg": 0, "pos": 1}


def _reviews(folder: Path) -> tuple[list[Path], list[int]]:
    files, labels = [], []
    for name, label in IMDB_LABELS.items():
        found = sorted((folder / name).glob("*.txt"))
        files += found
        labels += [label] * len(found)
    return files, labels


class ImdbByteDataset(Dataset):
    """IMDB reviews as byte sequences: ``(tokens (N,) long, label)``, 1 = positive.

    Args:
        path: the ``aclImdb`` folder, or a folder that contains it.
        split: ``"train"``, ``"val"`` or ``"test"`` (see the module docs).
        max_len: bytes kept per review; None keeps all.
        val_size: training reviews held out as "val"; 0 makes "val" the test set.
        seed: the permutation that picks the held-out reviews.

    Files are read when a sample is asked for, so building the dataset is quick.
    """

    def __init__(
        self,
        split: str = "train",
        *,
        path=None,
        max_len: int | None = 4000,
        val_size: int = 0,
        seed: int = 0,
    ) -> None:
        check_choice("split", split, SPLITS)
        root = require_path("imdb-byte", path)
        if (root / "aclImdb").is_dir():
            root = root / "aclImdb"
        self.max_len = check_int("max_len", max_len, ge=1, allow_none=True)
        check_int("val_size", val_size, ge=0)
        check_int("seed", seed)
        part = "train" if split == "train" or (split == "val" and val_size) else "test"
        missing = [n for n in IMDB_LABELS if not (root / part / n).is_dir()]
        if missing:
            raise ValueError(
                f"path must be an aclImdb folder with {part}/pos and {part}/neg, got "
                f"{str(root)!r} without {', '.join(f'{part}/{m}' for m in missing)}"
            )
        files, labels = _reviews(root / part)
        if not files:
            raise ValueError(f"path must hold *.txt reviews in {root / part}/{{pos,neg}}, got none")
        if part == "train" and val_size:
            if val_size >= len(files):
                raise ValueError(
                    f"val_size must be smaller than the {len(files)} training reviews, got "
                    f"{val_size}"
                )
            keep = holdout(len(files), val_size, seed, split).tolist()
            files, labels = [files[i] for i in keep], [labels[i] for i in keep]
        self.files, self.labels = files, labels
        self.num_classes = 2

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return bytes_to_tokens(self.files[index].read_bytes(), self.max_len), self.labels[index]
