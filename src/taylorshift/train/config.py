"""Training configuration: typed dataclass sections and ``key=value`` overrides.

A :class:`TrainConfig` has four sections, each a frozen dataclass:

- ``data`` (:class:`DataConfig`): the task of ``taylorshift.data``, its options, batch sizes;
- ``model`` (:class:`ModelConfig`): a ``taylorshift.models`` registry name and overrides;
- ``optim`` (:class:`OptimConfig`): optimizer, learning-rate schedule, clipping;
- ``run`` (:class:`RunConfig`): seed, device, precision, logging, checkpoints.

Settings are addressed by dotted keys (``optim.lr``, ``data.options.num_samples``,
``data.split_options.train.num_samples``); every value is checked against the field's
type, and an unknown key raises :class:`ConfigError` naming it. The presets live in
``train/presets.py``; ``train/resolve.py`` builds a config from a preset, a JSON/TOML file and
overrides (:func:`~taylorshift.train.resolve.resolve_config`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import os
import re
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._validate import check_bool, check_choice, check_int, check_number, check_str

__all__ = [
    "ConfigError",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "TrainConfig",
    "apply_override",
]

OPTIMIZERS = ("lamb", "adamw")
AMP_MODES = ("auto", "bf16", "off")
TAYLORSHIFT_MODES = ("auto", "direct", "efficient")
SPLITS = ("train", "val", "test")

# run.device (and eval's, generate's --device): a name; train/distributed.resolve_device
# checks that the machine has it
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|(?:cuda|xpu)(?::\d+)?")
DEVICE_CHOICES = "auto, cpu, cuda[:N], mps or xpu[:N]"


class ConfigError(ValueError):
    """A bad training setting: unknown key, wrong type or value out of range."""


def _suggest(name: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=2)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


@dataclass(frozen=True)
class DataConfig:
    """What to train on.

    Args:
        task: a name of ``taylorshift.data.list_tasks()``.
        options: options of ``get_task(task).build`` for every split (e.g. ``path``).
        split_options: per-split options on top, e.g. ``{"train": {"num_samples": 4096}}``.
        batch_size: the global batch (all processes together; each takes an equal share).
        eval_batch_size: batch for evaluation (default: ``batch_size``).
        num_workers: DataLoader worker processes per training process.
        pad_to_multiple: round padded lengths up to a multiple of this (8 suits tensor cores).
        train_limit, eval_limit: use only the first so many samples of a split.
        eval_split: evaluated every epoch (and every ``run.eval_every`` steps).
        test_split: evaluated once at the end; None skips it.
    """

    task: str = "listops"
    options: dict[str, Any] = field(default_factory=dict)
    split_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    batch_size: int = 32
    eval_batch_size: int | None = None
    num_workers: int = 0
    pad_to_multiple: int | None = None
    train_limit: int | None = None
    eval_limit: int | None = None
    eval_split: str = "val"
    test_split: str | None = "test"


@dataclass(frozen=True)
class ModelConfig:
    """Which model: ``create_model(name, **overrides)`` with the kernel shortcuts applied.

    Args:
        name: a name of ``taylorshift.models.list_models()``.
        kernel: attention kernel, overrides the preset's (``taylorshift``, ``softmax``,
            ``linear``, ``holt``, ...).
        mode: TaylorShift form ``auto``, ``direct`` or ``efficient`` (``kernel_args["mode"]``).
        overrides: any other config field of the model (``depth``, ``drop_path``, ...).
        kernel_args: options per attention kernel, ``{kernel: {option: value}}``, applied
            only when the model's kernel is that one, so that a preset can carry a
            TaylorShift setting and still train with ``--kernel softmax``. They update the
            model's own ``kernel_args``; ``overrides.kernel_args`` and ``mode`` win over them.

    ``num_classes`` and ``vocab_size`` follow the task unless ``overrides`` sets them.
    """

    name: str = "listops-small"
    kernel: str | None = None
    mode: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    kernel_args: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and schedule: linear warm-up, then cosine decay to ``min_lr``, per step.

    Args:
        name: ``lamb`` (the paper's) or ``adamw``.
        lr: peak learning rate.
        min_lr: learning rate at the end of the cosine.
        weight_decay: decoupled weight decay of matrices (biases, norms, CLS token and
            position tables get none).
        betas, eps: moment coefficients and denominator epsilon.
        grad_clip: clip the global gradient norm to this; None does not clip.
        epochs: length of the schedule and of the run.
        warmup_epochs: linear warm-up (may be fractional).
        lr_multipliers: learning-rate factors by parameter name (its last dotted part), e.g.
            ``{"temperature": 10}`` for TaylorShift's per-head τ; those parameters get
            ``lr`` × the factor (under the same schedule) and no weight decay.
    """

    name: str = "lamb"
    lr: float = 1e-3
    min_lr: float = 0.0
    weight_decay: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    grad_clip: float | None = 1.0
    epochs: int = 200
    warmup_epochs: float = 5.0
    lr_multipliers: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RunConfig:
    """How to run.

    Args:
        seed: model initialisation, drop path, data order.
        device: ``auto`` (CUDA if present), ``cpu``, ``cuda``, ``cuda:1``, ...
        amp: ``auto`` (bf16 autocast on CUDA GPUs that support it, off elsewhere),
            ``bf16`` (also on CPU) or ``off``.
        out_dir: metrics, config and checkpoints go here.
        max_steps: stop after this many optimizer steps (the schedule still spans
            ``optim.epochs``); None runs all epochs.
        log_every: steps between train records (mean loss since the last one).
        eval_every: also evaluate every so many steps; None: once per epoch only.
        checkpoint_every: also checkpoint every so many steps; None: per epoch only.
        keep_checkpoints: how many recent checkpoints to keep.
        progress: tqdm progress bars (when tqdm is installed).
        tensorboard: also write TensorBoard scalars (when tensorboard is installed).
        threads: ``torch.set_num_threads`` for CPU work; None leaves torch's default.
        collective_timeout_s: seconds a collective of a multi-process run waits for the
            other processes before the run stops with an error naming the ranks that did
            not answer (torch's default would be 10-30 minutes, silent).
        sequence_parallel: processes that share one sequence (consecutive ranks under
            torchrun), each holding a contiguous slice of its tokens; the TaylorShift
            kernels exchange their key-side states (``taylorshift.distributed``). The world
            size must be a multiple; the rest is data parallelism. Causal LM tasks (kind
            ``lm``) with TaylorShift attention only; 1 = off.
    """

    seed: int = 0
    device: str = "auto"
    amp: str = "auto"
    out_dir: str = "runs/train"
    max_steps: int | None = None
    log_every: int = 10
    eval_every: int | None = None
    checkpoint_every: int | None = None
    keep_checkpoints: int = 2
    progress: bool = True
    tensorboard: bool = False
    threads: int | None = None
    sequence_parallel: int = 1
    collective_timeout_s: float = 600.0


SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "model": ModelConfig,
    "optim": OptimConfig,
    "run": RunConfig,
}

# Settings that change how a run is carried out, not what it computes: a run may resume
# with other values.
RUNTIME_KEYS = frozenset(
    {
        "data.eval_batch_size",
        "data.num_workers",
        "data.test_split",
        "run.device",
        "run.max_steps",
        "run.log_every",
        "run.eval_every",
        "run.checkpoint_every",
        "run.keep_checkpoints",
        "run.progress",
        "run.tensorboard",
        "run.threads",
        "run.out_dir",
        "run.collective_timeout_s",
    }
)


@dataclass(frozen=True)
class TrainConfig:
    """A whole training run: ``data``, ``model``, ``optim`` and ``run`` sections.

    Build one from a preset and overrides with :func:`resolve_config`, or directly:
    ``TrainConfig(optim=OptimConfig(lr=1e-3))``. ``validate()`` runs on construction.
    """

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        for name, cls in SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"{name} must be a {cls.__name__}, got {getattr(self, name)!r}")
        self.validate()

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (JSON-ready: tuples become lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, settings: Mapping[str, Any]) -> TrainConfig:
        """Build from a nested dict; missing settings take their defaults.

        Raises:
            ConfigError: unknown section or setting, or a value of the wrong type.
        """
        if not isinstance(settings, Mapping):
            raise ConfigError(f"a config must be a table of sections, got {settings!r}")
        unknown = [k for k in settings if k not in SECTIONS]
        if unknown:
            raise ConfigError(
                f"unknown section {unknown[0]!r}{_suggest(unknown[0], SECTIONS)}; sections: "
                f"{', '.join(SECTIONS)}"
            )
        sections = {}
        for name, section_cls in SECTIONS.items():
            values = settings.get(name, {})
            if not isinstance(values, Mapping):
                raise ConfigError(f"section {name!r} must be a table of settings, got {values!r}")
            hints = typing.get_type_hints(section_cls)
            kwargs = {}
            for key, value in values.items():
                if key not in hints:
                    raise _unknown_key(f"{name}.{key}")
                kwargs[key] = _check_type(f"{name}.{key}", value, hints[key])
            sections[name] = section_cls(**kwargs)
        return cls(**sections)

    def replace(self, **settings: Any) -> TrainConfig:
        """A copy with dotted-key settings applied: ``replace(**{"optim.lr": 1e-3})``."""
        tree = self.to_dict()
        for key, value in settings.items():
            apply_override(tree, key, value)
        return TrainConfig.from_dict(tree)

    def with_absolute_data_paths(self) -> TrainConfig:
        """A copy whose relative ``path`` data options (``data.options`` and each split's)
        are absolute, taken against the current folder as the loaders would take them: a
        run records where its data is, so that ``eval`` and ``--resume`` find it from any
        folder. Other values are left as they are (a bad one is the loader's to refuse)."""
        tree = self.to_dict()
        for options in (tree["data"]["options"], *tree["data"]["split_options"].values()):
            path = options.get("path") if isinstance(options, dict) else None
            if isinstance(path, str) and path:
                options["path"] = os.path.abspath(os.path.expanduser(path))
        return TrainConfig.from_dict(tree)

    def differences(self, other: TrainConfig, ignore: Iterable[str] = ()) -> list[str]:
        """Dotted keys whose values differ, as ``"key (self, other)"`` strings."""
        a, b = _flatten(self.to_dict()), _flatten(other.to_dict())
        skip = set(ignore)
        return [
            f"{k} ({a.get(k)!r}, {b.get(k)!r})"
            for k in sorted(set(a) | set(b))
            if k not in skip and a.get(k) != b.get(k)
        ]

    def validate(self) -> None:
        """Raise ConfigError naming the first bad setting, what it accepts and what it got."""
        d, m, o, r = self.data, self.model, self.optim, self.run
        _check(check_int, "data.batch_size", d.batch_size, ge=1)
        for key in ("eval_batch_size", "pad_to_multiple", "train_limit", "eval_limit"):
            _check(check_int, f"data.{key}", getattr(d, key), ge=1, allow_none=True)
        _check(check_int, "data.num_workers", d.num_workers, ge=0)
        _check(check_choice, "data.eval_split", d.eval_split, choices=SPLITS)
        if d.test_split is not None:
            _check(check_choice, "data.test_split", d.test_split, choices=SPLITS)
        bad = [s for s in d.split_options if s not in SPLITS]
        if bad:
            raise ConfigError(f"data.split_options keys must be among {SPLITS}, got {bad[0]!r}")
        for split, options in d.split_options.items():
            if not isinstance(options, dict):
                raise ConfigError(
                    f"data.split_options.{split} must be a table of options, got {options!r}"
                )
        if m.mode is not None:
            _check(check_choice, "model.mode", m.mode, choices=TAYLORSHIFT_MODES)
            if m.kernel not in (None, "taylorshift"):
                raise ConfigError(
                    f"model.mode applies to the taylorshift kernel only, got kernel {m.kernel!r}"
                )
        for kernel, options in m.kernel_args.items():
            if not isinstance(options, dict):  # e.g. an option set without its kernel
                from ..nn import list_kernels  # (an error path: nn only then)

                example = "OPTION" if kernel in list_kernels() else kernel
                raise ConfigError(
                    f"model.kernel_args.{kernel} must be a table of kernel options, got "
                    f"{options!r}: model.kernel_args holds {{kernel: {{option: value}}}}, e.g. "
                    f"--set model.kernel_args.taylorshift.{example}={json.dumps(options)}"
                )
        _check(check_choice, "optim.name", o.name, choices=OPTIMIZERS)
        _check(check_number, "optim.lr", o.lr, gt=0)
        if not 0 <= o.min_lr <= o.lr:
            raise ConfigError(f"optim.min_lr must be in [0, optim.lr={o.lr}], got {o.min_lr}")
        _check(check_number, "optim.weight_decay", o.weight_decay, ge=0)
        if not all(0 <= beta < 1 for beta in o.betas):
            raise ConfigError(f"optim.betas must be two numbers in [0, 1), got {o.betas}")
        _check(check_number, "optim.eps", o.eps, gt=0)
        _check(check_number, "optim.grad_clip", o.grad_clip, gt=0, allow_none=True)
        _check(check_int, "optim.epochs", o.epochs, ge=1)
        for key, factor in o.lr_multipliers.items():
            if (
                isinstance(factor, bool)
                or not isinstance(factor, (int, float))
                or not 0 < factor < float("inf")
            ):
                raise ConfigError(
                    f"optim.lr_multipliers must map parameter names to finite numbers > 0, "
                    f"got {key!r}: {factor!r}"
                )
        if not 0 <= o.warmup_epochs <= o.epochs:
            raise ConfigError(
                f"optim.warmup_epochs must be in [0, optim.epochs={o.epochs}], got "
                f"{o.warmup_epochs}"
            )
        if not isinstance(r.device, str) or not DEVICE_PATTERN.fullmatch(r.device):
            raise ConfigError(f"run.device must be {DEVICE_CHOICES}; got {r.device!r}")
        _check(check_choice, "run.amp", r.amp, choices=AMP_MODES)
        _check(check_int, "run.seed", r.seed, ge=-(2**63), le=2**63 - 1)  # (torch's range)
        if not r.out_dir:
            raise ConfigError("run.out_dir must be a folder name, got ''")
        for key in ("max_steps", "eval_every", "checkpoint_every", "threads"):
            _check(check_int, f"run.{key}", getattr(r, key), ge=1, allow_none=True)
        for key in ("log_every", "sequence_parallel", "keep_checkpoints"):
            _check(check_int, f"run.{key}", getattr(r, key), ge=1)
        _check(check_number, "run.collective_timeout_s", r.collective_timeout_s, gt=0)


def _check(check, key: str, value: Any, **limits: Any) -> Any:
    """``check(key, value, **limits)``, a check of ``taylorshift._validate``, raising its
    TypeError or ValueError as :class:`ConfigError` (the one error ``taylorshift train``
    reports as a line)."""
    try:
        return check(key, value, **limits)
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err)) from None


def _all_keys() -> list[str]:
    return [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def _unknown_key(key: str) -> ConfigError:
    section = key.split(".", 1)[0]
    if section not in SECTIONS:
        return ConfigError(
            f"unknown setting {key!r}: no section {section!r}{_suggest(section, SECTIONS)}; "
            f"sections: {', '.join(SECTIONS)}"
        )
    keys = [k for k in _all_keys() if k.startswith(section + ".")]
    return ConfigError(
        f"unknown setting {key!r}{_suggest(key, _all_keys())}; settings of {section}: "
        f"{', '.join(k.split('.', 1)[1] for k in keys)}"
    )


def _type_name(hint: Any) -> str:
    if hint is type(None):
        return "none"
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if origin is tuple:
        return f"a list of {len(typing.get_args(hint))} numbers"
    if origin is dict or hint is dict:
        return "a table"
    return {bool: "a bool", int: "an int", float: "a number", str: "a str"}.get(hint, str(hint))


def _check_type(key: str, value: Any, hint: Any) -> Any:
    """``value`` converted to the field type ``hint`` (int -> float, list -> tuple)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check_type(key, value, inner[0]) if len(inner) == 1 else value
    if hint is bool:
        return _check(check_bool, key, value)
    if hint is int:
        return _check(check_int, key, value)
    if hint is float:  # an infinite value is refused by validate() where it matters
        return _check(check_number, key, value, finite=False)
    if hint is str:
        return _check(check_str, key, value, allow_empty=True)
    ok = False
    if origin is tuple:
        args = typing.get_args(hint)
        if isinstance(value, (list, tuple)) and len(value) == len(args):
            value = tuple(
                _check_type(f"{key}[{i}]", v, a)
                for i, (v, a) in enumerate(zip(value, args, strict=True))
            )
            ok = True
    elif origin is dict or hint is dict:
        ok = isinstance(value, Mapping)
        value = copy.deepcopy(dict(value)) if ok else value
    else:  # pragma: no cover - every field type is handled above
        ok = True
    if not ok:
        raise ConfigError(f"{key} must be {_type_name(hint)}; got {value!r}")
    return value


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _parse_text(key: str, text: str, hint: Any) -> Any:
    """Parse the command-line text of ``key`` as its field type ``hint``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if type(None) in args and text.strip().lower() in ("none", "null"):
            return None
        inner = [a for a in args if a is not type(None)]
        return _parse_text(key, text, inner[0])
    try:
        if hint is bool:
            lowered = text.strip().lower()
            if lowered in _TRUE + _FALSE:
                return lowered in _TRUE
            raise ValueError
        if hint is int:
            return int(text)
        if hint is float:
            return float(text)
        if hint is str:
            return text
        if origin is tuple:
            parts = json.loads(text) if text.strip().startswith("[") else text.split(",")
            return tuple(float(p) for p in parts)
        if origin is dict or hint is dict:
            value = json.loads(text)
            if not isinstance(value, dict):
                raise ValueError
            return value
    except (ValueError, TypeError, json.JSONDecodeError):
        pass
    raise ConfigError(f"{key} must be {_type_name(hint)}; got {text!r}")


def _parse_free(text: str) -> Any:
    """A value inside a free-form table: JSON when it parses (numbers, true, null, lists),
    else the text itself (paths, names)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_override(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set the dotted ``key`` of the nested config dict ``tree`` in place.

    ``value`` may be a string from the command line (parsed as the field's type: ``"1e-3"``
    for a float, ``"true"`` for a bool, ``"none"`` for an optional, ``"0.9,0.98"`` for
    ``betas``, JSON for a table) or an already typed value. Keys below a table field
    (``data.options.path``, ``data.split_options.train.num_samples``) set entries of it; a
    string there is read as JSON when it parses and kept as text otherwise.

    Raises:
        ConfigError: an unknown key (naming it, with a suggestion) or an unparsable value.
    """
    parts = key.split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(
            f"a setting must be written section.name (e.g. optim.lr), got {key!r}; "
            f"sections: {', '.join(SECTIONS)}"
        )
    section, name, rest = parts[0], parts[1], parts[2:]
    if section not in SECTIONS:
        raise _unknown_key(key)
    hints = typing.get_type_hints(SECTIONS[section])
    if name not in hints:
        raise _unknown_key(f"{section}.{name}")
    hint = hints[name]
    table = tree.setdefault(section, {})
    if not rest:
        table[name] = _parse_text(key, value, hint) if isinstance(value, str) else value
        return
    if not (typing.get_origin(hint) is dict or hint is dict):
        raise ConfigError(
            f"{section}.{name} is {_type_name(hint)}, not a table: cannot set {key!r}"
        )
    node = table.get(name)
    if node is None:
        node = table[name] = {}
    for part in rest[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {key!r}: {part!r} holds {child!r}, not a table")
        node = child
    node[rest[-1]] = _parse_free(value) if isinstance(value, str) else value


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and prefix.count(".") < 1:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
