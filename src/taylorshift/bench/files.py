"""Result files written atomically (``taylorshift.atomic.write_atomic``): a crash mid-write
never leaves a truncated file."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from ..atomic import write_atomic

__all__ = [
    "fresh_folder",
    "write_atomic",
    "write_csv",
    "write_figure",
    "write_json",
    "write_results",
    "write_text",
]


def add_output_options(parser: argparse.ArgumentParser, default: str | None) -> None:
    """``--out DIR`` (``default``; None: the tool picks it, ``bench-results``),
    ``--no-plots`` (also ``--no-plot``) and ``--overwrite``: where every bench tool writes,
    spelled alike."""
    parser.add_argument(
        "--out",
        type=Path,
        default=None if default is None else Path(default),
        metavar="DIR",
        help=f"output folder (default: {default or 'bench-results'})",
    )
    parser.add_argument(
        "--no-plots", "--no-plot", action="store_true", help="write no PNGs (no matplotlib needed)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write into --out even if it holds an earlier run (default: a new --out-2, ...)",
    )


def fresh_folder(
    folder: str | os.PathLike,
    overwrite: bool = False,
    parser: argparse.ArgumentParser | None = None,
) -> Path:
    """Where a bench tool writes its results: ``folder`` if it is missing or empty (or
    ``overwrite``), else the first missing or empty ``folder-2``, ``folder-3``, ... so that a
    second run never silently replaces the files of the first (it says where it writes).

    The folder is made, and a file written and removed there, before any measurement: a
    folder that cannot take the results fails at once (``parser.error`` naming ``--out``,
    or the ``OSError``), not after a sweep of minutes."""
    path = _fresh(Path(folder), overwrite)
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as err:
        if parser is None:
            raise
        parser.error(f"--out: cannot write into {str(path)!r}: {err.strerror or err}")
    return path


def _fresh(base: Path, overwrite: bool) -> Path:
    if overwrite or not base.exists() or (base.is_dir() and not any(base.iterdir())):
        return base
    k = 2
    while True:
        candidate = base.with_name(f"{base.name}-{k}")
        if not candidate.exists() or (candidate.is_dir() and not any(candidate.iterdir())):
            print(
                f"note: {base} holds an earlier run; writing to {candidate} (--overwrite "
                f"writes into {base})",
                file=sys.stderr,
            )
            return candidate
        k += 1


def write_text(path: str | os.PathLike, text: str) -> Path:
    return write_atomic(path, text.encode())


def write_json(path: str | os.PathLike, obj: object) -> Path:
    """Indented JSON; NaN and infinities are written as null (JSON has neither)."""
    return write_text(path, json.dumps(_finite(obj), indent=1) + "\n")


def _finite(obj: object) -> object:
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_csv(
    path: str | os.PathLike, rows: Iterable[dict], columns: Sequence[str] | None = None
) -> Path:
    """Rows of dicts as CSV; columns default to the keys in order of first appearance."""
    rows = list(rows)
    if columns is None:
        columns = list(dict.fromkeys(k for row in rows for k in row))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in columns})
    return write_text(path, buf.getvalue())


def write_results(
    folder: str | os.PathLike,
    results: dict,
    rows: Iterable[dict],
    report: Callable[[dict], str],
    names: tuple[str, str, str] = ("results.json", "results.csv", "report.md"),
    *,
    figure: tuple[str, Callable[[dict], object]] | None = None,
) -> list[Path]:
    """A benchmark's files in ``folder``: ``results`` as JSON, ``rows`` as CSV and
    ``report(results)`` as Markdown, named by ``names``, then ``figure`` (file name, function
    of ``results`` returning a matplotlib figure) as PNG where given. The report and the
    figure come last, so the data survive a report or a plot that fails."""
    folder = Path(folder)
    json_name, csv_name, report_name = names
    written = [
        write_json(folder / json_name, results),
        write_csv(folder / csv_name, rows),
        write_text(folder / report_name, report(results)),
    ]
    if figure is not None:
        figure_name, make_figure = figure
        written.append(write_figure(folder / figure_name, make_figure(results)))
    return written


def write_figure(path: str | os.PathLike, fig, *, dpi: int = 110) -> Path:
    """A matplotlib figure as PNG (rendered in memory, then written atomically)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return write_atomic(path, buf.getvalue())
