"""Shared pieces of the training tests: a tiny run config, subprocess runs of the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from taylorshift.train import TrainConfig, resolve_config

from .forked import fork_cli, fork_ranks

SRC = Path(__file__).resolve().parents[2] / "src"

# A run of a few seconds: ListOps of 8-32 tokens, a 1-block width-32 model, one thread (so
# that runs in separate processes compute bitwise alike), 4 steps per epoch.
TINY = {
    "run.progress": False,
    "run.threads": 1,
    "run.log_every": 1,
    "data.test_split": None,
    "data.split_options.train.num_samples": 64,
    "data.split_options.val.num_samples": 32,
    "model.mode": "direct",
}


def tiny_config(out_dir: Path, **settings) -> TrainConfig:
    """The ``listops-tiny`` preset made smaller, writing to ``out_dir``; ``settings`` are
    dotted keys with ``__`` for ``.`` (``optim__lr=1e-2``)."""
    overrides = {**TINY, "run.out_dir": str(out_dir)}
    overrides.update({k.replace("__", "."): v for k, v in settings.items()})
    return resolve_config("listops-tiny", overrides=overrides)


def tiny_argv(out_dir: Path, *extra: str) -> list[str]:
    """The ``taylorshift train`` arguments of :func:`tiny_config`."""
    argv = ["train", "--preset", "listops-tiny", "--out", str(out_dir)]
    for key, value in TINY.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        argv += ["--set", f"{key}={text}"]
    return [*argv, *extra]


def cli_env() -> dict[str, str]:
    """This environment with ``src`` first on PYTHONPATH, for ``python -m taylorshift``."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }


def run_cli(
    argv: list[str],
    env: dict[str, str] | None = None,
    module: list[str] | None = None,
    ranks: int | None = None,
):
    """Run ``python -m taylorshift ARGV`` (or ``python -m MODULE... -m taylorshift ARGV``).

    Without ``module``, in a process forked from a server with torch imported
    (``tests/train/forked.py``: the same entry point, seconds sooner); with ``ranks``, as
    ``torchrun --standalone --nproc-per-node=RANKS`` would run it, the ranks forked the
    same way (``fork_ranks``).
    """
    environ = {**cli_env(), **(env or {})}
    if ranks is not None:
        return fork_ranks(argv, environ, ranks)
    if not module:
        return fork_cli(argv, environ)
    command = [sys.executable, "-m", *module, "-m", "taylorshift", *argv]
    return subprocess.run(
        command, capture_output=True, text=True, env=environ, timeout=300, check=False
    )


@pytest.fixture(autouse=True)
def keep_thread_count():
    """``run.threads`` sets torch's thread count for the process: put it back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
