"""``taylorshift bench models``: the "Which Transformer to Favor" metrics of whole models.

For every registry model × attention kernel (× TaylorShift mode) × projection variant, one
row of measurements:

- parameters (``sum(p.numel())``);
- FLOPs per sample, counted by ``torch.utils.flop_counter.FlopCounterMode`` on one sample:
  the forward pass, and a training step's forward + backward (matrix products, convolutions
  and attention ops; elementwise work is not counted by torch's counter);
- inference throughput in samples/s at the best batch size: batch sizes 1, 2, 4, ... are
  timed until throughput stops improving, memory runs out, ``--max-batch`` or the budget;
  the whole curve is kept;
- training step time (forward, cross-entropy, backward, AdamW step) at ``--train-batch``;
- training peak memory (one step at ``--train-batch``) and inference peak memory (one
  forward at batch 1): the measured peak extra memory of the call
  (:func:`taylorshift.bench.measure.measure_memory`: CUDA allocator statistics, or a fresh
  process's resident-set high-water mark on the CPU) plus the bytes of the tensors that live
  between calls (parameters and buffers; for training also AdamW's state).

A head-count sweep at fixed width (the TaylorShift paper's Table 5) measures the same for one
model with h heads, and ``--accuracy`` adds Pareto fronts of accuracy against each metric.
Out of memory and over budget are results (statuses), never crashes.

Modules: :mod:`.cases` (rows, building models and steps, FLOPs), :mod:`.sweep` (measuring
a row), :mod:`.pareto` (metrics, fronts, accuracies), :mod:`.report` and :mod:`.plots` (the
files), :mod:`.cli` (the command line). Their public names are importable from here;
``render_report`` and ``render_summary`` are now ``report_markdown`` and ``summary``.
"""

from ..core import OK, OOM, OVER_BUDGET, SKIPPED, renamed
from ..runner import Budget
from .cases import (
    DTYPES,
    MODEL_KERNEL,
    MODES,
    RECIPE,
    Case,
    Settings,
    build_model,
    build_step,
    count_flops,
    make_inputs,
)
from .cli import (
    FULL_DEFAULTS,
    HEADS_CPU,
    HEADS_GPU,
    HELP,
    QUICK_DEFAULTS,
    add_arguments,
    plan,
    run,
    settings_from,
)
from .pareto import METRICS, Metric, load_accuracy, pareto_front, pareto_table
from .plots import plot_curves, plot_heads, plot_pareto
from .report import report_markdown, summary, write_outputs
from .sweep import STAGES, measure_case, measure_memory_points, sweep_throughput

__all__ = [
    "DTYPES",
    "FULL_DEFAULTS",
    "HEADS_CPU",
    "HEADS_GPU",
    "HELP",
    "METRICS",
    "MODEL_KERNEL",
    "MODES",
    "OK",
    "OOM",
    "OVER_BUDGET",
    "QUICK_DEFAULTS",
    "RECIPE",
    "SKIPPED",
    "STAGES",
    "Budget",
    "Case",
    "Metric",
    "Settings",
    "add_arguments",
    "build_model",
    "build_step",
    "count_flops",
    "load_accuracy",
    "make_inputs",
    "measure_case",
    "measure_memory_points",
    "pareto_front",
    "pareto_table",
    "plan",
    "plot_curves",
    "plot_heads",
    "plot_pareto",
    "report_markdown",
    "run",
    "settings_from",
    "summary",
    "sweep_throughput",
    "write_outputs",
]

__getattr__ = renamed(
    __name__, {"render_report": "report_markdown", "render_summary": "summary"}, globals()
)
