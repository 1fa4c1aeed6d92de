"""``Executor(check_finite=True)``: stop at the first op that makes a NaN or an unasked Inf.

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

The rule (``unasked_non_finite``): an op fails the check when it *makes* a
non-finite value nobody asked for --

* a NaN, always (unless the op's own attributes hold a NaN: ``rg.fill(s, nan)``);
* an Inf, unless one of the op's inputs already held an infinity, or the op's
  attributes hold one (``rg.fill_like(x, -np.inf)``, ``rg.constant([-np.inf])``),
  or the op runs sub-blocks (a loop's or branch's values come from its body,
  whose ops are checked one by one).

So ``-inf`` masks pass (the fill asks for it; the ``where``, ``add`` and
softmax after it read an infinity), and so do top-k sampling masks; an
overflow (``exp`` of a large value), ``0/0``, ``log`` of a negative number or
of zero stop the run at the op that made them.
"""
from __future__ import annotations

import math

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


def unasked_non_finite(xp, op, names, values, inputs) -> str | None:
    """The first of ``names`` (outputs of ``op``, values in ``values``) holding a non-finite value
    the rule of this module does not allow, given the op's ``inputs`` (arrays); None if none."""
    for name, value in zip(names, values):
        if is_finite(xp, value):
            continue
        if not _asked(xp, op, value, inputs):
            return name
    return None


def _asked(xp, op, value, inputs) -> bool:
    """Whether the non-finite ``value`` that ``op`` made is one it was asked for."""
    nan_asked, inf_asked = _attrs_hold(op.attrs)
    if bool(xp.any(xp.isnan(value))) and not nan_asked:
        return False
    if not bool(xp.any(xp.isinf(value))):
        return True
    return inf_asked or bool(op.sub_blocks()) or any(_holds_inf(xp, a) for a in inputs)


def _holds_inf(xp, value) -> bool:
    return not is_finite(xp, value) and bool(xp.any(xp.isinf(value)))


def _attrs_hold(attrs) -> tuple[bool, bool]:
    """(a NaN, an infinity) somewhere in the attribute values (numbers, nested lists, arrays)."""
    nan = inf = False
    stack = list(attrs.values())
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            nan, inf = nan or math.isnan(item), inf or math.isinf(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, np.ndarray) and item.dtype.kind == "f":
            nan, inf = nan or bool(np.isnan(item).any()), inf or bool(np.isinf(item).any())
    return nan, inf


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
