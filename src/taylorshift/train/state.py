"""The progress of a run: :class:`TrainState`, what a checkpoint carries besides the model,
optimizer, schedule and random states, and :class:`MetricsWindow`, the steps a ``train``
record averages over."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MetricsWindow", "TrainState"]


@dataclass
class MetricsWindow:
    """The steps since the last ``train`` record: its loss is their mean, its throughput
    their samples and tokens over the time since the window opened.

    Attributes:
        loss: the sum of the steps' global losses.
        steps, samples, tokens: counts over all processes (tokens: real ones, token tasks).
        carried: seconds the window was open before this process took it over (from a
            checkpoint).
        start: ``time.perf_counter()`` when this process's clock started.
    """

    loss: float = 0.0
    steps: int = 0
    samples: int = 0
    tokens: int = 0
    carried: float = 0.0
    start: float = field(default_factory=time.perf_counter)

    def add(self, loss: float, samples: int, tokens: int | None) -> None:
        """Count one step."""
        self.loss += loss
        self.steps += 1
        self.samples += samples
        if tokens is not None:
            self.tokens += tokens

    def restart_clock(self) -> None:
        """Time from now on (the set-up of a run is not training time)."""
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds the window has been open."""
        return self.carried + time.perf_counter() - self.start

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint form."""
        return {
            "loss": self.loss,
            "steps": self.steps,
            "samples": self.samples,
            "tokens": self.tokens,
            "elapsed": self.elapsed(),
        }

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> MetricsWindow:
        """The window of :meth:`to_dict`, open ``elapsed`` seconds already."""
        saved = dict(saved)
        carried = saved.pop("elapsed")
        return cls(**saved, carried=carried)


@dataclass
class TrainState:
    """Where a run stands: what a checkpoint's ``state.pt`` holds besides the optimizer,
    the schedule and the random states, so that a resumed run goes on (and logs) as if it
    had never stopped.

    Attributes:
        step: optimizer steps done.
        epoch: completed epochs.
        batch_in_epoch: batches of the current epoch done.
        best_accuracy: the best accuracy on ``data.eval_split`` so far (None before the
            first evaluation).
        window: the train records' averaging window, so that a resumed run logs the same
            means as an uninterrupted one (throughput excepted).
    """

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_accuracy: float | None = None
    window: MetricsWindow = field(default_factory=MetricsWindow)

    def advance(self, steps_per_epoch: int) -> bool:
        """Count one step; True when it ended an epoch."""
        self.step += 1
        self.batch_in_epoch += 1
        if self.batch_in_epoch < steps_per_epoch:
            return False
        self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        return True

    def record_accuracy(self, accuracy: float) -> None:
        """Keep ``accuracy`` if it is the best so far."""
        if self.best_accuracy is None or accuracy > self.best_accuracy:
            self.best_accuracy = accuracy

    def to_dict(self) -> dict[str, Any]:
        """The entries of ``state.pt`` this state owns."""
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "best_accuracy": self.best_accuracy,
            "log_window": self.window.to_dict(),
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> TrainState:
        """The state of a checkpoint's ``state.pt`` dict (one saved before
        ``best_accuracy`` or ``log_window`` existed gets None and a fresh window)."""
        window = state.get("log_window")
        return cls(
            step=state["step"],
            epoch=state["epoch"],
            batch_in_epoch=state["batch_in_epoch"],
            best_accuracy=state.get("best_accuracy"),
            window=MetricsWindow() if window is None else MetricsWindow.from_dict(window),
        )
