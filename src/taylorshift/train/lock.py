"""One training process per run folder: an exclusive lock on ``<run folder>/.lock``.

Two launches into one folder (a requeued job started while the old one still runs) would
delete and append to one ``metrics.jsonl`` and prune each other's checkpoints. ``train``
therefore takes ``RunLock(out_dir)`` before it reads or writes anything in the folder, and
a second ``train`` on the same folder fails at once with :class:`RunLockedError`, naming
the holder (its pid, host and start time, which the holder writes into the lock file).

The lock is an advisory ``flock`` on the file, not the file's existence: the kernel drops
it when its process ends, however it ends (SIGKILL included), so a crashed run never
leaves a stale lock behind; the file itself stays, holding the last holder's description.
``flock`` is local to one machine's kernel (on some network file systems it does not
exclude another host) and exists on POSIX systems only; elsewhere no lock is taken.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".lock"

__all__ = ["LOCK_FILE", "RunLock", "RunLockedError"]


class RunLockedError(RuntimeError):
    """Another process is training into the same run folder."""


class RunLock:
    """Exclusive lock on a run folder, held from ``acquire()`` (or ``with``) to ``release()``.

    Args:
        folder: the run folder (created if missing).
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock or raise :class:`RunLockedError` naming the holder."""
        if fcntl is None or self._fd is not None:
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunLockedError(
                f"run folder {str(self.folder)!r} is in use by another training process "
                f"({holder}); wait for it to end or stop it, or choose another run.out_dir"
            ) from None
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Give the lock back (the file stays; the next holder overwrites it)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    """The holder's description from the lock file, for the error message."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["since"])))
        return f"pid {info['pid']} on host {info['host']}, since {since}"
    except (ValueError, KeyError, TypeError, OSError):
        return "holder unknown: it has not written its description yet"
