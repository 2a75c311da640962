"""Data: the paper's training tasks and loaders of the standard file formats.

- ``get_task(name).build(split, **options)`` / ``list_tasks()``: ``listops`` (generated,
  runs anywhere), ``listops-tsv``, ``cifar-pixel``, ``imdb-byte``, ``text-csv``,
  ``text-jsonl``, ``image-folder``, ``digits`` (scikit-learn's bundled digits as 1,024
  pixels); language modelling: ``recall`` (generated), ``lm`` (bytes of your text file) and
  ``text-bytes`` (bytes of the Python standard library's source). Nothing is downloaded:
  loaders read the files you give, or files already on the machine.
- Token datasets yield ``(LongTensor (N,), int)``, image datasets ``(FloatTensor (C, H, W),
  int)``, LM datasets ``(tokens LongTensor (N,), targets LongTensor (N,))`` with
  ``IGNORE_INDEX`` (-100) where no loss is taken; ``collate_tokens`` / ``collate_lm`` pad a
  batch and return its mask (True = real token), ``collate_images`` stacks one.
- ``get_kind(spec.kind)`` (or ``spec.behaviour``): the :class:`TaskKind` of a task's kind,
  which collates, unpacks a batch into model inputs and labels, and sums the loss.
- ``taylorshift.data.listops``: the ListOps generator, evaluator and tokenizer;
  ``taylorshift.data.recall``: multi-query associative recall; ``taylorshift.data.lm_text``:
  byte windows of a file, ``encode_text`` / ``decode_bytes`` for prompts and samples.

See docs/data.md.
"""

from .cifar import CifarPixelDataset, load_cifar_batch, rgb_to_gray
from .collate import IGNORE_INDEX, collate_images, collate_lm, collate_tokens
from .digits import DigitsDataset
from .images import ImageFolderDataset
from .imdb import ImdbByteDataset
from .kinds import TaskKind, get_kind
from .listops import (
    ListOpsDataset,
    ListOpsTSV,
    detokenize,
    evaluate,
    generate_expression,
    tokenize,
)
from .lm_text import LMTextDataset, decode_bytes, encode_text
from .recall import RecallDataset
from .registry import TaskSpec, get_task, list_tasks, register_task
from .text import TextFileDataset, encode_bytes, label_mapping
from .text_bytes import TextBytesDataset

__all__ = [
    "IGNORE_INDEX",
    "CifarPixelDataset",
    "DigitsDataset",
    "ImageFolderDataset",
    "ImdbByteDataset",
    "LMTextDataset",
    "ListOpsDataset",
    "ListOpsTSV",
    "RecallDataset",
    "TaskKind",
    "TaskSpec",
    "TextBytesDataset",
    "TextFileDataset",
    "collate_images",
    "collate_lm",
    "collate_tokens",
    "decode_bytes",
    "detokenize",
    "encode_bytes",
    "encode_text",
    "evaluate",
    "generate_expression",
    "get_kind",
    "get_task",
    "label_mapping",
    "list_tasks",
    "load_cifar_batch",
    "register_task",
    "rgb_to_gray",
    "tokenize",
]
