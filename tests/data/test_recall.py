"""Multi-query associative recall: the structure of every sequence re-parsed independently
of the generator, determinism, splits, the vocabulary option, errors."""

from __future__ import annotations

import pickle

import pytest
import torch

from taylorshift.data import IGNORE_INDEX, RecallDataset, get_task
from taylorshift.data.recall import RECALL_FILLER_ID, RECALL_PAD_ID, recall_vocab

SETTINGS = [
    pytest.param(dict(seq_len=128, num_pairs=16, vocab_size=128), id="defaults"),
    pytest.param(dict(seq_len=37, num_pairs=5, vocab_size=13, num_queries=2), id="L37-P5-V13-Q2"),
    pytest.param(dict(seq_len=8, num_pairs=2, vocab_size=6), id="L8-P2-V6-full"),
    pytest.param(dict(seq_len=203, num_pairs=1, vocab_size=4), id="L203-P1-V4"),
    pytest.param(dict(seq_len=111, num_pairs=9, vocab_size=101, num_queries=9), id="L111-P9-V101"),
]


def parse(tokens: list[int], num_pairs: int, vocab_size: int) -> tuple[dict, list[int]]:
    """The pairs ``{key: value}`` of a sequence and its expected targets, read from the
    tokens alone: keys are the ids 2..K+1, values K+2.., filler 1."""
    num_keys = (vocab_size - 2) // 2
    is_key = lambda t: 2 <= t < 2 + num_keys  # noqa: E731
    is_value = lambda t: 2 + num_keys <= t < vocab_size  # noqa: E731
    pairs = {}
    for k, v in zip(tokens[0 : 2 * num_pairs : 2], tokens[1 : 2 * num_pairs : 2], strict=True):
        assert is_key(k) and is_value(v) and k not in pairs
        pairs[k] = v
    targets = [IGNORE_INDEX] * len(tokens)
    pos = 2 * num_pairs
    while pos < len(tokens):
        t = tokens[pos]
        if t == RECALL_FILLER_ID:
            pos += 1
            continue
        assert is_key(t), f"a query must start with a key, got {t} at {pos}"
        assert tokens[pos + 1] == pairs[t], "a query key is followed by its value"
        targets[pos] = pairs[t]
        pos += 2
    return pairs, targets


@pytest.mark.parametrize("settings", SETTINGS)
def test_every_target_is_the_value_of_the_query_key(settings):
    ds = RecallDataset("train", num_samples=50, **settings)
    num_queries = settings.get("num_queries", settings["num_pairs"])
    for i in range(len(ds)):
        tokens, targets = ds[i]
        assert tokens.dtype == targets.dtype == torch.long
        assert tokens.shape == targets.shape == (settings["seq_len"],)
        assert int(tokens.min()) >= 1 and int(tokens.max()) < settings["vocab_size"]  # no pad
        pairs, expected = parse(tokens.tolist(), settings["num_pairs"], settings["vocab_size"])
        assert targets.tolist() == expected
        asked = tokens[targets != IGNORE_INDEX].tolist()
        assert len(asked) == len(set(asked)) == num_queries and set(asked) <= set(pairs)
        where = (targets != IGNORE_INDEX).nonzero().flatten()
        assert torch.equal(targets[where], tokens[where + 1])  # the value is the next token
        assert ds.sequence(i) == (tokens.tolist(), pairs)


def test_queries_are_spread_and_values_may_repeat():
    ds = RecallDataset("val", num_samples=200, seq_len=64, num_pairs=4, vocab_size=10)
    first, last, repeated = set(), set(), 0
    for i in range(len(ds)):
        tokens, targets = ds[i]
        where = (targets != IGNORE_INDEX).nonzero().flatten().tolist()
        first.add(where[0])
        last.add(where[-1])
        values = tokens[1:8:2].tolist()
        repeated += len(set(values)) < len(values)
    assert min(first) == 8 and max(last) == 62  # right after the pairs ... at the very end
    assert len(first) > 10 and len(last) > 10
    assert repeated > 0  # 4 values out of 4: repeats are likely, and allowed


def test_deterministic_per_index_and_splits_differ():
    opts = dict(seq_len=40, num_pairs=6, vocab_size=30, num_samples=20)
    a, b = RecallDataset("train", **opts), RecallDataset("train", **opts)
    for i in (0, 7, 19):
        assert all(torch.equal(x, y) for x, y in zip(a[i], b[i], strict=True))
    assert torch.equal(a[-1][0], a[19][0])
    copy = pickle.loads(pickle.dumps(a))  # as DataLoader workers get it
    assert all(torch.equal(x, y) for x, y in zip(copy[3], a[3], strict=True))
    sequences = {
        name: [tuple(ds[i][0].tolist()) for i in range(20)]
        for name, ds in {
            "train": a,
            "val": RecallDataset("val", **opts),
            "test": RecallDataset("test", **opts),
            "seed": RecallDataset("train", **opts, seed=1),
        }.items()
    }
    assert len({s for seqs in sequences.values() for s in seqs}) == 80
    assert len(set(sequences["train"])) == 20


def test_defaults_vocabulary_and_registry():
    ds = RecallDataset("test", num_pairs=3, seq_len=12)
    assert (len(ds), ds.num_queries, ds.vocab_size) == (3000, 3, 128)
    assert (ds.pad_id, ds.filler_id) == (RECALL_PAD_ID, RECALL_FILLER_ID) == (0, 1)
    assert recall_vocab(128) == (range(2, 65), range(65, 128))
    assert recall_vocab(7) == (range(2, 4), range(4, 7))
    spec = get_task("recall")
    assert (spec.kind, spec.num_classes, spec.pad_id) == ("lm", None, RECALL_PAD_ID)
    assert (spec.vocab_size, spec.max_len) == (128, 128)
    assert len(spec.build("train")) == 100_000
    bigger = spec.build("val", vocab_size=1000, num_samples=5)
    assert bigger.vocab_size == 1000 and int(bigger[0][0].max()) < 1000
    assert int(bigger[0][0][1]) >= 501  # values come from the upper half


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(seq_len=0), "seq_len must be a positive int; got 0"),
        (
            dict(seq_len=20, num_pairs=6),
            r"seq_len must be >= 2 \* num_pairs \+ 2 \* num_queries = 24 .* got 20",
        ),
        (
            dict(seq_len=20, num_pairs=6, num_queries=5),
            r"seq_len must be >= 2 \* num_pairs \+ 2 \* num_queries = 22 .* got 20",
        ),
        (dict(num_pairs=0), "num_pairs must be a positive int; got 0"),
        (dict(vocab_size=3), "vocab_size must be an int >= 4; got 3"),
        (dict(num_pairs=8, vocab_size=17), r"vocab_size must be >= 2 \+ 2 \* num_pairs = 18 .*17"),
        (dict(num_pairs=4, num_queries=5), r"num_queries must be in \[1, num_pairs = 4\].* 5"),
        (dict(num_queries=0), "num_queries must be a positive int; got 0"),
        (dict(num_samples=0), "num_samples must be a positive int; got 0"),
    ],
)
def test_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        RecallDataset("train", **options)


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(num_pairs=2.0), "num_pairs must be a positive int; got 2.0"),
        (dict(seed="a"), "seed must be an int; got 'a'"),
    ],
)
def test_options_of_a_wrong_type(options, match):
    with pytest.raises(TypeError, match=match):
        RecallDataset("train", **options)


def test_bad_split_and_index():
    with pytest.raises(ValueError, match="split must be one of 'train', 'val', 'test'; got 'dev'"):
        RecallDataset("dev")
    ds = RecallDataset("train", num_samples=3)
    with pytest.raises(IndexError, match=r"index must be in \[0, 3\), got 3"):
        ds[3]
    with pytest.raises(TypeError):
        ds["0"]
