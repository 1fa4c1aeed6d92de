"""Where user code built an op: ``"train.py:42"``, recorded when the op is made.

Error messages name this place (``Op.where()``), so a fault found at run
time points at the user's line, not at retrograd's insides. The place is the
first stack frame outside the retrograd package (and outside the
``contextlib``/``functools`` glue between them); ``retrograd/models/charlm.py`` counts
as user code, since it is where the ``retrograd train`` model is built.

Recording costs a short walk of ``sys._getframe`` links with a cached
verdict per file (about a microsecond per op), not ``inspect.stack()``,
which reads source files. Gradient makers run under ``located(op.location)``
so the backward ops of a forward op point at the forward op's line.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
from contextlib import contextmanager
from typing import Iterator

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# The models of ``retrograd train`` are user code of the library, built here (models/charlm.py; the
# modules that build the sampler and the transformer call ``count_as_user_code(__file__)``), so
# the command's errors name their lines, not the installed ``retrograd`` script.
_USER_MODULES_INSIDE = {os.path.join(_PACKAGE, "models", "charlm.py")}
_GLUE = {os.path.abspath(contextlib.__file__), os.path.abspath(functools.__file__)}

# filename -> display text, or None for frames to skip; filled lazily, never large.
_verdicts: dict[str, str | None] = {}
_overrides: list[str | None] = []


def _verdict(filename: str) -> str | None:
    found = _verdicts.get(filename, ...)
    if found is not ...:
        return found
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    skip = (path in _GLUE or path.startswith(_PACKAGE)) and path not in _USER_MODULES_INSIDE
    shown = None if skip else _display(path)
    _verdicts[filename] = shown
    return shown


def _display(path: str) -> str:
    """A path under the working directory relative to it (``train.py``), else as it is."""
    if path.startswith("<"):
        return path                               # <stdin>, <ipython-input-3-...>
    try:
        relative = os.path.relpath(path)
    except ValueError:                            # another drive on Windows
        return path
    return path if relative.startswith(os.pardir) else relative


def count_as_user_code(filename: str) -> None:
    """Ops built in the module ``filename`` (inside retrograd) are located at its own lines.

    Example::

        count_as_user_code(__file__)       # at the top of a model-building module
    """
    path = os.path.abspath(filename)
    _USER_MODULES_INSIDE.add(path)
    _verdicts.pop(filename, None)
    _verdicts.pop(path, None)


def here() -> str | None:
    """``"file:line"`` of the innermost frame outside retrograd, or None if there is none.

    Example::

        op = Op("Tanh", ["x"], ["y"])        # op.location == here() at that line
    """
    if _overrides:
        return _overrides[-1]
    frame = sys._getframe(1)
    while frame is not None:
        shown = _verdict(frame.f_code.co_filename)
        if shown is not None:
            return f"{shown}:{frame.f_lineno}"
        frame = frame.f_back
    return None


@contextmanager
def located(location: str | None) -> Iterator[None]:
    """Ops made inside the ``with`` get ``location`` (gradient ops take their forward op's).

    Example::

        with located(op.location):
            grad_ops = build_gradient(op)
    """
    _overrides.append(location)
    try:
        yield
    finally:
        _overrides.pop()
