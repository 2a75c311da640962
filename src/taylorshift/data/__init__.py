"""Data: the paper's training tasks and loaders of the standard file formats.

- ``get_task(name).build(split, **options)`` / ``list_tasks()``: ``listops`` (generated,
  runs anywhere), ``listops-tsv``, ``cifar-pixel``, ``imdb-byte``, ``text-csv``,
  ``text-jsonl``, ``image-folder``. Nothing is downloaded: loaders read the files you give.
- Token datasets yield ``(LongTensor (N,), int)``, image datasets ``(FloatTensor (C, H, W),
  int)``; ``collate_tokens`` pads a batch and returns its mask (True = real token),
  ``collate_images`` stacks one.
- ``taylorshift.data.listops``: the ListOps generator, evaluator and tokenizer.

See docs/data.md.
"""

from .cifar import CifarPixelDataset, load_cifar_batch, rgb_to_gray
from .collate import collate_images, collate_tokens
from .images import ImageFolderDataset
from .imdb import ImdbByteDataset
from .listops import (
    ListOpsDataset,
    ListOpsTSV,
    detokenize,
    evaluate,
    generate_expression,
    tokenize,
)
from .registry import TaskSpec, get_task, list_tasks, register_task
from .text import TextFileDataset, encode_bytes, label_mapping

__all__ = [
    "CifarPixelDataset",
    "ImageFolderDataset",
    "ImdbByteDataset",
    "ListOpsDataset",
    "ListOpsTSV",
    "TaskSpec",
    "TextFileDataset",
    "collate_images",
    "collate_tokens",
    "detokenize",
    "encode_bytes",
    "evaluate",
    "generate_expression",
    "get_task",
    "label_mapping",
    "list_tasks",
    "load_cifar_batch",
    "register_task",
    "rgb_to_gray",
    "tokenize",
]
