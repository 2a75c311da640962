"""The training loop: :func:`train` a config (the model and splits a config builds are in
``build.py``, evaluation in ``evaluate.py``).

One optimizer step per global batch: forward under autocast (bf16 where enabled), cross
entropy in float32, backward (gradients averaged over processes by DDP), optional clipping
of the global gradient norm, optimizer step, schedule step. The loss is averaged over
processes before the backward pass so that every process sees the same value; a non-finite
one stops the run before its step is taken (:class:`NonFiniteLossError`).

Reproducibility: the data order, the model initialisation and every random number drawn in
training follow from ``run.seed``; a checkpoint stores every random state, so on a CPU a run
resumed from any checkpoint continues bitwise as if it had never stopped (same thread count
assumed). DataLoaders get their own generators, so creating one never draws from torch's
global generator.
"""

from __future__ import annotations

import contextlib
import json
import math
import platform
import random
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..atomic import write_atomic
from ..data import TaskSpec, get_task
from ..models import load_weights
from .build import _build_split, _setting, build_model
from .checkpoint import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    MODEL_FILE,
    capture_rng,
    kill_hook,
    load_state,
    read_config,
    restore_rng,
    resumable_checkpoint,
    save_checkpoint,
)
from .config import RUNTIME_KEYS, ConfigError, TrainConfig
from .distributed import (
    CollectiveTimeoutError,
    Dist,
    SequenceGroup,
    ShardedBatchSampler,
    derive_seed,
    sequence_group,
    setup,
    timed_out,
)
from .evaluate import (
    _amp_dtype,
    _autocast,
    byte_baselines,
    evaluate,
    shard_sequence,
)
from .lock import RunLock
from .metrics import MetricsLogger, Progress
from .optim import build_optimizer, build_scheduler

__all__ = [
    "NonFiniteLossError",
    "TrainResult",
    "build_model",
    "train",
]


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the run stopped without taking that step.

    Attributes:
        step: the step (counted from 1) whose loss was not finite.
        epoch: its epoch (from 0).
        loss: the value.
        checkpoint: the last good checkpoint folder, or None.
    """

    def __init__(self, message: str, step: int, epoch: int, loss: float, checkpoint):
        super().__init__(message)
        self.step, self.epoch, self.loss, self.checkpoint = step, epoch, loss, checkpoint


@dataclass
class TrainResult:
    """What :func:`train` returns (on every process).

    Attributes:
        out_dir: the run folder.
        step, epoch: optimizer steps done and completed epochs.
        checkpoint: the last checkpoint written (or resumed from).
        losses: the global loss of every step this call took, in order.
        eval: the last evaluation of ``data.eval_split`` (``loss``, ``accuracy``, ``samples``).
        test: the evaluation of ``data.test_split`` at the end, or None.
        best_accuracy: the best eval accuracy of the run so far.
    """

    out_dir: Path
    step: int
    epoch: int
    checkpoint: Path | None
    losses: list[float]
    eval: dict[str, Any] | None
    test: dict[str, Any] | None
    best_accuracy: float | None


def _collective_timeout(dist_info: Dist, timeout_s: float) -> CollectiveTimeoutError:
    """The error of a collective that ran out of time, naming the silent ranks if it can."""
    silent = dist_info.silent_ranks(min(30.0, timeout_s))
    who = (
        f"rank(s) {', '.join(map(str, silent))} did not answer"
        if silent
        else "another process did not answer"
    )
    return CollectiveTimeoutError(
        f"rank {dist_info.rank}: a collective waited run.collective_timeout_s={timeout_s:g} s "
        f"and {who}: that process crashed, hangs or was stopped. The last checkpoint is kept; "
        f"restart the job with --resume"
    )


def _check_resume(config: TrainConfig, checkpoint: Path) -> None:
    try:
        saved = TrainConfig.from_dict(read_config(checkpoint))
    except ConfigError as err:
        message = f"cannot resume from {checkpoint}: its config is unreadable: {err}"
        raise ConfigError(message) from None
    diffs = saved.differences(config, ignore=RUNTIME_KEYS)
    if diffs:
        raise ConfigError(
            f"cannot resume from {checkpoint}: the config differs in "
            f"{'; '.join(diffs)} (checkpoint's value first). Resume with the run's own "
            f"settings (its config.json), or start a new run in another run.out_dir"
        )


def _seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        return
    np.random.seed(seed % 2**32)


def train(config: TrainConfig, *, resume: bool = False) -> TrainResult:
    """Train ``config`` (see docs/train.md); in a ``torchrun`` job, on every process.

    Args:
        config: the run.
        resume: continue from the latest checkpoint in ``run.out_dir`` if there is one (a
            fresh start otherwise). Without it, a folder that holds checkpoints is refused.

    Returns:
        a :class:`TrainResult`.

    Raises:
        NonFiniteLossError: the loss became NaN or infinite (the last good checkpoint is
            kept; the message names the step).
        ConfigError: a setting that does not fit the task or model, or a resume with a
            different config.
        FileExistsError: ``run.out_dir`` holds checkpoints and ``resume`` is False.
        RunLockedError: another process is training into ``run.out_dir``.
    """
    dist_info, device = _setting(
        "run.device", setup, config.run.device, config.run.collective_timeout_s
    )
    try:
        # One training process per run folder (train/lock.py); the main process holds it
        # for the whole job, before it reads or writes anything there.
        lock = RunLock(config.run.out_dir) if dist_info.is_main else contextlib.nullcontext()
        _setting("run.out_dir", lock.__enter__)
        try:
            return _train(config, resume, dist_info, device)
        except RuntimeError as err:
            if dist_info.enabled and timed_out(err):
                raise _collective_timeout(dist_info, config.run.collective_timeout_s) from err
            raise
        finally:
            lock.__exit__(None, None, None)
    finally:
        dist_info.shutdown()


def _train(config: TrainConfig, resume: bool, dist_info: Dist, device: torch.device):
    run, data, optim = config.run, config.data, config.optim
    if run.threads is not None:
        torch.set_num_threads(run.threads)
    out_dir = Path(run.out_dir)
    if not resume and (out_dir / CHECKPOINT_DIR / "latest").exists():
        raise FileExistsError(
            f"{out_dir} holds checkpoints already; pass --resume to continue that run, or "
            f"choose another run.out_dir"
        )
    # The checkpoint `latest` names, verified; a damaged one is skipped for the newest
    # intact kept one, said in a warning (train/checkpoint.py).
    existing, skipped = resumable_checkpoint(out_dir) if resume else (None, None)
    if skipped and dist_info.is_main:
        warnings.warn(skipped, stacklevel=2)
    state = None
    if existing is not None:
        _check_resume(config, existing)
        state = load_state(existing)

    spec = _setting("data.task", get_task, data.task)
    kind = spec.behaviour
    train_set = _setting(f"data (task {data.task!r})", _build_split, config, spec, "train")
    eval_set = _setting(f"data (task {data.task!r})", _build_split, config, spec, data.eval_split)
    num_classes = spec.num_classes or getattr(train_set, "num_classes", None)
    vocab_size = getattr(train_set, "vocab_size", None)

    _seed_all(run.seed)
    model = build_model(config, spec, num_classes, vocab_size=vocab_size).to(device)
    if existing is not None:
        load_weights(model, existing / MODEL_FILE)
    seq = _sequence_parallel(model, spec, run.sequence_parallel, dist_info)
    optimizer = build_optimizer(model, optim)
    sampler = _setting(
        "data.batch_size", ShardedBatchSampler,
        len(train_set), data.batch_size, run.seed, seq.data_rank, seq.data_world,
    )  # fmt: skip
    steps_per_epoch = sampler.batches_per_epoch()
    scheduler = build_scheduler(optimizer, optim, steps_per_epoch)
    total_steps = optim.epochs * steps_per_epoch
    stop_at = min(total_steps, run.max_steps) if run.max_steps else total_steps

    # Training randomness (drop path, dropout) differs between processes.
    # (The processes of one sequence-parallel group draw alike: drop path must drop the same
    # samples on every slice.)
    _seed_all(derive_seed(run.seed, "train", seq.data_rank))
    step = epoch = batch_in_epoch = 0
    best_accuracy: float | None = None
    if state is not None:
        if state["steps_per_epoch"] != steps_per_epoch:
            raise ConfigError(
                f"cannot resume from {existing}: it has {state['steps_per_epoch']} steps per "
                f"epoch, this data gives {steps_per_epoch}"
            )
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step, epoch, batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        best_accuracy = state.get("best_accuracy")
        rng = state["rng"]
        if len(rng) == dist_info.world_size:
            restore_rng(rng[dist_info.rank])
        else:
            warnings.warn(
                f"the checkpoint holds random states of {len(rng)} processes, this run has "
                f"{dist_info.world_size}: reseeding (the run continues, not bitwise)",
                stacklevel=2,
            )
            _seed_all(derive_seed(run.seed, "train", seq.data_rank, step))

    net: nn.Module = model
    if dist_info.enabled:
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    amp_dtype = _amp_dtype(run.amp, device)

    metrics = MetricsLogger(out_dir, enabled=dist_info.is_main, tensorboard=run.tensorboard)
    if dist_info.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        if existing is None:
            metrics.path.unlink(missing_ok=True)
        else:
            metrics.truncate_after(step)
        write_atomic(
            out_dir / CONFIG_FILE,
            (json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n").encode(),
        )
    metrics.log(
        "start",
        step,
        world_size=dist_info.world_size,
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        parameters=sum(p.numel() for p in model.parameters()),
        device=str(device),
        amp=str(amp_dtype).replace("torch.", "") if amp_dtype else "off",
        python=platform.python_version(),
        torch=torch.__version__,
        resumed_from=step if existing is not None else None,
        model=model.config.to_dict(),
        config=config.to_dict(),
    )
    progress = Progress(stop_at, step, enabled=run.progress and dist_info.is_main)

    def say(text: str) -> None:
        if dist_info.is_main:
            progress.write(text)

    def run_eval(split_name: str, dataset: Dataset) -> dict[str, Any]:
        result = evaluate(
            model,
            dataset,
            spec,
            batch_size=data.eval_batch_size or data.batch_size,
            device=device,
            amp_dtype=amp_dtype,
            dist_info=dist_info,
            num_workers=data.num_workers,
            pad_to_multiple=data.pad_to_multiple,
            sequence=seq,
        )
        metrics.log("eval", step, epoch=epoch, split=split_name, **result)
        bpb = f" bits/byte {result['bits_per_byte']:.3f}" if "bits_per_byte" in result else ""
        say(
            f"step {step} epoch {epoch}: {split_name} accuracy {result['accuracy']:.4f} "
            f"loss {result['loss']:.4f}{bpb} ({result['samples']} samples)"
        )
        return result

    def log_baselines(split_name: str, dataset: Dataset) -> None:
        counts = byte_baselines(spec, train_set, dataset)
        if counts is None:
            return
        metrics.log("baseline", step, split=split_name, **counts)
        say(
            f"{split_name} count baselines: unigram {counts['unigram_bpb']:.3f}, bigram "
            f"{counts['bigram_bpb']:.3f} bits/byte (a model must beat the bigram)"
        )

    def checkpoint() -> Path:
        rng = dist_info.all_gather_object(capture_rng())
        train_state = {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "step": step,
            "epoch": epoch,
            "batch_in_epoch": batch_in_epoch,
            "steps_per_epoch": steps_per_epoch,
            "world_size": dist_info.world_size,
            "best_accuracy": best_accuracy,
            "rng": rng,
            # the train records' averaging window, so that a resumed run logs the same
            # means as an uninterrupted one (throughput excepted)
            "log_window": {
                **{k: window[k] for k in ("loss", "steps", "samples", "tokens")},
                "elapsed": time.perf_counter() - window["start"],
            },
        }
        path = out_dir / "checkpoints" / f"step-{step:08d}"
        if dist_info.is_main:
            # The record goes first and is fsynced with the log: a crash after `latest` moves
            # cannot lose it, and one before leaves it past the resumed step, where the
            # resume's truncate_after drops it.
            metrics.log("checkpoint", step, path=str(path))
            metrics.sync()
            path = save_checkpoint(
                out_dir,
                step=step,
                model=model,
                state=train_state,
                config=config.to_dict(),
                keep=run.keep_checkpoints,
            )
            kill_hook("checkpoint-done", step)
        dist_info.barrier()
        return path

    window: dict[str, Any] = {}
    grad_norm: torch.Tensor | None = None

    def reset_window() -> None:
        window.update(loss=0.0, steps=0, samples=0, tokens=0, start=time.perf_counter())

    def log_train(lr: float) -> None:
        """One train record: the mean loss of the steps since the previous one."""
        elapsed = max(time.perf_counter() - window["start"], 1e-9)
        record = {
            "epoch": epoch,
            "loss": window["loss"] / window["steps"],
            "lr": lr,
            "grad_norm": None if grad_norm is None else float(grad_norm),
            "samples_per_s": round(window["samples"] / elapsed, 2),
        }
        if kind.takes_tokens:
            record["tokens_per_s"] = round(window["tokens"] / elapsed, 1)
        metrics.log("train", step, **record)
        progress.update(
            0,
            loss=f"{record['loss']:.4f}",
            lr=f"{lr:.2e}",
            samples_s=f"{record['samples_per_s']:.0f}",
        )
        reset_window()

    losses: list[float] = []
    last_checkpoint = existing
    checkpoint_step = step if existing is not None else None
    last_eval: dict[str, Any] | None = None
    reset_window()
    if state is not None and "log_window" in state:
        saved = dict(state["log_window"])
        window.update(saved, start=time.perf_counter() - saved.pop("elapsed"))
    lr = optimizer.param_groups[0]["lr"]
    collate = spec.collate(data.pad_to_multiple)
    if existing is None:
        log_baselines(data.eval_split, eval_set)
    try:
        while step < stop_at:
            sampler.set_epoch(epoch, batch_in_epoch)
            loader = DataLoader(
                train_set,
                batch_sampler=sampler,
                collate_fn=collate,
                num_workers=data.num_workers,
                pin_memory=device.type == "cuda",
                generator=torch.Generator().manual_seed(
                    derive_seed(run.seed, "workers", epoch, batch_in_epoch)
                ),
            )
            net.train()
            for batch in loader:
                inputs, labels, tokens = kind.unpack(batch, device)
                inputs, kwargs, labels = shard_sequence(inputs, labels, seq)
                previous_lr, lr = lr, optimizer.param_groups[0]["lr"]
                with _autocast(device, amp_dtype):
                    logits = net(*inputs, **kwargs)
                loss_sum, _, scored = kind.losses(logits, labels)
                if seq.size > 1:
                    # The group's mean over all its targets, times the group size: DDP
                    # averages gradients over every process, and the slices' gradients
                    # must add up within a group.
                    scored = scored.detach().clone()
                    torch.distributed.all_reduce(scored, group=seq.group)
                    loss = loss_sum / scored.clamp(min=1) * seq.size
                else:
                    loss = loss_sum / scored.clamp(min=1)
                global_loss = dist_info.all_reduce_sum(loss.detach().clone())
                value = global_loss.item() / dist_info.world_size
                if not math.isfinite(value):
                    if window["steps"]:
                        log_train(previous_lr)
                    raise _nonfinite(metrics, step, epoch, value, last_checkpoint)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if optim.grad_clip is not None:
                    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
                optimizer.step()
                scheduler.step()
                step += 1
                batch_in_epoch += 1
                losses.append(value)
                window["loss"] += value
                window["steps"] += 1
                window["samples"] += len(labels) * seq.data_world
                if tokens is not None:
                    window["tokens"] += int(tokens) * dist_info.world_size
                epoch_end = batch_in_epoch == steps_per_epoch
                if epoch_end:
                    epoch, batch_in_epoch = epoch + 1, 0
                if step % run.log_every == 0 or epoch_end or step == stop_at:
                    log_train(lr)
                progress.update(1)
                if epoch_end or (run.eval_every and step % run.eval_every == 0):
                    last_eval = run_eval(data.eval_split, eval_set)
                    if best_accuracy is None or last_eval["accuracy"] > best_accuracy:
                        best_accuracy = last_eval["accuracy"]
                if (
                    epoch_end
                    or (run.checkpoint_every and step % run.checkpoint_every == 0)
                    or step == stop_at
                ):
                    last_checkpoint, checkpoint_step = checkpoint(), step
                kill_hook("step", step)
                if step >= stop_at:
                    break
        if checkpoint_step != step:
            last_checkpoint, checkpoint_step = checkpoint(), step
        test_result = None
        if data.test_split is not None and step == total_steps:
            test_set = _build_split(config, spec, data.test_split)
            log_baselines(data.test_split, test_set)
            test_result = run_eval(data.test_split, test_set)
        metrics.log("end", step, epoch=epoch, best_accuracy=best_accuracy)
    finally:
        progress.close()
        metrics.close()
    return TrainResult(
        out_dir=out_dir,
        step=step,
        epoch=epoch,
        checkpoint=last_checkpoint,
        losses=losses,
        eval=last_eval,
        test=test_result,
        best_accuracy=best_accuracy,
    )


def _sequence_parallel(
    model: nn.Module, spec: TaskSpec, size: int, dist_info: Dist
) -> SequenceGroup:
    """Make the model's kernels sequence-parallel when ``run.sequence_parallel`` > 1."""
    if size > 1 and not spec.behaviour.causal_lm:
        raise ConfigError(
            f"run.sequence_parallel needs a causal language-model task (kind 'lm'); task "
            f"{spec.name!r} is kind {spec.kind!r}"
        )
    try:
        seq = sequence_group(dist_info, size)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if seq.size > 1:
        from ..distributed import convert_sequence_parallel

        try:
            convert_sequence_parallel(model, seq.group)
        except ValueError as err:
            raise ConfigError(f"run.sequence_parallel: {err}") from None
    return seq


def _nonfinite(metrics, step: int, epoch: int, value: float, checkpoint) -> NonFiniteLossError:
    where = (
        f"the last good checkpoint is {checkpoint}"
        if checkpoint is not None
        else "no checkpoint was written yet"
    )
    message = (
        f"the loss is {value} at step {step + 1} (epoch {epoch}): stopped without taking that "
        f"step; {where}. Lower optim.lr, set optim.grad_clip or run.amp=off, then continue "
        f"with --resume"
    )
    metrics.log("nonfinite", step + 1, epoch=epoch, loss=str(value), message=message)
    return NonFiniteLossError(message, step + 1, epoch, value, checkpoint)
