"""Weights on disk: safetensors files that carry the model's class and config.

``save_model`` writes every tensor of ``model.state_dict()`` and the metadata

    {"taylorshift_model": <class name>, "config": <JSON of model.config>, "format_version": "1"}

so ``load_model(path)`` rebuilds the model from the file alone. The file is written
through ``taylorshift.atomic.write_atomic`` (temporary name, fsync, ``os.replace``): a crash
mid-write never leaves a truncated file under the final name.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save
from torch import nn

from ..atomic import write_atomic
from .encoder import ModelConfigBase
from .registry import check_placement, get_model_class

FORMAT_VERSION = "1"

# Settings that change how (not what) is computed, or only regularise training: weights
# move freely between models that differ in them.
_RUNTIME_SETTINGS = frozenset({"dropout", "attn_drop", "drop_path"})


def save_model(model: nn.Module, path: str | os.PathLike) -> Path:
    """Save ``model``'s tensors and config to the safetensors file ``path`` (atomically).

    Args:
        model: a registered model class with a ``config`` (``TransformerClassifier``,
            ``VisionTransformer``, or a class decorated with ``register_model_class``).
        path: the file to write (missing folders are made). An existing file is replaced.

    Returns:
        ``path`` as a ``Path``.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfigBase):
        raise TypeError(
            f"save_model needs a taylorshift model with a config; got {type(model).__name__}"
        )
    name = type(model).__name__
    get_model_class(name)  # refuse what load_model could not rebuild
    if any(t.is_meta for t in model.state_dict().values()):
        raise ValueError(
            "model: its tensors are on the meta device and hold no values to save; "
            "materialise them first (model.to_empty(device='cpu'), then load or initialise)"
        )
    if Path(path).is_dir():  # (before the tensors are serialised)
        raise IsADirectoryError(errno.EISDIR, "path: a folder, not the file to write", str(path))
    metadata = {
        "taylorshift_model": name,
        "config": json.dumps(config.to_dict(), sort_keys=True),
        "format_version": FORMAT_VERSION,
    }
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}  # tied weights (an LM head sharing the embedding) once
    first_of: dict[tuple, str] = {}
    for key, value in model.state_dict().items():
        ident = (value.device, value.untyped_storage().data_ptr(), value.storage_offset(),
                 tuple(value.shape), tuple(value.stride()))  # fmt: skip
        if value.numel() and ident in first_of:
            aliases[key] = first_of[ident]
            continue
        first_of[ident] = key
        tensors[key] = value.detach().cpu().contiguous()
    if aliases:
        metadata["aliases"] = json.dumps(aliases, sort_keys=True)
    return write_atomic(path, save(tensors, metadata=metadata))


def _load_tensors(path: str | os.PathLike, device: str) -> dict[str, torch.Tensor]:
    """The file's tensors, tied names (metadata ``aliases``) filled in from their source."""
    tensors = load_file(str(path), device=device)
    try:
        aliases = json.loads(_read_metadata(path).get("aliases", "{}"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: its metadata 'aliases' is not valid JSON: {err}") from None
    if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
        raise ValueError(
            f"{path}: its metadata 'aliases' must map tensor names to tensor names; got "
            f"{str(aliases)[:80]}"
        )
    for key, source in aliases.items():
        if source in tensors:
            tensors[key] = tensors[source]
    return tensors


def _read_metadata(path: str | os.PathLike) -> dict[str, str]:
    if not os.path.isfile(path):  # an OSError that callers catch as a missing file
        raise FileNotFoundError(f"no weights file at {path}: expected a .safetensors file")
    try:  # (safetensors says "No such file or directory" for a file it may not read)
        with open(path, "rb"):
            pass
    except OSError as err:
        raise type(err)(
            err.errno, f"cannot read the weights file: {err.strerror}", str(path)
        ) from None
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{path} is not a readable safetensors file: {err}") from err
    missing = [k for k in ("taylorshift_model", "config", "format_version") if k not in metadata]
    if missing:
        raise ValueError(
            f"{path} lacks the metadata {missing}: it was not written by "
            "taylorshift.models.save_model (load its tensors with safetensors directly)"
        )
    if metadata["format_version"] != FORMAT_VERSION:
        raise ValueError(
            f"{path} has format_version {metadata['format_version']!r}; this version of "
            f"taylorshift reads {FORMAT_VERSION!r}"
        )
    return metadata


def read_model_config(path: str | os.PathLike) -> tuple[str, ModelConfigBase]:
    """The model class name and the config stored in ``path``, without loading tensors."""
    metadata = _read_metadata(path)
    cls = get_model_class(metadata["taylorshift_model"])
    try:
        settings = json.loads(metadata["config"])
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: the stored config is not valid JSON: {err}") from err
    if not isinstance(settings, dict):
        raise ValueError(
            f"{path}: the stored config must be a JSON object; got {type(settings).__name__}"
        )
    try:
        return cls.__name__, cls.config_class.from_dict(settings)
    except (TypeError, ValueError) as err:  # (an unknown setting, a bad value)
        raise ValueError(
            f"{path}: the stored config does not make a {cls.__name__}: {err}"
        ) from None


def _uniform_float_dtype(tensors: dict[str, torch.Tensor]) -> torch.dtype | None:
    dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    return dtypes.pop() if len(dtypes) == 1 else None


def _listing(names: list[str], limit: int = 10) -> str:
    more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _check_tensors(model: nn.Module, tensors: dict[str, torch.Tensor], path) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    shapes = [
        f"{k} (file {tuple(tensors[k].shape)}, model {tuple(expected[k].shape)})"
        for k in sorted(set(expected) & set(tensors))
        if tensors[k].shape != expected[k].shape
    ]
    problems = [
        f"{what}: {_listing(names)}"
        for what, names in (
            ("missing tensors", missing),
            ("unexpected tensors", unexpected),
            ("shape mismatches", shapes),
        )
        if names
    ]
    if problems:
        raise ValueError(f"{path} does not fit this {type(model).__name__}: " + "; ".join(problems))


def load_model(
    path: str | os.PathLike, map_location: str | torch.device | None = None, *, dtype=None
) -> nn.Module:
    """Rebuild the model saved by ``save_model`` from the file alone (in eval mode).

    Args:
        path: a file written by ``save_model``.
        map_location: device of the model (default CPU).
        dtype: dtype of its parameters; default: the stored one (when all stored floating
            tensors share one dtype, else the default dtype).

    Raises:
        FileNotFoundError: no file at ``path``; another ``OSError`` (naming ``path``) when
            it cannot be read.
        ValueError: not a taylorshift weights file, unknown model class, a stored config
            that does not make one, tensors that do not fit it (names listed), or a device
            torch does not know or the meta device for ``map_location``.
        TypeError: ``dtype`` not a floating torch.dtype.
    """
    check_placement(map_location, dtype, device_arg="map_location")
    name, config = read_model_config(path)
    device = torch.device(map_location) if map_location is not None else torch.device("cpu")
    if device.type == "meta":
        raise ValueError(
            "map_location: the meta device holds no values to load into; for the stored "
            "model without them, read_model_config(path) and create the model on 'meta'"
        )
    tensors = _load_tensors(path, str(device))
    cls = get_model_class(name)
    model = cls(config, device=device, dtype=dtype or _uniform_float_dtype(tensors))
    _check_tensors(model, tensors, path)
    model.load_state_dict(tensors)
    return model.eval()


def _config_differences(file_config: dict[str, Any], model_config: dict[str, Any]) -> list[str]:
    def comparable(cfg: dict[str, Any]) -> dict[str, Any]:
        cfg = {k: v for k, v in cfg.items() if k not in _RUNTIME_SETTINGS}
        kernel_args = dict(cfg.get("kernel_args") or {})
        kernel_args.pop("mode", None)  # direct and efficient TaylorShift share weights
        return {**cfg, "kernel_args": kernel_args}

    a, b = comparable(file_config), comparable(model_config)
    return [
        f"{k} (file {a.get(k)!r}, model {b.get(k)!r})"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]


def load_weights(model: nn.Module, path: str | os.PathLike, *, check_config: bool = True):
    """Load the tensors of ``path`` into ``model`` (a model of the same class and config).

    Args:
        model: the model to fill; its dtype and device stay.
        path: a file written by ``save_model``.
        check_config: refuse a file whose config differs from ``model.config`` in anything
            but ``dropout``, ``attn_drop``, ``drop_path`` and ``kernel_args["mode"]``
            (which change how, not what, the weights compute). Tensor names and shapes are
            always checked.

    Returns:
        ``model``.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file holds another model class, another config (the differing
            settings listed) or other tensors (missing/unexpected/mis-shaped names listed).
    """
    name, config = read_model_config(path)
    if name != type(model).__name__:
        raise ValueError(
            f"{path} holds a {name}, not a {type(model).__name__}; rebuild it with load_model"
        )
    if check_config:
        diffs = _config_differences(config.to_dict(), model.config.to_dict())
        if diffs:
            raise ValueError(
                f"{path} holds a {name} of another configuration: {'; '.join(diffs)} "
                "(load_model rebuilds the stored one)"
            )
    tensors = _load_tensors(path, "cpu")
    _check_tensors(model, tensors, path)
    model.load_state_dict(tensors)
    return model
