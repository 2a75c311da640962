"""``warn_user``: a warning that names the user's line, not the library's.

A fixed ``stacklevel`` points at the right frame only from one call path: the calibration's
warnings, reached from the op, a layer, a model or ``transformers``, named a line of
``dispatch.py``. ``warn_user`` skips every frame in this package, in torch and in
``transformers`` (when imported) and names the first frame outside them, as Python 3.12's
``skip_file_prefixes`` does (computed here by hand on older Pythons).
"""

from __future__ import annotations

import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _skipped_prefixes() -> tuple[str, ...]:
    prefixes = [_PACKAGE]
    for name in ("torch", "transformers"):
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            prefixes.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return tuple(prefixes)


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the first caller outside this
    package, torch and transformers (the outermost frame if all are inside)."""
    prefixes = _skipped_prefixes()
    if sys.version_info >= (3, 12):
        warnings.warn(message, category, skip_file_prefixes=prefixes)
        return
    frame, level = sys._getframe(1), 2  # level 2: warn_user's caller
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(
        prefixes
    ):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
