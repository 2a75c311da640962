"""Registry: names, presets' sizes, overrides, and every registered model runs forward and back."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from taylorshift.models import (
    LISTOPS_TOKENS,
    LISTOPS_VOCAB_SIZE,
    CausalLM,
    ClassifierConfig,
    TransformerClassifier,
    VisionTransformer,
    create_model,
    list_models,
    register_model,
)
from taylorshift.models import registry as registry_module
from tests.models.cases import inputs_for, tiny_overrides

PAPER_TASKS = ["listops", "cifar-pixel", "imdb-byte", "vit-tiny", "vit-small"]
SMALL = ["listops-small", "cifar-pixel-small", "imdb-byte-small", "vit-micro"]


def test_list_models_is_sorted_and_lists_each_model_once():
    names = list_models()
    assert names == sorted(names)
    assert names == sorted([*PAPER_TASKS, *SMALL, "lm-tiny", "lm-small", "lm-base"])
    assert list_models("listops*") == ["listops", "listops-small"]


@pytest.mark.parametrize("kernel", ["softmax", "softmax-naive", "linear", "holt"])
def test_old_kernel_names_still_build_the_model_with_that_kernel(kernel):
    # "<model>-<kernel>" was a registry entry; now the kernel is an argument
    old = create_model(f"listops-{kernel}", device="meta")
    assert old.config == create_model("listops", attn_kernel=kernel, device="meta").config
    assert old.config.attn_kernel == kernel
    with pytest.raises(ValueError, match="unknown model 'listops-nonsense'"):
        create_model("listops-nonsense")


@pytest.mark.parametrize("name", list_models())
def test_every_registered_model_runs_forward_and_backward(name):
    model = create_model(name, **tiny_overrides(name)).train()
    x = inputs_for(model, batch=2, length=9)
    logits = model(x)
    if isinstance(model, CausalLM):
        assert logits.shape == (2, 9, model.config.vocab_size)
    else:
        assert logits.shape == (2, model.config.num_classes)
    logits.square().mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.config.attn_kernel == "taylorshift"


@pytest.mark.parametrize(
    ("name", "cls", "sizes"),
    [
        ("listops", TransformerClassifier, (4, 512, 8, 2)),
        ("cifar-pixel", TransformerClassifier, (1, 256, 4, 1)),
        ("imdb-byte", TransformerClassifier, (4, 256, 4, 4)),
        ("vit-tiny", VisionTransformer, (12, 192, 3, 4)),
        ("vit-small", VisionTransformer, (12, 384, 6, 4)),
    ],
)
def test_paper_presets_match_table_6(name, cls, sizes):
    model = create_model(name, device="meta")
    cfg = model.config
    assert isinstance(model, cls)
    assert (cfg.depth, cfg.dim, cfg.num_heads, cfg.mlp_ratio) == sizes
    assert (cfg.dropout, cfg.drop_path) == (0.0, 0.05)
    assert cfg.pos_embedding == ("learned" if name.startswith("vit") else "cosine")


def test_preset_inputs():
    assert create_model("listops", device="meta").config.vocab_size == LISTOPS_VOCAB_SIZE == 20
    assert set("0123456789") <= set(LISTOPS_TOKENS)
    assert {"MIN", "MAX", "MED", "SM", "FIRST", "LAST", "[", "]"} <= set(LISTOPS_TOKENS)
    assert create_model("cifar-pixel", device="meta").config.vocab_size == 256
    imdb = create_model("imdb-byte", device="meta").config
    assert (imdb.vocab_size, imdb.num_classes, imdb.max_len) == (258, 2, 4000)
    vit = create_model("vit-small", device="meta").config
    assert (vit.img_size, vit.patch_size, vit.num_patches) == (224, 16, 196)


def test_vit_parameter_counts_match_deit():
    # DeiT-Ti 5.7 M, DeiT-S 22.1 M (ours: no position embedding on the CLS token, plus one
    # temperature per head)
    for name, expected in (("vit-tiny", 5.72e6), ("vit-small", 22.05e6)):
        count = sum(p.numel() for p in create_model(name, device="meta").parameters())
        assert abs(count - expected) / expected < 2e-3, (name, count)


def test_overrides_apply_and_do_not_leak_into_the_preset():
    model = create_model("listops", attn_kernel="softmax", depth=1, dim=32, num_heads=2)
    assert (model.config.attn_kernel, model.config.depth, len(model.blocks)) == ("softmax", 1, 1)
    model.config.kernel_args["mode"] = "direct"
    assert create_model("listops", device="meta").config.kernel_args == {}


def test_unknown_override_names_the_key_and_lists_valid_ones():
    with pytest.raises(TypeError, match=r"has no setting 'heads'.*valid settings: .*num_heads"):
        create_model("listops", heads=2)
    with pytest.raises(TypeError, match=r"has no setting 'patch_size'"):
        create_model("listops-small", patch_size=4)
    with pytest.raises(TypeError, match=r"has no setting 'vocab_size'"):
        create_model("vit-micro", vocab_size=4)


def test_unknown_model_suggests_close_names():
    with pytest.raises(ValueError, match=r"unknown model 'listop'.*did you mean 'listops'"):
        create_model("listop")


def test_bad_override_value_is_refused_by_the_config():
    with pytest.raises(ValueError, match=r"attn_kernel must be one of .*got 'flash'"):
        create_model("listops-small", attn_kernel="flash")


def test_register_model_decorator(monkeypatch):
    monkeypatch.setattr(registry_module, "_MODELS", dict(registry_module._MODELS))

    @register_model
    def my_tiny_classifier(*, device=None, dtype=None, **overrides) -> nn.Module:
        config = ClassifierConfig(vocab_size=5, dim=8, depth=1, num_heads=2).replace(**overrides)
        return TransformerClassifier(config, device=device, dtype=dtype)

    assert "my-tiny-classifier" in list_models()
    assert create_model("my-tiny-classifier", num_classes=4).config.num_classes == 4
    with pytest.raises(ValueError, match="registered already"):
        register_model("my-tiny-classifier")(my_tiny_classifier)


def test_dtype_and_device_are_checked_by_name():
    """(torch's own errors: "Only Tensors of floating point ... can require gradients", or
    a list of every device type, naming neither argument.)"""
    with pytest.raises(TypeError, match=r"dtype must be a floating torch\.dtype or None; got"):
        create_model("lm-tiny", dtype=torch.int32)
    with pytest.raises(TypeError, match=r"dtype must be a floating torch\.dtype or None; got 'f"):
        create_model("lm-tiny", dtype="float32")
    with pytest.raises(ValueError, match=r"device must be a torch device such as 'cpu'.*'gpu'"):
        create_model("lm-tiny", device="gpu")
