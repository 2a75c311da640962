"""Real data without a download: scikit-learn's digits as pixel sequences, Python's own
source as byte-level text, and the count baselines every LM result is read against."""

from __future__ import annotations

import importlib.util
import math
import zlib

import pytest
import torch

from taylorshift.data import get_task
from taylorshift.data.digits import DIGITS_COUNT, DigitsDataset, upsample_gray
from taylorshift.data.text_bytes import (
    TextBytesDataset,
    count_baselines,
    split_of_file,
    stdlib_folder,
)

# find_spec, not importorskip: scikit-learn takes seconds to import, and every test worker
# collects this module; only the worker that runs the digits tests imports it.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sklearn") is None,
    reason="the digits task reads scikit-learn's bundled copy",
)


# digits


@pytest.fixture(scope="module")
def digit_splits():
    return {s: DigitsDataset(s) for s in ("train", "val", "test")}


def test_digit_splits_are_disjoint_cover_all_and_fixed_by_seed(digit_splits):
    from sklearn.datasets import load_digits

    images = torch.as_tensor(load_digits().images)  # (1797, 8, 8), 0..16
    sizes = {s: len(d) for s, d in digit_splits.items()}
    assert sizes == {"train": DIGITS_COUNT - 500, "val": 250, "test": 250}
    # Map every sequence back to its source image at the original resolution: each split's
    # images are distinct images of the set, no image is in two splits, all are used.
    at8 = {s: DigitsDataset(s, image_size=8) for s in digit_splits}
    flat = images.reshape(len(images), -1).round().to(torch.long) * 255
    seen = []
    for split, ds in at8.items():
        for i in range(len(ds)):
            tokens, _ = ds[i]
            match = ((flat + 8) // 16 == tokens).all(-1).nonzero().flatten().tolist()
            assert match, f"{split} item {i} is not an image of the set"
            seen.append(match[0])
    assert len(set(seen)) == DIGITS_COUNT
    again = DigitsDataset("test")
    assert torch.equal(again.tokens, digit_splits["test"].tokens)
    other = DigitsDataset("test", split_seed=1)
    assert not torch.equal(other.tokens, digit_splits["test"].tokens)


def test_digit_items_are_1024_gray_levels_with_labels(digit_splits):
    spec = get_task("digits")
    assert (spec.kind, spec.num_classes, spec.vocab_size, spec.max_len) == (
        "tokens", 10, 256, 1024,
    )  # fmt: skip
    tokens, label = digit_splits["train"][0]
    assert tokens.dtype == torch.long and tokens.shape == (1024,)
    assert int(tokens.min()) >= 0 and int(tokens.max()) <= 255 and 0 <= label <= 9
    labels = digit_splits["train"].labels
    assert set(labels.tolist()) == set(range(10))  # every class in training


def test_upsampling_keeps_constants_and_corners():
    # A constant image stays constant; level 16 is white (255), 0 black.
    flat = torch.full((1, 8, 8), 16, dtype=torch.uint8)
    assert bool((upsample_gray(flat, 32) == 255).all())
    assert bool((upsample_gray(torch.zeros(1, 8, 8, dtype=torch.uint8), 32) == 0).all())
    # Half-pixel centres: output pixel r sits at input coordinate (r + 0.5) / 4 - 0.5, so a
    # corner lies beyond the corner pixel's centre and keeps its value, and pixel 5 sits at
    # 0.875: weights 1/8 and 7/8 on input pixels 0 and 1 along each axis.
    g = torch.Generator().manual_seed(0)
    image = torch.randint(0, 17, (1, 8, 8), generator=g, dtype=torch.uint8)
    big = upsample_gray(image, 32)[0].double()
    x = image[0].double() * 255 / 16
    for r, c in ((0, 0), (0, 31), (31, 0), (31, 31)):
        assert big[r, c] == x[r * 7 // 31, c * 7 // 31].round()
    by_hand = (x[0, 0] + 7 * x[0, 1] + 7 * x[1, 0] + 49 * x[1, 1]) / 64
    assert abs(big[5, 5] - by_hand) <= 0.5
    # row 14 sits at 3.125 and column 26 at 6.125: weights 7/8, 1/8 along both axes
    by_hand = (49 * x[3, 6] + 7 * x[3, 7] + 7 * x[4, 6] + x[4, 7]) / 64
    assert abs(big[14, 26] - by_hand) <= 0.5


@pytest.mark.parametrize(
    "option, value, match",
    [
        ("image_size", 0, r"image_size must be a positive int; got 0"),
        ("val_size", 0, r"val_size must be a positive int; got 0"),
        ("test_size", 1700, r"val_size \+ test_size must leave training images"),
        ("split_seed", -1, r"split_seed must be an int >= 0; got -1"),
    ],
)
def test_digit_options_are_checked(option, value, match):
    with pytest.raises(ValueError, match=match):
        DigitsDataset("train", **{option: value})


# text-bytes


def _write(folder, files):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def _names_by_split(count=200):
    """File names a.py, b.py, ... grouped by the rule crc32(name) % 20 (0 test, 1 val)."""
    names = {"train": [], "val": [], "test": []}
    for i in range(count):
        name = f"m{i}.py"
        bucket = zlib.crc32(name.encode()) % 20
        names[{0: "test", 1: "val"}.get(bucket, "train")].append(name)
    return names


def _all(names):
    return [n for split in names.values() for n in split]


def test_files_split_by_name_hash_and_join_in_order(tmp_path):
    names = _names_by_split()
    files = {n: f"# {n}\n" + "x = 1\n" * (5 + i) for i, n in enumerate(_all(names))}
    folder = _write(tmp_path / "src", {**files, "notes.txt": "not python\n"})
    for split, expected in names.items():
        assert all(split_of_file(n) == split for n in expected)
        ds = TextBytesDataset(split, path=folder, seq_len=8)
        assert ds.files == sorted(expected)
        want = "".join(files[n] for n in sorted(expected)).encode()
        assert bytes(ds.data.tolist()) == want
        tokens, targets = ds[1]
        assert bytes(tokens.tolist()) == want[8:16] and bytes(targets.tolist()) == want[9:17]
    # another pattern reads other files
    ds = TextBytesDataset(split_of_file("notes.txt"), path=folder, pattern="*.txt", seq_len=4)
    assert ds.files == ["notes.txt"]


def test_the_default_text_is_this_pythons_standard_library():
    spec = get_task("text-bytes")
    assert (spec.kind, spec.vocab_size, spec.byte_tokens) == ("lm", 258, True)
    test = spec.build("test")
    assert test.path == stdlib_folder()
    assert test.files and all(split_of_file(n) == "test" for n in test.files)
    in_test = [p.name for p in stdlib_folder().glob("*.py") if split_of_file(p.name) == "test"]
    assert test.files == sorted(in_test)
    assert len(test.data) > 50_000 and len(test) == (len(test.data) - 257) // 256 + 1


@pytest.mark.parametrize(
    "options, match",
    [
        ({"path": "missing-folder"}, r"path must be a folder of text files, got '.*missing-f"),
        ({"pattern": "*.nothing"}, r"split 'train' of task 'text-bytes' must hold at least one"),
        ({"seq_len": 0}, r"seq_len must be a positive int; got 0"),
        ({"pattern": ""}, r"pattern must be a non-empty str"),
    ],
)
def test_text_bytes_errors(options, match):
    with pytest.raises(ValueError, match=match):
        TextBytesDataset("train", **options)


def test_a_split_shorter_than_a_window_is_refused(tmp_path):
    names = _names_by_split(60)
    folder = _write(tmp_path / "src", {n: "ab\n" for n in _all(names)})
    with pytest.raises(ValueError, match=r"split 'val' .* at least seq_len \+ 1 = 101 bytes"):
        TextBytesDataset("val", path=folder, seq_len=100)


# count baselines


def test_count_baselines_against_hand_counts():
    train = torch.tensor(list(b"abab"), dtype=torch.uint8)
    target = torch.tensor(list(b"aab"), dtype=torch.uint8)
    a = 0.5
    # unigram: a and b seen twice each of 4, add-1/2 over 256 values
    p_a = p_b = (2 + a) / (4 + 256 * a)
    unigram = -(2 * math.log2(p_a) + math.log2(p_b)) / 3
    # bigram: a->b seen twice (a is followed by b in both), b->a once
    p_aa = (0 + a) / (2 + 256 * a)
    p_ab = (2 + a) / (2 + 256 * a)
    bigram = -(math.log2(p_aa) + math.log2(p_ab)) / 2
    got = count_baselines(train, target, smoothing=a)
    assert got["unigram_bpb"] == pytest.approx(unigram, rel=1e-12)
    assert got["bigram_bpb"] == pytest.approx(bigram, rel=1e-12)


def test_count_baselines_on_python_source_beat_uniform():
    spec = get_task("text-bytes")
    counts = count_baselines(spec.build("train").data, spec.build("val").data)
    assert counts["bigram_bpb"] < counts["unigram_bpb"] < 8.0


def _bytes(n):
    return torch.zeros(n, dtype=torch.uint8)


@pytest.mark.parametrize(
    "train, target, smoothing, match",
    [
        (_bytes(1), _bytes(4), 0.5, "train must be"),
        (_bytes(4), _bytes(4).view(2, 2), 0.5, "target must be"),
        (torch.zeros(4), _bytes(4), 0.5, "train must be a 1-D integer"),
        (_bytes(4), _bytes(4), 0.0, "smoothing must be > 0"),
    ],
)
def test_count_baseline_errors(train, target, smoothing, match):
    with pytest.raises(ValueError, match=match):
        count_baselines(train, target, smoothing)
