"""Accuracy against efficiency: the metrics a Pareto plot puts against accuracy, Pareto
fronts, and the accuracies a run is given (``--accuracy``)."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core import MIB

__all__ = ["METRICS", "Metric", "load_accuracy", "metric_value", "pareto_front", "pareto_table"]


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


def metric_value(row: dict, metric: Metric) -> float | None:
    value = row.get(metric.key)
    return None if value is None else value / metric.scale


def pareto_table(rows: Sequence[dict]) -> dict[str, list[str]]:
    """Per metric: the names of the rows with an accuracy on the front."""
    scored = [r for r in rows if r.get("accuracy") is not None]
    fronts = {}
    for metric in METRICS:
        points = [(metric_value(r, metric), r["accuracy"]) for r in scored]
        on = pareto_front(points, better=metric.better)
        fronts[metric.key] = [r["name"] for r, keep in zip(scored, on, strict=True) if keep]
    return fronts
