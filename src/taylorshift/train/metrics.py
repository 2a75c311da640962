"""Metrics: JSON Lines records, optional TensorBoard scalars, optional tqdm progress bars.

``<out_dir>/metrics.jsonl`` holds one JSON object per line, each with ``"event"``,
``"step"`` (optimizer steps done) and ``"time"`` (seconds since the Unix epoch):

- ``start``: ``world_size``, ``steps_per_epoch``, ``total_steps``, ``parameters``,
  ``device``, ``amp``, ``resumed_from`` (a step or null) and the full ``config``;
- ``train``: ``epoch``, ``loss`` (mean over the steps since the previous record), ``lr``,
  ``grad_norm`` (before clipping; null without clipping), ``samples_per_s``,
  ``tokens_per_s`` (real tokens, token tasks);
- ``eval``: ``epoch``, ``split``, ``loss``, ``accuracy``, ``samples``;
- ``checkpoint``: ``path``;
- ``nonfinite``: ``epoch``, ``loss`` (as text: "nan", "inf"), ``message``;
- ``end``: ``epoch``, ``best_accuracy`` (of the eval split).

Each record is written with one ``write`` call and flushed, so a crash loses at most the
line being written (readers skip a torn last line). On resume, records after the resumed
step are dropped first, so the file reads like one uninterrupted run.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..atomic import write_atomic

__all__ = ["METRICS_FILE", "MetricsLogger", "read_metrics"]

METRICS_FILE = "metrics.jsonl"


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a metrics file (a run folder or the file itself); a torn line is
    skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    return list(_records(path))


def _records(path: Path) -> Iterator[dict[str, Any]]:
    if not path.is_file():
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                yield record


class MetricsLogger:
    """Append metric records of the main process to ``metrics.jsonl`` (and TensorBoard).

    Args:
        out_dir: the run folder.
        enabled: False on processes other than rank 0 (every call is then a no-op).
        tensorboard: also write scalars under ``out_dir/tensorboard`` if tensorboard is
            installed (a warning otherwise).
    """

    def __init__(self, out_dir: str | os.PathLike, *, enabled: bool = True, tensorboard=False):
        self.path = Path(out_dir) / METRICS_FILE
        self.enabled = enabled
        self._writer = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                warnings.warn(
                    "run.tensorboard is set but tensorboard is not installed "
                    "(pip install tensorboard); writing metrics.jsonl only",
                    stacklevel=2,
                )
            else:
                self._writer = SummaryWriter(str(Path(out_dir) / "tensorboard"))

    def truncate_after(self, step: int) -> None:
        """Drop what a resume from the checkpoint of ``step`` writes again, atomically: the
        records of later steps (work lost by a crash) and those of ``step`` itself after
        its ``checkpoint`` record (a stopped run's partial train record and ``stopped``, a
        finished run's test evaluation and ``end``; ``start`` records stay, one per
        resume). Without such a record (a log of an older version), every record of
        ``step`` stays."""
        if not self.enabled or not self.path.is_file():
            return
        records = list(_records(self.path))
        marks = [
            i
            for i, r in enumerate(records)
            if r.get("event") == "checkpoint" and r.get("step") == step
        ]
        end = marks[-1] if marks else len(records)
        kept = [
            r
            for i, r in enumerate(records)
            if r.get("step", 0) < step
            or (r.get("step", 0) == step and (i <= end or r.get("event") == "start"))
        ]
        write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept).encode())

    def log(self, event: str, step: int, **values: Any) -> None:
        """Append one record ``{"event": event, "step": step, "time": ..., **values}``."""
        if not self.enabled:
            return
        record = {"event": event, "step": step, "time": round(time.time(), 3), **values}
        line = json.dumps(record) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
        if self._writer is not None:
            prefix = values.get("split", event)
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._writer.add_scalar(f"{prefix}/{key}", value, step)

    def sync(self) -> None:
        """fsync the metrics file (called with each checkpoint)."""
        if self.enabled and self.path.is_file():
            with open(self.path, "a", encoding="utf-8") as f:
                os.fsync(f.fileno())
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class Progress:
    """A tqdm bar over the steps of a run, or nothing (no tqdm, disabled, not rank 0)."""

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        self._bar = None
        if not enabled:
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

    def update(self, n: int = 1, **postfix: Any) -> None:
        if self._bar is None:
            return
        self._bar.update(n)
        if postfix:
            self._bar.set_postfix(postfix, refresh=False)

    def write(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
