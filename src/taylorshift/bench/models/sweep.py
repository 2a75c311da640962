"""Measuring one row of ``bench models``: FLOPs, the inference throughput over batch sizes,
the training step time, then (after all timing) the peak memory of a training step and of
an inference call. Out of memory, errors and the budget become statuses of the row."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .. import machine, measure
from ..core import OK, OVER_BUDGET, SKIPPED
from ..runner import Budget, failure, free_cache
from .cases import (
    DTYPES,
    RECIPE,
    Case,
    Settings,
    build_model,
    count_flops,
    inference_call,
    make_inputs,
    state_bytes,
    tensor_bytes,
    train_call,
)

__all__ = ["STAGES", "measure_case", "measure_memory_points", "sweep_throughput"]


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
    limit = settings.max_memory_bytes or memory_limit(device)
    peak = PeakMemory(device)
    per_sample: float | None = None  # extra bytes per sample, from the last batch
    while batch <= settings.max_batch:
        if budget.over():
            return curve, OVER_BUDGET
        if per_sample is not None and per_sample * batch > limit:
            # The OOM killer would end the whole run, not just this row: stop before.
            curve.append({
                "batch": batch, "status": OVER_BUDGET,
                "error": f"predicted {per_sample * batch / 2**30:.2f} GiB > "
                         f"{limit / 2**30:.2f} GiB (--max-memory-gib)",
            })  # fmt: skip
            return curve, "over budget (memory)"
        if progress is not None:
            progress(f"throughput B={batch}")
        peak.reset()
        try:
            call = call_at(batch)
        except Exception as err:  # a failing point ends the sweep, never the run
            curve.append({"batch": batch, **failure(err, device)})
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
            result = measure.TimeResult(**failure(err, device))
        del call
        extra = peak.extra_bytes()
        if extra is not None:
            per_sample = max(per_sample or 0.0, extra / batch)
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


def memory_limit(device: torch.device) -> int:
    """The default budget of a throughput point: 90 % of the GPU, or half the RAM."""
    total = machine.memory_bytes(device)
    if total is None:
        return 1 << 62
    return int(0.9 * total) if device.type == "cuda" else total // 2


class PeakMemory:
    """The peak extra memory of a stretch of work: on CUDA the allocator's peak over what
    was allocated at ``reset``; on Linux the process's resident peak (VmHWM, reset through
    /proc/self/clear_refs) over its resident size at ``reset``; elsewhere unknown (None)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.base = device, 0

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current resident size
            self.base = _status_kib("VmRSS") * 1024
        except OSError:
            self.base = -1

    def extra_bytes(self) -> int | None:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) - self.base
        if self.base < 0:
            return None
        try:
            return max(0, _status_kib("VmHWM") * 1024 - self.base)
        except OSError:
            return None


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"{field} not in /proc/self/status")


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
        return measure.MemoryResult(**failure(err, settings.device))


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
_STATUS_FIELD = {stage: f"{stage}_status" for stage in STAGES}


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
        result = failure(err, device)
        row["errors"]["build"] = result["error"]
        return fail_all(result["status"])
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
            result = failure(err, device)
            row["flops_status"] = result["status"]
            row["errors"]["flops"] = result["error"]

    # Inference throughput over batch sizes
    curve, stop = sweep_throughput(
        lambda b: inference_call(model, inputs_at(b)[0]), settings, budget, progress=note
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
                train_call(model, inputs, targets, optimizer),
                device=device,
                target_s=settings.target_s,
                warmup_s=settings.warmup_s,
                min_reps=settings.min_reps,
                max_reps=settings.max_reps,
            )
            del inputs, targets
        except Exception as err:
            result = measure.TimeResult(**failure(err, device))
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
            free_cache(device)

    # State bytes: what lives between calls (AdamW state counted from the real optimizer
    # when a step ran, else two moments per parameter).
    row["inference_state_bytes"] = state_bytes(model)
    if optimizer is not None and optimizer.state:
        row["train_state_bytes"] = state_bytes(model, optimizer)
    else:
        row["train_state_bytes"] = state_bytes(model) + 2 * tensor_bytes(model.parameters())
    model = optimizer = None  # free them before the memory points (CUDA runs in-process)
    free_cache(device)

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
