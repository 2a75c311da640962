"""``taylorshift bench``: the op sweep — time and peak memory of attention vs sequence length.

For each dtype, head dim d, pass (forward, or forward and backward) and sequence length N
on a grid, every implementation of a small registry (:data:`IMPLEMENTATIONS`: SDPA, the
materialised softmax of the paper's baseline, direct and efficient TaylorShift) runs on
inputs of layout (B, H, N, d). Time comes from :func:`taylorshift.bench.measure.time_call`
(warm-up, median with min/max); peak memory from
:func:`taylorshift.bench.measure.measure_memory` (a fresh process per point on the CPU, the
allocator's statistics on CUDA) for a subset of head dims. Then the crossovers — from which
N the efficient form beats the direct one, and the best softmax — are set beside the cost
model of :mod:`taylorshift.theory`, and ``results.json``, ``results.csv``, ``report.md``
and plots are written.

Nothing stops the sweep: out of memory, errors and points over a budget are results with
their status (``"ok"``, ``"oom"``, ``"error: <type>"``, ``"over budget"``, ``"skipped"``).
A series (one implementation, pass, d and dtype) stops at its first failure or over-budget
point; the rest of it is recorded as ``"skipped"``. docs/bench.md describes the method.

Modules: :mod:`.cases` (the registry and the calls), :mod:`.sweep` (settings and the
measurement), :mod:`.analysis` (crossovers), :mod:`.report` and :mod:`.plots` (the files),
:mod:`.cli` (the command line). Their public names are importable from here.
"""

from ...vocab import PASSES
from ..core import OK, OOM, OVER_BUDGET, SKIPPED
from ..load import NOISY_SHARE, QUIET_SHARE, CpuLoad
from .analysis import BASELINES, METRIC_KEY, analyse, theory_rows
from .cases import (
    COLOURS,
    DTYPES,
    FAMILIES,
    IMPLEMENTATIONS,
    RECIPE,
    Implementation,
    build_call,
    make_call,
    make_inputs,
    model_flops,
    pytorch_direct,
    pytorch_efficient,
    register_implementation,
    sdpa,
    softmax_naive,
    taylorshift_direct,
    taylorshift_efficient,
    triton_direct,
    triton_efficient,
)
from .cli import HELP, SWEEP_OPTIONS, add_arguments, run, settings_from_args
from .plots import figure_names
from .report import CSV_COLUMNS, findings, report_markdown, summary, write_outputs
from .sweep import (
    DEFAULT_D,
    DEFAULT_MEMORY_D,
    FULL_MEMORY_N,
    FULL_N,
    FULL_N_CUDA,
    MEMORY_CALL_FACTOR,
    QUICK,
    QUICK_MEMORY_N,
    QUICK_N,
    SCHEMA,
    Settings,
    count_points,
    predicted_bytes,
    run_sweep,
    upgrade_results,
)

__all__ = [
    "BASELINES",
    "COLOURS",
    "CSV_COLUMNS",
    "DEFAULT_D",
    "DEFAULT_MEMORY_D",
    "DTYPES",
    "FAMILIES",
    "FULL_MEMORY_N",
    "FULL_N",
    "FULL_N_CUDA",
    "HELP",
    "IMPLEMENTATIONS",
    "MEMORY_CALL_FACTOR",
    "METRIC_KEY",
    "NOISY_SHARE",
    "OK",
    "OOM",
    "OVER_BUDGET",
    "PASSES",
    "QUICK",
    "QUICK_MEMORY_N",
    "QUICK_N",
    "QUIET_SHARE",
    "RECIPE",
    "SCHEMA",
    "SKIPPED",
    "SWEEP_OPTIONS",
    "CpuLoad",
    "Implementation",
    "Settings",
    "add_arguments",
    "analyse",
    "build_call",
    "count_points",
    "figure_names",
    "findings",
    "make_call",
    "make_inputs",
    "model_flops",
    "predicted_bytes",
    "pytorch_direct",
    "pytorch_efficient",
    "register_implementation",
    "report_markdown",
    "run",
    "run_sweep",
    "sdpa",
    "settings_from_args",
    "softmax_naive",
    "summary",
    "taylorshift_direct",
    "taylorshift_efficient",
    "theory_rows",
    "triton_direct",
    "triton_efficient",
    "upgrade_results",
    "write_outputs",
]
