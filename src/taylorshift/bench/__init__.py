"""Benchmarks: timing and memory measurement, sweeps, crossovers, plots and reports.

The shared core:

- :mod:`.core`: statuses (``ok``, ``oom``, ``over budget``, ``skipped``), the pass and dtype
  vocabulary, units, the one markdown table, ``--device``, missing extras;
- :mod:`.runner`: a failure as a result, a series that ends at its first failure, the budget;
- :mod:`.measure`: timing (:func:`~.measure.time_call`) and peak memory
  (:func:`~.measure.measure_memory`, a fresh process per point on the CPU);
- :mod:`.machine`: the one description of the machine a result came from, and the command;
- :mod:`.load`: other processes' share of the CPUs, to tell quiet timings from noisy ones;
- :mod:`.crossover`, :mod:`.figures`, :mod:`.files` (atomic result files).

The tools, one ``taylorshift bench`` subcommand each (``HELP``, ``add_arguments``, ``run``):
:mod:`.op` (``taylorshift bench`` itself, the op sweep), :mod:`.models`, :mod:`.scaling`,
:mod:`.calibrate`, :mod:`.decode` and :mod:`.seqpar`.
"""
