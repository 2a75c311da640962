"""Building and loading the CPU kernels (``efficient.c``, ``direct.c``,
``efficient_causal.c``, ``rows.c``, ``decode.c``) on first use.

The C sources are compiled by the machine's C compiler (``$CC``, else ``cc``, ``gcc`` or
``clang`` on the PATH), all at once, each to an object file, and linked into a shared
library in the cache folder (``$TAYLORSHIFT_CACHE_DIR``, else ``$XDG_CACHE_HOME/taylorshift``, else
``~/.cache/taylorshift``), named by a hash of the sources, the compiler, its flags and the
CPU, so that a changed source, compiler or machine builds anew and a shared home folder
never hands one CPU's build to another. The build writes to a temporary file and renames
it into place: a process killed mid-build never leaves a broken library behind. Processes
that need the same library at once (the ranks of a job, test workers) build it once: one
holds a lock on the folder while it compiles, the others wait for its file and load it
(``_build_once``). Where the cache folder cannot be written (a read-only home), the
build goes to ``<tmp>/taylorshift-<uid>/cpu-kernels``, a folder only this user may write.

Flags: ``-O3 -march=native -fopenmp`` first; a compiler that refuses one of them gets the
next, plainer set (without ``-march=native``, then without OpenMP: one thread). Loading
happens once per process; ``unavailable_reason()`` says why the kernels cannot run here
(``TAYLORSHIFT_CPU_KERNELS=off``, no compiler, a failed build), and the callers then use
the PyTorch forms, which compute the same function.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in ("efficient.c", "direct.c", "efficient_causal.c", "rows.c", "decode.c")
)
# included by the sources: in the hash too
HEADERS = tuple(Path(__file__).with_name(name) for name in ("rows.h", "vectors.h", "kernels.h"))
ENV = "TAYLORSHIFT_CPU_KERNELS"
FLAG_SETS = (
    ("-O3", "-march=native", "-fopenmp"),
    ("-O3", "-fopenmp"),
    ("-O3",),
)
COMMON_FLAGS = ("-std=gnu11", "-shared", "-fPIC", "-ffp-contract=fast")
BUILD_TIMEOUT_S = 120
# how long a process waits for another's build before it builds itself: the build's two
# steps (the sources side by side, then the link) may each take BUILD_TIMEOUT_S
LOCK_WAIT_S = 2 * BUILD_TIMEOUT_S + 30

logger = logging.getLogger("taylorshift.dispatch")


class BuildError(RuntimeError):
    """The kernels could not be built or loaded here; the message says why."""


class CacheNotWritableError(BuildError):
    """The cache folder cannot be written: no compiler flags would help."""


def setting() -> str:
    """``$TAYLORSHIFT_CPU_KERNELS``: ``auto`` (the default: use them when they build) or
    ``off``."""
    value = os.environ.get(ENV, "auto").strip().lower()
    return "off" if value in ("off", "0", "false", "no") else "auto"


def compiler() -> str | None:
    """The C compiler: ``$CC`` if set, else the first of cc, gcc, clang on the PATH."""
    own = os.environ.get("CC", "").strip()
    if own:
        return own
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    return None


def unavailable_reason() -> str | None:
    """Why the CPU kernels cannot run in this process, or None when they can (builds them
    on the first call)."""
    if setting() == "off":
        return f"turned off by {ENV}=off"
    try:
        library()
    except BuildError as err:
        return str(err)
    return None


def is_available() -> bool:
    return unavailable_reason() is None


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The loaded kernels (built on the first call of the process); raises BuildError."""
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler found (set CC, or install gcc or clang)")
    version = _compiler_version(cc)
    errors = []
    for flags in FLAG_SETS:
        path = _library_path(cc, version, flags)
        if not path.exists():
            try:
                try:
                    _build_once(cc, flags, path)
                except CacheNotWritableError as err:
                    # a read-only home (a container, a compute node): a folder of this
                    # user's own in the temporary directory instead
                    path = _private_fallback(path.name, err)
                    if not path.exists():
                        _build_once(cc, flags, path)
            except CacheNotWritableError as err:
                raise BuildError(f"the CPU kernels cannot be built: {err}") from err
            except BuildError as err:
                errors.append(f"{' '.join(flags)}: {err}")
                continue
        try:
            return _declare(ctypes.CDLL(str(path)))
        except OSError as err:
            errors.append(f"{' '.join(flags)}: loading {path} failed: {err}")
    names = " and ".join(source.name for source in SOURCES)
    raise BuildError(f"building {names} with {cc} failed: " + " | ".join(errors))


def _private_fallback(name: str, why: CacheNotWritableError) -> Path:
    """``<tmp>/taylorshift-<uid>/cpu-kernels/<name>``, in a folder that only this user can
    write (a library loaded from a folder others can write to would run their code): made
    with mode 0700, or refused when it exists with another owner or other permissions."""
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    top = Path(tempfile.gettempdir()) / f"taylorshift-{user}"
    try:
        top.mkdir(mode=0o700, exist_ok=True)
        info = top.stat()
    except OSError as err:
        raise CacheNotWritableError(f"{why}; and {top}: {err}") from err
    if hasattr(os, "getuid") and (info.st_uid != os.getuid() or info.st_mode & 0o077):
        raise CacheNotWritableError(
            f"{why}; and {top} is not this user's private folder (owner {info.st_uid}, "
            f"mode {info.st_mode & 0o777:o}; expected owner {os.getuid()}, mode 700)"
        )
    logger.info("CPU kernels: %s; building in %s instead", why, top)
    return top / "cpu-kernels" / name


def _compiler_version(cc: str) -> str:
    try:
        done = subprocess.run(
            [cc, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise BuildError(f"the C compiler {cc!r} does not run: {err}") from err
    return done.stdout.splitlines()[0] if done.stdout else ""


def _cpu_flags() -> str:
    """What -march=native depends on: the CPU's model and feature flags, where readable."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


def _library_path(cc: str, version: str, flags: tuple[str, ...]) -> Path:
    from ..taylor_shift.calibration import cache_dir

    digest = hashlib.sha256()
    sources = [source.read_bytes().decode() for source in (*SOURCES, *HEADERS)]
    for part in (*sources, cc, version, *flags, *COMMON_FLAGS, platform.machine(),
                 _cpu_flags()):  # fmt: skip
        digest.update(part.encode() + b"\0")
    return cache_dir() / "cpu-kernels" / f"kernels-{digest.hexdigest()[:16]}.so"


def _build_once(cc: str, flags: tuple[str, ...], path: Path) -> None:
    """Build ``path`` unless another process, holding the folder's lock, has built it
    meanwhile: eight ranks starting at once compile once, not eight times side by side."""
    with build_lock(path.parent):
        if not path.exists():
            _build(cc, flags, path)


@contextlib.contextmanager
def build_lock(folder: Path, wait_s: float | None = None):
    """Hold an exclusive lock on ``folder`` (``flock`` on the folder itself: no lock file
    is left behind; released when the process ends, however it ends). Waits at most
    ``wait_s`` (default ``LOCK_WAIT_S``) for a holder, then goes on without the lock, as it
    does where the folder cannot be made or locked (no ``fcntl``: Windows): the build's
    rename keeps concurrent builds safe, only slower."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield  # the build reports the unwritable folder (CacheNotWritableError)
        return
    try:
        deadline = time.monotonic() + (LOCK_WAIT_S if wait_s is None else wait_s)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    logger.warning("CPU kernels: %s stayed locked; building without it", folder)
                    break
                time.sleep(0.05)
            except OSError:  # a file system without locks
                break
        yield
    finally:
        os.close(fd)  # releases the lock


def _build(cc: str, flags: tuple[str, ...], path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".build-", suffix=".so")
        os.close(fd)
    except OSError as err:
        raise CacheNotWritableError(
            f"cannot write to {path.parent}: {err} (set TAYLORSHIFT_CACHE_DIR to a writable folder)"
        ) from err
    try:
        # (the objects beside the library's temporary file: a folder known to be writable)
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".build-") as objects:
            # every source to an object file at once, then one link: the cores share the
            # compilers (a pool as wide as the cores would leave the slowest source last)
            names = [str(Path(objects) / f"{source.stem}.o") for source in SOURCES]
            jobs = [[cc, *flags, *COMMON_FLAGS, "-c", str(source), "-o", name]
                    for source, name in zip(SOURCES, names, strict=True)]  # fmt: skip
            with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
                for error in pool.map(_compile, jobs):
                    if error:
                        raise BuildError(error)
            error = _compile([cc, *flags, *COMMON_FLAGS, "-o", tmp, *names, "-lm"])
            if error:
                raise BuildError(error)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _compile(command: list[str]) -> str | None:
    """Run one compiler command: None, or what went wrong (its last lines)."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return f"exit {done.returncode}: {' / '.join(tail)}"
    return None


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    i, p, f = ctypes.c_int, ctypes.c_void_p, ctypes.c_float
    lib.ts_state_rows.argtypes, lib.ts_state_rows.restype = [i], i
    lib.ts_state_cols.argtypes, lib.ts_state_cols.restype = [i], i
    # the single feature products (the passes below call them in C; benchmarks time them)
    lib.ts_state.argtypes = [i, i, i, p, p, i, i, p, p, i, i]
    lib.ts_state.restype = i  # 0, or 1: out of memory
    lib.ts_readout.argtypes = [i, i, i, p, p, i, p, i, p, p, i, p, i]
    lib.ts_readout.restype = None
    lib.ts_pair_grad.argtypes = [i, i, i, p, p, i, i, p, p, i, p, i]
    lib.ts_pair_grad.restype = i
    # the passes, one signature for the three forms (kernels.h)
    forward = [i, i, i, i, i, p, p, p, p, p, f, i, f, i, i, p, p, p, p, i]
    backward = [i, i, i, i, i, p, p, p, p, p, f, i, f, i, i, p, p, p, p, p, p, p, p, p, i]
    for form in ("efficient", "causal", "direct"):
        for name, argtypes in ((f"ts_{form}_forward", forward), (f"ts_{form}_backward", backward)):
            getattr(lib, name).argtypes, getattr(lib, name).restype = argtypes, i
    lib.ts_decode_step.argtypes = [i, i, i, i, p, p, p, p, f, p, i, f, p, p, p, i]
    lib.ts_decode_step.restype = None
    return lib
