"""A stop on request: SIGTERM (a scheduler's preemption, ``kill``) ends a training run at
the end of the step it arrives in, with a checkpoint of that step (docs/train.md).

``StopRequests`` notes the signal while training runs; the trainer sums the note over the
processes in the all-reduce it already makes for the loss every step, so every process of a
multi-process job stops after the same step, whichever of them got the signal.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import FrameType

__all__ = ["STOP_SIGNALS", "StopRequests", "TrainingStopped"]

STOP_SIGNALS = (signal.SIGTERM,)


class TrainingStopped(Exception):
    """A run stopped on request after ``step``, its checkpoint ``checkpoint`` written."""

    def __init__(self, step: int, checkpoint: Path | None, signal_name: str | None) -> None:
        self.step, self.checkpoint, self.signal_name = step, checkpoint, signal_name
        by = signal_name or "a signal to another process of the job"
        super().__init__(f"stopped by {by} after step {step}; checkpoint {checkpoint}")


class StopRequests:
    """While entered (in the main thread), a ``STOP_SIGNALS`` signal sets ``received``
    instead of ending the process; the handlers before come back on exit. Elsewhere (another
    thread, a handler set from C) it notes nothing and changes nothing."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, object] = {}
        self._pid = os.getpid()

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                previous = signal.getsignal(sig)
                if previous is not None:
                    self._previous[sig] = previous
                    signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:  # a forked child (a DataLoader worker): as before
            signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
            signal.raise_signal(signum)
            return
        self.received = signum

    @property
    def signal_name(self) -> str | None:
        return None if self.received is None else signal.Signals(self.received).name
