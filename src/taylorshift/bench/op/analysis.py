"""The op sweep's analysis: crossovers of every efficient implementation against the best
direct and the best softmax one at each N, and the cost model's crossovers beside them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict

from ... import theory
from ...vocab import PASSES
from ..core import OK
from ..crossover import find_crossover
from ..load import NOISY_SHARE

__all__ = [
    "BASELINES",
    "METRIC_KEY",
    "analyse",
    "best",
    "impl_names",
    "label",
    "series",
    "theory_by_d",
    "theory_rows",
]


def theory_rows(results: dict) -> list[dict]:
    cfg = results["config"]
    ds = sorted(set(cfg["ds"]) | set(cfg.get("memory_ds") or ()))
    return [asdict(row) for row in theory.crossover_table(ds)]


def series(points: Iterable[dict], key: str, **match) -> dict[int, float]:
    return {
        p["n"]: p[key]
        for p in points
        if p["status"] == OK and all(p.get(k) == v for k, v in match.items())
    }


def best(points: list[dict], family: str, key: str, **match) -> dict[int, float]:
    """Per N the lowest cost among the implementations of a family."""
    best: dict[int, float] = {}
    for p in points:
        if p["family"] != family or p["status"] != OK:
            continue
        if not all(p.get(k) == v for k, v in match.items()):
            continue
        value = p[key]
        if value is not None and value > 0 and (p["n"] not in best or value < best[p["n"]]):
            best[p["n"]] = value
    return best


METRIC_KEY = {"time": "median_s", "memory": "peak_extra_bytes"}
BASELINES = {"direct": "taylorshift-direct", "softmax": "softmax"}


def analyse(results: dict) -> list[dict]:
    """Crossovers of every efficient implementation against the best direct and the best
    softmax implementation, per metric, dtype, pass and d (see :func:`find_crossover`)."""
    points = results["points"]
    out = []
    groups = sorted(
        {(p["kind"], p["dtype"], p["pass"], p["d"]) for p in points},
        key=lambda g: (g[0] != "time", g[1], g[3], PASSES.index(g[2])),
    )
    challengers = sorted({p["impl"] for p in points if p["family"] == "taylorshift-efficient"})
    for kind, dtype, pass_name, d in groups:
        key = METRIC_KEY[kind]
        match = {"kind": kind, "dtype": dtype, "pass": pass_name, "d": d}
        for challenger in challengers:
            mine = series(points, key, impl=challenger, **match)
            for baseline, family in BASELINES.items():
                cross = find_crossover(mine, best(points, family, key, **match))
                disturbed = kind == "time" and _disturbed(points, cross, match, challenger, family)
                out.append(
                    {
                        "metric": kind,
                        "dtype": dtype,
                        "pass": pass_name,
                        "d": d,
                        "challenger": challenger,
                        "baseline": baseline,
                        **cross.to_dict(),
                        "unreliable": disturbed,
                        "text": cross.describe() + (" (unreliable)" if disturbed else ""),
                    }
                )
    return out


def _disturbed(points: list[dict], cross, match: dict, challenger: str, family: str) -> bool:
    """Whether a time point that places the crossover (the challenger's or the baseline
    family's at the N on either side of it) ran while other processes used more than
    NOISY_SHARE of the CPUs, even after any re-measuring: then the crossover is unreliable."""
    near = {n for n in (cross.n_below, cross.n_above) if n is not None}
    return any(
        (p.get("other_cpu_share") or 0) > NOISY_SHARE
        for p in points
        if p["n"] in near
        and (p["impl"] == challenger or p["family"] == family)
        and all(p.get(k) == v for k, v in match.items())
    )


def theory_by_d(results: dict) -> dict[int, dict]:
    return {row["d"]: row for row in results.get("theory") or theory_rows(results)}


def label(results: dict, name: str) -> str:
    """The name of an implementation in tables and legends."""
    return results.get("implementations", {}).get(name, {}).get("label", name)


def impl_names(results: dict, kind: str) -> list[str]:
    """The implementations with points of ``kind``, in registry order."""
    order = list(results.get("implementations", {}))
    seen = {p["impl"] for p in results["points"] if p["kind"] == kind}
    return [n for n in order if n in seen] + sorted(seen - set(order))
