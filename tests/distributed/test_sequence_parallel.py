"""Sequence-parallel TaylorShift on 2 and 4 gloo processes equals the single-process op.

Outputs and gradients (q, k, v, temperature; module parameters) in float64, non-causal and
causal, with and without key padding, normalize True and False, balanced and uneven shards,
empty shards, several chunks per shard, cross-attention split unlike the queries, an
Attention module on a slice (grouped heads, short convolutions and local heads reading the
neighbouring ranks' rows, padding anywhere), data × sequence parallelism under DDP; the
neighbours' rows (``neighbour_rows``) and their gradients against a plain reference; and
float16/bfloat16 inputs against the single-process form's own error (SPEC §8). The cases are in
``cases.py``; one spawn per world size runs them all (module-scoped fixture), each case
is reported as its own test here.
"""

from __future__ import annotations

import pytest

from .cases import case_ids
from .spawn import run_spawned

# pytest-xdist: every case on one worker, so each world size spawns once
pytestmark = pytest.mark.xdist_group("sequence-parallel-spawn")

WORLD_SIZES = (2, 4)
CASES = [pytest.param(p, c, id=f"P{p}-{c}") for p in WORLD_SIZES for c in case_ids(p)]


@pytest.fixture(scope="module")
def spawned_results(tmp_path_factory):
    """{world size: [results of rank 0, rank 1, ...]}, each run once, on first use."""
    cache: dict[int, list] = {}

    def get(world_size: int) -> list:
        if world_size not in cache:
            workdir = tmp_path_factory.mktemp(f"P{world_size}")
            cache[world_size] = run_spawned(
                "tests.distributed.cases:run_cases", world_size, workdir
            )
        return cache[world_size]

    return get


@pytest.mark.parametrize(("world_size", "case_id"), CASES)
def test_case_matches_single_process(spawned_results, world_size, case_id):
    results = spawned_results(world_size)
    failures = [r[case_id] for r in results if r.get(case_id, "missing on a rank")]
    assert not failures, "\n".join(str(f) for f in failures)


def test_every_rank_ran_every_case(spawned_results):
    for world_size in WORLD_SIZES:
        for rank, result in enumerate(spawned_results(world_size)):
            assert sorted(result) == sorted(case_ids(world_size)), f"P{world_size} rank {rank}"
