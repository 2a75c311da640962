"""Your own text classification data as bytes: CSV and JSON Lines files.

Tokens are the bytes of the UTF-8 text (ids 0-255 of the byte vocabulary, pad 256, cls
257; ``data/vocab.py``), cut to ``max_len``, exactly as for IMDB.

Files: ``path`` is a file (used for the split asked for) or a folder holding
``train.csv``, ``val.csv`` and ``test.csv`` (``.jsonl`` for JSON Lines; ``valid`` and
``dev`` are accepted for val). A CSV file has a header row naming its columns; a JSON
Lines file holds one object per line. The columns (keys) are ``text`` and ``label`` unless
``text_column`` / ``label_column`` say otherwise.

Labels: any values (strings, ints); one that reads as an integer (``1``, ``"1"``) is that
integer. They are mapped to ids 0..K-1 in sorted order (numerically when every label is
an integer, as text otherwise), taken from the training file when ``path`` is a folder,
so every split uses the same mapping; ``labels=[...]`` fixes the mapping (and its order)
yourself. A label outside the mapping is an error. The
dataset exposes ``classes`` (label of each id) and ``class_to_idx``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset

from .._validate import check_choice, check_int, check_str
from ._common import SPLITS, bytes_to_tokens, require_path, split_file

__all__ = ["TextFileDataset", "encode_bytes", "label_mapping"]

_SPLIT_NAMES = {"train": ("train",), "val": ("val", "valid", "dev"), "test": ("test",)}


def encode_bytes(text: str | bytes, max_len: int | None = None) -> torch.Tensor:
    """Byte ids (LongTensor (N,), values 0-255) of ``text`` in UTF-8, cut to ``max_len``."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return bytes_to_tokens(data, max_len)


def _norm(value: object) -> object:
    """A label as an int when it reads as one (``1``, ``"1"``, ``" 01"``), else as text."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value)
    try:
        return int(text.strip())
    except ValueError:
        return text


def label_mapping(values: Sequence[object]) -> list[int | str]:
    """The distinct labels in id order: ints in numeric order when every label reads as an
    int (``"10"`` after ``"9"``), otherwise sorted as text. Labels are normalised first:
    ``"1"`` and ``1`` are one class, ``1``."""
    distinct = set(map(_norm, values))
    if all(isinstance(v, int) for v in distinct):
        return sorted(distinct)  # type: ignore[type-var]
    return sorted(distinct, key=str)


def _read_rows(path: Path, fmt: str, delimiter: str) -> Iterator[tuple[int, dict]]:
    """(line number, row dict) pairs of a CSV or JSON Lines file."""
    if fmt == "csv":
        with open(path, newline="", encoding="utf-8") as f:
            old_limit = csv.field_size_limit()
            csv.field_size_limit(1 << 30)  # long documents exceed csv's default of 128 KiB
            try:
                reader = csv.DictReader(f, delimiter=delimiter)
                for row in reader:
                    yield reader.line_num, row
            finally:
                csv.field_size_limit(old_limit)
    else:
        with open(path, encoding="utf-8") as f:
            for line_num, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    msg = f"{path} line {line_num} must be a JSON object: {err}"
                    raise ValueError(msg) from err
                if not isinstance(row, dict):
                    raise ValueError(f"{path} line {line_num} must be a JSON object, got {row!r}")
                yield line_num, row


def _load(path: Path, fmt: str, text_column: str, label_column: str, delimiter: str):
    texts, labels = [], []
    try:
        rows = list(_read_rows(path, fmt, delimiter))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} must be UTF-8 text: {err}") from None
    if not rows:
        what = "a row under the header" if fmt == "csv" else "a JSON object line"
        raise ValueError(f"{path} must hold at least one sample ({what}); got none")
    for line, row in rows:
        for column in (text_column, label_column):
            if column not in row or row[column] is None:
                raise ValueError(
                    f"{path} line {line} must have the column {column!r}, got columns "
                    f"{sorted(k for k in row if k is not None)}"
                )
        text = row[text_column]
        if not isinstance(text, str):
            raise ValueError(f"{path} line {line}: {text_column} must be text, got {text!r}")
        label = row[label_column]
        if isinstance(label, (list, dict, float)):
            raise ValueError(
                f"{path} line {line}: {label_column} must be a string or an int, got {label!r}"
            )
        texts.append(text)
        labels.append(label)
    return texts, labels


class TextFileDataset(Dataset):
    """Text classification from CSV or JSON Lines: ``(bytes (N,) long, label id)``.

    Args:
        path: a file, or a folder with one file per split (see the module docs).
        split: ``"train"``, ``"val"`` or ``"test"``.
        fmt: ``"csv"`` or ``"jsonl"``.
        text_column, label_column: the columns (keys) that hold the text and the label.
        max_len: bytes kept per text (default 4000, as for IMDB); None keeps all.
        labels: the label values in id order; default: sorted labels of the training file
            (folder) or of the file itself.
        delimiter: the CSV field separator (``","``; ``"\\t"`` for TSV files).
    """

    def __init__(
        self,
        split: str = "train",
        *,
        path=None,
        fmt: str = "csv",
        text_column: str = "text",
        label_column: str = "label",
        max_len: int | None = 4000,
        labels: Sequence[object] | None = None,
        delimiter: str = ",",
    ) -> None:
        check_choice("split", split, SPLITS)
        if fmt not in ("csv", "jsonl"):
            raise ValueError(f"fmt must be 'csv' or 'jsonl', got {fmt!r}")
        task = f"text-{fmt}"
        root = require_path(task, path)
        text_column = check_str("text_column", text_column)
        label_column = check_str("label_column", label_column)
        if not isinstance(delimiter, str) or len(delimiter) != 1:
            raise ValueError(f"delimiter must be one character, got {delimiter!r}")
        self.max_len = check_int("max_len", max_len, ge=1, allow_none=True)
        self.path = split_file(task, root, split, [f"{n}.{fmt}" for n in _SPLIT_NAMES[split]])
        self.single_file = root.is_file()  # the same file serves any split asked for
        texts, raw = _load(self.path, fmt, text_column, label_column, delimiter)
        if labels is not None:
            if isinstance(labels, (str, bytes)) or not isinstance(labels, Sequence) or not labels:
                raise ValueError(f"labels must be a non-empty list of label values, got {labels!r}")
            classes = [_norm(v) for v in labels]
            if len(set(classes)) != len(classes):
                raise ValueError(f"labels must not repeat a value, got {list(labels)!r}")
        else:
            source = raw
            train_file = root / f"train.{fmt}"
            if root.is_dir() and split != "train" and train_file.is_file():
                source = _load(train_file, fmt, text_column, label_column, delimiter)[1]
            classes = label_mapping(source)
        self.classes = classes
        self.class_to_idx = {c: i for i, c in enumerate(classes)}
        self.labels = []
        for row, value in enumerate(raw, 1):
            if _norm(value) not in self.class_to_idx:
                raise ValueError(
                    f"{self.path}: label {value!r} (row {row}) must be one of {classes!r}"
                )
            self.labels.append(self.class_to_idx[_norm(value)])
        self.texts = texts
        self.num_classes = len(classes)

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return encode_bytes(self.texts[index], self.max_len), self.labels[index]
