"""What a config builds: the task's splits (:func:`_build_split`) and the model
(:func:`build_model`, with :func:`model_overrides` fitting it to the task), with errors that
name the setting."""

from __future__ import annotations

from torch import nn
from torch.utils.data import Dataset, Subset

from ..data import TaskSpec
from ..models import CausalLM, create_model
from ..nn import list_kernels
from ..nn.kernels import check_kernel_options
from .config import ConfigError, TrainConfig
from .lock import RunLockedError

__all__ = ["build_model", "model_overrides"]


def _setting(what: str, fn, *args):
    """``fn(*args)``, with the errors a bad setting gives (a missing or malformed data file,
    an unknown task, a data option of the wrong type or value, a device that is not there,
    an unwritable run folder) raised as :class:`ConfigError` naming the setting, so the CLI
    prints one error line for them."""
    try:
        return fn(*args)
    except (ConfigError, RunLockedError):
        raise
    except (ValueError, TypeError, OSError, RuntimeError, ImportError) as err:
        raise ConfigError(f"{what}: {err}") from err


def _build_split(config: TrainConfig, spec: TaskSpec, split: str) -> Dataset:
    options = {**config.data.options, **config.data.split_options.get(split, {})}
    if isinstance(options.get("operators"), list):
        options["operators"] = tuple(options["operators"])
    dataset = spec.build(split, **options)
    if split != "train" and getattr(dataset, "single_file", False):
        # One file read as every split would score the model on its own training data.
        raise ConfigError(
            f"data path of task {spec.name!r} must be a folder with one file per split when "
            f"training or evaluating on split {split!r}; got the single file "
            f"{str(dataset.path)!r}, which would be the train split as well (docs/data.md)"
        )
    if len(dataset) == 0:  # (the loaders refuse an empty file; this catches any other case)
        where = f" ({dataset.path})" if getattr(dataset, "path", None) else ""
        raise ConfigError(f"split {split!r} of task {spec.name!r} holds no samples{where}")
    limit = config.data.train_limit if split == "train" else config.data.eval_limit
    if limit is not None and limit < len(dataset):
        kept = {k: getattr(dataset, k, None) for k in ("num_classes", "vocab_size")}
        dataset = Subset(dataset, range(limit))
        for key, value in kept.items():
            setattr(dataset, key, value)
    return dataset


def model_overrides(
    config: TrainConfig, spec: TaskSpec, num_classes: int | None, vocab_size: int | None = None
) -> dict:
    """The ``create_model`` overrides of a run: ``model.overrides``, the kernel and mode
    shortcuts, and the task's ``num_classes`` / ``vocab_size`` where the preset differs
    (``vocab_size``: the built dataset's, when its options set it)."""
    m = config.model
    overrides = dict(m.overrides)
    if m.kernel is not None:
        overrides["attn_kernel"] = m.kernel
    try:
        probe = create_model(m.name, device="meta", **overrides)
    except TypeError as err:
        raise ConfigError(f"model.overrides: {err}") from None
    except ValueError as err:
        raise ConfigError(f"model: {err}") from None
    kernel = probe.config.attn_kernel
    unknown = sorted(set(m.kernel_args) - set(list_kernels()))
    if unknown:
        raise ConfigError(
            f"model.kernel_args keys must be kernel names ({', '.join(list_kernels())}); "
            f"got {unknown[0]!r}"
        )
    for name, given in m.kernel_args.items():  # (every kernel's: the run may switch later)
        try:
            check_kernel_options(name, given)
        except TypeError as err:
            raise ConfigError(f"model.kernel_args.{name}: {err}") from None
    kernel_args = dict(probe.config.kernel_args)
    if m.kernel_args.get(kernel):
        # the model's options, this kernel's options of the run, then the explicit ones
        explicit = overrides.get("kernel_args") or {}
        kernel_args = {**kernel_args, **m.kernel_args[kernel], **explicit}
        overrides["kernel_args"] = kernel_args
    if m.mode is not None:
        if kernel != "taylorshift":
            raise ConfigError(
                f"model.mode applies to the taylorshift kernel; model {m.name!r} uses "
                f"{kernel!r} (set model.kernel=taylorshift)"
            )
        overrides["kernel_args"] = {**kernel_args, "mode": m.mode}
    kind = spec.behaviour
    is_lm = isinstance(probe, CausalLM)
    if kind.causal_lm != is_lm:
        wanted = "a causal language model (lm-tiny, lm-small, ...)" if kind.causal_lm else (
            "a classifier")  # fmt: skip
        raise ConfigError(
            f"task {spec.name!r} (kind {spec.kind!r}) needs {wanted}; model {m.name!r} is a "
            f"{type(probe).__name__}"
        )
    if is_lm:
        wanted = vocab_size or spec.vocab_size
        if wanted not in (None, probe.config.vocab_size) and "vocab_size" not in overrides:
            overrides["vocab_size"] = wanted
        return overrides
    probe = probe.config
    if num_classes not in (None, probe.num_classes) and "num_classes" not in overrides:
        overrides["num_classes"] = num_classes
    takes_tokens = hasattr(probe, "vocab_size")
    if kind.takes_tokens:
        if not takes_tokens:
            raise ConfigError(
                f"model {m.name!r} takes images but task {spec.name!r} gives token sequences"
            )
        wanted = spec.vocab_size
        if wanted not in (None, probe.vocab_size) and "vocab_size" not in overrides:
            overrides["vocab_size"] = wanted
    elif takes_tokens:
        raise ConfigError(f"model {m.name!r} takes token ids but task {spec.name!r} gives images")
    return overrides


def build_model(
    config: TrainConfig,
    spec: TaskSpec,
    num_classes: int | None,
    device=None,
    vocab_size: int | None = None,
) -> nn.Module:
    """``create_model`` with :func:`model_overrides` applied."""
    overrides = model_overrides(config, spec, num_classes, vocab_size)
    try:
        return create_model(config.model.name, device=device, **overrides)
    except (TypeError, ValueError) as err:  # a setting at odds with the run's kernel options
        raise ConfigError(f"model: {err}") from None
