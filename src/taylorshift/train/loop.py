"""The training loop: :func:`train` a config, run by a :class:`Trainer` whose progress is a
:class:`~taylorshift.train.state.TrainState` (the model and splits a config builds are in
``build.py``, evaluation in ``evaluate.py``, what depends on the task's kind in
``taylorshift.data.kinds``).

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
import inspect
import json
import math
import platform
import random
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..atomic import write_atomic
from ..data import TaskSpec, get_task
from ..models import create_model
from ..nn.kernels import TaylorShiftKernel
from .build import _build_split, _setting, build_model
from .checkpoint import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    capture_rng,
    kill_hook,
    load_checkpoint_model,
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
from .state import MetricsWindow, TrainState
from .stop import StopRequests, TrainingStopped, ignore_stop_signals

__all__ = [
    "NonFiniteLossError",
    "TrainResult",
    "Trainer",
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
        # a run of an older version may have recorded a relative data path: taken against
        # this folder, as that version did
        saved = TrainConfig.from_dict(read_config(checkpoint)).with_absolute_data_paths()
    except ConfigError as err:
        message = f"cannot resume from {checkpoint}: its config is unreadable: {err}"
        raise ConfigError(message) from None
    diffs = _with_kernel_named(saved).differences(_with_kernel_named(config), ignore=RUNTIME_KEYS)
    if diffs:
        raise ConfigError(
            f"cannot resume from {checkpoint}: the config differs in "
            f"{'; '.join(diffs)} (checkpoint's value first). Resume with the run's own "
            f"settings (its config.json), or start a new run in another run.out_dir"
        )


def _with_kernel_named(config: TrainConfig) -> TrainConfig:
    """``config`` with ``model.kernel`` None (the model's own) and, for TaylorShift,
    ``model.mode`` None (the kernel options' own) spelled out, so that resuming with
    ``--kernel`` or ``--mode`` naming what the run already used is the same run."""
    m = config.model
    if m.kernel is not None and (m.kernel != "taylorshift" or m.mode is not None):
        return config
    try:
        probe = create_model(m.name, device="meta", **m.overrides).config
    except (TypeError, ValueError):  # (a bad setting: the build reports it by name later)
        return config
    kernel = m.kernel or probe.attn_kernel
    named = {"model.kernel": kernel}
    if kernel == "taylorshift" and m.mode is None:
        options = {**probe.kernel_args, **m.kernel_args.get(kernel, {})}
        default = inspect.signature(TaylorShiftKernel).parameters["mode"].default
        named["model.mode"] = options.get("mode", default)
    return config.replace(**named)


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
        TrainingStopped: SIGTERM came (to any process of the job); the run stopped after the
            step it came in (or the next: it is read with the step's loss), with a
            checkpoint of that step (``--resume`` continues).
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
            return Trainer(config, resume=resume, dist_info=dist_info, device=device).run()
        except RuntimeError as err:
            if dist_info.enabled and timed_out(err):
                raise _collective_timeout(dist_info, config.run.collective_timeout_s) from err
            raise
        finally:
            lock.__exit__(None, None, None)
    finally:
        dist_info.shutdown()


def learned_temperatures(model: nn.Module) -> list[list[float]]:
    """τ of every TaylorShift layer of ``model`` (normalised form), one list of heads per
    layer in module order: what the eval records carry, to see how sharp the heads grew."""
    return [
        [round(float(t), 4) for t in kernel.tau.detach().flatten()]
        for kernel in model.modules()
        if isinstance(kernel, TaylorShiftKernel) and kernel.normalize
    ]


class Trainer:
    """One call of :func:`train` on one process: a run's objects, built from its config and
    the checkpoint it resumes, and the loop over them.

    Constructing it checks the run folder, reads the checkpoint to resume (``resume``),
    builds the splits, the model, the optimizer, the schedule and the batch sampler, and
    restores the :class:`TrainState` and the random states; :meth:`run` then trains (call
    it once). The progress a checkpoint keeps is ``state``; what a call reports but a
    checkpoint does not keep (its losses, the last evaluation and checkpoint) are
    attributes of the trainer.

    Args:
        config: the run.
        resume: continue from the latest intact checkpoint in ``run.out_dir`` if any.
        dist_info: the processes of the job (``train/distributed.py``).
        device: this process's device.

    Attributes:
        spec, kind: the task and its :class:`~taylorshift.data.kinds.TaskKind`.
        model: the model; ``net`` is the module trained (``model``, or its DDP wrapper).
        state: the :class:`TrainState`.
        steps_per_epoch, total_steps: of the whole run; ``stop_at``: the step this call
            stops at (``run.max_steps`` or ``total_steps``).
        resumed_from: the checkpoint resumed from, or None.
        losses: the global loss of every step this call took.
        last_eval: the last evaluation of ``data.eval_split`` (None before the first).
        last_checkpoint, checkpoint_step: the last checkpoint written (or resumed from) and
            its step.
    """

    def __init__(
        self, config: TrainConfig, *, resume: bool, dist_info: Dist, device: torch.device
    ) -> None:
        config = config.with_absolute_data_paths()  # eval, --resume: from any folder
        run, data, optim = config.run, config.data, config.optim
        self.config, self.dist_info, self.device = config, dist_info, device
        if run.threads is not None:
            torch.set_num_threads(run.threads)
        self.out_dir = Path(run.out_dir)
        if not resume and (self.out_dir / CHECKPOINT_DIR / "latest").exists():
            raise FileExistsError(
                f"{self.out_dir} holds checkpoints already; pass --resume to continue that "
                f"run, or choose another run.out_dir"
            )
        # The checkpoint `latest` names, verified; a damaged one is skipped for the newest
        # intact kept one, said in a warning (train/checkpoint.py).
        existing, skipped = resumable_checkpoint(self.out_dir) if resume else (None, None)
        if skipped and dist_info.is_main:
            warnings.warn(skipped, stacklevel=2)
        saved = None
        if existing is not None:
            _check_resume(config, existing)
            saved = load_state(existing)
        self.resumed_from: Path | None = existing

        self.spec = spec = _setting("data.task", get_task, data.task)
        self.kind = spec.behaviour
        where = f"data (task {data.task!r})"
        self.train_set = _setting(where, _build_split, config, spec, "train")
        self.eval_set = _setting(where, _build_split, config, spec, data.eval_split)
        # the test split too, so that a missing or bad one stops the run before any step
        self.test_set = None
        if data.test_split is not None:
            self.test_set = _setting(where, _build_split, config, spec, data.test_split)
        num_classes = spec.num_classes or getattr(self.train_set, "num_classes", None)
        vocab_size = getattr(self.train_set, "vocab_size", None)

        _seed_all(run.seed)
        self.model = build_model(config, spec, num_classes, vocab_size=vocab_size).to(device)
        if existing is not None:
            load_checkpoint_model(existing, into=self.model)
        self.seq = _sequence_parallel(self.model, spec, run.sequence_parallel, dist_info)
        self.optimizer = build_optimizer(self.model, optim)
        self.sampler = _setting(
            "data.batch_size", ShardedBatchSampler,
            len(self.train_set), data.batch_size, run.seed, self.seq.data_rank,
            self.seq.data_world,
        )  # fmt: skip
        self.steps_per_epoch = self.sampler.batches_per_epoch()
        self.scheduler = build_scheduler(self.optimizer, optim, self.steps_per_epoch)
        self.total_steps = optim.epochs * self.steps_per_epoch
        self.stop_at = min(self.total_steps, run.max_steps) if run.max_steps else self.total_steps

        # Training randomness (drop path, dropout) differs between processes.
        # (The processes of one sequence-parallel group draw alike: drop path must drop the
        # same samples on every slice.)
        _seed_all(derive_seed(run.seed, "train", self.seq.data_rank))
        self.state = TrainState()
        if saved is not None:
            self._restore(saved)

        self.net: nn.Module = self.model
        if dist_info.enabled:
            self.net = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[device.index] if device.type == "cuda" else None
            )
        self.amp_dtype = _amp_dtype(run.amp, device)

        self.losses: list[float] = []
        self.last_eval: dict[str, Any] | None = None
        self.last_checkpoint = existing
        self.checkpoint_step = self.state.step if existing is not None else None
        self.stop_requests = StopRequests()
        self.grad_norm: torch.Tensor | None = None  # of the last step, with optim.grad_clip
        self.lr = self.optimizer.param_groups[0]["lr"]  # of the last step taken
        self.metrics = MetricsLogger(self.out_dir, enabled=False)  # opened by run()
        self.progress = Progress(self.stop_at, self.state.step, enabled=False)

    def _restore(self, saved: dict[str, Any]) -> None:
        """Optimizer, schedule, :class:`TrainState` and random states of a checkpoint."""
        if saved["steps_per_epoch"] != self.steps_per_epoch:
            raise ConfigError(
                f"cannot resume from {self.resumed_from}: it has {saved['steps_per_epoch']} "
                f"steps per epoch, this data gives {self.steps_per_epoch}"
            )
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.state = TrainState.from_dict(saved)
        rng, dist_info = saved["rng"], self.dist_info
        if len(rng) == dist_info.world_size:
            restore_rng(rng[dist_info.rank])
        else:
            warnings.warn(
                f"the checkpoint holds random states of {len(rng)} processes, this run has "
                f"{dist_info.world_size}: reseeding (the run continues, not bitwise)",
                stacklevel=3,
            )
            seed = derive_seed(self.config.run.seed, "train", self.seq.data_rank, self.state.step)
            _seed_all(seed)

    def run(self) -> TrainResult:
        """Train to ``stop_at``, evaluating, logging and checkpointing on the way, then
        evaluate ``data.test_split`` if the run reached its last step."""
        run, data, is_main = self.config.run, self.config.data, self.dist_info.is_main
        self.metrics = MetricsLogger(self.out_dir, enabled=is_main, tensorboard=run.tensorboard)
        try:
            self.stop_requests.__enter__()
            self._log_start()
            self.state.window.restart_clock()
            self.progress = Progress(
                self.stop_at, self.state.step, enabled=run.progress and is_main
            )
            if self.resumed_from is None:
                self.log_baselines(data.eval_split, self.eval_set)
            while self.state.step < self.stop_at:
                self._run_epoch()
            if self.checkpoint_step != self.state.step:
                self.checkpoint()
            test_result = None
            if data.test_split is not None and self.state.step == self.total_steps:
                self.log_baselines(data.test_split, self.test_set)
                test_result = self.evaluate_split(data.test_split, self.test_set)
            self.metrics.log(
                "end", self.state.step, epoch=self.state.epoch,
                best_accuracy=self.state.best_accuracy,
            )  # fmt: skip
        finally:
            self.stop_requests.__exit__()
            self.progress.close()
            self.metrics.close()
        return TrainResult(
            out_dir=self.out_dir,
            step=self.state.step,
            epoch=self.state.epoch,
            checkpoint=self.last_checkpoint,
            losses=self.losses,
            eval=self.last_eval,
            test=test_result,
            best_accuracy=self.state.best_accuracy,
        )

    def _log_start(self) -> None:
        """Prepare the run folder (config.json; a fresh or truncated metrics log) and log
        the ``start`` record."""
        config, dist_info, model, step = self.config, self.dist_info, self.model, self.state.step
        if dist_info.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            if self.resumed_from is None:
                self.metrics.path.unlink(missing_ok=True)
            else:
                self.metrics.truncate_after(step)
            write_atomic(
                self.out_dir / CONFIG_FILE,
                (json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n").encode(),
            )
        amp_dtype = self.amp_dtype
        self.metrics.log(
            "start",
            step,
            world_size=dist_info.world_size,
            steps_per_epoch=self.steps_per_epoch,
            total_steps=self.total_steps,
            parameters=sum(p.numel() for p in model.parameters()),
            device=str(self.device),
            amp=str(amp_dtype).replace("torch.", "") if amp_dtype else "off",
            python=platform.python_version(),
            torch=torch.__version__,
            resumed_from=step if self.resumed_from is not None else None,
            model=model.config.to_dict(),
            config=config.to_dict(),
        )

    def _run_epoch(self) -> None:
        """The rest of the current epoch, or of the run if it stops first."""
        state, run, data = self.state, self.config.run, self.config.data
        self.sampler.set_epoch(state.epoch, state.batch_in_epoch)
        loader = DataLoader(
            self.train_set,
            batch_sampler=self.sampler,
            collate_fn=self.spec.collate(data.pad_to_multiple),
            num_workers=data.num_workers,
            pin_memory=self.device.type == "cuda",
            worker_init_fn=ignore_stop_signals,
            generator=torch.Generator().manual_seed(
                derive_seed(run.seed, "workers", state.epoch, state.batch_in_epoch)
            ),
        )
        self.net.train()
        for batch in loader:
            self._step(batch)
            if state.step >= self.stop_at:
                break

    def _step(self, batch) -> None:
        """One optimizer step on ``batch``, then the logging, evaluation and checkpoint due."""
        state, seq, dist_info = self.state, self.seq, self.dist_info
        inputs, labels, tokens = self.kind.unpack(batch, self.device)
        inputs, kwargs, labels = shard_sequence(inputs, labels, seq)
        previous_lr, self.lr = self.lr, self.optimizer.param_groups[0]["lr"]
        with _autocast(self.device, self.amp_dtype):
            logits = self.net(*inputs, **kwargs)
        loss_sum, _, scored = self.kind.losses(logits, labels)
        if seq.size > 1:
            # The group's mean over all its targets, times the group size: DDP averages
            # gradients over every process, and the slices' gradients must add up within
            # a group.
            scored = scored.detach().clone()
            torch.distributed.all_reduce(scored, group=seq.group)
            loss = loss_sum / scored.clamp(min=1) * seq.size
        else:
            loss = loss_sum / scored.clamp(min=1)
        # the loss and the stop requests (stop.py) summed over the processes in one call
        asked = 0.0 if self.stop_requests.received is None else 1.0
        total, stops = dist_info.all_reduce_sum(
            torch.stack([loss.detach(), loss.new_tensor(asked)])
        ).tolist()
        value = total / dist_info.world_size
        if not math.isfinite(value):
            if state.window.steps:
                self._log_train(previous_lr)
            raise _nonfinite(self.metrics, state.step, state.epoch, value, self.last_checkpoint)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_clip = self.config.optim.grad_clip
        if grad_clip is not None:
            self.grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        epoch_end = state.advance(self.steps_per_epoch)
        self.losses.append(value)
        real_tokens = None if tokens is None else int(tokens) * dist_info.world_size
        state.window.add(value, len(labels) * seq.data_world, real_tokens)
        self._after_step(epoch_end)
        if stops and state.step < self.stop_at:
            self._stop()

    def _stop(self) -> None:
        """Checkpoint this step (unless just done) and stop the run: ``TrainingStopped``.

        The train record of the steps since the last one comes after the checkpoint, which
        keeps them in its window: a resume drops the record (``truncate_after``) and logs
        those steps where an uninterrupted run does."""
        state = self.state
        if self.checkpoint_step != state.step:
            self.checkpoint()
        if state.window.steps:
            self._log_train(self.lr)
        self.metrics.log("stopped", state.step, signal=self.stop_requests.signal_name)
        raise TrainingStopped(state.step, self.last_checkpoint, self.stop_requests.signal_name)

    def _after_step(self, epoch_end: bool) -> None:
        """The train record, evaluation and checkpoint due after a step."""
        state, run, step = self.state, self.config.run, self.state.step
        due = step % run.log_every == 0 or epoch_end or step == self.total_steps
        if due:
            self._log_train(self.lr)
        self.progress.update(1)
        if epoch_end or (run.eval_every and step % run.eval_every == 0):
            self.last_eval = self.evaluate_split(self.config.data.eval_split, self.eval_set)
            state.record_accuracy(self.last_eval["accuracy"])
        if (
            epoch_end
            or (run.checkpoint_every and step % run.checkpoint_every == 0)
            or step == self.stop_at
        ):
            self.checkpoint()
        if step == self.stop_at and not due:
            # run.max_steps stops here: the steps since the last record, logged after the
            # checkpoint as when a signal stops the run (see _stop)
            self._log_train(self.lr)
        kill_hook("step", step)

    def _log_train(self, lr: float) -> None:
        """One train record, the mean loss of the steps since the previous one; a new
        window."""
        state, window = self.state, self.state.window
        elapsed = max(window.elapsed(), 1e-9)
        grad_norm = self.grad_norm
        record = {
            "epoch": state.epoch,
            "loss": window.loss / window.steps,
            "lr": lr,
            "grad_norm": None if grad_norm is None else float(grad_norm),
            "samples_per_s": round(window.samples / elapsed, 2),
        }
        if self.kind.takes_tokens:
            record["tokens_per_s"] = round(window.tokens / elapsed, 1)
        self.metrics.log("train", state.step, **record)
        self.progress.update(
            0,
            loss=f"{record['loss']:.4f}",
            lr=f"{lr:.2e}",
            samples_s=f"{record['samples_per_s']:.0f}",
        )
        state.window = MetricsWindow()

    def _say(self, text: str) -> None:
        if self.dist_info.is_main:
            self.progress.write(text)

    def evaluate_split(self, split_name: str, dataset: Dataset) -> dict[str, Any]:
        """:func:`evaluate` the model on ``dataset`` (of split ``split_name``), logged."""
        data, state = self.config.data, self.state
        result = evaluate(
            self.model,
            dataset,
            self.spec,
            batch_size=data.eval_batch_size or data.batch_size,
            device=self.device,
            amp_dtype=self.amp_dtype,
            dist_info=self.dist_info,
            num_workers=data.num_workers,
            pad_to_multiple=data.pad_to_multiple,
            sequence=self.seq,
        )
        taus = learned_temperatures(self.model)
        extra = {"temperatures": taus} if taus else {}
        self.metrics.log("eval", state.step, epoch=state.epoch, split=split_name, **result, **extra)
        bpb = f" bits/byte {result['bits_per_byte']:.3f}" if "bits_per_byte" in result else ""
        self._say(
            f"step {state.step} epoch {state.epoch}: {split_name} accuracy "
            f"{result['accuracy']:.4f} loss {result['loss']:.4f}{bpb} "
            f"({result['samples']} {'target tokens' if self.kind.per_token else 'samples'})"
        )
        return result

    def log_baselines(self, split_name: str, dataset: Dataset) -> None:
        """Log the count baselines of ``dataset`` (byte tasks; nothing otherwise)."""
        counts = byte_baselines(self.spec, self.train_set, dataset)
        if counts is None:
            return
        self.metrics.log("baseline", self.state.step, split=split_name, **counts)
        self._say(
            f"{split_name} count baselines: unigram {counts['unigram_bpb']:.3f}, bigram "
            f"{counts['bigram_bpb']:.3f} bits/byte (a model must beat the bigram)"
        )

    def checkpoint(self) -> Path:
        """Save a checkpoint of this step (every process takes part); its folder."""
        dist_info, state = self.dist_info, self.state
        rng = dist_info.all_gather_object(capture_rng())
        train_state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "steps_per_epoch": self.steps_per_epoch,
            "world_size": dist_info.world_size,
            "rng": rng,
            **state.to_dict(),
        }
        path = self.out_dir / CHECKPOINT_DIR / f"step-{state.step:08d}"
        if dist_info.is_main:
            # The record goes first and is fsynced with the log: a crash after `latest`
            # moves cannot lose it, and one before leaves it past the resumed step, where
            # the resume's truncate_after drops it.
            self.metrics.log("checkpoint", state.step, path=str(path))
            self.metrics.sync()
            path = save_checkpoint(
                self.out_dir,
                step=state.step,
                model=self.model,
                state=train_state,
                config=self.config.to_dict(),
                keep=self.config.run.keep_checkpoints,
            )
            kill_hook("checkpoint-done", state.step)
        dist_info.barrier()
        self.last_checkpoint, self.checkpoint_step = path, state.step
        return path


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
