"""The rows of ``bench models``: a registry model with config overrides and an input
length (:class:`Case`), how rows are measured (:class:`Settings`), and building the model,
its inputs, an inference call or a training step, and counting FLOPs. :func:`build_step` is
the recipe of the fresh-process memory worker."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..core import dtypes

__all__ = ["Case", "Settings", "build_model", "build_step", "count_flops", "make_inputs"]

DTYPES = dtypes("float32", "float16", "bfloat16")
MODES = ("direct", "efficient", "auto")
MODEL_KERNEL = "model"  # --kernels value: keep the registry model's own kernel
RECIPE = "taylorshift.bench.models.cases:build_step"


@dataclass(frozen=True)
class Case:
    """One row to measure: a registry model with config overrides and an input length.

    ``overrides`` are ``create_model`` overrides (kernel, kernel_args, projection, sizes);
    ``seq_len`` is the input length in tokens (classifiers) or patches (ViT, derived from
    ``img_size``). ``group`` is ``"models"`` or ``"heads"`` (the head-count sweep).
    """

    name: str
    model: str
    kernel: str
    mode: str | None
    projection: str
    seq_len: int
    tokens: int  # attention sequence length: seq_len (+1 for a CLS token)
    overrides: dict[str, Any] = field(default_factory=dict)
    group: str = "models"

    def spec(self) -> dict[str, Any]:
        """What the fresh-process memory worker needs to rebuild the model (JSON-ready)."""
        return {"model": self.model, "overrides": self.overrides, "seq_len": self.seq_len}


@dataclass(frozen=True)
class Settings:
    """How rows are measured (shared by all of them)."""

    device: str = "cpu"
    dtype: str = "float32"
    max_batch: int = 1024
    train_batch: int = 16
    target_s: float = 0.5
    warmup_s: float = 0.1
    min_reps: int = 3
    max_reps: int = 50
    min_gain: float = 0.02  # a larger batch must be this much faster to count as improving
    memory: bool = True
    threads: int | None = None  # CPU threads of the memory worker (None: torch's default)
    # the throughput sweep stops before a batch predicted to need more than this many bytes
    # beyond what the process held before it (None: half the RAM on the CPU, 90 % of the
    # GPU's memory on CUDA)
    max_memory_bytes: int | None = None


# Building models, inputs and steps (also used by the fresh-process memory worker)


def build_model(spec: dict[str, Any], device: torch.device | str, dtype: torch.dtype) -> nn.Module:
    """The registry model of a :meth:`Case.spec`, seeded, on ``device`` in ``dtype``."""
    from ...models import create_model

    torch.manual_seed(0)
    return create_model(spec["model"], device=device, dtype=dtype, **spec["overrides"])


def make_inputs(
    model: nn.Module, batch: int, seq_len: int, device: torch.device | str, dtype: torch.dtype
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Random inputs and class targets for ``model``: ((inputs,), targets (B,)).

    Token ids (B, N), features (B, N, F) or images (B, C, H, W), whichever the model takes.
    """
    cfg = model.config
    # values do not matter; made on the device (no host copy of a large batch)
    targets = torch.randint(0, cfg.num_classes, (batch,), device=device)
    if hasattr(cfg, "img_size"):  # ViT: seq_len patches come from the image size
        shape = (batch, cfg.in_chans, cfg.img_size, cfg.img_size)
        return (torch.randn(shape, device=device, dtype=dtype),), targets
    if cfg.vocab_size is not None:
        return (torch.randint(0, cfg.vocab_size, (batch, seq_len), device=device),), targets
    x = torch.randn(batch, seq_len, cfg.in_features, device=device, dtype=dtype)
    return (x,), targets


def inference_call(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], object]:
    model.eval()

    def call():
        with torch.inference_mode():
            return model(*inputs)

    return call


def train_call(
    model: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    targets: torch.Tensor,
    optimizer: torch.optim.Optimizer,
) -> Callable[[], object]:
    model.train()

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(*inputs).float(), targets)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def build_step(
    spec: dict[str, Any], batch: int, train: bool, device: str = "cpu", dtype: str = "float32"
) -> Callable[[], object]:
    """Recipe for :func:`taylorshift.bench.measure.measure_memory`: a zero-argument callable
    running one inference forward (``train=False``) or one training step (``train=True``:
    forward, cross-entropy, backward, AdamW step) of the model of ``spec``."""
    torch_dtype = DTYPES[dtype]
    model = build_model(spec, device, torch_dtype)
    inputs, targets = make_inputs(model, batch, spec["seq_len"], device, torch_dtype)
    if not train:
        return inference_call(model, inputs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return train_call(model, inputs, targets, optimizer)


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Bytes of the tensors that live between calls: parameters, buffers, optimizer state."""
    total = tensor_bytes(model.parameters()) + tensor_bytes(model.buffers())
    if optimizer is not None:
        total += sum(tensor_bytes(state.values()) for state in optimizer.state.values())
    return total


# FLOPs


def _flop_formulas() -> dict:
    """Formulas for the attention ops torch's counter lacks: SDPA's CPU flash kernel.

    Without them ``softmax`` models on the CPU would count no attention FLOPs at all.
    """
    from torch.utils import flop_counter

    aten = torch.ops.aten
    formulas: dict = {}

    def forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
        return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)

    def backward(grad_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kw):
        return flop_counter.sdpa_backward_flop_count(
            grad_shape, query_shape, key_shape, value_shape
        )

    for name, formula in (
        ("_scaled_dot_product_flash_attention_for_cpu", forward),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", backward),
    ):
        op = getattr(aten, name, None)
        if op is not None:
            formulas[op] = formula
    return formulas


def count_flops(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], targets: torch.Tensor, *, train: bool
) -> int:
    """FLOPs of one forward (``train=False``, no grad) or forward + backward (``train=True``)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping=_flop_formulas())
    was_training = model.training
    model.train(train)
    try:
        if train:
            with counter:
                F.cross_entropy(model(*inputs).float(), targets).backward()
            model.zero_grad(set_to_none=True)
        else:
            with counter, torch.no_grad():
                model(*inputs)
    finally:
        model.train(was_training)
    return int(counter.get_total_flops())
