"""Multi-query associative recall (MQAR), the recall test of linear attention.

The task of the Zoology and Based papers (Arora et al. 2023, 2024), generated here from its
description. A sequence first lists ``num_pairs`` key-value pairs, then asks for the values
of ``num_queries`` of those keys, each query somewhere among filler tokens::

    k1 v1 k2 v2 k3 v3 k4 v4 | _ _ k3 v3 _ k1 v1 _ _ _ k4 v4 _
      pairs (context)       |   queries among filler, up to seq_len

Keys are distinct within a sequence; values are drawn independently (two keys may share a
value). A query is a key followed by its value, so the sequence reads as text and a model
that has recalled correctly generates the value as the next token after the key; the
target at a query key's position is its value, and ``IGNORE_INDEX`` (-100) everywhere else
(the pairs themselves are random and cannot be predicted). The queried keys are distinct
and in random order, and their places among the filler are uniform over all arrangements.

Vocabulary (``vocab_size`` ids): 0 pad, 1 filler, then the keys ``[2, 2 + K)`` with
``K = (vocab_size - 2) // 2`` and the values ``[2 + K, vocab_size)``.

Sample ``i`` of a split is a pure function of ``(seed, split, i)`` and the options (its
``random.Random`` is seeded with that text), so workers and ranks agree and splits differ.
"""

from __future__ import annotations

import operator
import random

import torch
from torch.utils.data import Dataset

from .._validate import check_choice, check_int
from ._common import SPLITS
from .collate import IGNORE_INDEX

__all__ = [
    "RECALL_FILLER_ID",
    "RECALL_PAD_ID",
    "RECALL_SPLIT_SIZES",
    "RecallDataset",
    "recall_vocab",
]

RECALL_PAD_ID, RECALL_FILLER_ID = 0, 1
_FIRST_KEY = 2
#: Default samples per split (the sizes Zoology trains and tests MQAR with).
RECALL_SPLIT_SIZES = {"train": 100_000, "val": 3_000, "test": 3_000}


def recall_vocab(vocab_size: int) -> tuple[range, range]:
    """The key ids and the value ids of a recall vocabulary of ``vocab_size`` ids."""
    check_int("vocab_size", vocab_size, ge=4)
    num_keys = (vocab_size - _FIRST_KEY) // 2
    return (
        range(_FIRST_KEY, _FIRST_KEY + num_keys),
        range(_FIRST_KEY + num_keys, vocab_size),
    )


class RecallDataset(Dataset):
    """MQAR sequences generated on the fly: ``(tokens (seq_len,) long, targets (seq_len,)
    long)``, targets ``IGNORE_INDEX`` except at the query keys (see the module docs).

    Args:
        split: ``"train"``, ``"val"`` or ``"test"`` (each its own random stream).
        seq_len: tokens per sequence, at least ``2 * num_pairs + 2 * num_queries``.
        num_pairs: key-value pairs at the start of a sequence.
        vocab_size: ids in the vocabulary: pad, filler, keys and values; at least
            ``2 + 2 * num_pairs`` so that the pairs can have distinct keys.
        num_queries: keys asked for, ``1..num_pairs``; default ``num_pairs`` (every key).
        num_samples: sequences in the split; default 100k / 3k / 3k.
        seed: selects the data set.

    Attributes:
        vocab_size, pad_id, filler_id, key_ids, value_ids: the vocabulary (a model for this
        data needs ``vocab_size`` embeddings and outputs).
    """

    def __init__(
        self,
        split: str = "train",
        *,
        seq_len: int = 128,
        num_pairs: int = 16,
        vocab_size: int = 128,
        num_queries: int | None = None,
        num_samples: int | None = None,
        seed: int = 0,
    ) -> None:
        self.split = check_choice("split", split, SPLITS)
        self.num_pairs = check_int("num_pairs", num_pairs, ge=1)
        self.vocab_size = check_int("vocab_size", vocab_size, ge=4)
        if vocab_size < _FIRST_KEY + 2 * num_pairs:
            raise ValueError(
                f"vocab_size must be >= 2 + 2 * num_pairs = {_FIRST_KEY + 2 * num_pairs} (pad, "
                f"filler, and as many value ids as distinct key ids), got {vocab_size}"
            )
        if num_queries is None:
            num_queries = num_pairs
        check_int("num_queries", num_queries, ge=1)
        if num_queries > num_pairs:
            raise ValueError(
                f"num_queries must be in [1, num_pairs = {num_pairs}] (distinct keys), "
                f"got {num_queries}"
            )
        self.num_queries = num_queries
        self.seq_len = check_int("seq_len", seq_len, ge=1)
        if seq_len < 2 * (num_pairs + num_queries):
            raise ValueError(
                f"seq_len must be >= 2 * num_pairs + 2 * num_queries = "
                f"{2 * (num_pairs + num_queries)} (the pairs, then each query key and its "
                f"value), got {seq_len}"
            )
        if num_samples is None:
            num_samples = RECALL_SPLIT_SIZES[split]
        self.num_samples = check_int("num_samples", num_samples, ge=1)
        self.seed = check_int("seed", seed)
        self.pad_id, self.filler_id = RECALL_PAD_ID, RECALL_FILLER_ID
        self.key_ids, self.value_ids = recall_vocab(vocab_size)

    def __len__(self) -> int:
        return self.num_samples

    def sequence(self, index: int) -> tuple[list[int], dict[int, int]]:
        """Sample ``index`` as a list of ids, and its pairs as ``{key: value}``."""
        index = operator.index(index)
        if not -self.num_samples <= index < self.num_samples:
            raise IndexError(f"index must be in [0, {self.num_samples}), got {index}")
        index %= self.num_samples
        rng = random.Random(f"taylorshift-recall/{self.seed}/{self.split}/{index}")
        keys = rng.sample(self.key_ids, self.num_pairs)
        pairs = {k: rng.choice(self.value_ids) for k in keys}
        ids = [t for k in keys for t in (k, pairs[k])]
        # The query region holds num_queries two-token pairs and `free` filler tokens:
        # choosing which of its (free + num_queries) units are pairs is uniform over
        # arrangements.
        region = self.seq_len - 2 * self.num_pairs
        free = region - 2 * self.num_queries
        queried = rng.sample(keys, self.num_queries)
        slots = set(rng.sample(range(free + self.num_queries), self.num_queries))
        queries = iter(queried)
        for unit in range(free + self.num_queries):
            if unit in slots:
                key = next(queries)
                ids += (key, pairs[key])
            else:
                ids.append(self.filler_id)
        return ids, pairs

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids, pairs = self.sequence(index)
        tokens = torch.tensor(ids, dtype=torch.long)
        targets = torch.full_like(tokens, IGNORE_INDEX)
        start = 2 * self.num_pairs
        for pos in range(start, self.seq_len - 1):
            if ids[pos] in pairs:
                targets[pos] = pairs[ids[pos]]
        return tokens, targets
