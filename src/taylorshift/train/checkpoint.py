"""Checkpoints that lose nothing, written so that a crash at any moment leaves a good one.

Layout under ``<out_dir>/checkpoints/``::

    latest                  the name of the newest complete checkpoint, e.g. "step-00000384"
    step-00000384/
        model.safetensors   weights and model config (``taylorshift.models.save_model``)
        state.pt            optimizer, scheduler, progress, every RNG state (torch.save)
        config.json         the TrainConfig of the run
        checksums.json      SHA-256 of each file above, taken when it was written

Writing: all files go into a fresh hidden folder ``.tmp-step-...`` (each file flushed and
fsynced, then the folder), the folder is renamed to ``step-...``, and only then is
``latest`` replaced by a new file (written to a temporary name, fsynced, ``os.replace``).
A crash before that replace leaves ``latest`` on the previous checkpoint, whose files are
untouched; leftovers are removed by the next save. Readers follow ``latest`` only.

Reading verifies: ``verify_checkpoint`` compares every file with its recorded SHA-256 and
raises :class:`DamagedCheckpointError` naming the file (a flipped bit in the weights or
the optimizer state would otherwise load silently). ``resumable_checkpoint`` is what a
resume uses: the checkpoint ``latest`` names if it is intact, else the newest intact kept
one, with a note saying which was skipped and why. Checkpoints written before checksums
existed (no ``checksums.json``) are read unverified.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..atomic import fsync_path, interrupts_deferred, write_atomic
from ..models import load_model, load_weights, save_model

__all__ = [
    "CHECKPOINT_DIR",
    "KILL_ENV",
    "DamagedCheckpointError",
    "capture_rng",
    "find_checkpoint",
    "kill_hook",
    "latest_checkpoint",
    "load_state",
    "restore_rng",
    "resumable_checkpoint",
    "save_checkpoint",
    "verify_checkpoint",
]

CHECKPOINT_DIR = "checkpoints"
LATEST = "latest"
MODEL_FILE, STATE_FILE, CONFIG_FILE = "model.safetensors", "state.pt", "config.json"
CHECKSUM_FILE = "checksums.json"
STATE_VERSION = 1

#: Test hook: ``"<point>:<step>"`` makes the process SIGKILL itself at that point of that
#: step. Points: ``step`` (after the step and its logging/checkpointing),
#: ``checkpoint-files`` (checkpoint files written, folder not yet renamed),
#: ``checkpoint-pointer`` (folder renamed, ``latest`` not yet replaced) and
#: ``checkpoint-done`` (``latest`` replaced, the run not yet going on).
KILL_ENV = "TAYLORSHIFT_TRAIN_KILL_AT"


def kill_hook(point: str, step: int) -> None:
    """SIGKILL this process if ``KILL_ENV`` names ``point`` at ``step`` (tests only).

    ``"<point>:<step>@<rank>"`` applies to that rank only, ``"...@<rank>/freeze:<s>"``
    makes that rank stop answering (sleep ``s`` seconds) instead of dying, and ``".../term"``
    sends it SIGTERM (a stop on request, train/stop.py).
    """
    value = os.environ.get(KILL_ENV)
    if not value:
        return
    target, _, action = value.partition("/")
    where, _, rank = target.partition("@")
    if where != f"{point}:{step}" or (rank and rank != os.environ.get("RANK", "0")):
        return
    if action.startswith("freeze:"):
        # (SIGTERM still ends the frozen process at once, as a launcher stopping the job
        # sends it, rather than being noted by train/stop.py for a step that never ends)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        time.sleep(float(action.removeprefix("freeze:")))
        return
    os.kill(os.getpid(), signal.SIGTERM if action == "term" else signal.SIGKILL)


def capture_rng() -> dict[str, Any]:
    """Every random state this process uses: Python ``random``, NumPy (if installed), torch
    CPU and, if CUDA is initialised, every CUDA device."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is optional
        pass
    else:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (name, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back the random states of :func:`capture_rng`."""
    random.setstate(_as_tuples(state["python"]))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        try:
            import numpy as np
        except ImportError:  # pragma: no cover
            pass
        else:
            name, keys, pos, has_gauss, cached = state["numpy"]
            np.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        states = state["cuda"]
        for index in range(min(len(states), torch.cuda.device_count())):
            torch.cuda.set_rng_state(states[index], index)


def _as_tuples(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuples(v) for v in value)
    return value


def _step_name(step: int) -> str:
    return f"step-{step:08d}"


@interrupts_deferred()
def save_checkpoint(
    out_dir: str | os.PathLike,
    *,
    step: int,
    model: nn.Module,
    state: dict[str, Any],
    config: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write checkpoint ``step`` under ``out_dir/checkpoints`` and point ``latest`` at it.

    Args:
        out_dir: the run folder.
        step: optimizer steps done; names the checkpoint folder.
        model: the bare model (not a DDP wrapper).
        state: everything else to restore (optimizer, scheduler, progress, RNG states).
        config: the run's config as a dict (written as ``config.json``).
        keep: how many checkpoints to keep (the newest ones).

    Returns:
        the checkpoint folder.

    A Ctrl-C while it writes takes effect when the checkpoint is complete
    (``interrupts_deferred``): the run stops with this step saved and ``latest`` on it.
    """
    root = Path(out_dir) / CHECKPOINT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / _step_name(step)
    tmp = root / f".tmp-{final.name}-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        save_model(model, tmp / MODEL_FILE)
        with open(tmp / STATE_FILE, "wb") as f:
            torch.save({"version": STATE_VERSION, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        with open(tmp / CONFIG_FILE, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        fsync_path(tmp / MODEL_FILE)
        sums = {name: _sha256(tmp / name) for name in (MODEL_FILE, STATE_FILE, CONFIG_FILE)}
        with open(tmp / CHECKSUM_FILE, "w", encoding="utf-8") as f:
            json.dump({"sha256": sums}, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        fsync_path(tmp)
        kill_hook("checkpoint-files", step)
        if final.exists():  # left by a crash between rename and pointer: never `latest`
            shutil.rmtree(final)
        os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    fsync_path(root)
    kill_hook("checkpoint-pointer", step)
    write_atomic(root / LATEST, (final.name + "\n").encode())
    _prune(root, keep)
    return final


class DamagedCheckpointError(ValueError):
    """A checkpoint file differs from the checksum recorded when it was written."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_checkpoint(folder: str | os.PathLike) -> Path:
    """``folder`` if each of its files matches its recorded SHA-256 (or none is recorded);
    else :class:`DamagedCheckpointError` naming the first file that does not."""
    folder = Path(folder)
    record = folder / CHECKSUM_FILE
    if not record.is_file():
        return folder  # written before checksums existed
    try:
        sums = json.loads(record.read_text(encoding="utf-8"))["sha256"]
        items = sorted(sums.items())
    except (ValueError, KeyError, TypeError, AttributeError):
        raise DamagedCheckpointError(f"{record} is unreadable: the checkpoint is damaged") from None
    for name, expected in items:
        path = folder / name
        if not path.is_file():
            raise DamagedCheckpointError(f"{path} is missing: the checkpoint is damaged")
        if _sha256(path) != expected:
            raise DamagedCheckpointError(
                f"{path} differs from the checksum recorded when it was written: the "
                f"checkpoint is damaged"
            )
    return folder


def resumable_checkpoint(out_dir: str | os.PathLike) -> tuple[Path | None, str | None]:
    """(the checkpoint to resume from, a note on any checkpoint skipped): the one ``latest``
    names if it is intact, else the newest intact kept one; (None, None) without any.

    Raises:
        DamagedCheckpointError: checkpoints exist but none of them is intact.
    """
    root = Path(out_dir) / CHECKPOINT_DIR
    problems = []
    current = None
    try:
        current = latest_checkpoint(out_dir)
        if current is None:  # no checkpoint was completed (folders without ``latest`` are
            return None, None  # a crash's leftovers, as for ``latest_checkpoint``)
        return verify_checkpoint(current), None
    except (OSError, ValueError) as err:  # unreadable ``latest``, or a damaged checkpoint
        problems.append(str(err))
    candidates = sorted((p for p in root.glob("step-*") if p.is_dir()), reverse=True)
    for folder in candidates:
        if folder == current:  # (found damaged above: said once)
            continue
        if not (folder / STATE_FILE).is_file() or not (folder / MODEL_FILE).is_file():
            continue
        try:
            verify_checkpoint(folder)
        except DamagedCheckpointError as err:
            problems.append(str(err))
            continue
        return folder, f"{'; '.join(problems)}; resuming from {folder.name} instead"
    raise DamagedCheckpointError(f"no intact checkpoint in {root}: {'; '.join(problems)}")


def _prune(root: Path, keep: int) -> None:
    """Remove temporary folders and all but the ``keep`` newest checkpoints up to ``latest``."""
    current = latest_checkpoint(root.parent)
    for path in root.glob(".tmp-*"):
        shutil.rmtree(path, ignore_errors=True)
    if current is None:
        return
    steps = sorted(p for p in root.glob("step-*") if p.is_dir())
    newer = [p for p in steps if p.name > current.name]
    kept = [p for p in steps if p.name <= current.name][-keep:]
    for path in steps:
        if path in newer or path not in kept:
            shutil.rmtree(path, ignore_errors=True)


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The checkpoint folder that ``out_dir/checkpoints/latest`` names, or None."""
    pointer = Path(out_dir) / CHECKPOINT_DIR / LATEST
    if not pointer.is_file():
        return None
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError(f"{pointer} must name a checkpoint folder; it is not text") from None
    path = pointer.parent / name
    if not name or not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"{pointer} names {name!r}, which is not a complete checkpoint")
    return path


def find_checkpoint(path: str | os.PathLike) -> Path:
    """The checkpoint folder meant by ``path``: a run folder (its latest checkpoint), a
    ``checkpoints`` folder, a checkpoint folder, or a file inside one."""
    path = Path(path)
    if path.is_file():
        path = path.parent
    if (path / STATE_FILE).is_file() and (path / MODEL_FILE).is_file():
        return path
    if path.name == CHECKPOINT_DIR:
        path = path.parent
    found = latest_checkpoint(path)
    if found is not None:
        return found
    raise FileNotFoundError(
        f"no checkpoint at {path}: expected a run folder (with checkpoints/latest), a "
        f"checkpoint folder (with {MODEL_FILE} and {STATE_FILE}) or a file in one"
    )


def load_state(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """The ``state.pt`` dict of a checkpoint folder (tensors on the CPU)."""
    path = Path(checkpoint) / STATE_FILE
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # (torch.load's errors for a cut or damaged file vary)
        raise DamagedCheckpointError(f"{path} is not a readable state file ({err})") from None
    if not isinstance(state, dict):
        raise DamagedCheckpointError(f"{path} must hold a dict; got {type(state).__name__}")
    if state.get("version") != STATE_VERSION:
        raise ValueError(
            f"{path} has state version {state.get('version')!r}; this taylorshift reads "
            f"{STATE_VERSION}"
        )
    return state


def load_checkpoint_model(checkpoint: str | os.PathLike, into=None, map_location=None):
    """The model of a checkpoint folder (``load_model``), or its weights loaded ``into`` a
    built model (``load_weights``); a file that cannot be read (cut, damaged, of a
    checkpoint written before checksums) raises :class:`DamagedCheckpointError` naming it."""
    path = Path(checkpoint) / MODEL_FILE
    try:
        if into is None:
            return load_model(path, map_location=map_location)
        load_weights(into, path)
        return into
    except FileNotFoundError:
        raise
    except ValueError as err:
        raise DamagedCheckpointError(str(err)) from None


def read_config(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """The ``config.json`` dict of a checkpoint folder."""
    path = Path(checkpoint) / CONFIG_FILE
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise DamagedCheckpointError(f"{path} is not valid JSON ({err})") from None
