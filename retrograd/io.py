"""Saving and loading persistable values (parameters and optimizer state) as ``.npz``.

* ``save_params(scope, path, program)`` writes every persistable Var of
  ``program`` to a temporary file next to ``path`` and renames it over
  ``path`` (``os.replace``), so a crash leaves either the old file or the
  new one, never half of one.
* ``load_params(scope, path, program=None)`` reads with
  ``allow_pickle=False`` (no code runs on load), checks names, shapes and
  dtypes, and only then touches the scope: a bad file changes nothing.

The file is a plain ``.npz``: one array per persistable, keyed by its name,
so ``np.load(path)`` reads it too.

Example::

    rg.save_params(exe.scope, "model.npz", main)
    ...
    exe2 = rg.Executor()
    exe2.run(startup)
    rg.load_params(exe2.scope, "model.npz", main)   # training resumes exactly
"""
from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from .backend import to_numpy
from .errors import FeedError
from .ir.program import Program, Var
from .runtime.scope import Scope


class ParamFileError(FeedError):
    """A parameter file is missing, unreadable, or does not fit the program or scope."""


def persistable_vars(program: Program) -> list[Var]:
    """The Vars of ``program`` that live in the scope across runs, sorted by name."""
    found = {v.name: v for block in program.blocks for v in block.vars.values() if v.persistable}
    return [found[name] for name in sorted(found)]


def save_params(scope: Scope, path: str | os.PathLike, program: Program) -> Path:
    """Write ``program``'s persistable values from ``scope`` to ``path`` (``.npz``), atomically.

    Saves parameters and optimizer state (velocities, moments, step counts),
    so ``load_params`` resumes training exactly. Returns the path written.

    Example::

        rg.save_params(exe.scope, "ckpt.npz", main)
    """
    path = Path(path)
    arrays = {}
    missing = []
    for var in persistable_vars(program):
        value = scope.find(var.name)
        if value is None:
            missing.append(var.name)
        else:
            arrays[var.name] = to_numpy(value)
    if missing:
        raise ParamFileError(f"cannot save to {path}: the scope has no value for "
                             f"{_names(missing)} (run the startup program first)")
    if not arrays:
        raise ParamFileError(f"cannot save to {path}: the program has no persistable variables")
    if not path.parent.is_dir():
        raise ParamFileError(f"cannot save to {path}: directory {path.parent} does not exist")
    _atomic_write(path, arrays)
    return path


def _atomic_write(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write to a temporary file in ``path``'s directory, sync it, then rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            _write_npz(file, arrays)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write_npz(file, arrays: dict[str, np.ndarray]) -> None:
    np.savez(file, **arrays)


def read_params(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array stored in a parameter file, by name; ParamFileError if it is not one.

    Example::

        for name, value in rg.read_params("ckpt.npz").items():
            print(name, value.shape, value.dtype)
    """
    path = Path(path)
    if not path.is_file():
        raise ParamFileError(f"parameter file {path} does not exist")
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # a .npy file holds one bare array
            raise ParamFileError(f"{path} holds a single array (.npy), not a parameter file (.npz)")
        with loaded:
            arrays = {name: loaded[name] for name in loaded.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as exc:
        raise ParamFileError(f"{path} is not a readable parameter file (.npz): "
                             f"{type(exc).__name__}: {exc}") from None
    return arrays


def load_params(scope: Scope, path: str | os.PathLike, program: Program | None = None, *,
                strict: bool = False) -> list[str]:
    """Load a file written by ``save_params`` into ``scope``; return the names loaded.

    With ``program``, every persistable Var of the program must be in the
    file with its declared shape and dtype (``strict=True`` also rejects
    entries the program lacks). Without it, each entry must match the shape
    and dtype of any value the scope already holds under that name. On a
    mismatch, ParamFileError lists what does not match and the scope is left
    unchanged.

    Example::

        exe.run(startup)
        rg.load_params(exe.scope, "ckpt.npz", main)
    """
    arrays = read_params(path)
    problems = _mismatches(arrays, scope, program, strict)
    if problems:
        what = "the program" if program is not None else "the values in the scope"
        raise ParamFileError(f"{path} does not fit {what}: {'; '.join(problems)} "
                             "(was it saved from another model or with other sizes?)")
    for name, value in arrays.items():
        scope.set(name, value)
    return sorted(arrays)


def _mismatches(arrays: dict[str, np.ndarray], scope: Scope, program: Program | None,
                strict: bool) -> list[str]:
    problems = []
    if program is not None:
        wanted = {v.name: v for v in persistable_vars(program)}
        missing = [n for n in wanted if n not in arrays]
        if missing:
            problems.append(f"missing {_names(missing)}")
        if strict:
            extra = [n for n in arrays if n not in wanted]
            if extra:
                problems.append(f"not in the program: {_names(extra)}")
        expected = {n: (v.shape, v.dtype) for n, v in wanted.items()}
    else:
        expected = {}
        for name in arrays:
            held = scope.find(name)
            if held is not None:
                expected[name] = (tuple(held.shape), str(to_numpy(held).dtype))
    for name, value in arrays.items():
        if name not in expected:
            continue
        shape, dtype = expected[name]
        if len(shape) != value.ndim or any(d >= 0 and d != v for d, v in zip(shape, value.shape)):
            problems.append(f"'{name}' has shape {list(value.shape)} in the file, expected "
                            f"{_shape(shape)}")
        elif str(value.dtype) != dtype:
            problems.append(f"'{name}' has dtype {value.dtype} in the file, expected {dtype}")
    return problems


def _shape(shape) -> str:
    return "[" + ", ".join("?" if d < 0 else str(d) for d in shape) + "]"


def _names(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
