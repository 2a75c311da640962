"""``taylorshift train`` and ``taylorshift eval``: argument setup and runners for ``cli.py``.

``train`` builds a :class:`~taylorshift.train.config.TrainConfig` from ``--preset``, then
``--config FILE``, then the shortcut flags, then every ``--set key=value`` in order; a bad
key or value exits with status 2 and a message naming it. Under ``torchrun`` every process
runs the same command.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from pathlib import Path

from ..cliargs import non_negative_float, positive_int, share
from ..nn.cache import CACHE_KINDS
from .config import SPLITS, TAYLORSHIFT_MODES, ConfigError
from .presets import list_presets
from .resolve import resolve_config

__all__ = [
    "add_eval_arguments",
    "add_generate_arguments",
    "add_train_arguments",
    "run_eval",
    "run_generate",
    "run_train",
]

# (flag, dotted key, argparse type, metavar, help)
_SHORTCUTS = (
    ("--task", "data.task", str, "NAME", "task of taylorshift.data (data.task)"),
    ("--data", "data.options.path", str, "PATH", "data file or folder (data.options.path)"),
    ("--model", "model.name", str, "NAME", "model registry name (model.name)"),
    (
        "--kernel",
        "model.kernel",
        str,
        "NAME",
        "attention kernel: taylorshift, softmax, linear, holt, ... (model.kernel)",
    ),
    ("--epochs", "optim.epochs", int, "N", "epochs of the schedule (optim.epochs)"),
    ("--lr", "optim.lr", float, "LR", "peak learning rate (optim.lr)"),
    ("--batch-size", "data.batch_size", int, "B", "global batch size (data.batch_size)"),
    ("--seed", "run.seed", int, "S", "seed of init, data order, drop path (run.seed)"),
    ("--device", "run.device", str, "DEV", "auto, cpu, cuda[:N], mps, xpu[:N] (run.device)"),
    ("--out", "run.out_dir", str, "DIR", "run folder (run.out_dir)"),
    ("--max-steps", "run.max_steps", int, "N", "stop after N steps (run.max_steps)"),
    ("--eval-every", "run.eval_every", int, "N", "also evaluate every N steps (run.eval_every)"),
)


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. optim.lr=1e-3), got {text!r}")
    return key.strip(), value


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset",
        choices=list_presets(),
        metavar="NAME",
        help=f"starting config: {', '.join(list_presets())} (default: the config file's "
        "preset, else listops-cpu)",
    )
    parser.add_argument("--config", metavar="FILE", help="JSON or TOML file of config sections")
    for flag, key, kind, metavar, text in _SHORTCUTS:
        parser.add_argument(flag, type=kind, metavar=metavar, dest=f"_set_{key}", help=text)
    parser.add_argument(
        "--mode",
        choices=TAYLORSHIFT_MODES,
        dest="_set_model.mode",
        help="TaylorShift form (model.mode)",
    )
    parser.add_argument(
        "--set",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any setting by dotted key, e.g. optim.lr=1e-3, data.options.path=/data/cifar, "
        "model.overrides.depth=2 (repeatable; applied last, in order)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint of the run folder (a fresh start if none)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (run.progress=false)"
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config as JSON and exit"
    )


def _resolve(args: argparse.Namespace):
    overrides = [
        (name[len("_set_") :], value)
        for name, value in vars(args).items()
        if name.startswith("_set_") and value is not None
    ]
    if args.no_progress:
        overrides.append(("run.progress", False))
    return resolve_config(args.preset, args.config, [*overrides, *args.set])


def _is_main() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _warning_line(message, *_: object, **__: object) -> None:
    """A warning (a damaged checkpoint skipped on resume, ...) as one line on stderr."""
    print(f"taylorshift train: warning: {message}", file=sys.stderr)


def run_train(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        config = _resolve(args)
    except ConfigError as err:
        parser.error(str(err))
    if args.print_config:
        print(json.dumps(config.to_dict(), indent=2))
        return 0
    from .checkpoint import DamagedCheckpointError
    from .distributed import CollectiveTimeoutError
    from .lock import RunLockedError
    from .loop import NonFiniteLossError, train
    from .stop import TrainingStopped

    try:
        with warnings.catch_warnings():  # (restores showwarning afterwards)
            warnings.showwarning = _warning_line
            result = train(config, resume=args.resume)
    except (ConfigError, FileExistsError, RunLockedError, DamagedCheckpointError) as err:
        parser.error(str(err))
    except (NonFiniteLossError, CollectiveTimeoutError) as err:
        print(f"taylorshift train: error: {err}", file=sys.stderr)
        return 1
    except TrainingStopped as stop:
        if _is_main():
            print(
                f"taylorshift train: {stop}; continue with the same command and --resume",
                file=sys.stderr,
            )
        return 143  # 128 + SIGTERM, as a shell reports a process that SIGTERM ended
    except KeyboardInterrupt:
        from .checkpoint import latest_checkpoint

        saved = latest_checkpoint(Path(config.run.out_dir))
        what = f"the last checkpoint is {saved}" if saved else "no checkpoint was written yet"
        if _is_main():
            print(
                f"taylorshift train: interrupted; {what}; continue with the same command and "
                f"--resume",
                file=sys.stderr,
            )
        return 130
    if _is_main():
        parts = [f"trained {result.step} steps ({result.epoch} epochs) in {result.out_dir}"]
        done = ((config.data.eval_split, result.eval), (config.data.test_split, result.test))
        for name, res in done:
            if res is not None:
                parts.append(f"{name} accuracy {res['accuracy']:.4f} loss {res['loss']:.4f}")
        parts.append(f"checkpoint {result.checkpoint}")
        print("; ".join(parts))
    return 0


_RUN_PATHS = "a run folder (its latest checkpoint), a checkpoint folder"


def _add_checkpoint_argument(parser: argparse.ArgumentParser, also: str) -> None:
    """The required ``--checkpoint PATH`` of eval and generate; ``also``: what else it takes
    besides a run folder or a checkpoint folder."""
    parser.add_argument("--checkpoint", required=True, metavar="PATH", help=_RUN_PATHS + also)


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    _add_checkpoint_argument(parser, " or a file in one")
    parser.add_argument("--split", choices=SPLITS, default="test", help="(default: %(default)s)")
    parser.add_argument("--batch-size", type=int, metavar="B", help="default: the run's")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda[:N], mps, xpu[:N]")
    parser.add_argument(
        "--limit", type=int, metavar="N", help="only the first N samples (sequences of an LM)"
    )
    parser.add_argument(
        "--data",
        metavar="PATH",
        help="the run's task on the data at PATH (default: the path the run recorded)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")


def run_eval(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    for flag, value in (("--batch-size", args.batch_size), ("--limit", args.limit)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be a positive integer, got {value}")
    from .checkpoint import DamagedCheckpointError
    from .distributed import resolve_device
    from .evaluate import evaluate_checkpoint

    try:
        resolve_device(args.device)  # (evaluate_checkpoint checks it too, naming `device`)
    except ValueError as err:
        parser.error(f"--device: {err}")
    try:
        result = evaluate_checkpoint(
            args.checkpoint,
            args.split,
            batch_size=args.batch_size,
            device=args.device,
            limit=args.limit,
            data_path=args.data,
        )
    except (FileNotFoundError, ConfigError, DamagedCheckpointError) as err:
        parser.error(str(err))
    if not _is_main():
        return 0 if math.isfinite(result["loss"]) else 1
    if args.json:  # (strict JSON: a loss that is not finite is null, exit status 1 below)
        print(json.dumps({k: _finite_or_none(v) for k, v in result.items()}))
    else:  # a language model's result counts scored target tokens (it has a perplexity)
        unit = "target tokens" if "perplexity" in result else "samples"
        print(
            f"{result['split']}: accuracy {result['accuracy']:.4f}  loss {result['loss']:.4f}  "
            f"({result['samples']} {unit}, {result['checkpoint']}, step {result['step']})"
        )
    if not math.isfinite(result["loss"]):
        # A damaged weight file or a diverged model: never a successful evaluation.
        print(
            f"error: the loss on split {result['split']!r} is {result['loss']} (not finite): "
            f"the weights of {result['checkpoint']} are damaged or the model diverged",
            file=sys.stderr,
        )
        return 1
    return 0


def _finite_or_none(value):
    """``value``, or None for a float that is not finite (strict JSON has no NaN)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    _add_checkpoint_argument(parser, ", or a model file written by save_model, of a causal LM")
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument(
        "--prompt",
        action="append",
        help="text to continue (default: a newline); repeated, the prompts run as one batch "
        "(left-padded) and each is printed with its continuation in turn",
    )
    prompt.add_argument(
        "--ids",
        metavar="ID,ID,...",
        action="append",
        help="the prompt as comma-separated token ids, e.g. --ids 1,2,3; the output is ids "
        "too, a line per prompt (models whose tokens are not bytes, e.g. recall); "
        "repeatable as --prompt",
    )
    parser.add_argument("--max-new-tokens", type=positive_int, default=200, metavar="N")
    parser.add_argument(
        "--temperature", type=non_negative_float, default=1.0, help="0 = greedy (default 1)"
    )
    parser.add_argument("--top-k", type=positive_int, metavar="K", help="sample among the top K")
    parser.add_argument(
        "--top-p",
        type=share,
        metavar="P",
        help="nucleus sampling: among the most likely tokens holding P of the probability",
    )
    parser.add_argument(
        "--eos-id",
        type=int,
        metavar="ID",
        help="end a row at this token id, printed with it (e.g. 10, a newline for byte models)",
    )
    parser.add_argument(
        "--cache",
        choices=CACHE_KINDS,
        default="auto",
        help="decoding cache: constant-size state (TaylorShift, linear) or keys/values",
    )
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument(
        "--device", default="cpu", help="cpu, cuda[:N], mps, xpu[:N], auto (default cpu)"
    )


def _generate_model_path(path: str):
    from .checkpoint import MODEL_FILE, find_checkpoint, verify_checkpoint

    given = Path(path)
    if given.is_file() and given.name != MODEL_FILE and given.suffix == ".safetensors":
        return given
    return verify_checkpoint(find_checkpoint(given)) / MODEL_FILE


def run_generate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import torch

    from ..data.lm_text import decode_bytes, encode_text
    from ..models import CausalLM, load_model
    from .distributed import resolve_device

    try:
        device = resolve_device(args.device)
    except ValueError as err:
        parser.error(f"--device: {err}")
    texts = ["\n"] if args.prompt is None else args.prompt
    flag = "--prompt" if args.ids is None else "--ids"
    rows = []
    for given in args.ids or texts:
        if args.ids is None:
            rows.append(encode_text(given))
            continue
        try:
            ids = [int(t) for t in given.replace(" ", "").split(",")]
        except ValueError:  # (also an empty item, as in 1,,2 or a trailing comma)
            parser.error(f"--ids must be comma-separated ints, e.g. 1,2,3; got {given!r}")
        rows.append(torch.tensor(ids, dtype=torch.long))
    try:
        model = load_model(_generate_model_path(args.checkpoint), map_location=device)
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    if not isinstance(model, CausalLM):
        parser.error(
            f"--checkpoint must hold a causal language model (CausalLM); got a "
            f"{type(model).__name__}"
        )
    vocab = model.config.vocab_size
    for row in rows:
        if not row.numel():
            parser.error(f"{flag} must hold at least one token; got an empty prompt")
        if int(row.max()) >= vocab or int(row.min()) < 0:
            parser.error(
                f"{flag}: token ids must be in [0, {vocab}) for this model; got {row.tolist()}"
            )
    if args.eos_id is not None and not 0 <= args.eos_id < vocab:
        parser.error(f"--eos-id: expected a token id in [0, {vocab}), got {args.eos_id}")
    # one batch, left-padded (generate takes padding anywhere; each row as if alone)
    n = max(len(row) for row in rows)
    prompt = torch.zeros(len(rows), n, dtype=torch.long)
    mask = torch.zeros(len(rows), n, dtype=torch.bool)
    for i, row in enumerate(rows):
        prompt[i, n - len(row) :], mask[i, n - len(row) :] = row, True
    generator = torch.Generator(device=device).manual_seed(args.seed)
    try:
        new = model.generate(
            prompt.to(device),
            args.max_new_tokens,
            prompt_mask=None if bool(mask.all()) else mask.to(device),
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            eos_id=args.eos_id,
            cache=args.cache,
            generator=generator,
        ).cpu()
    except ValueError as err:
        parser.error(str(err))
    for i, row in enumerate(new):
        if args.eos_id is not None:  # the row up to its end (generate repeats it after)
            ended = (row == args.eos_id).nonzero()
            row = row[: int(ended[0]) + 1] if len(ended) else row
        if args.ids is not None:
            print(",".join(str(t) for t in row.tolist()))
        else:
            sys.stdout.write(texts[i] + decode_bytes(row) + "\n")
    return 0
