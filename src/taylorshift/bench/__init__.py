"""Benchmarks: timing and memory measurement, sweeps, crossovers, plots and reports.

``taylorshift bench`` (the op sweep), ``bench models``, ``bench scaling`` and
``bench calibrate`` are built on :mod:`taylorshift.bench.measure`.
"""
