"""LAMB against a hand computation, the parameter groups, the warm-up + cosine schedule."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from taylorshift.models import create_model
from taylorshift.train import Lamb, OptimConfig, WarmupCosine, build_optimizer, build_scheduler
from taylorshift.train.optim import param_groups


def lamb_by_hand(w, grads, lr, betas, eps, wd):
    """LAMB (You et al., Algorithm 2) in plain Python floats, one step per gradient."""
    b1, b2 = betas
    m, v = [0.0] * len(w), [0.0] * len(w)
    for t, g in enumerate(grads, start=1):
        m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, g, strict=True)]
        v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, g, strict=True)]
        u = [
            (mi / (1 - b1**t)) / (math.sqrt(vi / (1 - b2**t)) + eps) + wd * wi
            for mi, vi, wi in zip(m, v, w, strict=True)
        ]
        w_norm = math.sqrt(sum(x * x for x in w))
        u_norm = math.sqrt(sum(x * x for x in u))
        trust = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
        w = [wi - lr * trust * ui for wi, ui in zip(w, u, strict=True)]
    return w


@pytest.mark.parametrize("steps", [1, 3], ids=["one-step", "three-steps"])
@pytest.mark.parametrize("wd", [0.0, 0.01], ids=["wd0", "wd0.01"])
def test_lamb_matches_the_hand_computation(steps, wd):
    w0 = [3.0, 4.0, -1.0]
    grads = [[1.0, -2.0, 0.5], [0.3, 0.1, -0.7], [-1.5, 2.0, 0.25]][:steps]
    param = torch.nn.Parameter(torch.tensor(w0, dtype=torch.float64))
    opt = Lamb([param], lr=0.1, betas=(0.9, 0.999), eps=1e-6, weight_decay=wd)
    for g in grads:
        param.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    expected = lamb_by_hand(w0, grads, 0.1, (0.9, 0.999), 1e-6, wd)
    torch.testing.assert_close(param.detach().double(), torch.tensor(expected, dtype=torch.float64))


def test_lamb_first_step_moves_each_tensor_by_lr_times_its_norm():
    # The trust ratio makes ||w_new - w|| = lr ||w|| whatever the gradient's scale.
    for scale in (1e-6, 1.0, 1e4):
        param = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
        param.grad = torch.tensor([1.0, -2.0]) * scale
        Lamb([param], lr=0.01).step()
        moved = (param.detach() - torch.tensor([3.0, 4.0])).norm().item()
        assert moved == pytest.approx(0.01 * 5.0, rel=1e-5)


def test_lamb_zero_weights_take_a_plain_adam_step():
    param = torch.nn.Parameter(torch.zeros(2))
    param.grad = torch.tensor([2.0, -3.0])
    Lamb([param], lr=0.1, eps=1e-8).step()  # trust ratio 1: the update is sign(g) after step 1
    torch.testing.assert_close(param.detach(), torch.tensor([-0.1, 0.1]))


def test_lamb_rejects_bad_settings():
    p = [torch.nn.Parameter(torch.ones(1))]
    with pytest.raises(ValueError, match="lr must be a number > 0; got 0"):
        Lamb(p, lr=0)
    with pytest.raises(ValueError, match=r"betas\[1\] must be a number in \[0, 1\); got 1.0"):
        Lamb(p, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="eps must be a number > 0; got 0"):
        Lamb(p, eps=0)
    with pytest.raises(ValueError, match="weight_decay must be a number >= 0; got -1"):
        Lamb(p, weight_decay=-1)


def test_weight_decay_spares_biases_norms_and_cls():
    model = create_model("listops-small", depth=1, dim=32, num_heads=2)
    decay, plain = param_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.05 and plain["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"])
    plain_names = {names[id(p)] for p in plain["params"]}
    assert "cls_token" in plain_names and any(n.endswith("norm1.weight") for n in plain_names)
    assert len(decay["params"]) + len(plain["params"]) == len(list(model.parameters()))
    assert isinstance(build_optimizer(model, OptimConfig(name="adamw")), torch.optim.AdamW)
    assert isinstance(build_optimizer(model, OptimConfig(name="lamb")), Lamb)


def test_temperatures_are_never_decayed():
    # τ is stored as (1, H, 1, 1): four dims, yet a per-head scalar, not a matrix.
    for kernel_args in ({}, {"log_temperature": True}):
        model = create_model("lm-tiny", kernel_args=kernel_args)
        names = {id(p): n for n, p in model.named_parameters()}
        decay, plain = param_groups(model, 0.1)
        decayed = {names[id(p)].rsplit(".", 1)[-1] for p in decay["params"]}
        assert not decayed & {"temperature", "log_temperature"}
        kept = {names[id(p)].rsplit(".", 1)[-1] for p in plain["params"]}
        assert kept & {"temperature", "log_temperature"}


@pytest.mark.parametrize("name", ["lamb", "adamw"])
def test_lr_multipliers_give_named_parameters_their_own_rate(name):
    model = create_model("lm-tiny")
    config = OptimConfig(name=name, lr=2e-3, lr_multipliers={"temperature": 10.0, "nothing": 3})
    optimizer = build_optimizer(model, config)
    groups = optimizer.param_groups
    assert [g["lr"] for g in groups] == pytest.approx([2e-3, 2e-3, 2e-2])
    tau = [p for n, p in model.named_parameters() if n.endswith(".temperature")]
    assert len(tau) == 2 and {id(p) for p in groups[2]["params"]} == {id(p) for p in tau}
    assert groups[2]["weight_decay"] == 0.0 and groups[2]["lr_multiplier_of"] == "temperature"
    # the schedule scales every group alike
    scheduler = build_scheduler(optimizer, OptimConfig(lr=2e-3, epochs=2, warmup_epochs=1), 4)
    for _ in range(2):
        optimizer.step()
        scheduler.step()
    assert groups[2]["lr"] == pytest.approx(10 * groups[0]["lr"])
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_warmup_cosine_values():
    f = WarmupCosine(warmup_steps=4, total_steps=12, min_ratio=0.1)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == 1.0  # cosine starts at its top
    assert f(8) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way down
    assert f(12) == pytest.approx(0.1) and f(50) == pytest.approx(0.1)  # clipped at the end
    values = [f(s) for s in range(4, 13)]
    assert all(a > b for a, b in itertools.pairwise(values))
    assert WarmupCosine(0, 10)(0) == 1.0  # no warm-up


def test_scheduler_sets_the_lr_of_each_step():
    param = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([param], lr=0.2)
    config = OptimConfig(lr=0.2, min_lr=0.02, epochs=3, warmup_epochs=1.0)
    scheduler = build_scheduler(opt, config, steps_per_epoch=4)  # 4 warm-up of 12 steps
    schedule = WarmupCosine(4, 12, 0.1)
    seen = []
    for _ in range(12):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    assert seen == pytest.approx([0.2 * schedule(s) for s in range(12)])
    assert seen[0] == pytest.approx(0.05) and seen[3] == pytest.approx(0.2)
