"""save_model / load_model / load_weights: exact round trips and clear refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from taylorshift import atomic as atomic_module
from taylorshift.models import (
    TransformerClassifier,
    VisionTransformer,
    create_model,
    load_model,
    load_weights,
    read_model_config,
    save_model,
)
from tests.models.cases import F64, classifier, inputs_for, lengths_mask


def _assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


def _trained_a_little(model, *inputs):
    """Move the weights (temperature included) away from their initial values."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    model(*inputs).square().mean().backward()
    opt.step()
    return model.eval()


@pytest.mark.parametrize(
    "settings",
    [
        {"token_embedding": "conv", "pos_embedding": "learned", "max_len": 12,
         "kernel_args": {"mode": "efficient", "temperature": 2.5}},
        {"attn_kernel": "holt", "kernel_args": {"alpha": 2.0}, "pooling": "mean",
         "projection": "super", "context_len": 12},
        {"token_embedding": "linear", "in_features": 3, "attn_kernel": "softmax"},
    ],
    ids=["conv-learned-taylorshift", "holt-super-mean", "linear-softmax"],
)  # fmt: skip
def test_classifier_round_trip_is_exact(tmp_path, settings):
    model = classifier(**settings)
    x, mask = inputs_for(model, batch=3, length=10), lengths_mask([10, 4, 7], 10)
    _trained_a_little(model, x, mask)
    path = save_model(model, tmp_path / "model.safetensors")
    loaded = load_model(path)
    assert type(loaded) is TransformerClassifier and not loaded.training
    assert loaded.config == model.config
    _assert_same_state(model, loaded)
    assert torch.equal(loaded(x, mask), model(x, mask))


def test_vit_round_trip_is_exact(tmp_path):
    model = create_model("vit-micro", depth=1, dim=16, num_heads=2, patch_embedding="conv")
    images = inputs_for(model, batch=2, length=0)
    _trained_a_little(model, images)
    loaded = load_model(save_model(model, tmp_path / "vit.safetensors"))
    assert type(loaded) is VisionTransformer and loaded.config == model.config
    _assert_same_state(model, loaded)
    assert torch.equal(loaded(images), model(images))


def test_file_carries_class_config_and_format(tmp_path):
    model = classifier(depth=1)
    path = save_model(model, tmp_path / "m.safetensors")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta["taylorshift_model"] == "TransformerClassifier"
    assert meta["format_version"] == "1"
    assert json.loads(meta["config"]) == model.config.to_dict()
    assert read_model_config(path) == ("TransformerClassifier", model.config)


def test_load_model_dtype_and_device(tmp_path):
    path = save_model(classifier(depth=1), tmp_path / "m.safetensors")
    assert next(load_model(path).parameters()).dtype == F64  # the stored dtype
    model = load_model(path, map_location="cpu", dtype=torch.float32)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_load_weights_into_the_same_architecture(tmp_path):
    source = classifier(seed=1, kernel_args={"mode": "efficient"}, dropout=0.1)
    path = save_model(source, tmp_path / "m.safetensors")
    # mode, dropout, attn_drop and drop_path may differ: they do not change the weights
    target = classifier(seed=2, kernel_args={"mode": "direct"}, drop_path=0.2)
    assert load_weights(target, path) is target
    _assert_same_state(source, target)


def test_loading_another_architecture_fails_clearly(tmp_path):
    path = save_model(classifier(), tmp_path / "classifier.safetensors")
    vit = VisionTransformer(dim=16, depth=1, num_heads=2, img_size=8, patch_size=4)
    with pytest.raises(ValueError, match=r"holds a TransformerClassifier, not a VisionTransformer"):
        load_weights(vit, path)


def test_loading_another_config_names_the_differences(tmp_path):
    path = save_model(classifier(depth=2, dim=24), tmp_path / "m.safetensors")
    other = classifier(depth=1, dim=24, attn_kernel="linear")
    with pytest.raises(
        ValueError,
        match=r"another configuration: attn_kernel \(file 'taylorshift', model 'linear'\); "
        r"depth \(file 2, model 1\)",
    ):
        load_weights(other, path)


def test_missing_unexpected_and_misshaped_tensors_are_listed(tmp_path):
    model = classifier(depth=1)
    path = save_model(model, tmp_path / "m.safetensors")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    del tensors["head.weight"]
    tensors["extra.bias"] = torch.zeros(2)
    tensors["norm.weight"] = torch.zeros(5, dtype=F64)
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata=meta)
    message = (
        r"does not fit this TransformerClassifier: missing tensors: head.weight; "
        r"unexpected tensors: extra.bias; shape mismatches: norm.weight \(file \(5,\), "
        r"model \(24,\)\)"
    )
    with pytest.raises(ValueError, match=message):
        load_model(tmp_path / "bad.safetensors")
    with pytest.raises(ValueError, match=message):
        load_weights(model, tmp_path / "bad.safetensors")


def test_files_not_written_by_save_model_are_refused(tmp_path):
    plain = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(plain))
    with pytest.raises(ValueError, match=r"lacks the metadata .*not written by"):
        load_model(plain)
    for missing in (tmp_path / "none.safetensors", tmp_path):  # no file; a folder
        with pytest.raises(FileNotFoundError, match=r"no weights file at .*: expected a "):
            load_model(missing)
        with pytest.raises(FileNotFoundError, match=r"no weights file at"):
            load_weights(create_model("listops-small"), missing)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=r"is not a readable safetensors file"):
        load_model(junk)
    future = tmp_path / "future.safetensors"
    meta = {"taylorshift_model": "TransformerClassifier", "config": "{}", "format_version": "9"}
    save_file({"w": torch.zeros(2)}, str(future), metadata=meta)
    with pytest.raises(ValueError, match=r"has format_version '9'; this version .* reads '1'"):
        load_model(future)
    unknown = tmp_path / "unknown.safetensors"
    save_file({"w": torch.zeros(2)}, str(unknown), metadata={**meta, "format_version": "1",
              "taylorshift_model": "GPT"})  # fmt: skip
    with pytest.raises(ValueError, match=r"unknown model class 'GPT'; known classes: "):
        load_model(unknown)


def _resaved(tmp_path, model, **metadata):
    """``model``'s file, saved again with some metadata replaced (as a hand edit would)."""
    path = save_model(model, tmp_path / "model.safetensors")
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (no dict)
        stored = f.metadata()
    edited = tmp_path / "edited.safetensors"
    save_file(tensors, str(edited), metadata={**stored, **metadata})
    return edited


@pytest.mark.parametrize(
    "metadata, match",
    [
        ({"config": "[1, 2]"}, r"the stored config must be a JSON object; got list"),
        ({"config": '{"depth": "two"}'}, r"stored config does not make a TransformerClassifier: "
         r"depth must be a positive int"),
        ({"config": '{"bogus": 1}'}, r"does not make a TransformerClassifier: .* no setting"),
        ({"aliases": "{bad"}, r"its metadata 'aliases' is not valid JSON"),
        ({"aliases": "[1]"}, r"its metadata 'aliases' must map tensor names to tensor names"),
    ],
    ids=["config-list", "config-value", "config-key", "aliases-json", "aliases-list"],
)  # fmt: skip
def test_damaged_metadata_is_refused_naming_the_file(tmp_path, metadata, match):
    # each was a bare TypeError, AttributeError or JSONDecodeError without the file's name
    edited = _resaved(tmp_path, classifier(seed=1), **metadata)
    with pytest.raises(ValueError, match=match) as err:
        load_model(edited)
    assert str(edited) in str(err.value)


def test_a_file_that_cannot_be_read_says_why(tmp_path, monkeypatch):
    # safetensors reported an unreadable file as "No such file or directory"
    path = save_model(classifier(seed=1), tmp_path / "m.safetensors")
    real_open = open

    def denied(file, *args, **kwargs):
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", denied)
    with pytest.raises(PermissionError, match=r"cannot read the weights file: Permission denied"):
        load_model(path)


def test_meta_devices_and_bad_placements_are_refused(tmp_path):
    path = save_model(classifier(seed=1), tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match=r"model: its tensors are on the meta device"):
        save_model(create_model("listops-small", device="meta"), tmp_path / "meta.safetensors")
    assert not (tmp_path / "meta.safetensors").exists()
    with pytest.raises(ValueError, match=r"map_location: the meta device holds no values"):
        load_model(path, map_location="meta")
    with pytest.raises(ValueError, match=r"map_location must be a torch device .*got 'gpu'"):
        load_model(path, map_location="gpu")
    with pytest.raises(TypeError, match=r"dtype must be a floating torch.dtype .*torch.int64"):
        load_model(path, dtype=torch.int64)


def test_saving_onto_a_folder_names_the_path(tmp_path):
    # the error named the temporary file, after the whole model had been serialised
    folder = tmp_path / "weights"
    folder.mkdir()
    with pytest.raises(IsADirectoryError, match=r"path: a folder, not the file to write"):
        save_model(classifier(seed=1), folder)
    assert list(folder.iterdir()) == [] and list(tmp_path.iterdir()) == [folder]
    nested = save_model(classifier(seed=1), tmp_path / "new" / "sub" / "m.safetensors")
    assert nested.is_file()  # missing folders are made (the docstring said they must exist)


def test_save_refuses_objects_without_a_config(tmp_path):
    with pytest.raises(TypeError, match=r"needs a taylorshift model with a config; got Linear"):
        save_model(torch.nn.Linear(2, 2), tmp_path / "x.safetensors")


def test_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    first = classifier(seed=1)
    save_model(first, path)
    save_model(classifier(seed=2), path)  # replacing works
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]

    def crash(fd):  # the bytes are in the temporary file, the disk fails before the rename
        raise OSError("disk full")

    monkeypatch.setattr(atomic_module.os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        save_model(first, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]  # no temp left
    _assert_same_state(load_model(path), classifier(seed=2))  # the old file is intact
