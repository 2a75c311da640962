"""Recipes for the fresh-process memory worker (importable as tests.bench.recipes)."""

import torch


def allocate(n_floats: int):
    """A callable whose only allocation is one float32 tensor of ``n_floats`` entries."""
    return lambda: torch.ones(n_floats)


def fail_with(message: str):
    def call():
        raise RuntimeError(message)

    return call
