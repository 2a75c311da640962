"""The ``taylorshift`` command line: one entry point, one subcommand per task.

Each subcommand is a :class:`Subcommand` in :data:`SUBCOMMANDS`: a function that adds its
arguments to its parser and a function that runs it and returns the exit status. A new
subcommand (``bench``, ``train``, ``eval``) is one more pair of functions and one more entry.
Bad argument combinations go through ``parser.error`` (message on stderr, exit status 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import theory
from .cliargs import format_table, positive_int

__all__ = ["SUBCOMMANDS", "Subcommand", "build_parser", "main"]


@dataclass(frozen=True)
class Subcommand:
    """A subcommand: its name, one-line help, argument setup and runner."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, argparse.ArgumentParser], int]


# `taylorshift theory`

DEFAULT_THEORY_LENGTH = 1024


def _theory_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--d",
        type=positive_int,
        nargs="+",
        default=list(theory.DEFAULT_TABLE_DIMS),
        metavar="D",
        help="head dims for the crossover table (default: %(default)s)",
    )
    parser.add_argument(
        "--d-emb",
        type=positive_int,
        metavar="E",
        help="embedding width: also analyse every head count h dividing E",
    )
    parser.add_argument(
        "--heads",
        type=positive_int,
        nargs="+",
        metavar="H",
        help="restrict the heads analysis to these head counts (each must divide E)",
    )
    parser.add_argument(
        "--n",
        type=positive_int,
        metavar="N",
        help=f"sequence length for the heads analysis (default: {DEFAULT_THEORY_LENGTH})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")


def _theory_report(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    """The data `theory` prints, as plain JSON-ready values; argument errors exit with 2."""
    if args.d_emb is None:
        for flag, value in (("--heads", args.heads), ("--n", args.n)):
            if value is not None:
                parser.error(f"{flag} needs --d-emb (the embedding width the heads split)")
    report: dict = {
        "crossovers": [dataclasses.asdict(row) for row in theory.crossover_table(args.d)],
    }
    if args.d_emb is not None:
        allowed = theory.divisors(args.d_emb)
        bad = [h for h in args.heads or () if h not in allowed]
        if bad:
            parser.error(
                f"--heads must divide --d-emb {args.d_emb} (expected one of {allowed}); "
                f"got {', '.join(map(str, bad))}"
            )
        n = DEFAULT_THEORY_LENGTH if args.n is None else args.n
        rows = theory.heads_analysis(args.d_emb, n, heads=args.heads)
        report["heads_analysis"] = {
            "d_emb": args.d_emb,
            "n": n,
            "optimal_head_dim_ops": theory.optimal_head_dim_ops(),
            "optimal_head_dim_entries": theory.optimal_head_dim_entries(n),
            "rows": [dataclasses.asdict(row) for row in rows],
        }
    return report


CROSSOVER_COLUMNS = (
    ("d", "d"),
    ("N0", "n0"),
    ("N1", "n1"),
    ("N0 sym", "n0_symmetric"),
    ("N1 sym", "n1_symmetric"),
    ("N0+18d (A100 est.)", "n0_a100_estimate"),
)

HEADS_COLUMNS = (
    ("h", "heads"),
    ("d", "head_dim"),
    ("ops direct", "ops_direct"),
    ("ops eff", "ops_efficient"),
    ("ops eff sym", "ops_efficient_symmetric"),
    ("entries direct", "entries_direct"),
    ("entries eff", "entries_efficient"),
    ("entries eff sym", "entries_efficient_symmetric"),
    ("N0", "n0"),
    ("N1", "n1"),
    ("N0 sym", "n0_symmetric"),
    ("N1 sym", "n1_symmetric"),
)


def _table_of(columns: Sequence[tuple[str, str]], rows: Sequence[dict]) -> str:
    return format_table([title for title, _ in columns], [[r[k] for _, k in columns] for r in rows])


def _print_theory(report: dict) -> None:
    print("Crossover sequence lengths per head (the efficient form is no costlier from N on)")
    print("  N0: FLOPs, N1: memory entries (the paper's Table 2); sym: our symmetric form;")
    print("  N0+18d: the paper's measured speed crossover on an A100, an empirical estimate")
    print()
    print(_table_of(CROSSOVER_COLUMNS, report["crossovers"]))
    heads = report.get("heads_analysis")
    if heads is None:
        return
    print()
    print(
        f"Heads analysis: d_emb = {heads['d_emb']}, N = {heads['n']} "
        "(ops and entries of the whole layer, crossovers per head)"
    )
    print()
    print(_table_of(HEADS_COLUMNS, heads["rows"]))
    d_ops, d_entries = heads["optimal_head_dim_ops"], heads["optimal_head_dim_entries"]
    print()
    print(
        f"Efficient costs are lowest at head dim d = d_emb/h ≈ {d_ops:.3f} (FLOPs) and "
        f"≈ {d_entries:.6g} (entries at N = {heads['n']}),\nboth below 1: the optimum lies past "
        "h = d_emb, so over the allowed head counts more heads make\nthe efficient form cheaper "
        "and the direct form dearer."
    )


def _run_theory(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    report = _theory_report(args, parser)
    if args.json:
        print(json.dumps(report))
    else:
        _print_theory(report)
    return 0


# `taylorshift bench [TOOL]`: the op sweep takes its options on `bench` itself; each tool is
# a module (or package) of taylorshift.bench with HELP, add_arguments and run.

BENCH_TOOLS = ("models", "scaling", "calibrate", "decode", "seqpar")


def _bench_arguments(parser: argparse.ArgumentParser) -> None:
    from .bench import op

    op.add_arguments(parser)
    parser.set_defaults(_bench=op, _bench_parser=parser)
    sub = parser.add_subparsers(dest="bench_tool", metavar="TOOL", required=False)
    for name in BENCH_TOOLS:
        module = importlib.import_module(f".bench.{name}", __package__)
        child = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(child)
        child.set_defaults(_bench=module, _bench_parser=child)


def _run_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    return args._bench.run(args, args._bench_parser)


# `taylorshift train` and `taylorshift eval`: taylorshift.train.cli holds both.


def _train_arguments(parser: argparse.ArgumentParser) -> None:
    from .train import cli as train_cli

    train_cli.add_train_arguments(parser)


def _run_train(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .train import cli as train_cli

    return train_cli.run_train(args, parser)


def _eval_arguments(parser: argparse.ArgumentParser) -> None:
    from .train import cli as train_cli

    train_cli.add_eval_arguments(parser)


def _run_eval(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .train import cli as train_cli

    return train_cli.run_eval(args, parser)


def _generate_arguments(parser: argparse.ArgumentParser) -> None:
    from .train import cli as train_cli

    train_cli.add_generate_arguments(parser)


def _run_generate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .train import cli as train_cli

    return train_cli.run_generate(args, parser)


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand(
        name="theory",
        help="crossover lengths and multi-head costs from the paper's cost model",
        add_arguments=_theory_arguments,
        run=_run_theory,
    ),
    Subcommand(
        name="bench",
        help="measure where each attention form pays off on this machine "
        "(tools: models, scaling, calibrate, decode, seqpar)",
        add_arguments=_bench_arguments,
        run=_run_bench,
    ),
    Subcommand(
        name="train",
        help="train a classifier or language model on a task of taylorshift.data (presets, "
        "resume, torchrun)",
        add_arguments=_train_arguments,
        run=_run_train,
    ),
    Subcommand(
        name="eval",
        help="accuracy and loss of a training checkpoint on a data split",
        add_arguments=_eval_arguments,
        run=_run_eval,
    ),
    Subcommand(
        name="generate",
        help="continue a prompt with a trained causal language model (taylorshift train --task lm)",
        add_arguments=_generate_arguments,
        run=_run_generate,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per entry of :data:`SUBCOMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="taylorshift",
        description="TaylorShift attention: cost model and tools.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in SUBCOMMANDS:
        child = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(child)
        child.set_defaults(_command=command, _parser=child)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``taylorshift`` command line on ``argv`` (default ``sys.argv[1:]``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        from .bench import machine

        machine.INVOKED_ARGV = argv  # results record the command as run
    return args._command.run(args, args._parser)
