"""Evaluation: :func:`evaluate` a model on a split, :func:`evaluate_checkpoint` a saved run,
the per-task loss (:func:`task_losses`)."""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from ..data import TaskSpec, get_kind, get_task
from ..data.text_bytes import count_baselines
from .build import _build_split, _setting
from .checkpoint import (
    find_checkpoint,
    load_checkpoint_model,
    load_state,
    read_config,
    verify_checkpoint,
)
from .config import ConfigError, TrainConfig
from .distributed import Dist, SequenceGroup, eval_shard, resolve_device, setup
from .stop import ignore_stop_signals

__all__ = [
    "byte_baselines",
    "evaluate",
    "evaluate_checkpoint",
    "shard_sequence",
    "task_losses",
]


def task_losses(logits: Tensor, labels: Tensor, kind: str) -> tuple[Tensor, Tensor, Tensor]:
    """(summed cross entropy, correct predictions, scored predictions) of a batch of a task
    of kind ``kind``: ``get_kind(kind).losses(logits, labels)`` (``taylorshift.data.kinds``).

    Classification: one prediction per sample, logits (B, C) and labels (B,). Language
    modelling (kind ``"lm"``): one per target token, logits (B, N, V) and targets (B, N)
    with ``IGNORE_INDEX`` where no prediction is scored.
    """
    return get_kind(kind).losses(logits, labels)


def _amp_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    if amp == "bf16":
        return torch.bfloat16
    if amp == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


def _autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: Dataset,
    spec: TaskSpec,
    *,
    batch_size: int,
    device: torch.device | str = "cpu",
    amp_dtype: torch.dtype | None = None,
    dist_info: Dist | None = None,
    num_workers: int = 0,
    pad_to_multiple: int | None = None,
    sequence: SequenceGroup | None = None,
) -> dict[str, Any]:
    """Accuracy and mean cross entropy of ``model`` on ``dataset``, over all processes.

    Each process takes every ``world_size``-th sample (``batch_size`` is the global batch,
    split between processes); sums are reduced, so the result counts every sample once.
    With ``sequence`` (sequence parallelism) the processes of a group share the samples of
    their data-parallel rank, each scoring its slice of the tokens.

    Returns:
        ``{"loss": float, "accuracy": float, "samples": int}``: per sample for
        classification; per scored target token for language modelling (kind ``"lm"``, a
        ``per_token`` kind: ``samples`` counts target tokens, and ``perplexity`` = exp(loss)
        is added).
    """
    dist_info = dist_info or Dist()
    sequence = sequence or SequenceGroup(data_rank=dist_info.rank, data_world=dist_info.world_size)
    device = torch.device(device)
    was_training = model.training
    model.eval()
    per_rank = max(1, -(-batch_size // sequence.data_world))
    batches = eval_shard(len(dataset), per_rank, sequence.data_rank, sequence.data_world)
    loader = DataLoader(
        dataset,
        batch_sampler=batches,
        collate_fn=spec.collate(pad_to_multiple),
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
        worker_init_fn=ignore_stop_signals,
        generator=torch.Generator(),
    )
    kind = spec.behaviour
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
    try:
        for batch in loader:
            inputs, labels, _ = kind.unpack(batch, device)
            inputs, kwargs, labels = shard_sequence(inputs, labels, sequence)
            with _autocast(device, amp_dtype):
                logits = model(*inputs, **kwargs)
            loss, correct, scored = kind.losses(logits, labels)
            totals[0] += loss.double()
            totals[1] += correct
            totals[2] += scored
    finally:
        model.train(was_training)
    loss_sum, correct, count = dist_info.all_reduce_sum(totals).tolist()
    denominator = max(count, 1.0)
    result = {
        "loss": loss_sum / denominator,
        "accuracy": correct / denominator,
        "samples": int(count),
    }
    if kind.per_token:
        result["perplexity"] = math.exp(min(result["loss"], 700.0))
    if spec.byte_tokens:
        result["bits_per_byte"] = result["loss"] / math.log(2.0)
    return result


def byte_baselines(spec: TaskSpec, train_set: Dataset, dataset: Dataset) -> dict | None:
    """Unigram and bigram bits per byte of ``dataset``'s whole split counted on
    ``train_set``'s (tasks with byte tokens whose datasets hold their bytes as ``data``; a
    ``Subset`` of ``data.train_limit`` / ``eval_limit`` counts its whole split), else None."""
    train_set = getattr(train_set, "dataset", train_set)
    dataset = getattr(dataset, "dataset", dataset)
    train_bytes, target = getattr(train_set, "data", None), getattr(dataset, "data", None)
    if not spec.byte_tokens or not isinstance(train_bytes, Tensor):
        return None
    if not isinstance(target, Tensor):
        return None
    return count_baselines(train_bytes, target)


def evaluate_checkpoint(
    path: str | os.PathLike,
    split: str = "test",
    *,
    batch_size: int | None = None,
    device: str = "auto",
    limit: int | None = None,
    data_path: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Evaluate a checkpoint (a run folder, a checkpoint folder or a file in one) on
    ``split`` of the data its run was trained on, or of the same task's data at
    ``data_path`` (the data moved, or another copy of it); under torchrun, shared between
    processes.

    Returns:
        ``{"checkpoint", "step", "split", "loss", "accuracy", "samples"}``.

    Raises:
        ConfigError: the data is not there (or not of the run's task), naming the path; or
            ``device`` names no device of this machine.
    """
    _setting("device", resolve_device, device)  # (before any file is read)
    folder = verify_checkpoint(find_checkpoint(path))
    config = TrainConfig.from_dict(read_config(folder))
    if limit is not None:
        config = config.replace(**{"data.eval_limit": limit})
    if data_path is not None:
        config = config.replace(**{"data.options.path": os.fspath(data_path)})
    dist_info, torch_device = _setting("device", setup, device)
    try:
        spec = get_task(config.data.task)
        where = f"data (task {spec.name!r}"
        where += ")" if data_path is not None else ", as the run recorded it; other: --data PATH)"
        dataset = _setting(where, _build_split, config, spec, split)
        model = load_checkpoint_model(folder, map_location=torch_device)
        _check_classes(dataset, model, where)
        result = evaluate(
            model,
            dataset,
            spec,
            batch_size=batch_size or config.data.eval_batch_size or config.data.batch_size,
            device=torch_device,
            amp_dtype=_amp_dtype(config.run.amp, torch_device),
            dist_info=dist_info,
            num_workers=config.data.num_workers,
            pad_to_multiple=config.data.pad_to_multiple,
        )
    finally:
        dist_info.shutdown()
    step = load_state(folder)["step"]
    return {"checkpoint": str(folder), "step": step, "split": split, **result}


def _check_classes(dataset, model, where: str) -> None:
    """Refuse data whose classes (read from the data: ``text-*``, ``image-folder``) are not
    as many as the model's outputs: its label ids would mean other classes (or none)."""
    have = getattr(dataset, "num_classes", None)
    want = getattr(model.config, "num_classes", None)
    if have is None or want is None or have == want:
        return
    names = getattr(dataset, "classes", None)
    shown = f" {list(names)!r}" if names is not None and len(names) <= 20 else ""
    raise ConfigError(
        f"{where}: the data has {have} classes{shown}, the model was trained on {want}: "
        "its label ids would mean other classes"
    )


def shard_sequence(inputs: tuple, labels: Tensor, seq: SequenceGroup | None):
    """This process's slice of a batch under sequence parallelism: (inputs, model keyword
    arguments, labels). Tokens, mask and targets are cut along N; ``positions`` give the
    slice its place in the sequence."""
    if seq is None or seq.size == 1:
        return inputs, {}, labels
    tokens, mask = inputs
    part = seq.shard(tokens.shape[1])
    positions = torch.arange(part.start, part.stop, device=tokens.device)
    return (tokens[:, part], mask[:, part]), {"positions": positions}, labels[:, part]
