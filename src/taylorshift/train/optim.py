"""Optimizers and the learning-rate schedule of training.

- :class:`Lamb`: layer-wise adaptive moments (You et al., 2020, "Large Batch Optimization
  for Deep Learning: Training BERT in 76 minutes", Algorithm 2), the paper's optimizer.
- :func:`build_optimizer`: LAMB or ``torch.optim.AdamW`` with weight decay on matrices only.
- :class:`WarmupCosine` / :func:`build_scheduler`: linear warm-up, then cosine decay, per step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from .._validate import check_number
from .config import OptimConfig

__all__ = ["Lamb", "WarmupCosine", "build_optimizer", "build_scheduler", "param_groups"]


class Lamb(torch.optim.Optimizer):
    """LAMB: Adam moments, decoupled weight decay, and a per-tensor trust ratio.

    For each parameter tensor ``w`` with gradient ``g`` at step ``t`` (from 1)::

        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g**2
        u = (m / (1 - beta1**t)) / (sqrt(v / (1 - beta2**t)) + eps) + weight_decay * w
        r = ||w|| / ||u||   if both norms are > 0, else 1
        w = w - lr * r * u

    The trust ratio ``r`` makes the step of every tensor ``lr`` times its own norm, so one
    learning rate fits layers of very different scales (the reason LAMB trains with large
    batches). ``||w||`` is used as is (the paper's ``phi`` is the identity).

    Args:
        params: parameters or parameter groups.
        lr: learning rate.
        betas: coefficients of the first and second moment averages.
        eps: added to the denominator.
        weight_decay: decoupled weight decay, part of ``u`` (so it is trust-scaled too).
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        check_number("lr", lr, gt=0)
        for i, beta in enumerate(betas):
            check_number(f"betas[{i}]", beta, ge=0, lt=1)
        check_number("eps", eps, gt=0)
        check_number("weight_decay", weight_decay, ge=0)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                grad = p.grad.float()
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                m_hat = m / (1 - beta1**t)
                v_hat = v / (1 - beta2**t)
                weight = p.float()
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(weight, alpha=group["weight_decay"])
                w_norm, u_norm = weight.norm(), update.norm()
                trust = torch.where(
                    (w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm)
                )
                p.add_((update * trust).to(p.dtype), alpha=-group["lr"])
        return loss


# Per-head scalars that happen to be stored with 4 dims, (1, H, 1, 1): never decayed.
_NO_DECAY_NAMES = ("temperature", "log_temperature")


def param_groups(
    model: nn.Module, weight_decay: float, lr_multipliers: dict[str, float] | None = None
) -> list[dict]:
    """Parameter groups: matrices and convolution kernels (decayed), everything else (not),
    and one undecayed group per entry of ``lr_multipliers`` that matches.

    Biases, LayerNorm weights, the CLS token, learned position tables and TaylorShift
    temperatures (parameters with fewer than 2 dimensions, or named ``cls_token`` /
    ``pos_embed`` / ``temperature`` / ``log_temperature``) are not decayed. A parameter
    whose name ends in a key of ``lr_multipliers`` (its last dotted part equal to the key,
    e.g. ``"temperature"``) gets its own group with ``lr`` = the optimizer's × the value and
    no weight decay; such groups carry the key as ``"lr_multiplier_of"``.
    """
    multipliers = dict(lr_multipliers or {})
    decay, no_decay = [], []
    scaled: dict[str, list[nn.Parameter]] = {key: [] for key in multipliers}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        last = name.rsplit(".", 1)[-1]
        if last in scaled:
            scaled[last].append(p)
            continue
        plain = (
            p.ndim < 2
            or name.endswith(".bias")
            or "cls_token" in name
            or "pos_embed" in name
            or last in _NO_DECAY_NAMES
        )
        (no_decay if plain else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups + [
        {"params": ps, "weight_decay": 0.0, "lr_multiplier_of": key, "lr_scale": multipliers[key]}
        for key, ps in scaled.items()
        if ps
    ]


def build_optimizer(model: nn.Module, config: OptimConfig) -> torch.optim.Optimizer:
    """LAMB or AdamW over ``param_groups(model, config.weight_decay, config.lr_multipliers)``."""
    groups = param_groups(model, config.weight_decay, config.lr_multipliers)
    for group in groups:
        group["lr"] = config.lr * group.pop("lr_scale", 1.0)
    kwargs = {"lr": config.lr, "betas": tuple(config.betas), "eps": config.eps}
    if config.name == "lamb":
        return Lamb(groups, **kwargs)
    if config.name == "adamw":
        return torch.optim.AdamW(groups, **kwargs)
    raise ValueError(f"optim.name must be lamb or adamw, got {config.name!r}")


@dataclass(frozen=True)
class WarmupCosine:
    """Learning-rate factor at a step: linear warm-up to 1, then cosine to ``min_ratio``.

    ``factor(s) = (s + 1) / warmup_steps`` for ``s < warmup_steps`` (so the first step
    already moves), then ``min_ratio + (1 - min_ratio) * (1 + cos(pi * p)) / 2`` with
    ``p = (s - warmup_steps) / (total_steps - warmup_steps)`` clipped to [0, 1].
    """

    warmup_steps: int
    total_steps: int
    min_ratio: float = 0.0

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(self.total_steps - self.warmup_steps, 1)
        progress = min(max((step - self.warmup_steps) / span, 0.0), 1.0)
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: OptimConfig, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Per-step :class:`WarmupCosine` over ``config.epochs`` epochs of ``steps_per_epoch``."""
    total = config.epochs * steps_per_epoch
    warmup = round(config.warmup_epochs * steps_per_epoch)
    schedule = WarmupCosine(warmup, total, config.min_lr / config.lr)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
