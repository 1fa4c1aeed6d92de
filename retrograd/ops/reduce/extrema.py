"""Extremes: ``max``/``min`` over axes, ``argmax``/``argmin``, ``topk``.

Tie rule (one for all of them): the first element in row-major order wins.
``argmax``/``argmin`` return its index (as NumPy and PyTorch do); ``topk``
orders equal values by index; and the gradient of ``max``/``min`` goes
entirely to that one element, the first maximal (minimal) element in flat
order over the reduced axes -- like ``torch.max(x, dim)``, unlike
``torch.amax``, which splits it evenly among ties.

A reduction over an empty axis has no value: ``max``, ``min``, ``argmax`` and
``argmin`` raise ``ExecutionError`` naming the op when an axis they reduce
has size 0 at run time (the onnxruntime engine through a guard node).
"""
from __future__ import annotations

import math

from ...errors import ProgramError, ShapeError, kernel_failure
from ...ir.program import Var, as_int
from ..core.lowering import lowers
from ..core.registry import append_op, defop
from .reductions import axis_attr, reduce_onnx, reduce_rule
from ..core.shapes import normalize_axes, normalize_axis


# --- the run-time check shared by kernels and the ONNX guard --------------------------------------

def check_not_empty(shape, axes, op_type: str) -> None:
    """Raise ValueError when an axis in ``axes`` has size 0 in ``shape``."""
    empty = [a for a in axes if int(shape[a]) == 0]
    if empty:
        raise ValueError(f"{op_type} over an empty axis: axis {empty[0]} of an input shaped "
                         f"{[int(d) for d in shape]} has size 0, so there is no extreme to take")


def not_empty_onnx(g, x: str, axes) -> str:
    """``x`` passed on behind a guard node failing the run when an axis in ``axes`` is empty
    (no guard when the shape rule knows every size)."""
    dims = [g.in_vars[0].shape[a] for a in axes]
    if all(d > 0 for d in dims):
        return x
    sizes = g.node("Gather", [g.shape(x), g.const(list(axes), "int64")])
    failed = g.node("Equal", [g.node("ReduceProd", [sizes], keepdims=0), g.const(0, "int64")])
    op, axes = g.op, tuple(axes)

    def verify(shape):
        try:
            check_not_empty(shape, axes, op.type)
        except ValueError as exc:
            raise kernel_failure(op.where(), exc) from None
    ok = g.check(failed, "the reduced axes must not be empty", verify, [g.shape(x)])
    return g.node("Where", [ok, x, x])


# --- max / min --------------------------------------------------------------------------------------

def _extreme_grad(g):
    x = g.x[0]
    axes = normalize_axes(g.attrs["axis"], x.ndim)
    if not axes:                       # nothing reduced (a scalar): the identity
        return [g.dy]
    from ..math.elementwise import expand_as
    dy = expand_as(g.dy, x, axes=() if g.attrs["keepdims"] else axes)
    return [dy * first_extreme_mask(x, axes, g.op.type)]


def _extreme_kernel(fn_name: str):
    def kernel(k, x):
        axes = normalize_axes(k.attrs["axis"], x.ndim)
        check_not_empty(x.shape, axes, k.op.type)
        if not axes:
            return k.xp.asarray(x, copy=True)
        return getattr(k.xp, fn_name)(x, axis=axes, keepdims=k.attrs["keepdims"])
    return kernel


def _extreme_onnx(onnx_type: str):
    def lower(g):
        axes = normalize_axes(g.attrs["axis"], g.in_vars[0].ndim)
        return [reduce_onnx(g, onnx_type, not_empty_onnx(g, g.ins[0], axes))]
    return lower


defop("Max", infer=reduce_rule, grad=_extreme_grad)(_extreme_kernel("max"))
defop("Min", infer=reduce_rule, grad=_extreme_grad)(_extreme_kernel("min"))
lowers("Max")(_extreme_onnx("ReduceMax"))
lowers("Min")(_extreme_onnx("ReduceMin"))


def max(x: Var, axis=None, keepdims: bool = False) -> Var:
    """The largest element over ``axis`` (None: all axes; an int or a list).

    Ties: the gradient goes to one element, the first maximal one in row-major
    order over the reduced axes (the one ``argmax`` picks), not split among them.
    An empty reduced axis fails the run (``ExecutionError``).

    Example::

        top = rg.max(scores, axis=1)                  # [N, C] -> [N]
    """
    return append_op("Max", [x], {"axis": axis_attr(axis), "keepdims": bool(keepdims)})[0]


def min(x: Var, axis=None, keepdims: bool = False) -> Var:
    """The smallest element over ``axis``; ties as ``rg.max`` (the first minimal element).

    Example::

        low = rg.min(x, axis=[0, 1], keepdims=True)
    """
    return append_op("Min", [x], {"axis": axis_attr(axis), "keepdims": bool(keepdims)})[0]


# --- the mask of the first extreme (max/min's gradient) ---------------------------------------------

def _mask_rule(ins, attrs):
    x = ins[0]
    normalize_axes(attrs["axes"], x.ndim)
    return [(x.shape, x.dtype)]


def _moved_last(ndim: int, axes) -> list[int]:
    """The permutation putting ``axes`` last (in order), the kept axes first."""
    return [a for a in range(ndim) if a not in axes] + list(axes)


def _inverse(perm) -> list[int]:
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = i
    return out


@defop("FirstExtremeMask", infer=_mask_rule, nondiff=(0,))
def _first_extreme_mask(k, x):
    """1 at the first maximal (``mode`` "Max") or minimal element over ``axes`` in row-major
    order, 0 elsewhere, in ``x``'s dtype and shape."""
    xp, axes = k.xp, tuple(k.attrs["axes"])
    perm = _moved_last(x.ndim, axes)
    moved = xp.permute_dims(x, tuple(perm))
    kept = tuple(moved.shape[:x.ndim - len(axes)])
    count = math.prod(moved.shape[x.ndim - len(axes):])
    rows = xp.reshape(moved, kept + (count,))
    pick = (xp.argmax if k.attrs["mode"] == "Max" else xp.argmin)(rows, axis=-1, keepdims=True)
    mask = xp.astype(xp.arange(count, dtype=pick.dtype) == pick, x.dtype)
    return xp.permute_dims(xp.reshape(mask, tuple(moved.shape)), tuple(_inverse(perm)))


@lowers("FirstExtremeMask")
def _first_extreme_mask_onnx(g):
    x, var = g.ins[0], g.in_vars[0]
    axes = tuple(g.attrs["axes"])
    perm = _moved_last(var.ndim, axes)
    moved = g.node("Transpose", [x], perm=perm)
    kept = g.node("Shape", [moved], start=0, end=var.ndim - len(axes))
    rows = g.node("Reshape", [moved, g.node("Concat", [kept, g.const([-1], "int64")], axis=0)])
    pick = g.node("ArgMax" if g.attrs["mode"] == "Max" else "ArgMin", [rows], axis=-1, keepdims=1,
                  select_last_index=0)
    count = g.scalar_dim(rows, -1)
    positions = g.node("Range", [g.const(0, "int64"), count, g.const(1, "int64")])
    mask = g.cast(g.node("Equal", [positions, pick]), var.dtype)
    return [g.node("Transpose", [g.node("Reshape", [mask, g.shape(moved)])], perm=_inverse(perm))]


def first_extreme_mask(x: Var, axes, mode: str) -> Var:
    """The tie rule of ``max``/``min`` (``mode``): a 0/1 mask of x's shape marking, per slice
    over ``axes``, the first maximal (minimal) element in row-major order."""
    mask = append_op("FirstExtremeMask", [x], {"axes": list(axes), "mode": mode})[0]
    mask.stop_gradient = True
    return mask


# --- argmax / argmin ---------------------------------------------------------------------------------

def _arg_rule(ins, attrs):
    x = ins[0]
    if attrs["axis"] is None or x.ndim == 0:       # a scalar's axis 0 or -1: index 0, as torch
        shape = (1,) * x.ndim if attrs["keepdims"] else ()
        return [(shape, "int64")]
    return [(reduce_rule(ins, attrs)[0][0], "int64")]


def _arg_kernel(fn_name: str):
    def kernel(k, x):
        xp, axis = k.xp, k.attrs["axis"]
        axes = tuple(range(x.ndim)) if axis is None or x.ndim == 0 else normalize_axes(axis, x.ndim)
        check_not_empty(x.shape, axes, k.op.type)
        if axis is None:
            out = getattr(xp, fn_name)(xp.reshape(x, (-1,)))
            out = xp.reshape(out, (1,) * x.ndim if k.attrs["keepdims"] else ())
        elif x.ndim == 0:
            out = xp.zeros((), dtype=xp.int64)        # (axes is () here: nothing can be empty)
        else:
            out = getattr(xp, fn_name)(x, axis=axes[0], keepdims=k.attrs["keepdims"])
        return xp.astype(out, xp.int64)
    return kernel


def _arg_onnx(onnx_type: str):
    def lower(g):
        x, var, axis, keepdims = g.ins[0], g.in_vars[0], g.attrs["axis"], int(g.attrs["keepdims"])
        axes = tuple(range(var.ndim)) if axis is None or var.ndim == 0 else normalize_axes(axis, var.ndim)
        x = not_empty_onnx(g, x, axes)
        if var.ndim == 0:
            return [g.const(0, "int64")]
        if axis is None:
            flat = g.node("Reshape", [x, g.const([-1], "int64")])
            out = g.node(onnx_type, [flat], axis=0, keepdims=0, select_last_index=0)
            return [g.node("Reshape", [out, g.const([1] * var.ndim, "int64")]) if keepdims else out]
        return [g.node(onnx_type, [x], axis=axes[0], keepdims=keepdims, select_last_index=0)]
    return lower


defop("ArgMax", infer=_arg_rule)(_arg_kernel("argmax"))
defop("ArgMin", infer=_arg_rule)(_arg_kernel("argmin"))
lowers("ArgMax")(_arg_onnx("ArgMax"))
lowers("ArgMin")(_arg_onnx("ArgMin"))


def _arg_axis(axis, x: Var):
    if axis is None:
        return None
    axis = as_int(axis, "axis")
    if x.ndim:
        normalize_axis(axis, x.ndim)
    elif axis not in (0, -1):
        raise ShapeError(f"axis {axis} is out of range for rank 0")
    return axis


def argmax(x: Var, axis=-1, keepdims: bool = False) -> Var:
    """int64 index of the largest element along ``axis`` (None: of the flattened ``x``); the
    first one on ties, as NumPy and PyTorch.

    Example::

        predicted = rg.argmax(logits, axis=-1)       # [N, C] -> int64 [N]
    """
    return append_op("ArgMax", [x], {"axis": _arg_axis(axis, x), "keepdims": bool(keepdims)})[0]


def argmin(x: Var, axis=-1, keepdims: bool = False) -> Var:
    """int64 index of the smallest element along ``axis``; the first one on ties.

    Example::

        nearest = rg.argmin(distances, axis=1)
    """
    return append_op("ArgMin", [x], {"axis": _arg_axis(axis, x), "keepdims": bool(keepdims)})[0]


# --- take / put along an axis (topk's gradient) -----------------------------------------------------------

def _take_rule(ins, attrs):
    x, indices = ins
    _require_indices(indices, x)
    normalize_axis(attrs["axis"], x.ndim)
    return [(indices.shape, x.dtype)]


def _require_indices(indices: Var, x: Var) -> None:
    if indices.dtype != "int64":
        raise ShapeError(f"indices '{indices.name}' must be int64, got {indices.dtype}")
    if indices.ndim != x.ndim:
        raise ShapeError(f"indices '{indices.name}' need the rank of '{x.name}' ({x.ndim}), got {indices.ndim}")


@defop("TakeAlongAxis", inputs=("x", "indices"), infer=_take_rule, nondiff=(1,),
       grad=lambda g: [put_along_axis(g.dy, g.x[1], g.x[0], g.attrs["axis"]), None])
def _take_along_axis(k, x, indices):
    """``numpy.take_along_axis`` (indices distinct within each slice where it is differentiated)."""
    return k.backend.take_along_axis(x, indices, k.attrs["axis"] % x.ndim)


@lowers("TakeAlongAxis")
def _take_along_axis_onnx(g):
    return [g.node("GatherElements", g.ins, axis=g.attrs["axis"] % g.ndim(0))]


def _put_rule(ins, attrs):
    values, indices, like = ins
    _require_indices(indices, like)
    normalize_axis(attrs["axis"], like.ndim)
    return [(like.shape, values.dtype)]


@defop("PutAlongAxis", inputs=("values", "indices", "like"), infer=_put_rule, nondiff=(1, 2),
       shape_only=(2,), grad=lambda g: [take_along_axis(g.dy, g.x[1], g.attrs["axis"]), None, None])
def _put_along_axis(k, values, indices, like):
    """Zeros shaped like ``like`` with ``values`` written at ``indices`` along ``axis``."""
    return k.backend.put_along_axis(like.shape, indices, values, k.attrs["axis"] % like.ndim)


@lowers("PutAlongAxis")
def _put_along_axis_onnx(g):
    values, indices, like = g.ins
    zeros = g.fill(g.shape(like), 0, g.in_vars[0].dtype)
    return [g.node("ScatterElements", [zeros, indices, values], axis=g.attrs["axis"] % g.ndim(2))]


def take_along_axis(x: Var, indices: Var, axis: int) -> Var:
    """``numpy.take_along_axis(x, indices, axis)`` (int64 ``indices`` of x's rank).

    Example::

        picked = take_along_axis(x, ids, 1)        # x [N, C], ids int64 [N, k] -> [N, k]
    """
    return append_op("TakeAlongAxis", [x, indices], {"axis": int(axis)})[0]


def put_along_axis(values: Var, indices: Var, like: Var, axis: int) -> Var:
    """Zeros of ``like``'s run-time shape with ``values`` at ``indices`` along ``axis``
    (indices distinct within each slice: topk's gradient).

    Example::

        dx = put_along_axis(dvalues, ids, x, 1)    # [N, k] into zeros [N, C]
    """
    return append_op("PutAlongAxis", [values, indices, like], {"axis": int(axis)})[0]


# --- topk ---------------------------------------------------------------------------------------------------

def _topk_rule(ins, attrs):
    x = ins[0]
    if x.ndim == 0:
        raise ShapeError(f"topk needs at least one axis, '{x.name}' is a scalar")
    if x.dtype == "bool":
        raise ShapeError(f"topk of bool '{x.name}': cast it to a number first")
    axis = normalize_axis(attrs["axis"], x.ndim)
    k = attrs["k"]
    if len(ins) > 1:
        if ins[1].dtype not in ("int64", "int32") or ins[1].ndim != 0:
            raise ShapeError(f"k '{ins[1].name}' must be an int64 scalar, got {ins[1].type_str()}")
        k = -1
    elif x.shape[axis] >= 0 and k > x.shape[axis]:
        raise ShapeError(f"k = {k} is larger than axis {axis} of '{x.name}' ({x.shape[axis]})")
    shape = tuple(k if i == axis else d for i, d in enumerate(x.shape))
    return [(shape, x.dtype), (shape, "int64")]


def check_k(k: int, size: int) -> None:
    """Raise ValueError unless 0 <= k <= size (the kernel's and the ONNX guard's check)."""
    if not 0 <= k <= size:
        raise ValueError(f"k = {k} must lie in [0, {size}] (the size of the axis topk selects along)")


def _topk_grad(g):
    x, axis = g.x[0], g.attrs["axis"]
    return [put_along_axis(g.dy, g.out[1], x, axis)] + [None] * (len(g.x) - 1)


@defop("TopK", inputs=("x", "k?"), outputs=("values", "indices"), infer=_topk_rule, nondiff=(1,),
       grad=_topk_grad)
def _topk(k, x, k_value=None):
    """The ``k`` largest entries along ``axis``, largest first; equal values in index order."""
    axis = k.attrs["axis"] % x.ndim
    count = k.attrs["k"] if k_value is None else int(k_value)
    check_k(count, x.shape[axis])
    order = k.backend.sort_descending(x, axis)
    index = tuple(slice(0, count) if i == axis else slice(None) for i in range(x.ndim))
    indices = order[index]
    return k.backend.take_along_axis(x, indices, axis), indices


@lowers("TopK")
def _topk_onnx(g):
    x, var = g.ins[0], g.in_vars[0]
    axis = g.attrs["axis"] % var.ndim
    if len(g.ins) > 1:
        count = g.node("Reshape", [g.cast(g.ins[1], "int64"), g.const([1], "int64")])
    else:
        count = g.const([g.attrs["k"]], "int64")
    if len(g.ins) > 1 or var.shape[axis] < 0:       # k may exceed the axis only at run time
        count = _k_in_range_onnx(g, count, g.dim(x, axis))
    values, indices = g.nodes("TopK", [x, count], 2, axis=axis, largest=1, sorted=1)
    return [values, indices]


def _k_in_range_onnx(g, count: str, size: str) -> str:
    """``count`` behind a guard node failing the run (with ``check_k``'s error) unless
    0 <= k <= size (both int64 [1])."""
    out_of_range = g.node("Or", [g.node("Greater", [count, size]), g.node("Less", [count, g.const([0], "int64")])])
    failed = g.node("Squeeze", [out_of_range, g.const([0], "int64")])
    op = g.op

    def verify(k_value, size_value):
        try:
            check_k(int(k_value[0]), int(size_value[0]))
        except ValueError as exc:
            raise kernel_failure(op.where(), exc) from None
    ok = g.check(failed, "k must lie in [0, the axis' size]", verify, [count, size])
    return g.node("Where", [ok, count, count])


def topk(x: Var, k, axis: int = -1):
    """``(values, indices)``: the ``k`` largest entries of ``x`` along ``axis``, largest first
    (equal values in index order), and their int64 positions. ``k`` is an int or an int64 0-d
    Var (then the output's size along ``axis`` is known only at run time); a ``k`` larger than
    the axis is a ``ShapeError`` when built, or an ``ExecutionError`` when run.

    Example::

        values, ids = rg.topk(logits, 5)             # [N, C] -> [N, 5], int64 [N, 5]
    """
    axis = as_int(axis, "topk: axis")
    if isinstance(k, Var):
        return tuple(append_op("TopK", [x, k], {"k": None, "axis": axis}))
    k = as_int(k, "topk: k")
    if k < 0:
        raise ProgramError(f"topk: k must be >= 0, got {k}")
    return tuple(append_op("TopK", [x], {"k": k, "axis": axis}))
