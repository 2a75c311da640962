"""Moved: the sequence-parallel benchmark is ``taylorshift bench seqpar``
(:mod:`taylorshift.bench.seqpar`).

The names are importable from here as before; ``python -m taylorshift.distributed.bench
ARGS`` says where it went and runs ``taylorshift bench seqpar ARGS``.
"""

from __future__ import annotations

import sys

from ..bench.seqpar import (
    bytes_per_rank,
    crossover_tokens,
    measure,
    measure_collective,
    measured_table,
    paper_table,
    state_elements,
)

__all__ = [
    "bytes_per_rank",
    "crossover_tokens",
    "main",
    "measure",
    "measure_collective",
    "measured_table",
    "paper_table",
    "state_elements",
]


def main(argv: list[str] | None = None) -> int:
    """``taylorshift bench seqpar ARGS``, after a note on stderr naming it."""
    from ..cli import main as taylorshift_main

    argv = sys.argv[1:] if argv is None else list(argv)
    print(
        "note: python -m taylorshift.distributed.bench is now `taylorshift bench seqpar`",
        file=sys.stderr,
    )
    return taylorshift_main(["bench", "seqpar", *argv])


if __name__ == "__main__":
    sys.exit(main())
