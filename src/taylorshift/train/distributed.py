"""Processes and data sharding: one process per device under ``torchrun``, or just one.

``torchrun --nproc-per-node=N -m taylorshift train ...`` sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` and the rendezvous address; :func:`setup` then joins the process group
(NCCL for CUDA devices, gloo on CPU). Without those variables everything runs in one
process and the collective helpers here are no-ops.

Data order is a pure function of ``(seed, epoch)``: :class:`ShardedBatchSampler` cuts the
same global batches whatever the number of processes, and gives each process an equal,
contiguous share of each, so N processes see the same global batches as one.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import DEVICE_CHOICES, DEVICE_PATTERN

__all__ = [
    "CollectiveTimeoutError",
    "Dist",
    "SequenceGroup",
    "ShardedBatchSampler",
    "derive_seed",
    "eval_shard",
    "sequence_group",
    "setup",
]


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any values (stable across processes and Python runs)."""
    text = "/".join(map(str, parts)).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1


class CollectiveTimeoutError(RuntimeError):
    """A collective of a multi-process run did not complete in ``run.collective_timeout_s``."""


@dataclass(frozen=True)
class Dist:
    """This process's place: ``rank`` of ``world_size``, device index ``local_rank``."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over processes (in place; returned)."""
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def all_gather_object(self, obj: object) -> list:
        """``[obj of rank 0, obj of rank 1, ...]`` on every process."""
        if not self.enabled:
            return [obj]
        out: list = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def shutdown(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()

    def silent_ranks(self, timeout_s: float) -> list[int] | None:
        """After a collective timed out: the ranks that do not answer a monitored barrier
        within ``timeout_s`` (rank 0 asks every other; another rank can only tell whether
        rank 0 answers), or None when it cannot tell."""
        group = _MONITOR.get("group")
        if not self.enabled or group is None:
            return None
        try:
            dist.monitored_barrier(
                group, timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True
            )
        except RuntimeError as err:
            found = re.search(r"[Rr]anks? ([\d, ]+) failed", str(err))
            if found:
                return [int(r) for r in re.findall(r"\d+", found.group(1))]
            return [0] if self.rank != 0 else None
        return []


_MONITOR: dict[str, object] = {}  # a gloo group for monitored_barrier (any backend)


def timed_out(err: BaseException) -> bool:
    """Whether ``err`` is a collective that ran out of time (gloo's or NCCL's wording)."""
    text = str(err).lower()
    return isinstance(err, RuntimeError) and ("timed out" in text or "timeout" in text)


def resolve_device(device: str, local_rank: int | None = None) -> torch.device:
    """The torch device that ``device`` names (``run.device``, eval's and generate's
    ``--device``): ``auto`` (CUDA if there is one, else the CPU), ``cpu``, ``cuda[:N]``,
    ``mps``, ``xpu[:N]``; with ``local_rank`` (under torchrun), ``auto`` and ``cuda`` mean
    ``cuda:local_rank``. Raises ``ValueError`` for any other name and for a device this
    machine does not have, before anything is loaded onto it."""
    if not isinstance(device, str) or not DEVICE_PATTERN.fullmatch(device):
        raise ValueError(f"expected {DEVICE_CHOICES}; got {device!r}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and local_rank is not None:
        device = f"cuda:{local_rank}"
    torch_device = torch.device(device)
    kind = torch_device.type
    backend = {"cuda": torch.cuda, "mps": torch.backends.mps, "xpu": getattr(torch, "xpu", None)}
    if kind != "cpu" and (backend[kind] is None or not backend[kind].is_available()):
        raise ValueError(f"{device!r} is not available: torch sees no {kind.upper()} device")
    if kind in ("cuda", "xpu") and torch_device.index is not None:
        count = backend[kind].device_count()
        if torch_device.index >= count:
            raise ValueError(
                f"{device!r} is not available: torch sees {count} {kind.upper()} device(s), "
                f"{kind}:0 to {kind}:{count - 1}"
            )
    return torch_device


def setup(device: str, timeout_s: float | None = None) -> tuple[Dist, torch.device]:
    """Join the process group that ``torchrun`` describes (if any) and pick the device.

    Args:
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:N``, ... (``run.device``). Under
            torchrun, ``auto`` and ``cuda`` mean ``cuda:LOCAL_RANK``.
        timeout_s: how long a collective waits for the other processes
            (``run.collective_timeout_s``); None: torch's default.

    Returns:
        this process's :class:`Dist` and device.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch_device = resolve_device(device, local_rank if world_size > 1 else None)
    if torch_device.type == "cuda":
        torch.cuda.set_device(torch_device)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if torch_device.type == "cuda" else "gloo"
        timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, timeout=timeout)
        # monitored_barrier (naming a rank that stopped answering) needs gloo
        _MONITOR["group"] = dist.new_group(backend="gloo", timeout=timeout)
    return Dist(rank, world_size, local_rank), torch_device


class ShardedBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Global batches of a shuffled epoch, this process's share of each; resumable.

    Epoch ``e`` uses the permutation ``randperm(num_samples)`` of a generator seeded with
    ``derive_seed(seed, "epoch", e)``; global batch ``i`` is its slice
    ``[i * batch_size, (i + 1) * batch_size)`` (an incomplete last batch is dropped) and
    process ``rank`` takes the ``rank``-th of ``world_size`` equal contiguous parts.
    ``set_epoch(e, start=k)`` skips the first ``k`` batches: a resumed run continues with
    exactly the batches that an uninterrupted one would have drawn.

    Args:
        num_samples: size of the dataset.
        batch_size: the global batch; must be divisible by ``world_size``.
        seed: base seed of the data order.
        rank, world_size: this process's share.
    """

    def __init__(
        self, num_samples: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1
    ) -> None:
        if batch_size % world_size:
            raise ValueError(
                f"data.batch_size must be divisible by the number of processes {world_size}, "
                f"got {batch_size}"
            )
        if num_samples < batch_size:
            raise ValueError(
                f"the training split must hold at least one batch of data.batch_size="
                f"{batch_size} samples, got {num_samples}"
            )
        self.num_samples, self.batch_size, self.seed = num_samples, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def batches_per_epoch(self) -> int:
        return self.num_samples // self.batch_size

    def __len__(self) -> int:
        return self.batches_per_epoch() - self.start

    def __iter__(self) -> Iterator[list[int]]:
        generator = torch.Generator().manual_seed(derive_seed(self.seed, "epoch", self.epoch))
        order = torch.randperm(self.num_samples, generator=generator)
        share = self.batch_size // self.world_size
        for i in range(self.start, self.batches_per_epoch()):
            first = i * self.batch_size + self.rank * share
            yield order[first : first + share].tolist()


def eval_shard(num_samples: int, batch_size: int, rank: int, world_size: int) -> list[list[int]]:
    """Evaluation batches of this process: every ``world_size``-th sample from ``rank``, so
    the processes together cover each sample exactly once."""
    mine = list(range(rank, num_samples, world_size))
    return [mine[i : i + batch_size] for i in range(0, len(mine), batch_size)]


@dataclass(frozen=True)
class SequenceGroup:
    """This process's place in sequence parallelism: ``rank`` of ``size`` processes that
    share each sequence (``group``, a process group, None when ``size`` is 1), and its data-
    parallel place ``data_rank`` of ``data_world``."""

    size: int = 1
    rank: int = 0
    group: object = None
    data_rank: int = 0
    data_world: int = 1

    def shard(self, n: int) -> slice:
        """This process's tokens of a sequence of ``n``."""
        from ..distributed import sequence_shard

        return sequence_shard(n, self.rank, self.size)


def sequence_group(dist_info: Dist, size: int) -> SequenceGroup:
    """Split the processes into groups of ``size`` consecutive ranks sharing a sequence.

    Every process creates every group (``torch.distributed.new_group`` is collective).
    """
    world, rank = dist_info.world_size, dist_info.rank
    if size == 1:
        return SequenceGroup(data_rank=rank, data_world=world)
    if world % size:
        raise ValueError(
            f"run.sequence_parallel must divide the number of processes {world}; got {size}"
        )
    groups = [dist.new_group(list(range(g, g + size))) for g in range(0, world, size)]
    return SequenceGroup(size, rank % size, groups[rank // size], rank // size, world // size)
