"""Saving and loading persistable values (parameters and optimizer state) as ``.npz``.

* ``save_params(scope, path, program)`` writes every persistable Var of
  ``program`` to a temporary file next to ``path`` and renames it over
  ``path`` (``os.replace``), so a crash leaves either the old file or the
  new one, never half of one.
* ``load_params(scope, path, program=None)`` reads with
  ``allow_pickle=False`` (no code runs on load), checks names, shapes and
  dtypes, and only then touches the scope: a bad file changes nothing.

The file is a plain ``.npz``: one array per persistable, keyed by its name,
so ``np.load(path)`` reads it too. ``save_params(..., with_program=True)`` also
stores the program itself (its JSON form, as the int32 array ``__program__``,
which ``read_params`` and ``load_params`` leave out and ``read_program``
returns): ``retrograd show model.npz`` prints it. Files are the same on every backend: values
are copied to the host to save, and ``scope.set`` moves loaded values onto the
scope's backend (save on torch or CUDA, load on NumPy, and back).

Example::

    rg.save_params(exe.scope, "model.npz", main)
    ...
    exe2 = rg.Executor()
    exe2.run(startup)
    rg.load_params(exe2.scope, "model.npz", main)   # training resumes exactly
"""
from __future__ import annotations

import lzma
import math
import os
import secrets
import time
import tokenize
import zipfile
import zlib
from pathlib import Path
from typing import Callable

import numpy as np

from .backends import dtype_name, to_numpy
from .errors import FeedError, ProgramError, RetrogradError
from .ir.dtypes import DTYPES, numpy_dtype
from .ir.program import Program, Var
from .runtime.scope import Scope


class ParamFileError(FeedError):
    """A parameter file is missing, unreadable, or does not fit the program or scope.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        try:
            rg.read_params("no/such/file.npz")
        except rg.ParamFileError as exc:
            print(exc)
        ```
    """


def persistable_vars(program: Program) -> list[Var]:
    """The Vars of ``program`` that live in the scope across runs, sorted by name."""
    found = {v.name: v for block in program.blocks for v in block.vars.values() if v.persistable}
    return [found[name] for name in sorted(found)]


PROGRAM_MEMBER = "__program__"    # int32 [n]: the UTF-8 bytes of the saved program's JSON


def save_params(scope: Scope, path: str | os.PathLike, program: Program, *,
                with_program: bool = False) -> Path:
    """Write ``program``'s persistable values from ``scope`` to ``path`` (``.npz``), atomically.

    Saves parameters and optimizer state (velocities, moments, step counts),
    so ``load_params`` resumes training exactly. ``with_program=True`` also
    stores ``program`` (``read_program``); a program the JSON form cannot hold
    is left out.

    Args:
        scope: The Scope holding the values (``exe.scope``).
        path: The file to write.
        program: The program whose persistable Vars are saved.
        with_program: Also store ``program`` itself (``read_program``).

    Returns:
        The path written.

    Example:
        ```python
        import os
        import tempfile

        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            loss = rg.mean(rg.layers.fc(rg.data("x", [-1, 3]), 2, name="fc"))
            rg.optim.Adam(1e-3).minimize(loss)
        exe = rg.Executor()
        exe.run(startup)
        path = os.path.join(tempfile.mkdtemp(), "ckpt.npz")
        rg.save_params(exe.scope, path, main)
        assert "fc.w" in rg.read_params(path) and "fc.w.moment1" in rg.read_params(path)
        ```
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
    for name, array in arrays.items():
        if not isinstance(array, np.ndarray) or array.dtype.hasobject or array.dtype.name not in DTYPES:
            raise ParamFileError(f"cannot save '{name}' to {path}: its value is "
                                 f"{getattr(array, 'dtype', type(array).__name__)}; parameter files hold "
                                 f"arrays of {', '.join(DTYPES)} (never pickled objects)")
    if with_program:
        arrays.update(_program_member(program))
    if path.is_dir():
        raise ParamFileError(f"cannot save to {path}: it is a directory")
    if not path.parent.is_dir():
        raise ParamFileError(f"cannot save to {path}: directory {path.parent} does not exist")
    try:
        _remove_stale_temps(path)
        _atomic_write(path, arrays)
    except OSError as exc:
        raise ParamFileError(f"cannot save to {path}: {exc.strerror or exc}") from None
    return path


def _program_member(program: Program) -> dict[str, np.ndarray]:
    try:
        text = program.to_json()
    except ProgramError:           # an op or attribute the JSON form cannot hold
        return {}
    return {PROGRAM_MEMBER: np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)}


def read_program(path: str | os.PathLike) -> Program | None:
    """The program stored in a parameter file by ``save_params(..., with_program=True)``, or None
    when it holds none; ParamFileError when the file is not a parameter file.

    Example::

        print(rg.io.read_program("retrograd-lstm.npz"))
    """
    codes = _read_npz(Path(path), lambda name, shape, dtype: None, {}, keep_program=True).get(PROGRAM_MEMBER)
    if codes is None:
        return None
    try:
        return Program.from_json(np.asarray(codes, dtype=np.uint8).tobytes().decode("utf-8"))
    except (UnicodeDecodeError, RetrogradError) as exc:
        raise ParamFileError(f"{path}: its stored program is damaged ({exc})") from None


def remove_stale_temps(path: str | os.PathLike) -> None:
    """Remove temporary files a killed save of ``path`` left beside it (``.<name>.<pid>.<hex>.tmp``
    of processes that are gone, or older than an hour)."""
    path = Path(path)
    if path.parent.is_dir():
        _remove_stale_temps(path)


# Temporary files are named ``.<file>.<pid>.<random>.tmp``. A save killed midway (SIGKILL,
# power loss) cannot remove its own; the next save in that directory removes those whose
# process is gone, or that are older than an hour (a process id may have been reused).
_STALE_AFTER_S = 3600.0


def _atomic_write(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write to a temporary file in ``path``'s directory, sync it, then rename it over ``path``."""
    fd, tmp = _create_temp(path)
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


def _create_temp(path: Path) -> tuple[int, str]:
    """A new file ``.<name>.<pid>.<random>.tmp`` beside ``path``, opened for writing, with the
    mode ``open()`` would give it (0666 less the umask; ``mkstemp`` would make it 0600)."""
    for _ in range(100):
        tmp = str(path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                           0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary file name beside {path}")


def _remove_stale_temps(path: Path) -> None:
    prefix = f".{path.name}."
    for entry in path.parent.iterdir():
        name = entry.name
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid = name[len(prefix):].split(".", 1)[0]
        try:
            stale = not (pid.isdigit() and _process_alive(int(pid))) \
                or time.time() - entry.stat().st_mtime > _STALE_AFTER_S
            if stale:
                entry.unlink()
        except OSError:
            continue     # removed meanwhile, or not ours to remove: leave it


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True      # exists but belongs to someone else (or cannot be asked): keep its file
    return True


def _write_npz(file, arrays: dict[str, np.ndarray]) -> None:
    """What ``np.savez`` writes, but never pickling (and names such as 'file' are fine)."""
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)


def read_params(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array stored in a parameter file, by name.

    Args:
        path: A file written by ``save_params``.

    Returns:
        A dict of name -> NumPy array.

    Raises:
        ParamFileError: The file is missing or not a parameter file.

    Example:
        ```python
        import os
        import tempfile

        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            loss = rg.mean(rg.layers.fc(rg.data("x", [-1, 3]), 2, name="fc"))
            rg.optim.Adam(1e-3).minimize(loss)
        exe = rg.Executor()
        exe.run(startup)
        path = os.path.join(tempfile.mkdtemp(), "ckpt.npz")
        rg.save_params(exe.scope, path, main)
        for name, value in rg.read_params(path).items():
            print(name, value.shape, value.dtype)
        ```
    """
    return _read_npz(Path(path), lambda name, shape, dtype: None, {})


# What a member may declare is checked before its data is read: ``check(name, shape,
# dtype)`` returns a complaint or None (then the member is skipped and the complaint
# kept); sizes come from the data actually present, never from a header alone.
_Check = Callable[[str, tuple, np.dtype], "str | None"]
_CHUNK = 1 << 20
# Everything a damaged or hostile archive makes zipfile, zlib, bz2 or lzma raise:
# BadZipFile (bad CRC, directory), zlib.error, lzma's LZMAError, OSError (bz2, disk),
# EOFError (truncated stream), NotImplementedError (unknown compression method),
# RuntimeError (an encrypted member), ValueError, SyntaxError and tokenize's TokenError
# (a .npy header numpy cannot parse; it is read with ast.literal_eval, never eval).
_ARCHIVE_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, lzma.LZMAError, OSError,
                   EOFError, NotImplementedError, RuntimeError, ValueError, SyntaxError,
                   tokenize.TokenError)


def _read_npz(path: Path, check: _Check, misfits: dict[str, str],
              keep_program: bool = False) -> dict[str, np.ndarray]:
    """The arrays of the file (the stored program's only with ``keep_program``)."""
    if path.is_dir():
        raise ParamFileError(f"parameter file {path} is a directory")
    if not path.is_file():
        raise ParamFileError(f"parameter file {path} does not exist")
    try:
        if not zipfile.is_zipfile(path):
            raise _not_a_zip(path)
        arrays: dict[str, np.ndarray] = {}
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                name = _member_name(info, path, arrays.keys() | misfits.keys())
                with archive.open(info) as member:
                    unchecked = name == PROGRAM_MEMBER       # not a persistable of any program
                    array = _read_member(member, info.file_size, name,
                                         (lambda *_: None) if unchecked else check, path, misfits)
                if array is not None and (keep_program or name != PROGRAM_MEMBER):
                    arrays[name] = array
        return arrays
    except _ARCHIVE_ERRORS as exc:
        raise _unreadable(path, f"{type(exc).__name__}: {exc}") from None


def _member_name(info: zipfile.ZipInfo, path: Path, seen) -> str:
    if info.is_dir() or not info.filename.endswith(".npy"):
        raise _unreadable(path, f"it holds '{info.filename}', which is not an array (.npy); "
                                "a parameter file holds one .npy member per value")
    name = info.filename[:-len(".npy")]
    if name in seen:
        raise _unreadable(path, f"it holds '{name}' twice")
    return name


def _read_member(member, size: int, name: str, check: _Check, path: Path,
                 misfits: dict[str, str]) -> np.ndarray | None:
    """One .npy member: header first (dtype, shape checked), then exactly the data it declares;
    None (and the complaint in ``misfits``) when the header does not pass ``check``."""
    version = np.lib.format.read_magic(member)
    if version not in ((1, 0), (2, 0)):
        raise _unreadable(path, f"'{name}' is a .npy file of version {version}, "
                                "which retrograd does not read")
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read_header(member)
    if dtype.kind == "V" and dtype.itemsize == 2 and dtype.names is None:
        dtype = numpy_dtype("bfloat16")     # NumPy writes ml_dtypes' bfloat16 as two raw bytes ('<V2')
    if dtype.hasobject or dtype.name not in DTYPES:
        raise _unreadable(path, f"'{name}' has dtype {dtype}; parameter files hold "
                                f"{', '.join(DTYPES)} (objects are never unpickled)")
    problem = check(name, shape, dtype)
    if problem:
        misfits[name] = problem
        return None
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > size:
        raise _unreadable(path, f"'{name}' declares shape {list(shape)} ({nbytes} bytes), "
                                f"more than the {size} bytes it holds")
    data = bytearray()
    while len(data) < nbytes:     # grows with the data present, not with what the header claims
        chunk = member.read(min(_CHUNK, nbytes - len(data)))
        if not chunk:
            raise _unreadable(path, f"'{name}' is truncated ({len(data)} of {nbytes} bytes)")
        data += chunk
    if member.read(1):            # also makes zipfile check the member's CRC
        raise _unreadable(path, f"'{name}' holds more data than its shape {list(shape)}")
    array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    return array.astype(dtype.newbyteorder("="), order="C", copy=False)


def _not_a_zip(path: Path) -> ParamFileError:
    with open(path, "rb") as file:
        if file.read(6) == b"\x93NUMPY":
            return ParamFileError(f"{path} holds a single array (.npy), not a parameter file (.npz)")
    return _unreadable(path, "not a zip archive")


def _unreadable(path: Path, why: str) -> ParamFileError:
    return ParamFileError(f"{path} is not a readable parameter file (.npz): {why}")


def load_params(scope: Scope, path: str | os.PathLike, program: Program | None = None, *,
                strict: bool = False) -> list[str]:
    """Load a file written by ``save_params`` into ``scope``; return the names loaded.

    On a mismatch, ParamFileError lists what does not match and the scope is
    left unchanged.

    Args:
        scope: The Scope to load into.
        path: The file.
        program: When given, every persistable Var of the program must be in
            the file with its declared shape and dtype. Without it, each entry
            must match the shape and dtype of any value the scope already holds
            under that name.
        strict: Also reject entries the program lacks.

    Returns:
        The names loaded.

    Raises:
        ParamFileError: The file is missing, unreadable, or does not fit.

    Example:
        ```python
        import os
        import tempfile

        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            loss = rg.mean(rg.layers.fc(rg.data("x", [-1, 3]), 2, name="fc"))
            rg.optim.Adam(1e-3).minimize(loss)
        exe = rg.Executor()
        exe.run(startup)
        path = os.path.join(tempfile.mkdtemp(), "ckpt.npz")
        rg.save_params(exe.scope, path, main)
        saved = exe.scope.get("fc.w").copy()
        exe.scope.set("fc.w", np.zeros_like(saved))
        exe.run(startup)                                   # then restore the checkpoint over it
        loaded = rg.load_params(exe.scope, path, main)
        assert "fc.w" in loaded and np.array_equal(exe.scope.get("fc.w"), saved)
        ```
    """
    misfits: dict[str, str] = {}
    arrays = _read_npz(Path(path), _header_check(scope, program), misfits)
    problems = _mismatches(arrays, misfits, scope, program, strict)
    if problems:
        what = "the program" if program is not None else "the values in the scope"
        raise ParamFileError(f"{path} does not fit {what}: {'; '.join(problems)} "
                             "(was it saved from another model or with other sizes?)")
    for name, value in arrays.items():
        scope.set(name, value)
    return sorted(arrays)


def _mismatches(arrays: dict[str, np.ndarray], misfits: dict[str, str], scope: Scope,
                program: Program | None, strict: bool) -> list[str]:
    problems = list(misfits.values())
    if program is not None:
        wanted = {v.name: v for v in persistable_vars(program)}
        missing = [n for n in wanted if n not in arrays and n not in misfits]
        if missing:
            problems.append(f"missing {_names(missing)}")
        if strict:
            extra = [n for n in list(arrays) + list(misfits) if n not in wanted]
            if extra:
                problems.append(f"not in the program: {_names(extra)}")
        expected = {n: (v.shape, v.dtype) for n, v in wanted.items()}
    else:
        expected = {}
        for name in arrays:
            held = scope.find(name)
            if held is not None:
                expected[name] = (tuple(held.shape), dtype_name(held.dtype))   # no device copy
    for name, value in arrays.items():
        if name in expected:
            problem = _misfit(name, value.shape, str(value.dtype), *expected[name])
            if problem:
                problems.append(problem)
    return problems


def _header_check(scope: Scope, program: Program | None) -> _Check:
    """Each member's declared shape and dtype against the program (or the scope's values),
    before its data is read: a header may declare any size."""
    wanted = None if program is None else {v.name: v for v in persistable_vars(program)}

    def check(name: str, shape: tuple, dtype: np.dtype) -> str | None:
        if wanted is not None:
            var = wanted.get(name)
            expected = None if var is None else (var.shape, var.dtype)
        else:
            held = scope.find(name)
            expected = None if held is None else (tuple(held.shape), dtype_name(held.dtype))
        return None if expected is None else _misfit(name, shape, dtype.name, *expected)
    return check


def _misfit(name: str, shape: tuple, dtype: str, want_shape: tuple, want_dtype: str) -> str | None:
    if len(shape) != len(want_shape) or any(d >= 0 and d != v for d, v in zip(want_shape, shape)):
        return f"'{name}' has shape {list(shape)} in the file, expected {_shape(want_shape)}"
    if dtype != want_dtype:
        return f"'{name}' has dtype {dtype} in the file, expected {want_dtype}"
    return None


def _shape(shape) -> str:
    return "[" + ", ".join("?" if d < 0 else str(d) for d in shape) + "]"


def _names(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
