"""TrainState and MetricsWindow: counting steps and epochs, the best accuracy, and the
checkpoint form (also of checkpoints written before a field existed)."""

from __future__ import annotations

import time

from taylorshift.train import TrainState
from taylorshift.train.state import MetricsWindow


def test_advance_counts_steps_and_epochs():
    state = TrainState()
    assert [state.advance(3) for _ in range(7)] == [False, False, True] * 2 + [False]
    assert (state.step, state.epoch, state.batch_in_epoch) == (7, 2, 1)
    for accuracy in (0.5, 0.25, 0.75, 0.5):
        state.record_accuracy(accuracy)
    assert state.best_accuracy == 0.75


def test_checkpoint_form_round_trips_and_reads_older_checkpoints():
    state = TrainState(step=5, epoch=1, batch_in_epoch=1, best_accuracy=0.5)
    state.window.add(2.0, 8, 100)
    state.window.add(1.0, 8, None)
    saved = state.to_dict()
    assert list(saved) == ["step", "epoch", "batch_in_epoch", "best_accuracy", "log_window"]
    window = saved["log_window"]
    assert {k: window[k] for k in ("loss", "steps", "samples", "tokens")} == {
        "loss": 3.0, "steps": 2, "samples": 16, "tokens": 100,
    }  # fmt: skip
    assert window["elapsed"] >= 0
    back = TrainState.from_dict({**saved, "log_window": {**window, "elapsed": 10.0}})
    assert (back.step, back.epoch, back.batch_in_epoch, back.best_accuracy) == (5, 1, 1, 0.5)
    assert (back.window.loss, back.window.steps, back.window.tokens) == (3.0, 2, 100)
    assert 10.0 <= back.window.elapsed() < 60.0

    # a checkpoint written before best_accuracy and the log window were saved
    old = TrainState.from_dict({"step": 4, "epoch": 1, "batch_in_epoch": 0})
    assert old.best_accuracy is None and old.window.steps == 0
    assert abs(old.window.start - time.perf_counter()) < 60.0
    assert MetricsWindow().to_dict()["steps"] == 0
