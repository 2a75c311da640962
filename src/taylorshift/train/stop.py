"""A stop on request: SIGTERM (a scheduler's preemption, ``kill``) ends a training run after
the step it arrives in (the next one if it comes after that step's loss was summed, where it
is read), with a checkpoint of that step (docs/train.md).

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

__all__ = ["STOP_SIGNALS", "StopRequests", "TrainingStopped", "ignore_stop_signals"]

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
    thread, a handler set from C) it notes nothing and changes nothing. A process forked
    while it is entered gets the handler before (SIGTERM's default ends it), not a note that
    nobody reads."""

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
        if os.getpid() != self._pid:  # a process forked during the run: the handler before
            signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
            signal.raise_signal(signum)
            return
        self.received = signum

    @property
    def signal_name(self) -> str | None:
        return None if self.received is None else signal.Signals(self.received).name


def ignore_stop_signals(worker_id: int) -> None:
    """``worker_init_fn`` of the training and evaluation DataLoaders: the workers ignore
    ``STOP_SIGNALS``. A SIGTERM to the whole process group (as Slurm sends it) would
    otherwise kill them under the step (torch sets SIGTERM's default in its workers), and
    the run would end in "DataLoader worker ... is killed by signal" instead of stopping
    after the step; the main process stops them when it ends, and a worker whose parent is
    gone exits by itself (torch's watchdog)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
