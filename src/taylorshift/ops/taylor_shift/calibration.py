"""The calibration file of ``mode="auto"``: where it lives, its format, reading it.

``taylorshift bench calibrate`` measures the direct/efficient crossover N̂ on this device
(CPU model or GPU name, with the torch and CUDA versions) per dtype, causal or not,
forward only or forward + backward, at a few head dims d, and stores it in
``calibration.json`` in the cache directory (``$TAYLORSHIFT_CACHE_DIR``, else
``$XDG_CACHE_HOME/taylorshift``, else ``~/.cache/taylorshift``). This module reads it once
per process (:func:`reload_calibration` reads it again) into a :class:`Calibration`: the
correction ratios ρ(d) = N̂_measured / N̂_theory that :mod:`.dispatch` applies to the
operation counts' crossover (docs/calibration.md). Reading never raises: a missing file is
None, a corrupt one None plus one warning, a file of another format version None (logged at
debug level). ``TAYLORSHIFT_CALIBRATION=off`` turns it off.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from ..._warn import warn_user
from ...theory import impl_crossover
from ...vocab import PASSES, dtype_name, pass_name
from .efficient_causal import DEFAULT_CAUSAL_CHUNK

logger = logging.getLogger("taylorshift.dispatch")

CACHE_DIR_ENV = "TAYLORSHIFT_CACHE_DIR"
CALIBRATION_ENV = "TAYLORSHIFT_CALIBRATION"
CALIBRATION_FILE = "calibration.json"
CALIBRATION_FORMAT = "taylorshift-calibration"
CALIBRATION_VERSION = 1
# Entries name their pass and dtype as taylorshift.vocab does; files written before name
# forward + backward "train" and are read as such (upgrade_entries).
OLD_TRAIN = "train"


def _theory_n(d: int, dv: int, causal: bool) -> float:
    """The op-count crossover (:func:`taylorshift.theory.impl_crossover`) at our chunk."""
    return impl_crossover(d, dv, causal, DEFAULT_CAUSAL_CHUNK)


# Where the calibration lives and which device it belongs to.


def cache_dir() -> Path:
    """``$TAYLORSHIFT_CACHE_DIR``, else ``$XDG_CACHE_HOME/taylorshift``, else ``~/.cache/…``."""
    own = os.environ.get(CACHE_DIR_ENV)
    if own:
        return Path(own).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "taylorshift"


def calibration_path(directory: str | os.PathLike | None = None) -> Path:
    return (Path(directory) if directory is not None else cache_dir()) / CALIBRATION_FILE


@lru_cache(maxsize=1)
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


@lru_cache(maxsize=16)
def _device_key(kind: str, index: int | None) -> str:
    if kind == "cpu":
        return f"cpu: {cpu_model()} | torch {torch.__version__}"
    if kind == "cuda":
        name = torch.cuda.get_device_name(index)
        return f"cuda: {name} | torch {torch.__version__} | cuda {torch.version.cuda}"
    return f"{kind}: | torch {torch.__version__}"


def device_key(device: torch.device | str) -> str:
    """What a calibration is valid for: the CPU model or GPU name and the software versions.

    Two GPUs of one model share a key (index 0 stands for an unindexed ``"cuda"``).
    """
    device = torch.device(device)
    index = device.index
    if device.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    return _device_key(device.type, index)


def _dtype_text(dtype: torch.dtype | str) -> str:
    """The vocabulary's dtype name; a name it does not know as it is (never matches a call)."""
    try:
        return dtype_name(dtype)
    except ValueError:
        return str(dtype).removeprefix("torch.")


def entry_key(dtype: torch.dtype | str, causal: bool, passes: str, d: int) -> str:
    """The key of one measured crossover inside a device's entries, in the vocabulary of
    :mod:`taylorshift.vocab` whatever the spelling given: 'float32/causal/forward+backward/d=64'
    for ``("fp32", True, "train", 64)`` too."""
    return f"{_dtype_text(dtype)}/{'causal' if causal else 'full'}/{pass_name(passes)}/d={d}"


def upgrade_entries(entries: Mapping[str, Mapping]) -> dict[str, dict]:
    """A device's entries with their pass and dtype (and so their keys) in the vocabulary:
    an entry of an older file, ``"pass": "train"``, becomes ``"forward+backward"``. Of two
    entries that then share a key, the later one stays (as the file's reader takes it)."""
    out: dict[str, dict] = {}
    for key, entry in entries.items():
        try:
            new = {**entry, "pass": pass_name(entry["pass"]), "dtype": _dtype_text(entry["dtype"])}
            key = entry_key(new["dtype"], bool(new["causal"]), new["pass"], int(new["d"]))
        except (KeyError, TypeError, ValueError):
            new = dict(entry)  # not an entry this version can read: kept as it was
        out.pop(key, None)
        out[key] = new
    return out


# The calibration in memory: per (device key, dtype, causal, pass), log ρ at calibrated d.


@dataclass(frozen=True)
class Calibration:
    """Correction ratios ρ(d) = N̂_measured / N̂_theory by (device key, dtype, causal, pass)."""

    path: str
    ratios: Mapping[tuple[str, str, bool, str], tuple[tuple[float, ...], tuple[float, ...]]]
    measured: Mapping[tuple[str, str, bool, str], dict[int, float]]

    def estimate(self, key: tuple[str, str, bool, str], d: int, dv: int) -> float | None:
        """N̂ for (d, dv) under ``key``, or None when nothing was measured for it."""
        found = self.ratios.get(key)
        if found is None:
            return None
        log_ds, log_rhos = found
        x = math.log(d)
        i = bisect.bisect_left(log_ds, x)
        if i == 0:
            log_rho = log_rhos[0]
        elif i == len(log_ds):
            log_rho = log_rhos[-1]
        else:
            t = (x - log_ds[i - 1]) / (log_ds[i] - log_ds[i - 1])
            log_rho = log_rhos[i - 1] + t * (log_rhos[i] - log_rhos[i - 1])
        return math.exp(log_rho) * _theory_n(d, dv, key[2])


class CalibrationError(ValueError):
    """The calibration file exists but cannot be used as one."""


def _usable_crossover(entry: Mapping, theory: float) -> float | None:
    """The N̂ an entry stands for: the interpolated crossover, or its bound beside theory;
    None for a sweep that found no crossover ("no data")."""
    found = entry["crossover"]
    status = found["status"]
    if status == "crossed":
        return float(found["n"])
    if status == "below":  # efficient won from the smallest N measured: N̂ <= n_above
        return min(float(found["n_above"]), theory)
    if status == "above":  # direct won up to the largest N measured: N̂ > n_below
        return max(float(found["n_below"]), theory)
    if status == "no data":
        return None
    raise CalibrationError(f"unknown crossover status {status!r}")


def _entry_field(entry: Mapping, name: str, kind: type) -> int | bool:
    """``entry[name]``, which must be a JSON integer (a positive one) or a JSON bool: a
    hand-edited "false" or 16.5 is refused, not read as True or 16."""
    value = entry[name]
    if kind is bool:
        ok = isinstance(value, bool)
    else:
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 31
    if not ok:
        what = "true or false" if kind is bool else "a positive integer"
        raise CalibrationError(f"{name} must be {what}; got {value!r}")
    return value


def parse_calibration(data: object, path: str = "") -> Calibration | None:
    """A :class:`Calibration` from the file's JSON, None for another format version.

    Raises :class:`CalibrationError` when the content is not a calibration.
    """
    if not isinstance(data, dict) or data.get("format") != CALIBRATION_FORMAT:
        raise CalibrationError(f"not a {CALIBRATION_FORMAT} file")
    if data.get("version") != CALIBRATION_VERSION:
        return None
    points: dict[tuple[str, str, bool, str], dict[int, float]] = {}
    try:
        for dev_key, device in data["devices"].items():
            for entry in device["entries"].values():
                d, dv = _entry_field(entry, "d", int), _entry_field(entry, "dv", int)
                causal = _entry_field(entry, "causal", bool)
                passes = entry["pass"]
                if passes not in (*PASSES, OLD_TRAIN) or d < 1 or dv < 1:
                    raise CalibrationError(f"bad entry for d={d}, pass {passes!r}")
                passes = pass_name(passes)  # files written before name forward + backward "train"
                n_hat = _usable_crossover(entry, _theory_n(d, dv, causal))
                if n_hat is None:
                    continue
                if not (math.isfinite(n_hat) and n_hat > 0):
                    raise CalibrationError(f"crossover {n_hat!r} is not a positive number")
                key = (str(dev_key), _dtype_text(entry["dtype"]), causal, passes)
                # ρ relative to the theory at the measured (d, dv): the call's dv may differ
                points.setdefault(key, {})[d] = n_hat / _theory_n(d, dv, causal)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as err:
        if isinstance(err, CalibrationError):
            raise
        raise CalibrationError(f"malformed entry ({type(err).__name__}: {err})") from None
    ratios = {}
    for key, by_d in points.items():
        ds = sorted(by_d)
        ratios[key] = (
            tuple(math.log(d) for d in ds),
            tuple(math.log(by_d[d]) for d in ds),
        )
    measured = {k: {d: r * _theory_n(d, d, k[2]) for d, r in v.items()} for k, v in points.items()}
    return Calibration(path=path, ratios=ratios, measured=measured)


_UNSET = object()
_loaded: object = _UNSET


def load_calibration() -> Calibration | None:
    """The calibration of the cache directory, read once per process (None when absent)."""
    global _loaded
    if _loaded is _UNSET:
        _loaded = _read_calibration(calibration_path())
    return _loaded  # type: ignore[return-value]


def reload_calibration() -> Calibration | None:
    """Forget the calibration read so far (and the cache dir it came from); read it again."""
    global _loaded
    _loaded = _UNSET
    return load_calibration()


def _read_calibration(path: Path) -> Calibration | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        logger.debug("no calibration at %s", path)
        return None
    except OSError as err:
        _warn_unusable(path, f"cannot be read ({err})")
        return None
    try:
        calibration = parse_calibration(json.loads(raw.decode("utf-8")), str(path))
    except UnicodeDecodeError as err:
        _warn_unusable(path, f"is not UTF-8 text ({err})")
        return None
    except (json.JSONDecodeError, RecursionError) as err:  # (nesting too deep to parse)
        _warn_unusable(path, f"is not valid JSON ({type(err).__name__}: {err})")
        return None
    except CalibrationError as err:
        _warn_unusable(path, str(err))
        return None
    if calibration is None:
        logger.debug("calibration at %s has another format version: ignored", path)
    return calibration


def _warn_unusable(path: Path, why: str) -> None:
    warn_user(
        f"taylorshift: ignoring the calibration file {path}: {why}; mode='auto' uses the "
        "operation counts. Run `taylorshift bench calibrate` again (or with --clear).",
        RuntimeWarning,
    )


@lru_cache(maxsize=8)
def _warn_once(why: str) -> None:
    warn_user(f"taylorshift: {why}; mode='auto' uses the operation counts", RuntimeWarning)


def _calibration_enabled() -> bool:
    return os.environ.get(CALIBRATION_ENV, "").strip().lower() not in ("off", "0", "false", "no")
