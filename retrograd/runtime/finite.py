"""``Executor(check_finite=True)``: stop at the first op whose output holds NaN or Inf.

After each op the executor asks ``first_non_finite`` about the op's float
outputs: one reduction per output (``all(isfinite(value))``), so the check
costs a pass over each output and, on a GPU, a synchronisation; it is off by
default. Only when an output fails are the inputs summarised (shape, dtype,
range, how many NaN/Inf) for the error, which names the op and the user's
line as every ``ExecutionError`` does.

Example::

    exe = rg.Executor(check_finite=True)
    exe.run(main, feed=batch)
    # ExecutionError: model.py:12: op #3 Log in block 0 produced NaN in its output 'log_0'
    #   (4 NaN, 0 Inf of 8 values; inputs: sub_0: float32[2, 4] min -1.5 max 2, finite)
"""
from __future__ import annotations

import numpy as np

from ..backends import dtype_name, to_numpy
from ..errors import ExecutionError
from ..ir.dtypes import FLOAT_DTYPES


def is_finite(xp, value) -> bool:
    """Whether a float array holds only finite numbers (True for other dtypes and non-arrays)."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or dtype_name(dtype) not in FLOAT_DTYPES:
        return True
    return bool(xp.all(xp.isfinite(value)))


def first_non_finite(xp, names, values) -> str | None:
    """The first of ``names`` whose value (in ``values``) is a float array holding NaN or Inf."""
    for name, value in zip(names, values):
        if not is_finite(xp, value):
            return name
    return None


def non_finite_error(where: str, name: str, value, inputs, note: str = "") -> ExecutionError:
    """The error of op ``where`` whose output ``name`` holds NaN/Inf; ``inputs``: (name, array)."""
    listed = ", ".join(f"{n}: {summary(a)}" for n, a in inputs) or "none"
    return ExecutionError(f"{where} produced {_kinds(value)} in its output '{name}' ({_counts(value)}; "
                          f"inputs: {listed}){note}")


def summary(value) -> str:
    """``float32[2, 4] min -1.5 max 2, finite`` (or ``, 3 NaN``): what an input held."""
    shape = getattr(value, "shape", None)
    if shape is None:
        return type(value).__name__
    array = to_numpy(value)
    head = f"{dtype_name(array.dtype)}{list(array.shape)}"
    if array.size == 0 or array.dtype.kind not in "fiub":
        return head
    finite = array[np.isfinite(array)] if array.dtype.kind == "f" else array
    bounds = f" min {finite.min():.4g} max {finite.max():.4g}" if finite.size else ""
    if array.dtype.kind != "f" or finite.size == array.size:
        return f"{head}{bounds}, finite" if array.dtype.kind == "f" else f"{head}{bounds}"
    return f"{head}{bounds}, {_counts(array)}"


def _counts(value) -> str:
    array = to_numpy(value)
    nan = int(np.isnan(array).sum())
    inf = int(np.isinf(array).sum())
    return f"{nan} NaN, {inf} Inf of {array.size} values"


def _kinds(value) -> str:
    array = to_numpy(value)
    kinds = [k for k, test in (("NaN", np.isnan), ("Inf", np.isinf)) if test(array).any()]
    return " and ".join(kinds) or "a non-finite value"
