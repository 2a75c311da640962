"""``taylorshift bench seqpar``: sequence-parallel TaylorShift, bytes per layer (on paper)
and measured times.

On the CPU, gloo (spawns max(--procs) processes; group sizes 1 and ``--procs`` are ranks
0..P-1 of them, measured back to back at each point)::

    taylorshift bench seqpar --procs 2 4 --lengths 4096 16384 65536 \\
        --out benchmarks/seqpar_cpu/results.json

On GPUs, NCCL (one process per GPU; group sizes 1, ``--procs`` below the world size, and
the world)::

    torchrun --standalone --nproc-per-node=8 -m taylorshift bench seqpar \\
        --lengths 65536 262144 1048576 --out results-nccl.json

Times are the median over ``--repeats`` calls of the slowest rank's time (ranks start each
call together, after a barrier): wall time, and the CPU time of the rank's process
(``time.process_time``, its own work: less disturbed by other load on a shared machine).
Forward runs under ``torch.no_grad``, forward + backward differentiates q, k and v.
Layout (B, H, N_r, d) per rank, dv = d, the balanced split of ``sequence_shard``.

Modules: :mod:`.costs` (bytes on paper), :mod:`.measure` (timing in a group),
:mod:`.report` (tables), :mod:`.cli`. This was ``python -m taylorshift.distributed.bench``.
"""

from .cli import HELP, add_arguments, run
from .costs import bytes_per_rank, crossover_tokens, state_elements
from .measure import DTYPES, Settings, measure, measure_collective
from .report import measured_table, paper_table

__all__ = [
    "DTYPES",
    "HELP",
    "Settings",
    "add_arguments",
    "bytes_per_rank",
    "crossover_tokens",
    "measure",
    "measure_collective",
    "measured_table",
    "paper_table",
    "run",
    "state_elements",
]
