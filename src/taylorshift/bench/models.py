"""``taylorshift bench models``: the "Which Transformer to Favor" metrics of whole models.

For every registry model × attention kernel (× TaylorShift mode) × projection variant, one
row of measurements:

- parameters (``sum(p.numel())``);
- FLOPs per sample, counted by ``torch.utils.flop_counter.FlopCounterMode`` on one sample:
  the forward pass, and a training step's forward + backward (matrix products, convolutions
  and attention ops; elementwise work is not counted by torch's counter);
- inference throughput in samples/s at the best batch size: batch sizes 1, 2, 4, ... are
  timed until throughput stops improving, memory runs out, ``--max-batch`` or the budget;
  the whole curve is kept;
- training step time (forward, cross-entropy, backward, AdamW step) at ``--train-batch``;
- training peak memory (one step at ``--train-batch``) and inference peak memory (one
  forward at batch 1): the measured peak extra memory of the call
  (:func:`taylorshift.bench.measure.measure_memory`: CUDA allocator statistics, or a fresh
  process's resident-set high-water mark on the CPU) plus the bytes of the tensors that live
  between calls (parameters and buffers; for training also AdamW's state).

A head-count sweep at fixed width (the TaylorShift paper's Table 5) measures the same for one
model with h heads, and ``--accuracy`` adds Pareto fronts of accuracy against each metric.
Out of memory and over budget are results (statuses), never crashes.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..cliargs import positive_float, positive_int
from . import files, machine, measure

__all__ = [
    "HELP",
    "METRICS",
    "Budget",
    "Case",
    "Settings",
    "add_arguments",
    "build_model",
    "build_step",
    "count_flops",
    "load_accuracy",
    "make_inputs",
    "measure_case",
    "measure_memory_points",
    "pareto_front",
    "plan",
    "run",
    "sweep_throughput",
    "write_outputs",
]

HELP = (
    "efficiency of whole models (parameters, FLOPs, throughput, training time and memory, "
    "inference memory) per kernel and projection, a head-count sweep, Pareto fronts"
)

OK = measure.OK
OOM = measure.OOM
OVER_BUDGET = "over budget"
SKIPPED = "skipped"

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MODES = ("direct", "efficient", "auto")
MODEL_KERNEL = "model"  # --kernels value: keep the registry model's own kernel
RECIPE = "taylorshift.bench.models:build_step"
MIB = 1 << 20
INSTALL_HINT = "pip install 'taylorshift[bench]'"


@dataclass(frozen=True)
class Metric:
    """A metric that Pareto plots put against accuracy."""

    key: str  # row field
    label: str  # axis label with unit
    better: str  # "lower" or "higher"
    file: str  # PNG name
    scale: float = 1.0  # row value / scale = plotted value


METRICS: tuple[Metric, ...] = (
    Metric(
        "throughput",
        "inference throughput (samples/s, best batch)",
        "higher",
        "pareto-throughput.png",
    ),
    Metric("train_step_s", "training step time (s)", "lower", "pareto-train-time.png"),
    Metric(
        "train_memory_bytes", "training peak memory (MiB)", "lower", "pareto-train-memory.png", MIB
    ),
    Metric(
        "inference_memory_bytes",
        "inference peak memory at batch 1 (MiB)",
        "lower",
        "pareto-inference-memory.png",
        MIB,
    ),
    Metric("flops_forward", "forward FLOPs per sample (GFLOP)", "lower", "pareto-flops.png", 1e9),
    Metric("params", "parameters (M)", "lower", "pareto-params.png", 1e6),
)


# What is measured


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


class Budget:
    """A wall-clock allowance for the whole run."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.start = time.perf_counter()

    def remaining(self) -> float:
        if self.seconds is None:
            return math.inf
        return self.seconds - (time.perf_counter() - self.start)

    def over(self) -> bool:
        return self.remaining() <= 0


# Building models, inputs and steps (also used by the fresh-process memory worker)


def build_model(spec: dict[str, Any], device: torch.device | str, dtype: torch.dtype) -> nn.Module:
    """The registry model of a :meth:`Case.spec`, seeded, on ``device`` in ``dtype``."""
    from ..models import create_model

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


def _inference_call(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], object]:
    model.eval()

    def call():
        with torch.inference_mode():
            return model(*inputs)

    return call


def _train_call(
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
        return _inference_call(model, inputs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return _train_call(model, inputs, targets, optimizer)


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Bytes of the tensors that live between calls: parameters, buffers, optimizer state."""
    total = _tensor_bytes(model.parameters()) + _tensor_bytes(model.buffers())
    if optimizer is not None:
        total += sum(_tensor_bytes(state.values()) for state in optimizer.state.values())
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


# Measuring


def _status_of(err: BaseException) -> str:
    return OOM if measure.is_oom(err) else f"error: {type(err).__name__}"


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def sweep_throughput(
    call_at: Callable[[int], Callable[[], object]],
    settings: Settings,
    budget: Budget,
    *,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[dict], str]:
    """Time inference at batch sizes 1, 2, 4, ... ≤ ``settings.max_batch``.

    ``call_at(batch)`` builds the zero-argument callable for one batch (it may raise out of
    memory). Stops after the first batch whose throughput is not ``min_gain`` above the
    best so far, at the first failed point (OOM), or when the budget is spent.
    Returns the curve (one dict per batch) and why it stopped: ``"no improvement"``,
    ``"max batch"``, ``"oom"``, ``"over budget"`` or ``"error: ..."``.
    """
    device = torch.device(settings.device)
    curve: list[dict] = []
    best = 0.0
    batch = 1
    while batch <= settings.max_batch:
        if budget.over():
            return curve, OVER_BUDGET
        if progress is not None:
            progress(f"throughput B={batch}")
        try:
            call = call_at(batch)
        except Exception as err:  # a failing point ends the sweep, never the run
            _empty_cache(device)
            curve.append({"batch": batch, "status": _status_of(err), "error": str(err)[:300]})
            return curve, curve[-1]["status"]
        try:
            result = measure.time_call(
                call,
                device=device,
                target_s=settings.target_s,
                warmup_s=settings.warmup_s,
                min_reps=settings.min_reps,
                max_reps=settings.max_reps,
            )
        except Exception as err:  # time_call turns only RuntimeError/MemoryError into results
            result = measure.TimeResult(status=_status_of(err), error=str(err)[:300])
        del call
        point = {
            "batch": batch,
            "status": result.status,
            "median_s": result.median_s,
            "q1_s": result.q1_s,
            "q3_s": result.q3_s,
            "reps": result.reps,
        }
        if result.status != OK:
            point["error"] = result.error
            curve.append(point)
            return curve, result.status
        point["samples_per_s"] = batch / result.median_s
        curve.append(point)
        if point["samples_per_s"] <= best * (1 + settings.min_gain):
            return curve, "no improvement"
        best = max(best, point["samples_per_s"])
        batch *= 2
    return curve, "max batch"


def _memory_point(
    case: Case, batch: int, train: bool, settings: Settings, budget: Budget
) -> measure.MemoryResult:
    if budget.over():
        return measure.MemoryResult(status=OVER_BUDGET)
    kwargs = {
        "spec": case.spec(),
        "batch": batch,
        "train": train,
        "device": settings.device,
        "dtype": settings.dtype,
    }
    timeout = min(600.0, max(10.0, budget.remaining()))
    try:
        return measure.measure_memory(
            RECIPE, kwargs, device=settings.device, threads=settings.threads, timeout_s=timeout
        )
    except Exception as err:
        return measure.MemoryResult(status=_status_of(err), error=str(err)[:300])


def _sdpa_backend(model: nn.Module, case: Case, settings: Settings) -> str | None:
    cfg = model.config
    if cfg.attn_kernel != "softmax":
        return None
    d = cfg.dim // cfg.num_heads
    q = torch.empty(
        1, cfg.num_heads, case.tokens, d, device=settings.device, dtype=DTYPES[settings.dtype]
    )
    return machine.sdpa_backend(q, q, q)


def _new_row(case: Case, settings: Settings) -> dict[str, Any]:
    overrides = case.overrides
    return {
        "name": case.name,
        "group": case.group,
        "model": case.model,
        "kernel": case.kernel,
        "mode": case.mode,
        "projection": case.projection,
        "dim": None,
        "depth": None,
        "heads": None,
        "head_dim": None,
        "seq_len": case.seq_len,
        "tokens": case.tokens,
        "device": settings.device,
        "dtype": settings.dtype,
        "status": OK,
        "params": None,
        "flops_forward": None,
        "flops_train": None,
        "flops_status": SKIPPED,
        "throughput": None,
        "best_batch": None,
        "throughput_status": SKIPPED,
        "throughput_stop": None,
        "train_batch": settings.train_batch,
        "train_step_s": None,
        "train_step_q1_s": None,
        "train_step_q3_s": None,
        "train_samples_per_s": None,
        "train_status": SKIPPED,
        "train_memory_bytes": None,
        "train_memory_extra_bytes": None,
        "train_state_bytes": None,
        "train_memory_status": SKIPPED,
        "inference_memory_bytes": None,
        "inference_memory_extra_bytes": None,
        "inference_state_bytes": None,
        "inference_memory_status": SKIPPED,
        "memory_method": None,
        "sdpa_backend": None,
        "accuracy": None,
        "overrides": dict(overrides),
        "curve": [],
        "errors": {},
    }


STAGES = ("flops", "throughput", "train", "train_memory", "inference_memory")
_STATUS_FIELD = {
    "flops": "flops_status",
    "throughput": "throughput_status",
    "train": "train_status",
    "train_memory": "train_memory_status",
    "inference_memory": "inference_memory_status",
}


def measure_case(
    case: Case,
    settings: Settings,
    budget: Budget | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure one row. Failures (OOM, errors, the budget) become statuses in the row.

    ``status`` is the model build's (``"ok"``, ``"oom"``, ``"over budget"``,
    ``"error: <type>"``); each metric has its own ``*_status``.
    """
    budget = budget or Budget(None)
    device = torch.device(settings.device)
    dtype = DTYPES[settings.dtype]
    row = _new_row(case, settings)
    note = progress or (lambda _stage: None)

    def fail_all(status: str) -> dict[str, Any]:
        row["status"] = status
        for stage in STAGES:
            if row[_STATUS_FIELD[stage]] == SKIPPED:
                row[_STATUS_FIELD[stage]] = status
        return row

    if budget.over():
        return fail_all(OVER_BUDGET)
    note("build")
    try:
        model = build_model(case.spec(), device, dtype)
    except Exception as err:  # a row that cannot run is a result, not the end of the run
        _empty_cache(device)
        row["errors"]["build"] = str(err)[:300]
        return fail_all(_status_of(err))
    cfg = model.config
    row.update(
        dim=cfg.dim,
        depth=cfg.depth,
        heads=cfg.num_heads,
        head_dim=cfg.dim // cfg.num_heads,
        params=sum(p.numel() for p in model.parameters()),
    )
    row["sdpa_backend"] = _sdpa_backend(model, case, settings)

    def inputs_at(batch: int):
        return make_inputs(model, batch, case.seq_len, device, dtype)

    # FLOPs of one sample
    if budget.over():
        row["flops_status"] = OVER_BUDGET
    else:
        note("flops")
        try:
            inputs, targets = inputs_at(1)
            row["flops_forward"] = count_flops(model, inputs, targets, train=False)
            row["flops_train"] = count_flops(model, inputs, targets, train=True)
            row["flops_status"] = OK
        except Exception as err:
            _empty_cache(device)
            row["flops_status"] = _status_of(err)
            row["errors"]["flops"] = str(err)[:300]

    # Inference throughput over batch sizes
    curve, stop = sweep_throughput(
        lambda b: _inference_call(model, inputs_at(b)[0]), settings, budget, progress=note
    )
    row["curve"], row["throughput_stop"] = curve, stop
    good = [p for p in curve if p["status"] == OK]
    if good:
        top = max(good, key=lambda p: p["samples_per_s"])
        row.update(throughput=top["samples_per_s"], best_batch=top["batch"])
        row["throughput_status"] = OK
    else:
        row["throughput_status"] = stop

    # Training step time
    optimizer = None
    if budget.over():
        row["train_status"] = OVER_BUDGET
    else:
        note("train step")
        try:
            inputs, targets = inputs_at(settings.train_batch)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            result = measure.time_call(
                _train_call(model, inputs, targets, optimizer),
                device=device,
                target_s=settings.target_s,
                warmup_s=settings.warmup_s,
                min_reps=settings.min_reps,
                max_reps=settings.max_reps,
            )
            del inputs, targets
        except Exception as err:
            result = measure.TimeResult(status=_status_of(err), error=str(err)[:300])
        row["train_status"] = result.status
        if result.status == OK:
            row.update(
                train_step_s=result.median_s,
                train_step_q1_s=result.q1_s,
                train_step_q3_s=result.q3_s,
                train_samples_per_s=settings.train_batch / result.median_s,
            )
        else:
            row["errors"]["train"] = result.error
            _empty_cache(device)

    # State bytes: what lives between calls (AdamW state counted from the real optimizer
    # when a step ran, else two moments per parameter).
    row["inference_state_bytes"] = _state_bytes(model)
    if optimizer is not None and optimizer.state:
        row["train_state_bytes"] = _state_bytes(model, optimizer)
    else:
        row["train_state_bytes"] = _state_bytes(model) + 2 * _tensor_bytes(model.parameters())
    model = optimizer = None  # free them before the memory points (CUDA runs in-process)
    _empty_cache(device)

    if settings.memory:
        measure_memory_points(row, case, settings, budget, progress=progress)
    return row


def measure_memory_points(
    row: dict[str, Any],
    case: Case,
    settings: Settings,
    budget: Budget | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Fill ``row``'s training (at ``train_batch``) and inference (batch 1) peak memory.

    A fresh process per point on the CPU, the allocator statistics on CUDA; the state
    bytes of the row (from :func:`measure_case`) are added to the measured peak extra.
    """
    budget = budget or Budget(None)
    for stage, batch, train in (
        ("train_memory", settings.train_batch, True),
        ("inference_memory", 1, False),
    ):
        if row["status"] != OK:
            break
        if progress is not None:
            progress(stage.replace("_", " "))
        result = _memory_point(case, batch, train, settings, budget)
        prefix = "train" if train else "inference"
        row[f"{prefix}_memory_status"] = result.status
        row["memory_method"] = result.method or row["memory_method"]
        if result.status == OK:
            extra = max(0, result.peak_extra_bytes)
            row[f"{prefix}_memory_extra_bytes"] = extra
            row[f"{prefix}_memory_bytes"] = extra + row[f"{prefix}_state_bytes"]
        elif result.error:
            row["errors"][stage] = result.error
    return row


# Pareto fronts and accuracy


def pareto_front(
    points: Sequence[tuple[float | None, float | None]], *, better: str = "lower"
) -> list[bool]:
    """Which points are on the Pareto front of (metric, accuracy) pairs.

    Accuracy is better when higher; the metric when lower (``better="lower"``: time,
    memory, FLOPs, parameters) or higher (``better="higher"``: throughput). A point is on
    the front when no other point is at least as good in both and better in one. Points
    with a missing or non-finite value are never on the front and dominate nothing.
    """
    if better not in ("lower", "higher"):
        raise ValueError(f"better must be 'lower' or 'higher'; got {better!r}")
    sign = 1.0 if better == "lower" else -1.0

    def usable(p) -> bool:
        return all(v is not None and math.isfinite(v) for v in p)

    costs = [(sign * p[0], -p[1]) if usable(p) else None for p in points]  # both: lower wins
    front = []
    for i, a in enumerate(costs):
        if a is None:
            front.append(False)
            continue
        dominated = any(
            b is not None and j != i and b[0] <= a[0] and b[1] <= a[1] and b != a
            for j, b in enumerate(costs)
        )
        front.append(not dominated)
    return front


def load_accuracy(path: str | Path) -> dict[str, float]:
    """Accuracies in % by row name, from a JSON object or a CSV with ``name,accuracy`` columns.

    Raises ValueError naming the file and what is wrong.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror or err}") from None
    if path.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON: {err}") from None
        if not isinstance(data, dict):
            raise ValueError(
                f"{path} must hold a JSON object mapping row names to accuracy in %; "
                f"got a {type(data).__name__}"
            )
        items = list(data.items())
    else:
        reader = csv.DictReader(text.splitlines())
        columns = reader.fieldnames or []
        if "name" not in columns or "accuracy" not in columns:
            raise ValueError(
                f"{path} must be CSV with a header holding 'name' and 'accuracy' columns; "
                f"got columns {columns}"
            )
        items = [(r["name"], r["accuracy"]) for r in reader]
    accuracy: dict[str, float] = {}
    for name, value in items:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if isinstance(value, bool) or not math.isfinite(number):
            raise ValueError(f"{path}: accuracy of {name!r} must be a number in %; got {value!r}")
        accuracy[str(name)] = number
    return accuracy


def _metric_value(row: dict, metric: Metric) -> float | None:
    value = row.get(metric.key)
    return None if value is None else value / metric.scale


def pareto_table(rows: Sequence[dict]) -> dict[str, list[str]]:
    """Per metric: the names of the rows with an accuracy on the front."""
    scored = [r for r in rows if r.get("accuracy") is not None]
    fronts = {}
    for metric in METRICS:
        points = [(_metric_value(r, metric), r["accuracy"]) for r in scored]
        on = pareto_front(points, better=metric.better)
        fronts[metric.key] = [r["name"] for r, keep in zip(scored, on, strict=True) if keep]
    return fronts


# Output: files, plots, report


def _flat(row: dict) -> dict:
    """A row for CSV: the curve as 'batch:samples/s' pairs, overrides as JSON."""
    flat = {k: v for k, v in row.items() if k not in ("curve", "errors", "overrides")}
    flat["overrides"] = json.dumps(row.get("overrides", {}), sort_keys=True)
    flat["curve"] = " ".join(
        f"{p['batch']}:{p['samples_per_s']:.6g}"
        if p["status"] == OK
        else f"{p['batch']}:{p['status']}"
        for p in row.get("curve", [])
    )
    return flat


def _si(value: float | None, unit: str = "") -> str:
    if value is None:
        return "–"
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}".rstrip()
    return f"{value:.3g} {unit}".rstrip()


def _cell(row: dict, status_key: str, text: str) -> str:
    status = row.get(status_key)
    return text if status == OK else (status or "–")


def _rate(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _mib(value: int | None) -> str:
    return "–" if value is None else f"{value / MIB:.1f}"


def _markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _main_table(rows: Sequence[dict]) -> str:
    headers = [
        "row",
        "params",
        "FLOPs fwd / sample",
        "FLOPs train / sample",
        "throughput (samples/s)",
        "best batch",
        "train step (ms)",
        "train memory (MiB)",
        "inference memory (MiB)",
        "accuracy (%)",
    ]
    body = []
    for r in rows:
        step = r["train_step_s"]
        body.append(
            [
                f"`{r['name']}`" + ("" if r["status"] == OK else f" ({r['status']})"),
                _si(r["params"]),
                _cell(r, "flops_status", _si(r["flops_forward"])),
                _cell(r, "flops_status", _si(r["flops_train"])),
                _cell(r, "throughput_status", _rate(r["throughput"])),
                "–" if r["best_batch"] is None else str(r["best_batch"]),
                _cell(r, "train_status", "–" if step is None else f"{step * 1e3:.4g}"),
                _cell(r, "train_memory_status", _mib(r["train_memory_bytes"])),
                _cell(r, "inference_memory_status", _mib(r["inference_memory_bytes"])),
                "–" if r["accuracy"] is None else f"{r['accuracy']:.2f}",
            ]
        )
    return _markdown_table(headers, body)


def _heads_table(rows: Sequence[dict]) -> str:
    headers = [
        "h",
        "d = dim/h",
        "kernel",
        "params",
        "FLOPs fwd / sample",
        "throughput (samples/s)",
        "best batch",
        "train step (ms)",
        "train memory (MiB)",
        "inference memory (MiB)",
        "accuracy (%)",
    ]
    body = []
    ordered = sorted(rows, key=lambda r: (r["kernel"], r["mode"] or "", r["heads"] or 0))
    for r in ordered:
        step = r["train_step_s"]
        body.append(
            [
                str(r["heads"] or r["overrides"].get("num_heads")),
                str(r["head_dim"] or "–"),
                r["kernel"] + (f" ({r['mode']})" if r["mode"] else ""),
                _si(r["params"]),
                _cell(r, "flops_status", _si(r["flops_forward"])),
                _cell(r, "throughput_status", _rate(r["throughput"])),
                "–" if r["best_batch"] is None else str(r["best_batch"]),
                _cell(r, "train_status", "–" if step is None else f"{step * 1e3:.4g}"),
                _cell(r, "train_memory_status", _mib(r["train_memory_bytes"])),
                _cell(r, "inference_memory_status", _mib(r["inference_memory_bytes"])),
                "–" if r["accuracy"] is None else f"{r['accuracy']:.2f}",
            ]
        )
    return _markdown_table(headers, body)


def _curve_lines(rows: Sequence[dict]) -> list[str]:
    lines = []
    for r in rows:
        points = ", ".join(
            f"{p['batch']}: {_rate(p['samples_per_s'])}"
            if p["status"] == OK
            else f"{p['batch']}: {p['status']}"
            for p in r["curve"]
        )
        lines.append(f"- `{r['name']}`: {points or '–'} (stopped: {r['throughput_stop']})")
    return lines


def render_report(results: dict) -> str:
    """report.md: tables with units, the machine, versions and the exact command."""
    rows = [r for r in results["rows"] if r["group"] == "models"]
    heads = [r for r in results["rows"] if r["group"] == "heads"]
    cfg = results["config"]
    info = results["machine"]
    out = [
        "# Model efficiency (`taylorshift bench models`)",
        "",
        f"Command: `{results['command']}`",
        "",
        f"Device {cfg['device']}, dtype {cfg['dtype']}; training step (forward, cross-entropy, "
        f"backward, AdamW) at batch {cfg['train_batch']}; inference memory at batch 1; "
        f"throughput at the best batch of 1, 2, 4, ... ≤ {cfg['max_batch']}. "
        f"Wall time {results['elapsed_s']:.1f} s"
        + (f" of a {cfg['budget_s']:g} s budget." if cfg.get("budget_s") else "."),
        "",
        "FLOPs: `torch.utils.flop_counter.FlopCounterMode` on one sample (matrix products, "
        "convolutions, attention; elementwise work not counted); train = forward + backward. "
        "Memory: measured peak extra of one call "
        f"({_memory_method(rows + heads)}) plus the bytes of parameters, buffers and (training) "
        "AdamW state. Cells that are not numbers are statuses (oom, over budget, skipped).",
        "",
    ]
    if rows:
        out += ["## Models", "", _main_table(rows), ""]
    if heads:
        out += [
            f"## Heads at fixed width: `{heads[0]['model']}`, dim {heads[0]['dim']}, "
            f"{heads[0]['seq_len']} tokens",
            "",
            _heads_table(heads),
            "",
        ]
    out += ["## Throughput by batch size (samples/s)", "", *_curve_lines(rows + heads), ""]
    acc = results.get("accuracy")
    if acc:
        out += ["## Pareto fronts (accuracy against each metric)", ""]
        for metric in METRICS:
            names = results["pareto"].get(metric.key, [])
            shown = ", ".join(f"`{n}`" for n in names) or "–"
            out.append(f"- {metric.label} ([{metric.file}]({metric.file})): {shown}")
        if acc.get("unmatched"):
            out += [
                "",
                "Accuracy entries matching no row: "
                + ", ".join(f"`{n}`" for n in acc["unmatched"]),
            ]
        out.append("")
    sdpa = sorted({r["sdpa_backend"] for r in rows + heads if r["sdpa_backend"]})
    out += [
        "## Machine",
        "",
        _markdown_table(["", ""], [[k, "–" if v is None else str(v)] for k, v in info.items()]),
        "",
        f"SDPA backend of the softmax rows: {', '.join(sdpa) if sdpa else 'n/a'}.",
        "",
    ]
    return "\n".join(out)


def _memory_method(rows: Sequence[dict]) -> str:
    methods = sorted({r["memory_method"] for r in rows if r["memory_method"]})
    return ", ".join(methods) if methods else "not measured"


def _figure(width: float = 6.4, height: float = 4.4):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _log_if_wide(ax, values: Sequence[float], axis: str = "x") -> None:
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 20:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")


def plot_pareto(rows: Sequence[dict], metric: Metric):
    """A scatter of accuracy against ``metric``; front points black, the front drawn."""
    points = [
        (_metric_value(r, metric), r["accuracy"], r["name"])
        for r in rows
        if r.get("accuracy") is not None and _metric_value(r, metric) is not None
    ]
    on = pareto_front([(x, y) for x, y, _ in points], better=metric.better)
    fig = _figure()
    ax = fig.add_subplot()
    for (x, y, name), keep in zip(points, on, strict=True):
        ax.scatter(
            x, y, s=36, edgecolors="black", facecolors="black" if keep else "white", zorder=3
        )
        ax.annotate(name, (x, y), fontsize=6, xytext=(4, 3), textcoords="offset points")
    _log_if_wide(ax, [x for x, _, _ in points])
    front = sorted((x, y) for (x, y, _), keep in zip(points, on, strict=True) if keep)
    if front:
        # The staircase bounding the dominated region, carried to the edges of the axes:
        # lower-is-better fronts rise to the right, higher-is-better ones fall.
        (x0, x1), (y0, _) = ax.get_xlim(), ax.get_ylim()
        xs, ys = (list(v) for v in zip(*front, strict=True))
        if metric.better == "lower":
            xs, ys, where = [xs[0], *xs, x1], [y0, *ys, ys[-1]], "post"
        else:
            xs, ys, where = [x0, *xs, xs[-1]], [ys[0], *ys, y0], "pre"
        ax.step(xs, ys, where=where, color="black", linewidth=1, zorder=2, label="Pareto front")
        ax.set_xlim(x0, x1)
        ax.set_ylim(bottom=y0)
        ax.legend(loc="best", fontsize=7)
    else:
        ax.text(
            0.5,
            0.5,
            "no row has both an accuracy and this metric",
            ha="center",
            transform=ax.transAxes,
        )
    ax.set_xlabel(f"{metric.label}, {metric.better} is better")
    ax.set_ylabel("accuracy (%)")
    ax.grid(True, alpha=0.3)
    return fig


def plot_curves(rows: Sequence[dict]):
    """Inference throughput against batch size, one line per row."""
    fig = _figure(7.0, 4.6)
    ax = fig.add_subplot()
    for r in rows:
        good = [p for p in r["curve"] if p["status"] == OK]
        if good:
            ax.plot(
                [p["batch"] for p in good],
                [p["samples_per_s"] for p in good],
                marker="o",
                markersize=3,
                label=r["name"],
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("inference throughput (samples/s)")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize=6)
    return fig


def plot_heads(rows: Sequence[dict]):
    """The head-count sweep: throughput and inference memory against h, one line per kernel."""
    fig = _figure(9.0, 3.8)
    axes = fig.subplots(1, 2)
    by_kernel: dict[str, list[dict]] = {}
    for r in rows:
        by_kernel.setdefault(r["kernel"] + (f" ({r['mode']})" if r["mode"] else ""), []).append(r)
    for label, group in by_kernel.items():
        group = sorted(group, key=lambda r: r["heads"] or 0)
        for ax, key, scale in (
            (axes[0], "throughput", 1.0),
            (axes[1], "inference_memory_bytes", MIB),
        ):
            pts = [(r["heads"], r[key] / scale) for r in group if r[key] is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=label)
    axes[0].set_ylabel("inference throughput (samples/s)")
    axes[1].set_ylabel("inference memory at batch 1 (MiB)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("heads h (fixed width)")
        ax.grid(True, alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=7)
    return fig


def write_outputs(out: str | Path, results: dict, *, plots: bool = True) -> list[Path]:
    """results.json, results.csv, report.md and (``plots``) the PNGs, written atomically."""
    out = Path(out)
    written = [
        files.write_json(out / "results.json", results),
        files.write_csv(out / "results.csv", [_flat(r) for r in results["rows"]]),
        files.write_text(out / "report.md", render_report(results)),
    ]
    if not plots:
        return written
    rows = results["rows"]
    written.append(files.write_figure(out / "throughput-vs-batch.png", plot_curves(rows)))
    heads = [r for r in rows if r["group"] == "heads"]
    if heads:
        written.append(files.write_figure(out / "heads-sweep.png", plot_heads(heads)))
    if any(r.get("accuracy") is not None for r in rows):
        for metric in METRICS:
            written.append(files.write_figure(out / metric.file, plot_pareto(rows, metric)))
    return written


# Command line

FULL_DEFAULTS: dict[str, Any] = {
    "models": ["cifar-pixel", "imdb-byte", "listops"],
    "kernels": ["taylorshift", "softmax", "linear"],
    "mode": ["direct", "efficient"],
    "projections": ["standard"],
    "heads_model": "cifar-pixel",
    "max_batch": 1024,
    "train_batch": 16,
    "target_s": 0.5,
    "budget_s": 3600.0,
    "memory_jobs": 1,
    "set": {},
    "seq_len": None,
}
QUICK_DEFAULTS: dict[str, Any] = {
    "models": ["cifar-pixel-small", "listops-small"],
    "kernels": ["taylorshift", "softmax"],
    "mode": ["efficient"],
    "projections": ["standard"],
    "heads_model": "cifar-pixel-small",
    "heads_sweep": [2, 8],
    "max_batch": 8,
    "train_batch": 2,
    "target_s": 0.01,
    "budget_s": 50.0,
    "memory_jobs": 2,
    "set": {"dim": 32, "depth": 1},
    "seq_len": 64,
}
HEADS_GPU = [4, 8, 16, 32, 64]
HEADS_CPU = [4, 8, 16]


def _setting(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE (e.g. dim=64), got {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw  # a bare string, e.g. pooling=mean
    return key.strip(), value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..nn import PROJECTIONS, list_kernels

    kernels = [*list_kernels(), MODEL_KERNEL]
    add = parser.add_argument
    add(
        "--models",
        nargs="+",
        metavar="NAME",
        help="registry models (taylorshift.models.list_models()); default: "
        f"{' '.join(FULL_DEFAULTS['models'])} (--quick: {' '.join(QUICK_DEFAULTS['models'])})",
    )
    add(
        "--kernels",
        nargs="+",
        choices=kernels,
        metavar="KERNEL",
        help=f"attention kernels to put in every model, of {kernels} ('model': the model's own); "
        f"default: {' '.join(FULL_DEFAULTS['kernels'])}",
    )
    add(
        "--mode",
        nargs="+",
        choices=MODES,
        metavar="MODE",
        help="TaylorShift form(s) of the taylorshift kernel: direct, efficient, auto; "
        "default: direct efficient (--quick: efficient)",
    )
    add(
        "--projections",
        nargs="+",
        choices=PROJECTIONS,
        metavar="PROJ",
        help=f"projection variants, of {list(PROJECTIONS)} (super's context length is set "
        "to the sequence length); default: standard",
    )
    add(
        "--seq-len",
        type=positive_int,
        metavar="N",
        help="input length: tokens of sequence models (default: the preset's max_len); "
        "patches of ViTs (a square k², the image becomes k·patch pixels)",
    )
    add(
        "--set",
        type=_setting,
        action="append",
        metavar="FIELD=VALUE",
        dest="set",
        help="config override for every model, JSON value (repeatable), e.g. --set dim=128",
    )
    add(
        "--heads-sweep",
        type=positive_int,
        nargs="*",
        metavar="H",
        help="head counts at fixed width for --heads-model (the paper's Table 5), each dividing "
        "its dim; the taylorshift kernel in each --mode. Default 4 8 16 32 64 on CUDA, "
        "4 8 16 on the CPU, 2 8 with --quick; the flag with no value skips the sweep",
    )
    add(
        "--heads-model",
        metavar="NAME",
        help="model of the heads sweep (default: cifar-pixel; --quick: cifar-pixel-small)",
    )
    add("--device", help="torch device (default: cuda if available, else cpu)")
    add(
        "--dtype",
        choices=list(DTYPES),
        default="float32",
        help="parameter and compute dtype (default: %(default)s)",
    )
    add(
        "--max-batch",
        type=positive_int,
        metavar="B",
        help="largest batch of the throughput sweep (default: 1024; --quick: 8)",
    )
    add(
        "--train-batch",
        type=positive_int,
        metavar="B",
        help="batch of the training step time and memory (default: 16; --quick: 2)",
    )
    add(
        "--target-s",
        type=positive_float,
        metavar="S",
        help="time per measured point: repetitions x call time (default: 0.5; --quick: 0.01)",
    )
    add(
        "--budget-s",
        type=positive_float,
        metavar="S",
        help="wall-clock budget of the run; what is left unmeasured gets the status "
        "'over budget' (default: 3600; --quick: 50)",
    )
    add(
        "--no-memory",
        action="store_true",
        help="skip the peak-memory points (on the CPU each takes a fresh process, ~3 s)",
    )
    add(
        "--threads",
        type=positive_int,
        metavar="T",
        help="CPU threads of torch for the timed calls and memory workers (default: torch's, "
        f"{torch.get_num_threads()} here)",
    )
    add(
        "--memory-jobs",
        type=positive_int,
        metavar="J",
        help="CPU memory points measured side by side, each in its own process, after all "
        "timing (default: 1; --quick: 2)",
    )
    add(
        "--accuracy",
        metavar="FILE",
        help="accuracy in %% by row name (JSON object or CSV with name,accuracy): adds "
        "Pareto fronts and plots",
    )
    add(
        "--quick",
        action="store_true",
        help="tiny sizes and few models: a smoke run of well under a minute on a CPU",
    )
    add("--out", default="bench-models", metavar="DIR", help="output folder (default: %(default)s)")
    add("--no-plots", action="store_true", help="write no PNGs (matplotlib not needed)")


def _resolve(args: argparse.Namespace, key: str) -> Any:
    value = getattr(args, key)
    if value is not None:
        return value
    return (QUICK_DEFAULTS if args.quick else FULL_DEFAULTS)[key]


def _device(args: argparse.Namespace, parser: argparse.ArgumentParser) -> torch.device:
    if args.device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(args.device)
    except (RuntimeError, ValueError):
        parser.error(f"--device must be a torch device (cpu, cuda, cuda:1); got {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: expected an available device, but CUDA is not")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"--device must be cpu or cuda[:i]; got {args.device!r}")
    return device


def _base_config(name: str, overrides: dict, flag: str, parser: argparse.ArgumentParser):
    from ..models import create_model

    try:
        return create_model(name, device="meta", **overrides).config
    except (TypeError, ValueError) as err:
        parser.error(f"{flag}: model {name!r} does not accept these settings: {err}")


def _cases_for(
    model: str,
    kernels: Sequence[str],
    modes: Sequence[str],
    projections: Sequence[str],
    seq_len: int | None,
    settings: dict,
    parser: argparse.ArgumentParser,
    *,
    heads: int | None = None,
    group: str = "models",
) -> list[Case]:
    """The rows of one model: kernels × modes (taylorshift only) × projections."""
    base_overrides = dict(settings)
    if heads is not None:
        base_overrides["num_heads"] = heads
    cfg = _base_config(model, base_overrides, "--set", parser)
    if hasattr(cfg, "img_size"):  # ViT
        if seq_len is not None:
            side = math.isqrt(seq_len)
            if side * side != seq_len:
                parser.error(
                    f"--seq-len for the ViT {model!r} counts patches: expected a square "
                    f"number k² (the image becomes k·{cfg.patch_size} pixels); got {seq_len}"
                )
            base_overrides["img_size"] = side * cfg.patch_size
            length = seq_len
        else:
            length = cfg.num_patches
    else:
        length = seq_len if seq_len is not None else cfg.max_len
        if length is None:
            parser.error(f"--seq-len: model {model!r} has no max_len; expected a length")
        if cfg.pos_embedding == "learned" and (cfg.max_len or 0) < length:
            base_overrides["max_len"] = length
    tokens = length + (1 if cfg.pooling == "cls" else 0)
    cases = []
    for kernel_choice in kernels:
        kernel = cfg.attn_kernel if kernel_choice == MODEL_KERNEL else kernel_choice
        kernel_modes: Sequence[str | None] = modes if kernel == "taylorshift" else [None]
        for mode in kernel_modes:
            for projection in projections:
                overrides = dict(base_overrides)
                overrides["attn_kernel"] = kernel
                kernel_args = dict(cfg.kernel_args) if kernel == cfg.attn_kernel else {}
                if mode is not None:
                    kernel_args["mode"] = mode
                overrides["kernel_args"] = kernel_args
                overrides["projection"] = projection
                overrides["context_len"] = tokens if projection == "super" else None
                label = kernel if mode is None else f"{kernel}-{mode}"
                name = f"{model}/{label}/{projection}"
                if heads is not None:
                    name += f"/h{heads}"
                _base_config(model, overrides, "--set", parser)  # validate early
                cases.append(
                    Case(
                        name=name,
                        model=model,
                        kernel=kernel,
                        mode=mode,
                        projection=projection,
                        seq_len=length,
                        tokens=tokens,
                        overrides=overrides,
                        group=group,
                    )
                )
    return cases


def _check_model(name: str, flag: str, parser: argparse.ArgumentParser) -> None:
    from ..models import list_models

    known = list_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        parser.error(
            f"{flag}: expected a registry model (taylorshift.models.list_models(): "
            f"{', '.join(known)}); got {name!r}{hint}"
        )


def plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[list[Case], dict]:
    """The cases to measure and the resolved configuration; bad values -> parser.error."""
    device = _device(args, parser)
    models = _resolve(args, "models")
    for name in models:
        _check_model(name, "--models", parser)
    kernels = _resolve(args, "kernels")
    modes = _resolve(args, "mode")
    projections = _resolve(args, "projections")
    seq_len = _resolve(args, "seq_len")
    settings = dict(QUICK_DEFAULTS["set"]) if args.quick else {}
    settings.update(dict(args.set or []))
    for key in ("attn_kernel", "kernel_args", "projection", "context_len"):
        if key in settings:
            parser.error(
                f"--set {key}: expected a size or model setting; choose kernels, modes and "
                "projections with --kernels, --mode and --projections"
            )
    cases: list[Case] = []
    for name in models:
        cases += _cases_for(name, kernels, modes, projections, seq_len, settings, parser)
    if args.heads_sweep is not None:
        heads = args.heads_sweep
    elif args.quick:
        heads = QUICK_DEFAULTS["heads_sweep"]
    else:
        heads = HEADS_GPU if device.type == "cuda" else HEADS_CPU
    heads_model = _resolve(args, "heads_model")
    if heads:
        _check_model(heads_model, "--heads-model", parser)
        dim = _base_config(heads_model, settings, "--set", parser).dim
        bad = [h for h in heads if dim % h]
        if bad:
            parser.error(
                f"--heads-sweep: expected head counts dividing {heads_model}'s dim {dim}; got "
                f"{', '.join(map(str, bad))}"
            )
        for h in heads:
            cases += _cases_for(
                heads_model,
                ["taylorshift"],
                modes,
                ["standard"],
                seq_len,
                settings,
                parser,
                heads=h,
                group="heads",
            )
    unique: dict[str, Case] = {}
    for case in cases:  # e.g. --kernels taylorshift model on a taylorshift preset
        unique.setdefault(case.name, case)
    cases = list(unique.values())
    accuracy = None
    if args.accuracy is not None:
        try:
            accuracy = load_accuracy(args.accuracy)
        except ValueError as err:
            parser.error(f"--accuracy: expected a JSON object or CSV of accuracies; {err}")
    config = {
        "device": str(device),
        "dtype": args.dtype,
        "quick": args.quick,
        "models": models,
        "kernels": kernels,
        "modes": modes,
        "projections": projections,
        "seq_len": seq_len,
        "set": settings,
        "heads_sweep": list(heads),
        "heads_model": heads_model if heads else None,
        "max_batch": _resolve(args, "max_batch"),
        "train_batch": _resolve(args, "train_batch"),
        "target_s": _resolve(args, "target_s"),
        "budget_s": _resolve(args, "budget_s"),
        "memory": not args.no_memory,
        "memory_jobs": _resolve(args, "memory_jobs"),
        "accuracy_file": args.accuracy,
        "out": args.out,
        "_accuracy": accuracy,
    }
    return cases, config


def _require(plots: bool) -> None:
    """tqdm (and matplotlib for plots) or an ImportError saying how to install them."""
    missing = []
    try:
        import tqdm  # noqa: F401
    except ImportError:
        missing.append("tqdm")
    if plots:
        try:
            import matplotlib.figure  # noqa: F401
        except ImportError:
            missing.append("matplotlib")
    if missing:
        raise ImportError(f"taylorshift bench models needs {' and '.join(missing)}: {INSTALL_HINT}")


def settings_from(config: dict) -> Settings:
    quick = config["quick"]
    return Settings(
        device=config["device"],
        dtype=config["dtype"],
        max_batch=config["max_batch"],
        train_batch=config["train_batch"],
        target_s=config["target_s"],
        warmup_s=min(0.1, config["target_s"]),
        min_reps=2 if quick else 3,
        max_reps=10 if quick else 50,
        memory=config["memory"],
        threads=torch.get_num_threads(),
    )


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``taylorshift bench models``: measure, then write the files into ``--out``."""
    cases, config = plan(args, parser)
    accuracy = config.pop("_accuracy")
    try:
        _require(plots=not args.no_plots)
    except ImportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        return _run(args, config, cases, accuracy)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace, config: dict, cases: list[Case], accuracy) -> int:
    from tqdm import tqdm

    settings = settings_from(config)
    budget = Budget(config["budget_s"])
    results: dict[str, Any] = {
        "tool": "taylorshift bench models",
        "command": machine.command_line(),
        "config": config,
        "settings": asdict(settings),
        "machine": machine.machine_info(settings.device),
        "elapsed_s": 0.0,
        "rows": [],
    }
    out = Path(args.out)
    # Phase 1: everything timed, one row after the other. Phase 2: the memory points,
    # after all timing (fresh processes on the CPU may run side by side: --memory-jobs).
    timing = replace(settings, memory=False)
    with tqdm(total=len(cases), unit="row", desc="bench models", dynamic_ncols=True) as bar:
        for case in cases:
            bar.set_description(case.name)
            row = measure_case(case, timing, budget, progress=bar.set_postfix_str)
            results["rows"].append(row)
            results["elapsed_s"] = time.perf_counter() - budget.start
            files.write_json(out / "results.json", results)  # partial results survive a crash
            bar.update()
    if settings.memory:
        jobs = config["memory_jobs"] if settings.device == "cpu" else 1
        pairs = list(zip(cases, results["rows"], strict=True))
        with (
            tqdm(total=len(pairs), unit="row", desc="peak memory", dynamic_ncols=True) as bar,
            ThreadPoolExecutor(max_workers=jobs) as pool,
        ):
            futures = [
                pool.submit(measure_memory_points, row, case, settings, budget)
                for case, row in pairs
            ]
            for future in as_completed(futures):
                future.result()
                bar.update()
    if accuracy is not None:
        names = {r["name"] for r in results["rows"]}
        for row in results["rows"]:
            row["accuracy"] = accuracy.get(row["name"])
        results["accuracy"] = {
            "file": config["accuracy_file"],
            "values": accuracy,
            "unmatched": sorted(set(accuracy) - names),
        }
        results["pareto"] = pareto_table(results["rows"])
    results["elapsed_s"] = time.perf_counter() - budget.start
    written = write_outputs(out, results, plots=not args.no_plots)
    print(render_summary(results))
    print(f"wrote {', '.join(p.name for p in written)} to {out}")
    return 0


def render_summary(results: dict) -> str:
    """The terminal summary: the tables of report.md."""
    rows = [r for r in results["rows"] if r["group"] == "models"]
    heads = [r for r in results["rows"] if r["group"] == "heads"]
    parts = []
    if rows:
        parts.append(_main_table(rows))
    if heads:
        parts.append(_heads_table(heads))
    parts.append(f"{len(results['rows'])} rows in {results['elapsed_s']:.1f} s")
    return "\n\n".join(parts)
