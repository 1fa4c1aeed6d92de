"""Ops that build a bigger tensor from a smaller one: stack, broadcast_to, tile, pad, and arange.

Each gradient is the same data moved back with ops that have gradients of
their own (stack <-> split, broadcast <-> sum, tile <-> sum of the copies,
pad <-> slice), so gradients of gradients work.
"""
from __future__ import annotations

import builtins
import math
from typing import Sequence

import numpy as np

from ... import backend
from ...errors import ProgramError, ShapeError, kernel_failure
from ...ir.dtypes import canonical, is_float
from ...ir.program import Var, as_float, as_int, as_ints, as_list
from .creation import scalar_like
from ..core.lowering import lowers
from ..math.elementwise import sum_to
from ..core.registry import append_op, defop
from ..core.shapes import normalize_axis, require_same_dtype
from .tensor import slice as slice_, split_like, squeeze, unsqueeze

INT_DTYPES = ("int64", "int32")


def _merge(dims: Sequence[int], what: str) -> int:
    known = {d for d in dims if d >= 0}
    if len(known) > 1:
        raise ShapeError(f"{what} differ: {', '.join('?' if d < 0 else str(d) for d in dims)}")
    return known.pop() if known else -1


# --- Stack ----------------------------------------------------------------------------------

def _stack_rule(ins, attrs):
    if not ins:
        raise ShapeError("stack needs at least one input")
    dtype = require_same_dtype(ins)
    rank = ins[0].ndim
    if any(v.ndim != rank for v in ins):
        raise ShapeError(f"inputs must share one shape, got {', '.join(v.type_str() for v in ins)}")
    axis = normalize_axis(attrs["axis"], rank + 1)
    shape = [_merge([v.shape[i] for v in ins], f"sizes of axis {i}") for i in range(rank)]
    shape.insert(axis, len(ins))
    return [(tuple(shape), dtype)]


def _stack_grad(g):
    axis = normalize_axis(g.attrs["axis"], g.x[0].ndim + 1)
    pieces = split_like(g.dy, [unsqueeze(x, axis) for x in g.x], axis)
    return [squeeze(piece, axis) for piece in pieces]


@defop("Stack", inputs=("xs*",), infer=_stack_rule, grad=_stack_grad)
def _stack(k, *xs):
    """The inputs (one shape) joined along a new axis ``axis``."""
    return k.xp.stack(list(xs), axis=k.attrs["axis"])


@lowers("Stack")
def _stack_onnx(g):
    axis = normalize_axis(g.attrs["axis"], g.in_vars[0].ndim + 1)
    where = g.const([axis], "int64")
    return [g.node("Concat", [g.node("Unsqueeze", [x, where]) for x in g.ins], axis=axis)]


def stack(xs: Sequence[Var], axis: int = 0) -> Var:
    """Join Vars of one shape along a new axis (``numpy.stack``).

    Example::

        pair = rg.stack([a, b], axis=0)            # two [N, D] -> [2, N, D]
    """
    xs = as_list(xs, "stack: xs")
    like = next((x for x in xs if isinstance(x, Var)), None)
    if like is None:
        raise ProgramError("stack needs at least one Var among xs (NumPy arrays beside it become constants)")
    xs = [scalar_like(x, like) for x in xs]
    return append_op("Stack", xs, {"axis": as_int(axis, "stack: axis")})[0]


# --- BroadcastTo ------------------------------------------------------------------------------

def _broadcast_target(x_shape: Sequence[int], shape: Sequence[int]) -> tuple[int, ...]:
    """The result's shape: ``shape`` with each -1 resolved to x's size there (may stay -1)."""
    lead = len(shape) - len(x_shape)
    if lead < 0:
        raise ShapeError(f"cannot broadcast rank {len(x_shape)} to {list(shape)} (fewer axes)")
    out = []
    for i, d in enumerate(shape):
        mine = x_shape[i - lead] if i >= lead else 1
        if d == -1:
            if i < lead:
                raise ShapeError(f"-1 in broadcast_to's shape {list(shape)} at a new leading axis {i}")
            out.append(mine)
            continue
        if d < 0:
            raise ShapeError(f"broadcast_to's shape {list(shape)} holds a negative size other than -1")
        if mine >= 0 and mine not in (1, d):
            raise ShapeError(f"cannot broadcast {list(x_shape)} to {list(shape)}: size {mine} to {d} "
                             f"(axis {i})")
        out.append(d)
    return tuple(out)


def _broadcast_to_rule(ins, attrs):
    x = ins[0]
    return [(_broadcast_target(x.shape, attrs["shape"]), x.dtype)]


@defop("BroadcastTo", infer=_broadcast_to_rule, grad=lambda g: [sum_to(g.dy, g.x[0])])
def _broadcast_to(k, x):
    """``x`` broadcast to ``shape`` (-1: keep x's size there), NumPy's rules."""
    shape = k.attrs["shape"]
    lead = len(shape) - x.ndim
    target = tuple(x.shape[i - lead] if d == -1 else d for i, d in enumerate(shape))
    if any(n not in (1, d) for n, d in zip(x.shape, target[lead:])):
        raise ValueError(f"cannot broadcast {list(x.shape)} to {list(target)}")
    return k.xp.broadcast_to(x, target)


@lowers("BroadcastTo")
def _broadcast_to_onnx(g):
    shape, x = g.attrs["shape"], g.ins[0]
    lead = len(shape) - g.in_vars[0].ndim
    if -1 not in shape:
        target = g.const(list(shape), "int64")
    else:
        target = g.node("Concat", [g.dim(x, i - lead) if d == -1 else g.const([d], "int64")
                                   for i, d in enumerate(shape)], axis=0)
    # ONNX Expand broadcasts both ways: a size-1 target would keep x's size where the kernel
    # refuses it (x's size known only at run time). Other mismatches fail in Expand itself.
    shrinking = [i - lead for i, d in enumerate(shape) if d == 1 and i >= lead and g.in_vars[0].shape[i - lead] < 0]
    if shrinking:
        sizes = g.node("Gather", [g.shape(x), g.const(shrinking, "int64")])
        failed = g.node("ReduceMax", [g.cast(g.node("Not", [g.node("Equal", [sizes, g.const(1, "int64")])]),
                                             "int64")], keepdims=0)
        op, dtype, name = g.op, g.in_vars[0].dtype, g.op.inputs[0]

        def verify(x_shape):       # the kernel's own error, with x's run-time shape
            x_shape = [int(d) for d in np.reshape(x_shape, -1)]
            target = [x_shape[i - lead] if d == -1 else d for i, d in enumerate(shape)]
            stand_in = np.broadcast_to(np.zeros((), dtype), tuple(x_shape))
            raise kernel_failure(op.where(), ValueError(f"cannot broadcast {x_shape} to {target}"),
                                 [(name, stand_in)])
        ok = g.check(g.cast(failed, "bool"), "x's size must be 1 where the shape asks for 1", verify,
                     [g.shape(x)])
        target = g.node("Where", [ok, target, target])
    return [g.node("Expand", [x, target])]


def broadcast_to(x: Var, shape: Sequence[int]) -> Var:
    """``x`` broadcast to ``shape`` (``numpy.broadcast_to``); a -1 keeps x's size on that axis.

    Example::

        rows = rg.broadcast_to(bias, [4, 8])       # bias [8] -> [4, 8]
    """
    shape = [-1 if d is None else as_int(d, "broadcast_to: a dimension") for d in as_list(shape, "broadcast_to: shape")]
    return append_op("BroadcastTo", [x], {"shape": shape})[0]


# --- Tile -------------------------------------------------------------------------------------

def _full_reps(reps: Sequence[int], ndim: int) -> list[int]:
    """``reps`` with leading 1s up to x's rank (NumPy's tile)."""
    return [1] * (ndim - len(reps)) + list(reps)


def _tile_rule(ins, attrs):
    x, reps = ins[0], attrs["reps"]
    if any(r < 0 for r in reps):
        raise ShapeError(f"tile's reps {reps} must be >= 0")
    shape = (1,) * (len(reps) - x.ndim) + tuple(x.shape)
    reps = _full_reps(reps, len(shape))
    return [(tuple(-1 if d < 0 else d * r for d, r in zip(shape, reps)), x.dtype)]


def _tile_grad(g):
    return [tile_grad(g.dy, g.x[0], g.attrs["reps"])]


def tile_grad(dy: Var, x: Var, reps: Sequence[int]) -> Var:
    """The copies ``tile(x, reps)`` made of x, summed back onto x's shape (Tile's gradient).

    Example::

        dx = tile_grad(dy, x, [3, 1])              # dy [3N, D] -> dx [N, D]
    """
    return append_op("TileGrad", [dy, x], {"reps": list(reps)})[0]


@defop("Tile", infer=_tile_rule, grad=_tile_grad)
def _tile(k, x):
    """``x`` repeated ``reps[i]`` times along each axis (``numpy.tile``)."""
    xp, reps = k.xp, k.attrs["reps"]
    x = xp.reshape(x, (1,) * (len(reps) - x.ndim) + tuple(x.shape))
    return xp.tile(x, tuple(_full_reps(reps, x.ndim)))


@lowers("Tile")
def _tile_onnx(g):
    x, reps = g.ins[0], g.attrs["reps"]
    extra = len(reps) - g.in_vars[0].ndim
    if extra > 0:
        x = g.node("Unsqueeze", [x, g.const(list(range(extra)), "int64")])
    rank = builtins.max(len(reps), g.in_vars[0].ndim)
    return [g.node("Tile", [x, g.const(_full_reps(reps, rank), "int64")])]


def _tile_grad_rule(ins, attrs):
    dy, x = ins
    return [(x.shape, dy.dtype)]


@defop("TileGrad", inputs=("dy", "x"), infer=_tile_grad_rule, nondiff=(1,), shape_only=(1,),
       grad=lambda g: [tile(g.dy, g.attrs["reps"]), None])
def _tile_grad_kernel(k, dy, x):
    """The copies Tile made, summed back onto ``x``'s shape (Tile's gradient)."""
    xp, reps = k.xp, k.attrs["reps"]
    shape = (1,) * (len(reps) - x.ndim) + tuple(x.shape)
    reps = _full_reps(reps, len(shape))
    split = tuple(d for pair in zip(reps, shape) for d in pair)
    total = xp.sum(xp.reshape(dy, split), axis=tuple(range(0, 2 * len(shape), 2)))
    return xp.reshape(total, tuple(x.shape))


@lowers("TileGrad")
def _tile_grad_onnx(g):
    dy, x = g.ins
    reps, ndim = g.attrs["reps"], g.in_vars[1].ndim
    extra = builtins.max(len(reps) - ndim, 0)
    reps = _full_reps(reps, ndim + extra)
    pieces = []
    for axis, r in enumerate(reps):
        pieces.append(g.const([r], "int64"))
        pieces.append(g.const([1], "int64") if axis < extra else g.dim(x, axis - extra))
    split = g.node("Reshape", [dy, g.node("Concat", pieces, axis=0)], allowzero=1)
    total = g.node("ReduceSum", [split, g.const(list(range(0, 2 * len(reps), 2)), "int64")], keepdims=0)
    return [g.node("Reshape", [total, g.shape(x)], allowzero=1)]


def tile(x: Var, reps) -> Var:
    """``x`` repeated ``reps[i]`` times along each axis (``numpy.tile``: fewer reps than axes
    repeat the last axes, more add leading axes).

    Example::

        grid = rg.tile(row, [3, 1])                # row [1, 4] -> [3, 4]
    """
    reps = [as_int(reps, "tile: reps")] if isinstance(reps, (int, np.integer)) else as_ints(reps, "tile: reps")
    return append_op("Tile", [x], {"reps": reps})[0]


# --- Pad --------------------------------------------------------------------------------------

def _pad_pairs(pads, ndim: int) -> list[list[int]]:
    """``pads`` as one [before, after] per axis, read as numpy.pad reads pad_width."""
    if isinstance(pads, (int, np.integer)):
        pairs = [[int(pads)] * 2] * ndim
    else:
        pads = as_list(pads, "pad: pads")
        if len(pads) == 2 and all(isinstance(p, (int, np.integer)) for p in pads):
            pairs = [[int(pads[0]), int(pads[1])]] * ndim          # one (before, after) for all
        else:
            pairs = [as_ints(p, "pad: a (before, after) pair") for p in pads]
            if len(pairs) == 1:
                pairs = pairs * ndim
    if len(pairs) != ndim or any(len(p) != 2 for p in pairs):
        raise ShapeError(f"pad needs one (before, after) pair per axis ({ndim}), got {pads!r:.80}")
    if any(d < 0 for p in pairs for d in p):
        raise ShapeError(f"pad sizes must be >= 0, got {pairs}")
    return pairs


def _pad_rule(ins, attrs):
    x = ins[0]
    pairs = _pad_pairs(attrs["pads"], x.ndim)
    return [(tuple(-1 if d < 0 else d + b + a for d, (b, a) in zip(x.shape, pairs)), x.dtype)]


def _pad_grad(g):
    pairs = _pad_pairs(g.attrs["pads"], g.x[0].ndim)
    axes = [i for i, p in enumerate(pairs) if p != [0, 0]]
    if not axes:
        return [g.dy]
    # x's part of dy: [before, size - after) on each padded axis
    return [slice_(g.dy, axes, [pairs[i][0] for i in axes], [-pairs[i][1] if pairs[i][1] else 2**62 for i in axes])]


@defop("Pad", infer=_pad_rule, grad=_pad_grad)
def _pad(k, x):
    """``x`` with ``value`` added before and after each axis (``numpy.pad``, constant mode)."""
    xp = k.xp
    pairs = k.attrs["pads"]
    shape = tuple(d + b + a for d, (b, a) in zip(x.shape, pairs))
    out = xp.full(shape, k.attrs["value"], dtype=x.dtype)
    out[tuple(builtins.slice(b, b + d) for d, (b, _) in zip(x.shape, pairs))] = x
    return out


@lowers("Pad")
def _pad_onnx(g):
    pairs, dtype = g.attrs["pads"], g.in_vars[0].dtype
    pads = [b for b, _ in pairs] + [a for _, a in pairs]
    value = g.attrs["value"] if is_float(dtype) else int(g.attrs["value"])
    return [g.node("Pad", [g.ins[0], g.const(pads, "int64"), g.const(value, dtype)], mode="constant")]


def pad(x: Var, pads, value: float = 0.0) -> Var:
    """``x`` with ``value`` before and after each axis: ``pads`` is one ``(before, after)`` per
    axis, as ``numpy.pad(x, pads, constant_values=value)`` reads it (one pair, or one int, for
    every axis). The gradient is the slice of the padded gradient that holds x.

    Example::

        y = rg.pad(x, [(0, 0), (1, 2)])            # x [N, D] -> [N, D + 3]
    """
    pairs = _pad_pairs(pads, x.ndim)
    value = as_float(value, "pad: value")
    if x.dtype == "bool" or (not is_float(x.dtype) and not float(value).is_integer()):
        raise ProgramError(f"pad: value {value} does not fit '{x.name}' {x.dtype}")
    return append_op("Pad", [x], {"pads": pairs, "value": value})[0]


# --- Arange -----------------------------------------------------------------------------------

def _range_length(start, stop, step) -> int:
    return builtins.max(0, math.ceil((stop - start) / step))


def _arange_rule(ins, attrs):
    for var in ins:
        if var.ndim != 0 or var.dtype not in INT_DTYPES:
            raise ShapeError(f"arange bound '{var.name}' must be an int64 or int32 0-d Var, got {var.type_str()}")
    if ins:
        return [((-1,), attrs["dtype"])]
    return [((_range_length(attrs["start"], attrs["stop"], attrs["step"]),), attrs["dtype"])]


def _bounds(attrs, values) -> tuple:
    """(start, stop): the attributes, with the Var-given ones (None there) read from ``values``."""
    values = iter(values)
    start = attrs["start"] if attrs["start"] is not None else int(next(values))
    stop = attrs["stop"] if attrs["stop"] is not None else int(next(values))
    return start, stop


@defop("Arange", inputs=("bounds*",), infer=_arange_rule)
def _arange(k, *bounds):
    """``start, start + step, ...`` below ``stop`` (above, for a negative step), as numpy.arange."""
    start, stop = _bounds(k.attrs, bounds)
    return k.xp.arange(start, stop, k.attrs["step"], dtype=backend.dtype_of(k.xp, k.attrs["dtype"]))


@lowers("Arange")
def _arange_onnx(g):
    a, dtype = g.attrs, g.attrs["dtype"]
    given = iter(g.ins)
    values = []
    for key in ("start", "stop"):
        if a[key] is not None:
            values.append(g.const(a[key], dtype))
        else:
            values.append(g.cast(next(given), dtype))
    return [g.node("Range", [*values, g.const(a["step"], dtype)])]


def arange(start, stop=None, step=1, dtype: str = "int64") -> Var:
    """``[start, start + step, ...)`` up to ``stop`` (``numpy.arange``); ``arange(n)`` counts from 0.

    ``start`` and ``stop`` may be int64 0-d Vars (the length is then known
    only at run time, ``-1``); ``step`` is a nonzero number. ``dtype`` is
    int64 by default; float32/float64 give float ranges.

    Example::

        positions = rg.arange(rg.ops.tensor.dim(x, 1))     # 0 .. T-1 for x [N, T, D]
    """
    if stop is None:
        start, stop = 0, start
    dtype = canonical(dtype)
    if dtype == "bool":
        raise ProgramError("arange: dtype must be an integer or float dtype")
    convert = as_float if is_float(dtype) else as_int
    step = convert(step, "arange: step")
    if step == 0:
        raise ProgramError("arange: step must not be 0")
    attrs = {"step": step, "dtype": dtype}
    bounds = []
    for key, value in (("start", start), ("stop", stop)):
        if isinstance(value, Var):
            attrs[key] = None
            bounds.append(value)
        else:
            attrs[key] = convert(value, f"arange: {key}")
    return append_op("Arange", bounds, attrs)[0]
