"""Training: config dataclasses and presets, the loop, checkpoints, multi-process runs.

- ``resolve_config(preset, file, overrides)`` -> :class:`TrainConfig` (sections ``data``,
  ``model``, ``optim``, ``run``); presets ``listops``, ``cifar-pixel``, ``imdb-byte`` (the
  paper's Table 6) and CPU-sized ``listops-cpu``, ``listops-tiny``, ``cifar-pixel-cpu``,
  ``imdb-byte-cpu``.
- ``train(config, resume=False)``: LAMB or AdamW, warm-up + cosine per step, bf16 autocast
  on CUDA, gradient clipping, evaluation every epoch, metrics as JSON Lines, atomic
  checkpoints from which a resumed run continues bitwise (on a CPU); under ``torchrun``,
  DistributedDataParallel.
- ``Trainer``: what ``train`` runs on each process (the run's objects and the loop);
  ``TrainState``: its progress (step, epoch, best accuracy, the metrics window), saved in
  every checkpoint.
- ``RunLock``: one training process per run folder (``RunLockedError`` for a second).
- ``evaluate_checkpoint(path, split)``: accuracy and loss of a saved run.
- ``Lamb``, ``WarmupCosine``: the optimizer and schedule.

The command line: ``taylorshift train`` and ``taylorshift eval``. See docs/train.md.
"""

from .build import build_model
from .checkpoint import find_checkpoint, latest_checkpoint, load_state
from .config import (
    ConfigError,
    DataConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    TrainConfig,
)
from .evaluate import evaluate, evaluate_checkpoint
from .lock import RunLock, RunLockedError
from .loop import NonFiniteLossError, Trainer, TrainResult, train
from .metrics import read_metrics
from .optim import Lamb, WarmupCosine, build_optimizer, build_scheduler
from .presets import PRESETS, get_preset, list_presets
from .resolve import load_config_file, resolve_config
from .state import TrainState
from .stop import TrainingStopped

__all__ = [
    "PRESETS",
    "ConfigError",
    "DataConfig",
    "Lamb",
    "ModelConfig",
    "NonFiniteLossError",
    "OptimConfig",
    "RunConfig",
    "RunLock",
    "RunLockedError",
    "TrainConfig",
    "TrainResult",
    "TrainState",
    "Trainer",
    "TrainingStopped",
    "WarmupCosine",
    "build_model",
    "build_optimizer",
    "build_scheduler",
    "evaluate",
    "evaluate_checkpoint",
    "find_checkpoint",
    "get_preset",
    "latest_checkpoint",
    "list_presets",
    "load_config_file",
    "load_state",
    "read_metrics",
    "resolve_config",
    "train",
]
