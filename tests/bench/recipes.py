"""Recipes for the fresh-process memory worker (importable as tests.bench.recipes)."""

import os
import signal
import time

import torch


def allocate(n_floats: int):
    """A callable whose only allocation is one float32 tensor of ``n_floats`` entries."""
    return lambda: torch.ones(n_floats)


def fail_with(message: str):
    def call():
        raise RuntimeError(message)

    return call


def sleep_on_second_call(seconds: float):
    """Returns at once the first time (the worker's warm-up), then sleeps ``seconds``."""
    calls = []

    def call():
        calls.append(None)
        if len(calls) > 1:
            time.sleep(seconds)

    return call


def die_on_second_call():
    """Ends its process with SIGKILL in the measured call, as the kernel's OOM killer would."""
    calls = []

    def call():
        calls.append(None)
        if len(calls) > 1:
            os.kill(os.getpid(), signal.SIGKILL)

    return call
