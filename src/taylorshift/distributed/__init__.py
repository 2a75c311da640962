"""Sequence parallelism: TaylorShift over a sequence split across ``torch.distributed`` ranks.

- :func:`sequence_parallel_taylor_shift`: the op on this rank's slice (B, H, N_r, d); one
  collective forward and one backward per call (docs/distributed.md).
- :class:`SequenceParallelKernel` and :func:`convert_sequence_parallel`: the same inside
  ``taylorshift.nn`` modules and models, which then take a slice (B, N_r, dim).
- :func:`sequence_shard`: a balanced contiguous split of N tokens over the ranks.
"""

from .kernel import SequenceParallelKernel, convert_sequence_parallel
from .sequence_parallel import sequence_parallel_taylor_shift, sequence_shard

__all__ = [
    "SequenceParallelKernel",
    "convert_sequence_parallel",
    "sequence_parallel_taylor_shift",
    "sequence_shard",
]
