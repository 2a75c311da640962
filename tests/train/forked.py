"""``python -m taylorshift`` in a process forked from a server that has imported torch and
the package already (the ``forkserver`` start method of multiprocessing, with preloaded
modules).

A fresh interpreter spends about 4 s here before the CLI runs (torch, then ``torch._dynamo``,
which the first optimizer imports); a kill-and-resume test starts six. The forked process
is a process of its own all the same: SIGKILL ends it at the test's kill points, it writes
its own files and draws its own random numbers, and ``taylorshift.cli.main`` is the entry
point ``python -m taylorshift`` calls (tests/test_cli.py runs that one as a subprocess).
The server is forked from nothing but imports, so no OpenMP or other thread pool is alive
in it (those do not survive a fork).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

PRELOAD = ["torch", "torch._dynamo", "taylorshift.cli", "taylorshift.train", __name__]

_context = None


def _server():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _main(argv: list[str], env: dict[str, str], out: str, err: str) -> None:
    """The child: the environment and the standard streams of ``env``, ``out`` and ``err``,
    then the CLI; exits with its status."""
    os.environ.clear()
    os.environ.update(env)
    with open(out, "w") as stdout, open(err, "w") as stderr:
        os.dup2(stdout.fileno(), 1)
        os.dup2(stderr.fileno(), 2)
    from taylorshift.cli import main

    with (
        open(1, "w", buffering=1, closefd=False) as sys.stdout,
        open(2, "w", buffering=1, closefd=False) as sys.stderr,
    ):
        try:
            code = main(argv)
        except SystemExit as exit_:  # as the interpreter reports it
            code = exit_.code
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code or 0)


def fork_cli(argv: list[str], env: dict[str, str], timeout: float = 300):
    """What ``subprocess.run([python, "-m", "taylorshift", *argv], env=env,
    capture_output=True, text=True)`` returns (returncode: the exit status, or -signal)."""
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        process = _server().Process(target=_main, args=(argv, env, str(out), str(err)))
        process.start()
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(argv, timeout)
        return subprocess.CompletedProcess(argv, process.exitcode, out.read_text(), err.read_text())
