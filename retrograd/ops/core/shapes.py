"""Shape-rule helpers shared by ops. ``-1`` marks a dimension known only at run time."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ...errors import ShapeError
from ...ir.dtypes import is_float, promote
from ...ir.program import Var


def broadcast_dim(a: int, b: int) -> int:
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if a < 0:
        return b if b > 1 else -1
    if b < 0:
        return a if a > 1 else -1
    raise ShapeError(f"dimensions {a} and {b} do not broadcast")


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """NumPy broadcasting, with -1 for unknown dimensions."""
    if len(shapes) == 2 and tuple(shapes[0]) == tuple(shapes[1]):
        return tuple(shapes[0])         # the common case (the same shape twice): as the loop would answer
    rank = max((len(s) for s in shapes), default=0)
    result = [1] * rank
    for shape in shapes:
        padded = [1] * (rank - len(shape)) + list(shape)
        try:
            result = [broadcast_dim(r, d) for r, d in zip(result, padded)]
        except ShapeError:
            raise ShapeError(f"shapes {', '.join(str(list(s)) for s in shapes)} do not broadcast") from None
    return tuple(result)


def same_as_first(ins: list[Var], attrs: dict):
    return [(ins[0].shape, ins[0].dtype)]


def float_same_as_first(ins: list[Var], attrs: dict):
    """Unary op defined on floats only (exp, log, tanh, ...): same shape and dtype."""
    require_float(ins[0])
    return same_as_first(ins, attrs)


def require_float(var: Var, what: str = "input") -> None:
    if not is_float(var.dtype):
        raise ShapeError(f"{what} '{var.name}' must be float32 or float64 (or bfloat16, float16), "
                         f"got {var.dtype}")


def require_same_dtype(ins: list[Var]) -> str:
    dtypes = {v.dtype for v in ins}
    if len(dtypes) > 1:
        raise ShapeError(f"inputs must share one dtype, got {', '.join(sorted(dtypes))}")
    return ins[0].dtype


def broadcast_rule(ins: list[Var], attrs: dict):
    """Elementwise binary op: broadcast shapes, promoted dtype."""
    dtype = promote(ins[0].dtype, ins[1].dtype)
    return [(broadcast_shapes(ins[0].shape, ins[1].shape), dtype)]


def compare_rule(ins: list[Var], attrs: dict):
    return [(broadcast_shapes(ins[0].shape, ins[1].shape), "bool")]


def normalize_axis(axis: int, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise ShapeError(f"axis {axis!r:.40} is not an integer")
    if not -ndim <= axis < max(ndim, 1):
        raise ShapeError(f"axis {axis} is out of range for rank {ndim}")
    return axis % ndim if ndim else 0


def normalize_axes(axis, ndim: int) -> tuple[int, ...]:
    """None means every axis; an int or a list of ints is normalised and sorted."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, int):
        axis = [axis]
    axes = [normalize_axis(a, ndim) for a in axis]
    if len(set(axes)) != len(axes):
        # NumPy refuses these too; silently reducing once would hide a typo.
        raise ShapeError(f"axis {list(axis)} repeats an axis (rank {ndim})")
    return tuple(sorted(axes))


def dims_compatible(a: int, b: int) -> bool:
    return a < 0 or b < 0 or a == b


def shapes_compatible(a: Sequence[int], b: Sequence[int]) -> bool:
    return len(a) == len(b) and all(dims_compatible(x, y) for x, y in zip(a, b))
