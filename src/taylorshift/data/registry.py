"""Task registry: ``get_task(name).build(split, **options)`` and ``list_tasks()``."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import Dataset

from .._validate import check_choice
from ._common import SPLITS
from .cifar import CifarPixelDataset
from .digits import DigitsDataset
from .images import ImageFolderDataset
from .imdb import ImdbByteDataset
from .kinds import KINDS, TaskKind, get_kind
from .listops import ListOpsDataset, ListOpsTSV
from .lm_text import LMTextDataset
from .recall import RECALL_PAD_ID, RecallDataset
from .text import TextFileDataset
from .text_bytes import TextBytesDataset
from .vocab import (
    BYTE_PAD_ID,
    BYTE_VOCAB_SIZE,
    LISTOPS_TOKENS,
    LISTOPS_VOCAB_SIZE,
    PAD,
    PIXEL_VOCAB_SIZE,
)

__all__ = ["TaskSpec", "get_task", "list_tasks", "register_task"]


@dataclass(frozen=True)
class TaskSpec:
    """A task: what its samples look like and how to build a split.

    Attributes:
        name: the registry name.
        num_classes: classes, or None when they come from the data (``text-*``,
            ``image-folder``: read ``dataset.num_classes`` of the built split); always
            None for kind ``"lm"`` (the model predicts one of ``vocab_size`` ids).
        vocab_size: token ids are in ``[0, vocab_size)`` with the default options; None for
            images. A task whose options change it (``recall``) builds datasets with a
            ``vocab_size`` attribute: read ``getattr(dataset, "vocab_size", spec.vocab_size)``.
        max_len: the longest sequence with the default options (None for images).
        pad_id: the id the collate function pads tokens with (None for images).
        kind: ``"tokens"`` (classification, items ``(LongTensor (N,), int)``), ``"image"``
            (items ``(FloatTensor (C, H, W), int)``) or ``"lm"`` (per-token targets, items
            ``(tokens LongTensor (N,), targets LongTensor (N,))`` with ``targets[i]`` the id
            to predict at position i or ``IGNORE_INDEX`` = -100 for no loss); its
            behaviour is ``spec.behaviour`` (``taylorshift.data.kinds``).
        description: one line for listings.
        builder: ``builder(split, **options)`` makes the dataset (a dataset class or a
            function); its keyword-only arguments are the task's options.
        byte_tokens: the tokens are bytes of text, so language-model scores are also given
            in bits per byte (``loss / ln 2``) beside the count baselines of
            ``taylorshift.data.text_bytes.count_baselines``.
    """

    name: str
    num_classes: int | None
    vocab_size: int | None
    max_len: int | None
    pad_id: int | None
    kind: str
    description: str = ""
    builder: Callable[..., Dataset] = field(default=None, repr=False, compare=False)  # type: ignore
    byte_tokens: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if not callable(self.builder):
            raise ValueError(f"builder must be callable, got {self.builder!r}")
        if self.behaviour.per_token and self.num_classes is not None:
            raise ValueError(
                f"num_classes must be None for kind {self.kind!r} (targets are token ids), "
                f"got {self.num_classes!r}"
            )

    @property
    def behaviour(self) -> TaskKind:
        """What depends on ``kind``: collate, unpack a batch, losses (``get_kind(kind)``)."""
        return get_kind(self.kind)

    @property
    def options(self) -> dict[str, Any]:
        """The task's options and their defaults (``inspect.Parameter.empty`` if required)."""
        params = inspect.signature(self.builder).parameters.values()
        return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}

    def build(self, split: str, **options: Any) -> Dataset:
        """The dataset of ``split`` (``"train"``, ``"val"``, ``"test"``) with ``options``.

        Raises:
            ValueError: a bad split, an unknown option, or a bad option value (naming the
                option, what it accepts and what it got).
        """
        check_choice("split", split, SPLITS)
        known = self.options
        unknown = [k for k in options if k not in known]
        if unknown:
            raise ValueError(
                f"options of task {self.name!r} must be among {', '.join(known) or 'none'}, "
                f"got unknown {', '.join(map(repr, unknown))}"
            )
        return self.builder(split, **options)

    def collate(self, pad_to_multiple: int | None = None) -> Callable:
        """The DataLoader ``collate_fn`` for this task (picklable, works with workers):
        ``collate_images``, ``collate_tokens`` or, for kind ``"lm"``, ``collate_lm``."""
        return self.behaviour.collate(self.pad_id, pad_to_multiple)


_TASKS: dict[str, TaskSpec] = {}


def register_task(spec: TaskSpec, *, overwrite: bool = False) -> TaskSpec:
    """Add ``spec`` to the registry under ``spec.name``."""
    if not isinstance(spec, TaskSpec):
        raise ValueError(f"spec must be a TaskSpec, got {type(spec).__name__}")
    if spec.name in _TASKS and not overwrite:
        raise ValueError(f"name must be a new task name, got {spec.name!r} (registered already)")
    _TASKS[spec.name] = spec
    return spec


def list_tasks() -> list[str]:
    """Sorted names accepted by ``get_task``."""
    return sorted(_TASKS)


def get_task(name: str) -> TaskSpec:
    """The registered task ``name`` (see ``list_tasks()``)."""
    if name not in _TASKS:
        close = difflib.get_close_matches(str(name), _TASKS, n=3)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        raise ValueError(f"name must be one of {', '.join(list_tasks())}, got {name!r}{hint}")
    return _TASKS[name]


def _text_csv(
    split, *, path=None, text_column="text", label_column="label", max_len=4000, labels=None,
    delimiter=",",
):  # fmt: skip
    return TextFileDataset(
        split, path=path, fmt="csv", text_column=text_column, label_column=label_column,
        max_len=max_len, labels=labels, delimiter=delimiter,
    )  # fmt: skip


def _text_jsonl(
    split, *, path=None, text_column="text", label_column="label", max_len=4000, labels=None
):
    return TextFileDataset(
        split, path=path, fmt="jsonl", text_column=text_column, label_column=label_column,
        max_len=max_len, labels=labels,
    )  # fmt: skip


_LISTOPS_PAD = LISTOPS_TOKENS.index(PAD)
for _spec in (
    TaskSpec(
        "listops", 10, LISTOPS_VOCAB_SIZE, 2000, _LISTOPS_PAD, "tokens",
        "ListOps generated on the fly (LRA rules, or exact lengths)", ListOpsDataset,
    ),
    TaskSpec(
        "listops-tsv", 10, LISTOPS_VOCAB_SIZE, 2000, _LISTOPS_PAD, "tokens",
        "ListOps from LRA's TSV files (basic_{train,val,test}.tsv)", ListOpsTSV,
    ),
    TaskSpec(
        "cifar-pixel", 10, PIXEL_VOCAB_SIZE, 1024, 0, "tokens",
        "CIFAR-10 as 1024 gray levels (cifar-10-batches-py)", CifarPixelDataset,
    ),
    TaskSpec(
        "imdb-byte", 2, BYTE_VOCAB_SIZE, 4000, BYTE_PAD_ID, "tokens",
        "IMDB reviews as bytes (aclImdb)", ImdbByteDataset,
    ),
    TaskSpec(
        "text-csv", None, BYTE_VOCAB_SIZE, 4000, BYTE_PAD_ID, "tokens",
        "your text classification CSV files, as bytes", _text_csv,
    ),
    TaskSpec(
        "text-jsonl", None, BYTE_VOCAB_SIZE, 4000, BYTE_PAD_ID, "tokens",
        "your text classification JSON Lines files, as bytes", _text_jsonl,
    ),
    TaskSpec(
        "image-folder", None, None, None, None, "image",
        "class folders of images per split (Pillow)", ImageFolderDataset,
    ),
    TaskSpec(
        "recall", None, 128, 128, RECALL_PAD_ID, "lm",
        "multi-query associative recall (MQAR), generated", RecallDataset,
    ),
    TaskSpec(
        "lm", None, BYTE_VOCAB_SIZE, 256, BYTE_PAD_ID, "lm",
        "byte-level language model on your text file", byte_tokens=True, builder=LMTextDataset,
    ),
    TaskSpec(
        "text-bytes", None, BYTE_VOCAB_SIZE, 256, BYTE_PAD_ID, "lm",
        "byte-level language model on Python's standard library source (no download)",
        byte_tokens=True, builder=TextBytesDataset,
    ),
    TaskSpec(
        "digits", 10, PIXEL_VOCAB_SIZE, 1024, 0, "tokens",
        "scikit-learn's handwritten digits as 1024 gray pixels (no download)", DigitsDataset,
    ),
):  # fmt: skip
    register_task(_spec)
