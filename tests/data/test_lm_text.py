"""Byte-level LM on a text file: contiguous splits, windows, targets shifted by one,
strides, errors, and the prompt / sample helpers. Files are generated here."""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils.data import DataLoader

from taylorshift.data import IGNORE_INDEX, LMTextDataset, decode_bytes, encode_text, get_task
from taylorshift.data.vocab import BYTE_PAD_ID, BYTE_VOCAB_SIZE


@pytest.fixture
def text_file(tmp_path):
    """1000 bytes of made-up UTF-8 text (two-byte characters included)."""
    rng = random.Random(0)
    words = ["taylor", "shift", "attention", "naïve", "ß", "linear", "softmax", "\n"]
    text = ""
    while len(text.encode()) < 1000:
        text += rng.choice(words) + " "
    data = text.encode()[:1000]
    path = tmp_path / "corpus.txt"
    path.write_bytes(data)
    return path, data


def test_splits_are_contiguous_parts(text_file):
    path, data = text_file
    parts = {
        split: LMTextDataset(split, path=path, seq_len=16, val_fraction=0.1, test_fraction=0.2)
        for split in ("train", "val", "test")
    }
    assert bytes(parts["train"].data.tolist()) == data[:700]
    assert bytes(parts["val"].data.tolist()) == data[700:800]
    assert bytes(parts["test"].data.tolist()) == data[800:]
    assert parts["train"].data.dtype == torch.uint8
    # default shares: 5 % each, rounded down
    default = {s: LMTextDataset(s, path=str(path), seq_len=16) for s in ("train", "val", "test")}
    assert [len(d.data) for d in default.values()] == [900, 50, 50]


@pytest.mark.parametrize(
    "seq_len, stride", [(16, None), (16, 5), (7, 7), (49, 1), (99, 3)], ids=lambda v: str(v)
)
def test_windows_and_targets(text_file, seq_len, stride):
    path, data = text_file
    ds = LMTextDataset("val", path=path, seq_len=seq_len, stride=stride, val_fraction=0.1)
    part = data[850:950]  # val: the 10 % before the last 5 % (test)
    step = stride or seq_len
    assert len(ds) == (100 - seq_len - 1) // step + 1
    for i in range(len(ds)):
        tokens, targets = ds[i]
        assert tokens.dtype == targets.dtype == torch.long
        assert tokens.shape == targets.shape == (seq_len,)
        assert bytes(tokens.tolist()) == part[i * step : i * step + seq_len]
        assert bytes(targets.tolist()) == part[i * step + 1 : i * step + seq_len + 1]
        assert torch.equal(tokens[1:], targets[:-1])
    # the last window ends inside the split; one more would not fit
    last = (len(ds) - 1) * step + seq_len + 1
    assert last <= 100 < last + step
    assert torch.equal(ds[-1][0], ds[len(ds) - 1][0])
    with pytest.raises(IndexError, match=rf"index must be in \[0, {len(ds)}\)"):
        ds[len(ds)]


def test_registry_and_batches(text_file):
    path, _ = text_file
    spec = get_task("lm")
    assert (spec.kind, spec.num_classes, spec.vocab_size, spec.pad_id, spec.max_len) == (
        "lm", None, BYTE_VOCAB_SIZE, BYTE_PAD_ID, 256,
    )  # fmt: skip
    assert spec.options == {
        "path": None, "seq_len": 256, "val_fraction": 0.05, "test_fraction": 0.05, "stride": None
    }  # fmt: skip
    train = spec.build("train", path=path, seq_len=32)
    assert (train.vocab_size, train.pad_id, len(train)) == (BYTE_VOCAB_SIZE, BYTE_PAD_ID, 28)
    loader = DataLoader(train, batch_size=4, collate_fn=spec.collate(pad_to_multiple=12))
    tokens, mask, targets = next(iter(loader))
    assert tokens.shape == mask.shape == targets.shape == (4, 36)
    assert bool(mask[:, :32].all()) and not bool(mask[:, 32:].any())
    assert bool((tokens[:, 32:] == BYTE_PAD_ID).all())
    assert bool((targets[:, 32:] == IGNORE_INDEX).all())
    assert torch.equal(targets[1, :32], train[1][1])


def test_too_short_split_names_split_and_sizes(tmp_path):
    path = tmp_path / "short.txt"
    path.write_bytes(b"x" * 200)
    with pytest.raises(
        ValueError,
        match=r"split 'val' of .*short.txt' must hold at least seq_len \+ 1 = 17 bytes for one "
        r"window, got 10 bytes \(its share 0.05 of 200\)",
    ):
        LMTextDataset("val", path=path, seq_len=16)
    with pytest.raises(ValueError, match=r"split 'test' .* got 0 bytes \(its share 0 of 200\)"):
        LMTextDataset("test", path=path, seq_len=16, test_fraction=0)
    with pytest.raises(ValueError, match=r"split 'train' .* = 201 bytes .* got 180 bytes"):
        LMTextDataset("train", path=path, seq_len=200)
    assert len(LMTextDataset("val", path=path, seq_len=9)) == 1  # exactly seq_len + 1 bytes
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="got 0 bytes"):
        LMTextDataset("train", path=empty, seq_len=1)


@pytest.mark.parametrize(
    "options, match",
    [
        ({}, "task 'lm' needs the option path"),
        ({"path": "/no/such/file.txt"}, "must be an existing file or folder, got '/no/such/"),
        ({"path": "FOLDER"}, "path must be a text file for task 'lm', got the folder"),
        ({"seq_len": 0}, "seq_len must be a positive int; got 0"),
        ({"stride": 0}, "stride must be a positive int or None; got 0"),
        ({"val_fraction": 1.0}, r"val_fraction must be a number in \[0, 1\); got 1.0"),
        ({"test_fraction": -0.1}, r"test_fraction must be a number in \[0, 1\); got -0.1"),
        (
            {"val_fraction": 0.5, "test_fraction": 0.5},
            "val_fraction \\+ test_fraction must be < 1 .* got 0.5 \\+ 0.5",
        ),
    ],
)
def test_bad_options(text_file, options, match):
    path, _ = text_file
    if options.get("path") == "FOLDER":
        options = {"path": path.parent}
    elif options:
        options = {"path": path, **options}
    with pytest.raises(ValueError, match=match):
        get_task("lm").build("train", **options)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"val_fraction": "0.1"}, r"val_fraction must be a number in \[0, 1\); got '0.1'"),
        ({"seq_len": 8.0}, "seq_len must be a positive int; got 8.0"),
    ],
)
def test_options_of_a_wrong_type(text_file, options, match):
    with pytest.raises(TypeError, match=match):
        get_task("lm").build("train", path=text_file[0], **options)


def test_encode_and_decode():
    text = "naïve ✓ TaylorShift\n"
    ids = encode_text(text)
    assert ids.dtype == torch.long and ids.tolist() == list(text.encode())
    assert decode_bytes(ids) == text
    assert decode_bytes(ids.tolist()) == text
    with_specials = [BYTE_PAD_ID, *ids.tolist(), 257, IGNORE_INDEX, BYTE_PAD_ID]
    assert decode_bytes(torch.tensor(with_specials)) == text  # pad, cls, -100 dropped
    assert decode_bytes([0x61, 0xFF, 0x62]) == "a\ufffdb"  # invalid UTF-8 replaced
    assert decode_bytes(torch.tensor([[104, 105]])) == "hi"
    assert encode_text("").tolist() == [] and decode_bytes([]) == ""
    with pytest.raises(ValueError, match="text must be a str, got bytes"):
        encode_text(b"abc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"ids must be integer ids, got torch\.float32"):
        decode_bytes(torch.zeros(2))
