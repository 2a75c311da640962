"""Loaders of the standard file formats, on small files written here: CIFAR-10 python
batches, the aclImdb tree, CSV / JSON Lines, image folders."""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch

from taylorshift.data import (
    CifarPixelDataset,
    ImageFolderDataset,
    ImdbByteDataset,
    TextFileDataset,
    encode_bytes,
    label_mapping,
    load_cifar_batch,
    rgb_to_gray,
)

np = pytest.importorskip("numpy")


def _cifar_folder(tmp_path, per_batch=2, protocol=2):
    """A cifar-10-batches-py folder: image k of the train set is filled with k + 1."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    k = 0
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = np.zeros((per_batch, 3072), dtype=np.uint8)
        labels = []
        for row in range(per_batch):
            data[row] = 100 + k if name == "test_batch" else k + 1
            labels.append(k % 10)
            k += 1
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": labels, b"batch_label": b"x"}, f, protocol)
    return folder


def test_gray_formula_on_known_pixels():
    rgb = torch.tensor(
        [
            [255, 0, 0],
            [0, 255, 0],
            [0, 0, 255],
            [255, 255, 255],
            [0, 0, 0],
            [10, 20, 30],
            [1, 0, 0],
            [2, 0, 0],
            [7, 7, 7],
        ],
        dtype=torch.uint8,
    ).T  # (3, P)
    gray = rgb_to_gray(rgb)
    assert gray.dtype == torch.uint8
    # 0.299 R + 0.587 G + 0.114 B rounded half up: 76.245, 149.685, 29.07, 255, 0, 18.15, ...
    assert gray.tolist() == [76, 150, 29, 255, 0, 18, 0, 1, 7]


@pytest.mark.parametrize("protocol", [2, 5])
def test_cifar_splits_shapes_and_pixels(tmp_path, protocol):
    folder = _cifar_folder(tmp_path, protocol=protocol)
    train = CifarPixelDataset("train", path=tmp_path, val_size=4)  # the parent folder works too
    val = CifarPixelDataset("val", path=folder, val_size=4)
    test = CifarPixelDataset("test", path=folder)
    assert (len(train), len(val), len(test)) == (6, 4, 2)
    tokens, label = train[0]
    assert tokens.shape == (1024,) and tokens.dtype == torch.long and isinstance(label, int)
    assert [int(train[i][0][0]) for i in range(6)] == [1, 2, 3, 4, 5, 6]  # gray of (k,k,k) = k
    assert [int(val[i][0][0]) for i in range(4)] == [7, 8, 9, 10]  # the last ones
    assert [val[i][1] for i in range(4)] == [6, 7, 8, 9]
    assert int(test[1][0][5]) == 111 and test[1][1] == 1
    everything = CifarPixelDataset("train", path=folder, val_size=0)
    assert len(everything) == 10
    assert len(CifarPixelDataset("val", path=folder, val_size=0)) == 2  # val is the test set


def test_cifar_colour_image(tmp_path):
    folder = _cifar_folder(tmp_path)
    data = np.zeros((1, 3072), dtype=np.uint8)
    data[0, 0], data[0, 1024 + 1], data[0, 2048 + 2] = 255, 255, 255  # R, G, B pixels
    data[0, [3, 1024 + 3, 2048 + 3]] = [10, 20, 30]
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({b"data": data, b"labels": [3]}, f)
    tokens, label = CifarPixelDataset("test", path=folder)[0]
    assert tokens[:5].tolist() == [76, 150, 29, 18, 0] and label == 3


def test_cifar_batch_without_numpy_arrays(tmp_path):
    path = tmp_path / "batch"
    with open(path, "wb") as f:
        pickle.dump({"data": bytes(range(256)) * 12, "labels": [9]}, f)
    images, labels = load_cifar_batch(path)
    assert images.shape == (1, 3, 1024) and labels.tolist() == [9]


class _Evil:
    def __reduce__(self):
        return (os.getcwd, ())


def test_cifar_errors(tmp_path):
    folder = _cifar_folder(tmp_path)
    with pytest.raises(ValueError, match="val_size must be smaller than the 10 training images"):
        CifarPixelDataset("train", path=folder, val_size=10)
    with pytest.raises(ValueError, match="val_size must be an int >= 0; got -1"):
        CifarPixelDataset("train", path=folder, val_size=-1)
    with pytest.raises(ValueError, match="split must be one of 'train', 'val', 'test'"):
        CifarPixelDataset("training", path=folder)
    (folder / "data_batch_3").unlink()
    with pytest.raises(ValueError, match=r"got .* without data_batch_3"):
        CifarPixelDataset("train", path=folder)
    evil = tmp_path / "evil"
    evil.write_bytes(pickle.dumps({b"data": _Evil(), b"labels": [1]}))
    with pytest.raises(ValueError, match="refusing to load"):
        load_cifar_batch(evil)
    keys = tmp_path / "keys"
    keys.write_bytes(pickle.dumps({b"pixels": b"", b"labels": []}))
    with pytest.raises(ValueError, match="must hold the keys b'data' and b'labels'"):
        load_cifar_batch(keys)
    short = tmp_path / "short"
    short.write_bytes(pickle.dumps({b"data": b"\0" * 3000, b"labels": [1]}))
    with pytest.raises(ValueError, match="3072 values per label, got 3000 values for 1 labels"):
        load_cifar_batch(short)
    wrong = tmp_path / "wrong"
    wrong.write_bytes(pickle.dumps({b"data": b"\0" * 3072, b"labels": [10]}))
    with pytest.raises(ValueError, match=r"labels must be in 0-9, got \[10\]"):
        load_cifar_batch(wrong)
    for name, data, labels, match in [  # (were read as black, wrapped, or truncated)
        ("float-pixels", [0.5] * 3072, [1], r"float-pixels: data must be integers in 0-255; got "),
        ("wide-pixels", [300] * 3072, [1], r"data must be in 0-255, got values from 300 to 300"),
        ("float-labels", b"\0" * 3072, [1.7], r"labels must be integers in 0-9; got torch\.f"),
        ("text-labels", b"\0" * 3072, ["cat"], r"text-labels: labels must be integers in 0-9"),
    ]:
        (tmp_path / name).write_bytes(pickle.dumps({b"data": data, b"labels": labels}))
        with pytest.raises(ValueError, match=match):
            load_cifar_batch(tmp_path / name)
    (tmp_path / "junk").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="must be a CIFAR-10 python batch"):
        load_cifar_batch(tmp_path / "junk")


def _imdb_tree(tmp_path):
    root = tmp_path / "aclImdb"
    reviews = {
        "train/pos": ["Great film.", "Loved it — café scenes!", "Wonderful."],
        "train/neg": ["Dull.", "Awful acting.", "No."],
        "train/unsup": ["ignored"],
        "test/pos": ["Superb."],
        "test/neg": ["Bad.", "Worse."],
    }
    for sub, texts in reviews.items():
        (root / sub).mkdir(parents=True)
        for i, text in enumerate(texts):
            (root / sub / f"{i}_{7 if 'pos' in sub else 2}.txt").write_text(text, "utf-8")
    return root


def test_imdb_bytes_labels_and_splits(tmp_path):
    root = _imdb_tree(tmp_path)
    train = ImdbByteDataset("train", path=tmp_path)  # the parent folder works too
    assert len(train) == 6 and sorted(train.labels) == [0, 0, 0, 1, 1, 1]
    texts = {bytes(t.tolist()).decode("utf-8"): label for t, label in train}
    assert texts["Loved it — café scenes!"] == 1 and texts["Dull."] == 0
    tokens, _ = next(iter(train))
    assert tokens.dtype == torch.long and tokens.dim() == 1
    long = next(t for t, _ in train if len(t) > 20)
    assert len(long) == len("Loved it — café scenes!".encode())  # multi-byte characters
    assert all(len(t) <= 5 for t, _ in ImdbByteDataset("train", path=root, max_len=5))
    assert len(ImdbByteDataset("test", path=root)) == 3
    assert ImdbByteDataset("val", path=root).files == ImdbByteDataset("test", path=root).files
    held = ImdbByteDataset("val", path=root, val_size=2, seed=3)
    rest = ImdbByteDataset("train", path=root, val_size=2, seed=3)
    assert len(held) == 2 and len(rest) == 4
    assert sorted(held.files + rest.files) == sorted(train.files)
    assert held.files == ImdbByteDataset("val", path=root, val_size=2, seed=3).files


def test_imdb_errors(tmp_path):
    root = _imdb_tree(tmp_path)
    with pytest.raises(ValueError, match="val_size must be smaller than the 6 training reviews"):
        ImdbByteDataset("val", path=root, val_size=6)
    with pytest.raises(ValueError, match="max_len must be a positive int or None; got 0"):
        ImdbByteDataset("train", path=root, max_len=0)
    for f in (root / "test" / "neg").iterdir():
        f.unlink()
    (root / "test" / "neg").rmdir()
    with pytest.raises(ValueError, match=r"with test/pos and test/neg, got .* without test/neg"):
        ImdbByteDataset("test", path=root)
    with pytest.raises(ValueError, match="task 'imdb-byte' needs the option path"):
        ImdbByteDataset(path=None)


def test_encode_bytes_and_label_mapping():
    assert encode_bytes("aé").tolist() == [97, 0xC3, 0xA9]
    assert encode_bytes(b"abc", max_len=2).tolist() == [97, 98]
    assert encode_bytes("").shape == (0,)
    assert label_mapping(["pos", "neg", "pos"]) == ["neg", "pos"]
    assert label_mapping(["10", "2", 1, "1"]) == [1, 2, 10]  # numeric, "1" and 1 are one
    assert label_mapping(["b", 1, "a"]) == [1, "a", "b"]


def _write_csv(path, rows, header="text,label"):
    path.write_text("\n".join([header, *rows]) + "\n", "utf-8")


def test_text_csv_folder(tmp_path):
    _write_csv(tmp_path / "train.csv", ['"Hello, world",pos', "bad,neg", "meh,neutral"])
    _write_csv(tmp_path / "val.csv", ["fine,pos"])
    _write_csv(tmp_path / "test.csv", ['"multi\nline",neg'])
    train = TextFileDataset("train", path=tmp_path)
    assert train.classes == ["neg", "neutral", "pos"] and train.num_classes == 3
    assert train.class_to_idx == {"neg": 0, "neutral": 1, "pos": 2}
    tokens, label = train[0]
    assert bytes(tokens.tolist()) == b"Hello, world" and label == 2
    val = TextFileDataset("val", path=tmp_path)  # the mapping of train.csv
    assert val.classes == train.classes and val[0][1] == 2
    assert bytes(TextFileDataset("test", path=tmp_path)[0][0].tolist()) == b"multi\nline"
    single = TextFileDataset("val", path=tmp_path / "val.csv")  # a file: its own labels
    assert single.classes == ["pos"] and single[0][1] == 0
    fixed = TextFileDataset("val", path=tmp_path / "val.csv", labels=["pos", "neg"])
    assert fixed[0][1] == 0 and fixed.num_classes == 2
    assert len(TextFileDataset("train", path=tmp_path, max_len=3)[0][0]) == 3


def test_text_csv_columns_delimiter_and_numeric_labels(tmp_path):
    path = tmp_path / "data.tsv"
    _write_csv(path, ["10\tten", "2\ttwo", "0\tzero"], header="y\tbody")
    ds = TextFileDataset("test", path=path, text_column="body", label_column="y", delimiter="\t")
    assert ds.classes == [0, 2, 10] and ds.labels == [2, 1, 0]
    assert TextFileDataset("test", path=path, text_column="body", label_column="y",
                           delimiter="\t", labels=[10, 2, 0]).labels == [0, 1, 2]  # fmt: skip


def test_text_jsonl(tmp_path):
    lines = [json.dumps({"text": "yes", "label": 1}), "", json.dumps({"text": "no", "label": 0})]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "dev.jsonl").write_text(json.dumps({"text": "sí", "label": "1"}) + "\n")
    ds = TextFileDataset("train", path=tmp_path, fmt="jsonl")
    assert ds.classes == [0, 1] and [label for _, label in ds] == [1, 0]
    val = TextFileDataset("val", path=tmp_path, fmt="jsonl")  # dev.jsonl
    assert val[0][1] == 1 and val[0][0].tolist() == [115, 0xC3, 0xAD]


def test_text_errors(tmp_path):
    _write_csv(tmp_path / "train.csv", ["a,pos"])
    _write_csv(tmp_path / "val.csv", ["b,other"])
    with pytest.raises(ValueError, match=r"label 'other' \(row 1\) must be one of \['pos'\]"):
        TextFileDataset("val", path=tmp_path)
    with pytest.raises(ValueError, match="must have the column 'body', got columns"):
        TextFileDataset("train", path=tmp_path, text_column="body")
    with pytest.raises(ValueError, match=r"a folder holding test.csv, got the folder"):
        TextFileDataset("test", path=tmp_path)
    with pytest.raises(ValueError, match="fmt must be 'csv' or 'jsonl', got 'xml'"):
        TextFileDataset("train", path=tmp_path, fmt="xml")
    with pytest.raises(ValueError, match="labels must not repeat a value"):
        TextFileDataset("train", path=tmp_path, labels=["pos", "pos"])
    with pytest.raises(ValueError, match="labels must be a non-empty list"):
        TextFileDataset("train", path=tmp_path, labels="pos")
    with pytest.raises(ValueError, match="delimiter must be one character, got ';;'"):
        TextFileDataset("train", path=tmp_path, delimiter=";;")
    with pytest.raises(ValueError, match="text_column must be a non-empty str; got ''"):
        TextFileDataset("train", path=tmp_path, text_column="")
    (tmp_path / "train.jsonl").write_text("{not json}\n")
    with pytest.raises(ValueError, match="line 1 must be a JSON object"):
        TextFileDataset("train", path=tmp_path, fmt="jsonl")
    (tmp_path / "train.jsonl").write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"line 1 must be a JSON object, got \[1, 2\]"):
        TextFileDataset("train", path=tmp_path, fmt="jsonl")
    (tmp_path / "train.jsonl").write_text('{"text": 5, "label": 1}\n')
    with pytest.raises(ValueError, match="text must be text, got 5"):
        TextFileDataset("train", path=tmp_path, fmt="jsonl")
    (tmp_path / "train.jsonl").write_text('{"text": "a", "label": 0.5}\n')
    with pytest.raises(ValueError, match=r"label must be a string or an int, got 0.5"):
        TextFileDataset("train", path=tmp_path, fmt="jsonl")
    (tmp_path / "train.jsonl").write_text("\n")
    with pytest.raises(ValueError, match=r"train\.jsonl must hold at least one sample \(a JSON"):
        TextFileDataset("train", path=tmp_path, fmt="jsonl")
    (tmp_path / "val.csv").write_text("text,label\n")  # (an empty split scored 0 and passed)
    with pytest.raises(ValueError, match=r"val\.csv must hold at least one sample \(a row under"):
        TextFileDataset("val", path=tmp_path)


def _image_tree(tmp_path, image):
    colours = {"cat": (255, 0, 0), "dog": (0, 0, 255)}
    for split, sizes in {"train": [(8, 8), (12, 6)], "val": [(5, 9)]}.items():
        for name, colour in colours.items():
            (tmp_path / split / name).mkdir(parents=True)
            for i, size in enumerate(sizes):
                image.new("RGB", size, colour).save(tmp_path / split / name / f"{i}.png")
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
    return tmp_path


def test_image_folder(tmp_path):
    image = pytest.importorskip("PIL.Image", reason="Pillow is not installed")
    root = _image_tree(tmp_path, image)
    train = ImageFolderDataset("train", path=root, image_size=4, mean=None, std=None)
    assert train.classes == ["cat", "dog"] and len(train) == 4 and train.num_classes == 2
    x, label = train[1]  # the 12 x 6 cat: resized to 8 x 4, centre-cropped to 4 x 4
    assert x.shape == (3, 4, 4) and x.dtype == torch.float32 and label == 0
    assert torch.allclose(x[0], torch.ones(4, 4)) and torch.allclose(x[1:], torch.zeros(2, 4, 4))
    normed, _ = ImageFolderDataset("val", path=root, image_size=4)[1]  # blue dog, ImageNet stats
    expected = (torch.tensor([0.0, 0.0, 1.0]) - torch.tensor([0.485, 0.456, 0.406])) / torch.tensor(
        [0.229, 0.224, 0.225]
    )
    assert torch.allclose(normed[:, 0, 0], expected, atol=1e-6)
    only_val = ImageFolderDataset("val", path=root / "val", image_size=2)  # one split's folder
    assert len(only_val) == 2


def test_image_folder_errors(tmp_path, monkeypatch):
    image = pytest.importorskip("PIL.Image", reason="Pillow is not installed")
    root = _image_tree(tmp_path, image)
    (root / "val" / "bird").mkdir()
    with pytest.raises(ValueError, match=r"must be among the training classes .* got \['bird'\]"):
        ImageFolderDataset("val", path=root)
    with pytest.raises(ValueError, match="image_size must be a positive int; got 0"):
        ImageFolderDataset("train", path=root, image_size=0)
    with pytest.raises(ValueError, match=r"std must be 3 positive numbers, got \(1, 0, 1\)"):
        ImageFolderDataset("train", path=root, std=(1, 0, 1))
    with pytest.raises(ValueError, match=r"mean must be None or 3 numbers \(R, G, B\), got"):
        ImageFolderDataset("train", path=root, mean=(0.5,))
    with pytest.raises(ValueError, match="mean and std must both be given or both None"):
        ImageFolderDataset("train", path=root, mean=None)
    empty = tmp_path / "empty" / "train" / "cls"
    empty.mkdir(parents=True)
    with pytest.raises(ValueError, match=r"must hold images .* got none in"):
        ImageFolderDataset("train", path=tmp_path / "empty")
    monkeypatch.setitem(__import__("sys").modules, "PIL", None)
    with pytest.raises(ImportError, match="Pillow, which is not installed: pip install pillow"):
        ImageFolderDataset("train", path=root)
