"""The tables of ``bench seqpar``: bytes per layer on paper, and measured times by sequence
length and group size."""

from __future__ import annotations

from ...vocab import FORWARD, FORWARD_BACKWARD
from ..core import markdown_table
from .costs import bytes_per_rank, crossover_tokens, state_elements

__all__ = ["measured_table", "paper_table"]


def paper_table(
    head_dims=(16, 32, 64, 128),
    lengths=(4096, 65536, 1 << 20),
    ranks=(4, 8),
    *,
    state_bytes: int = 4,
    kv_bytes: int = 2,
) -> str:
    """Markdown: MiB each rank sends per layer and head (B = H = 1; multiply by B·H),
    forward + backward, ours against ring attention, and the crossovers N*."""
    rows = []
    for d in head_dims:
        state_kib = state_elements(d, d) * state_bytes / 1024
        for p in ranks:
            for n in lengths:
                cells = []
                for causal in (False, True):
                    b = bytes_per_rank(n, d, d, ranks=p, causal=causal, state_bytes=state_bytes,
                                       kv_bytes=kv_bytes)  # fmt: skip
                    cells.append((b["ours_forward"] + b["ours_backward"]) / 2**20)
                ring = (b["ring_forward"] + b["ring_backward"]) / 2**20
                mib = [f"{x:,.3f}" for x in (*cells, ring)]
                rows.append([d, f"{state_kib:,.1f} KiB", p, f"{n:,}", *mib])
    headers = ["d = dv", "state per head", "P", "N", "ours, non-causal (MiB)"]
    headers += ["ours, causal (MiB)", "ring attention (MiB)"]
    lines = [
        markdown_table(headers, rows, "r" * len(headers)),
        "",
        "Crossover N* (ring attention sends less below it), forward / forward + backward:",
        "",
    ]
    rows = []
    for d in head_dims:
        cells = []
        for causal, p in ((False, 2), (True, 2), (True, 4), (True, 8)):
            c = crossover_tokens(
                d, d, ranks=p, causal=causal, state_bytes=state_bytes, kv_bytes=kv_bytes
            )
            cells.append(f"{c['forward']:,.0f} / {c['forward_backward']:,.0f}")
        rows.append([d, *cells])
    headers = ["d = dv", "non-causal, any P", "causal, P = 2", "causal, P = 4", "causal, P = 8"]
    lines.append(markdown_table(headers, rows, "r" * len(headers)))
    lines += [
        "",
        "Attention alone. A layer with a short convolution of k taps or local heads of window "
        "w sends one more all-gather of the rows next to each slice, P · B · (k − 1) rows "
        "(2 (w − 1) for non-causal local heads), independent of N (docs/distributed.md).",
    ]
    return "\n".join(lines)


def measured_table(rows: list[dict], clock: str = "wall") -> str:
    """Markdown: median ms by N and group size, speed-up against one process in brackets.

    ``clock``: ``"wall"`` (elapsed time of the slowest rank) or ``"cpu"`` (CPU time of the
    busiest rank's process: its own work, less disturbed by other load on the machine).
    """
    suffix = {"wall": "_s", "cpu": "_cpu_s"}[clock]
    sizes = sorted({r["ranks"] for r in rows})
    by = {(r["causal"], r["n"], r["ranks"]): r for r in rows}
    headers = ["pass", "causal", "N", *(f"P = {p}" for p in sizes)]
    headers.append(f"collective alone, P = {sizes[-1]}")
    table = []
    # (results.json fields: forward_s, forward_backward_s and the _cpu_s ones)
    passes = (("forward" + suffix, FORWARD), ("forward_backward" + suffix, FORWARD_BACKWARD))
    for key, name in passes:
        for causal in sorted({r["causal"] for r in rows}):
            for n in sorted({r["n"] for r in rows}):
                base = by.get((causal, n, 1))
                cells = []
                for p in sizes:
                    r = by.get((causal, n, p))
                    if r is None:
                        cells.append("–")
                        continue
                    ms = f"{r[key] * 1e3:,.1f}"
                    if base is not None and p != 1:
                        ms += f" ({base[key] / r[key]:.2f}×)"
                    cells.append(ms)
                last = by.get((causal, n, sizes[-1]))
                collective = "–" if last is None else f"{last['collective_s'] * 1e3:.2f}"
                table.append([name, "yes" if causal else "no", f"{n:,}", *cells, collective])
    return markdown_table(headers, table, "llr" + "r" * (len(sizes) + 1))
