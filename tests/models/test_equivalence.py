"""Model level: direct and efficient TaylorShift compute the same outputs and gradients."""

from __future__ import annotations

import pytest
import torch

from taylorshift.models import TransformerClassifier, VisionTransformer
from tests.helpers import assert_rel_close
from tests.models.cases import F64, classifier, inputs_for, lengths_mask


def _outputs_and_grads(model, *inputs):
    model.zero_grad()
    x = inputs[0]
    if x.is_floating_point():
        x = x.detach().clone().requires_grad_()
    out = model(x, *inputs[1:])
    # a loss that weights every logit differently, so no gradient cancels by symmetry
    weights = torch.linspace(-1.0, 2.0, out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    if x.requires_grad:
        grads["<input>"] = x.grad.clone()
    return out.detach(), grads


def _pair(build):
    """The same model in direct and efficient mode, with identical weights."""
    direct = build({"mode": "direct"})
    efficient = build({"mode": "efficient"})
    efficient.load_state_dict(direct.state_dict())
    return direct, efficient


def _assert_same(direct, efficient, *inputs):
    out_d, grads_d = _outputs_and_grads(direct, *inputs)
    out_e, grads_e = _outputs_and_grads(efficient, *inputs)
    assert_rel_close(out_e, out_d, 1e-11, "logits")
    assert grads_d.keys() == grads_e.keys()
    for name in grads_d:
        assert_rel_close(grads_e[name], grads_d[name], 1e-9, f"grad {name}")


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"pooling": "mean", "token_embedding": "conv"},
        {"token_embedding": "linear", "in_features": 5, "pos_embedding": "learned", "max_len": 20},
        {"projection": "super", "context_len": 20},
        {"kernel_args_extra": {"normalize": False}},
    ],
    ids=["cls-vocab", "mean-conv", "linear-learned", "super", "unnormalized"],
)
def test_classifier_direct_equals_efficient(settings):
    settings = dict(settings)
    extra = settings.pop("kernel_args_extra", {})

    def build(mode):
        return classifier(kernel_args={**mode, **extra}, depth=2, **settings)

    direct, efficient = _pair(build)
    x = inputs_for(direct, batch=3, length=17)
    _assert_same(direct, efficient, x, lengths_mask([17, 6, 11], 17))
    _assert_same(direct, efficient, x)


def test_vit_direct_equals_efficient():
    def build(mode):
        torch.manual_seed(0)
        return VisionTransformer(
            dim=24, depth=2, num_heads=3, img_size=16, patch_size=4, num_classes=5,
            kernel_args=mode, patch_embedding="conv", dtype=F64,
        )  # fmt: skip

    direct, efficient = _pair(build)
    _assert_same(direct, efficient, inputs_for(direct, batch=2, length=0))


def test_the_modes_really_differ_in_form():
    direct, efficient = _pair(lambda mode: classifier(kernel_args=mode))
    assert isinstance(direct, TransformerClassifier)
    assert direct.blocks[0].attn.kernel.mode == "direct"
    assert efficient.blocks[0].attn.kernel.mode == "efficient"


@pytest.mark.parametrize("name", ["lm-tiny", "listops-small"])
def test_per_sample_gradients_through_torch_func_equal_a_loop(name):
    # vmap(grad) over a batch (model ensembling, differential privacy): the attention runs
    # the reference under torch.func, and the models' token checks do not read values there
    from taylorshift.models import create_model

    torch.manual_seed(0)
    model = create_model(name).double().eval()
    params = {n: p.detach() for n, p in model.named_parameters()}
    tokens = torch.randint(1, 10, (3, 12))

    def loss(params, sample):
        out = torch.func.functional_call(model, params, (sample[None],))
        return out.square().mean()

    per_sample = torch.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, tokens)
    for i in range(3):
        model.zero_grad()
        loss(dict(model.named_parameters()), tokens[i]).backward()
        for n, p in model.named_parameters():
            assert_rel_close(per_sample[n][i], p.grad, 1e-9, f"sample {i}, {n}")
