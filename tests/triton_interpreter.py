"""A faster Triton interpreter for the suite: each set of ``triton.language`` modules
patched once a launch.

Under ``TRITON_INTERPRET=1`` (the kernel tests on machines without CUDA, and the GPU run's
dry run) Triton 3.x runs a kernel's grid in Python. Before a launch it patches the
builtins of the ``triton.language`` modules the kernel's globals hold with interpreted
versions (``_patch_lang``: a scan of every member of those modules and of the tensor class
with ``inspect.getmembers``) and restores them after. It patches again at every call of a
``@triton.jit`` device function inside the kernel: the first call of one whose globals
hold another of those modules (``tl.zeros`` lives beside ``triton.language.core``) patches
that module, but a call whose modules are patched already finds no builtin left to patch
and re-sets a few attributes to the same functions. In our kernels, whose loops call
device functions, those repeated scans took a fifth of a profiled test's time (21 %,
``benchmarks/suite_cpu``).

``install()`` makes a device function's patch return at once when its set of modules was
patched already in the same launch. What the kernels compute is unchanged (the tests
compare them with the references either way). Where Triton's interpreter has no
``_patch_lang`` (another version), it changes nothing.
"""

from __future__ import annotations

import inspect


class _Nothing:
    """The scope of a patch that patched nothing: nothing to restore."""

    def restore(self) -> None:
        pass


def install() -> bool:
    """Patch ``triton.runtime.interpreter._patch_lang`` as described above; whether it did
    (False: no interpreter, or one without ``_patch_lang``)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    real = getattr(interpreter, "_patch_lang", None)
    if real is None or getattr(real, "_once_a_launch", False):
        return real is not None
    patched = []  # the sets of modules patched in the running launch; none between launches

    def modules(fn) -> frozenset:
        """The ``triton.language`` modules ``_patch_lang`` patches for ``fn`` (its test)."""
        found = fn.__globals__.values()
        return frozenset(id(v) for v in found if inspect.ismodule(v) and v in (tl, tl.core))

    def patch_lang(fn):
        key = modules(fn)
        if patched and key in patched:  # a device function in a launch: patched already
            return _Nothing()
        scope = real(fn)
        if patched:  # a device function's first patch: part of the launch, as before
            patched.append(key)
            return scope
        patched.append(key)  # a launch
        restore = scope.restore

        def restore_and_end() -> None:
            patched.clear()
            restore()

        scope.restore = restore_and_end
        return scope

    patch_lang._once_a_launch = True
    interpreter._patch_lang = patch_lang
    return True
