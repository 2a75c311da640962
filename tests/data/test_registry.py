"""Task registry: names, specs matching the model vocabularies, options, errors, and a
DataLoader round trip."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from torch.utils.data import DataLoader

from taylorshift.data import TaskSpec, get_task, list_tasks, register_task, vocab
from taylorshift.data.registry import _TASKS

TASKS = [
    "cifar-pixel",
    "digits",
    "image-folder",
    "imdb-byte",
    "listops",
    "listops-tsv",
    "lm",
    "recall",
    "text-bytes",
    "text-csv",
    "text-jsonl",
]


def test_list_and_specs():
    assert list_tasks() == TASKS
    listops = get_task("listops")
    assert (listops.num_classes, listops.vocab_size, listops.max_len) == (10, 20, 2000)
    assert listops.pad_id == vocab.LISTOPS_TOKENS.index(vocab.PAD) and listops.kind == "tokens"
    assert get_task("listops-tsv").vocab_size == vocab.LISTOPS_VOCAB_SIZE
    cifar = get_task("cifar-pixel")
    assert (cifar.num_classes, cifar.vocab_size, cifar.max_len) == (10, 256, 1024)
    imdb = get_task("imdb-byte")
    assert (imdb.num_classes, imdb.vocab_size, imdb.max_len, imdb.pad_id) == (2, 258, 4000, 256)
    assert get_task("text-csv").num_classes is None and get_task("text-csv").pad_id == 256
    image = get_task("image-folder")
    assert image.kind == "image" and image.vocab_size is None and image.pad_id is None
    for name in ("recall", "lm", "text-bytes"):
        spec = get_task(name)
        assert spec.kind == "lm" and spec.num_classes is None
        # vocab_size and max_len are those of the default options
        assert spec.vocab_size == spec.options.get("vocab_size", vocab.BYTE_VOCAB_SIZE)
        assert spec.max_len == spec.options["seq_len"]
    assert get_task("lm").pad_id == vocab.BYTE_PAD_ID and get_task("recall").pad_id == 0
    assert [n for n in list_tasks() if get_task(n).byte_tokens] == ["lm", "text-bytes"]
    digits = get_task("digits")
    assert (digits.kind, digits.num_classes, digits.vocab_size, digits.max_len) == (
        "tokens", 10, 256, 1024,
    )  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        listops.max_len = 1  # type: ignore[misc]


def test_options_listed():
    assert get_task("listops").options == {
        "num_samples": None, "min_len": 500, "max_len": 2000, "exact_length": False,
        "max_depth": 10, "max_args": 10, "operators": ("MIN", "MAX", "MED", "SM"), "seed": 0,
    }  # fmt: skip
    assert get_task("cifar-pixel").options == {"path": None, "val_size": 5000}
    assert "delimiter" in get_task("text-csv").options
    assert "delimiter" not in get_task("text-jsonl").options
    for name in TASKS:
        assert all(v is not inspect.Parameter.empty for v in get_task(name).options.values())


def test_build_listops_and_load_batches():
    spec = get_task("listops")
    ds = spec.build("val", num_samples=6, min_len=20, max_len=100, max_depth=6, seed=2)
    loader = DataLoader(ds, batch_size=4, collate_fn=spec.collate(pad_to_multiple=8))
    tokens, mask, labels = next(iter(loader))
    assert tokens.shape[0] == 4 and tokens.shape[1] % 8 == 0 and mask.shape == tokens.shape
    assert torch.equal(mask.sum(1), torch.tensor([len(ds[i][0]) for i in range(4)]))
    assert labels.tolist() == [ds[i][1] for i in range(4)]
    assert bool((tokens[~mask] == spec.pad_id).all())


def test_build_recall_and_load_lm_batches():
    spec = get_task("recall")
    ds = spec.build("train", seq_len=30, num_pairs=4, vocab_size=40, num_samples=6)
    assert getattr(ds, "vocab_size", spec.vocab_size) == 40  # the option, not the default
    loader = DataLoader(ds, batch_size=4, collate_fn=spec.collate(pad_to_multiple=8))
    tokens, mask, targets = next(iter(loader))
    assert tokens.shape == mask.shape == targets.shape == (4, 32)
    assert torch.equal(tokens[:, :30], torch.stack([ds[i][0] for i in range(4)]))
    assert torch.equal(targets[:, :30], torch.stack([ds[i][1] for i in range(4)]))
    assert bool(mask[:, :30].all()) and not bool(mask[:, 30:].any())
    assert bool((tokens[:, 30:] == spec.pad_id).all()) and bool((targets[:, 30:] == -100).all())


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: get_task("listop"),
            "name must be one of cifar-pixel, .* got 'listop' .*did you mean 'listops'",
        ),
        (
            lambda: get_task("listops").build("dev"),
            "split must be one of 'train', 'val', 'test'; got 'dev'",
        ),
        (
            lambda: get_task("listops").build("train", length=5),
            "options of task 'listops' must be among num_samples, .* got unknown 'length'",
        ),
        (
            lambda: get_task("listops").build("train", min_len=-1),
            "min_len must be an int >= 0; got -1",
        ),
        (
            lambda: get_task("cifar-pixel").build("train"),
            "task 'cifar-pixel' needs the option path",
        ),
        (
            lambda: get_task("imdb-byte").build("test", path="/no/such/dir"),
            "must be an existing file or folder, got '/no/such/dir'",
        ),
        (
            lambda: get_task("text-jsonl").build("test", path=3),
            "path must be a str or os.PathLike, got 3",
        ),
        (lambda: register_task(get_task("listops")), "name must be a new task name, got 'listops'"),
        (lambda: register_task("listops"), "spec must be a TaskSpec, got str"),
        (lambda: TaskSpec("x", 2, 2, 2, 0, "audio", "", len), "kind must be one of .* got 'audio'"),
        (lambda: TaskSpec("x", 2, 2, 2, 0, "tokens"), "builder must be callable, got None"),
        (
            lambda: TaskSpec("x", 2, 2, 2, 0, "lm", "", len),
            "num_classes must be None for kind 'lm' .*got 2",
        ),
        (
            lambda: get_task("recall").build("train", num_pairs=40),
            r"seq_len must be >= 2 \* num_pairs \+ 2 \* num_queries = 160 .* got 128",
        ),
        (lambda: get_task("lm").build("val"), "task 'lm' needs the option path"),
    ],
)
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_register_your_own_task():
    def build(split, *, size=3):
        return [(torch.tensor([split == "train", 1]), 0)] * size

    spec = TaskSpec("toy", 2, 2, 2, 0, "tokens", "toy task", build)
    try:
        assert register_task(spec) is spec and "toy" in list_tasks()
        assert len(get_task("toy").build("test", size=5)) == 5
        assert get_task("toy").collate()(get_task("toy").build("val"))[0].shape == (3, 2)
    finally:
        _TASKS.pop("toy", None)
    assert get_task("image-folder").collate()([(torch.zeros(3, 2, 2), 1)])[0].shape == (1, 3, 2, 2)
