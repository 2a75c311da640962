"""A training config from a preset, then a JSON/TOML file, then ``key=value`` overrides."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

try:  # Python >= 3.11
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10
    tomllib = None  # type: ignore[assignment]

import typing

from .config import SECTIONS, ConfigError, TrainConfig, _unknown_key, apply_override
from .presets import PRESETS, get_preset

__all__ = ["load_config_file", "resolve_config"]


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a JSON (``.json``) or TOML (anything else) config file into a nested dict.

    The file holds sections (``[optim]`` / ``{"optim": {...}}``) and optionally a top-level
    ``preset = "name"``; it is checked when :func:`resolve_config` applies it.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err}") from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path} must be UTF-8 text: {err}") from None
    is_json = path.suffix.lower() == ".json"
    if not is_json and tomllib is None:  # pragma: no cover - Python 3.10
        raise ConfigError(f"reading TOML ({path}) needs Python >= 3.11; use a .json file")
    try:
        tree = json.loads(text) if is_json else tomllib.loads(text)
    except (json.JSONDecodeError, ValueError) as err:
        kind = "JSON" if is_json else "TOML"
        raise ConfigError(f"config file {path} is not valid {kind}: {err}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"config file {path} must hold a table of sections, got {tree!r}")
    return tree


def _merge(base: dict[str, Any], update: Mapping[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


def resolve_config(
    preset: str | None = None,
    file: str | Path | None = None,
    overrides: Iterable[tuple[str, Any]] | Mapping[str, Any] = (),
) -> TrainConfig:
    """A config from a preset, then a config file, then overrides (later wins).

    Args:
        preset: a name of :func:`list_presets`; default: the file's ``preset``, else the
            preset named like the task set by ``overrides`` (``lm``, ``recall``), else
            ``listops-cpu``.
        file: a JSON or TOML file of sections (see :func:`load_config_file`); tables in it
            are merged into the preset's (``[data.options]`` adds options).
        overrides: ``(dotted key, value)`` pairs or a mapping; string values are parsed as
            the field's type (see :func:`apply_override`).

    Raises:
        ConfigError: unknown preset, section, key, or a bad value.
    """
    file_tree = load_config_file(file) if file is not None else {}
    file_preset = file_tree.pop("preset", None)
    items = list(overrides.items() if isinstance(overrides, Mapping) else overrides)
    # A task with a preset of its own name (``lm``, ``recall``), or else of its name and
    # ``-cpu`` (``digits``, ``text-bytes``), starts from that preset.
    task = next((v for k, v in reversed(items) if k == "data.task"), None)
    by_task = None
    if isinstance(task, str):
        by_task = next((n for n in (task, f"{task}-cpu") if n in PRESETS), None)
    name = preset or file_preset or by_task or "listops-cpu"
    tree = get_preset(name).to_dict()
    # Another task than the preset's: the preset's task options (ListOps lengths, sample
    # counts) mean nothing to it, so they are dropped; the file and overrides give its own.
    file_data = file_tree.get("data")
    file_task = file_data.get("task") if isinstance(file_data, Mapping) else None
    final_task = task if isinstance(task, str) else file_task
    if isinstance(final_task, str) and final_task != tree["data"]["task"]:
        tree["data"]["options"], tree["data"]["split_options"] = {}, {}
    for section, values in file_tree.items():
        if section not in SECTIONS:
            raise _unknown_key(f"{section}.")
        if not isinstance(values, Mapping):
            raise ConfigError(f"section {section!r} of {file} must be a table, got {values!r}")
        hints = typing.get_type_hints(SECTIONS[section])
        for key in values:
            if key not in hints:
                raise _unknown_key(f"{section}.{key}")
        _merge(tree.setdefault(section, {}), values)
    for key, value in items:
        apply_override(tree, key, value)
    return TrainConfig.from_dict(tree)
