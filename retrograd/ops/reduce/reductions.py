"""Reductions: sum, mean, logsumexp and prod over axes (max/min/argmax: extrema.py)."""
from __future__ import annotations

from ...ir.dtypes import is_float
from ...ir.program import Var, as_int, as_ints
from ..core.registry import append_op, defop
from ..core.lowering import axes_input, lowers
from ..core.shapes import normalize_axes


def _reduce_rule(ins, attrs):
    x = ins[0]
    axes = normalize_axes(attrs["axis"], x.ndim)
    if attrs["keepdims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return [(shape, x.dtype)]


def _sum_rule(ins, attrs):
    """Sums keep the dtype; a sum of bools counts them (int64, as NumPy)."""
    [(shape, dtype)] = _reduce_rule(ins, attrs)
    return [(shape, "int64" if dtype == "bool" else dtype)]


def _mean_rule(ins, attrs):
    """The mean of integers or bools is float64 (as NumPy)."""
    [(shape, dtype)] = _reduce_rule(ins, attrs)
    return [(shape, dtype if is_float(dtype) else "float64")]


def _reduce_grad(is_mean: bool):
    def grad(g):
        from ..math.elementwise import expand_as
        x = g.x[0]
        axes = normalize_axes(g.attrs["axis"], x.ndim)
        inserted = () if g.attrs["keepdims"] else axes
        return [expand_as(g.dy, x, axes=inserted, mean_axes=axes if is_mean else ())]
    return grad


@defop("Sum", infer=_sum_rule, grad=_reduce_grad(False))
def _sum(k, x):
    axes = normalize_axes(k.attrs["axis"], x.ndim)
    dtype = k.xp.int64 if x.dtype == k.xp.bool else x.dtype
    return k.xp.sum(x, axis=axes, keepdims=k.attrs["keepdims"], dtype=dtype)


@lowers("Sum")
def _sum_onnx(g):
    x = g.ins[0] if g.in_vars[0].dtype != "bool" else g.cast(g.ins[0], "int64")
    return [_reduce_onnx(g, "ReduceSum", x)]


def _reduce_onnx(g, onnx_type: str, x: str) -> str:
    axes = normalize_axes(g.attrs["axis"], g.in_vars[0].ndim)
    if not axes:            # a scalar, or an empty axis list: nothing to reduce
        return g.node("Identity", [x])
    return g.node(onnx_type, [x, axes_input(g, axes)], keepdims=int(g.attrs["keepdims"]))


@defop("Mean", infer=_mean_rule, grad=_reduce_grad(True))
def _mean(k, x):
    axes = normalize_axes(k.attrs["axis"], x.ndim)
    if not k.xp.isdtype(x.dtype, "real floating"):
        x = k.xp.astype(x, k.xp.float64)
    return k.xp.mean(x, axis=axes, keepdims=k.attrs["keepdims"])


@lowers("Mean")
def _mean_onnx(g):
    """ReduceMean where the reduced sizes are known and not 0; else ReduceSum / count, so that the
    mean of nothing is NaN (0 / 0) as in NumPy and torch: ONNX ReduceMean of an empty tensor is 0."""
    x = g.ins[0] if is_float(g.in_vars[0].dtype) else g.cast(g.ins[0], "float64")
    shape = g.in_vars[0].shape
    axes = normalize_axes(g.attrs["axis"], len(shape))
    if all(shape[a] > 0 for a in axes):
        return [_reduce_onnx(g, "ReduceMean", x)]
    total = _reduce_onnx(g, "ReduceSum", x)
    sizes = g.node("Gather", [g.shape(g.ins[0]), g.const(list(axes), "int64")])
    count = g.cast(g.node("ReduceProd", [sizes], keepdims=0), g.out_vars[0].dtype)
    return [g.node("Div", [total, count])]


def _axis_attr(axis):
    if axis is None or isinstance(axis, int):
        return axis
    return as_ints(axis, "axis") if hasattr(axis, "__iter__") else as_int(axis, "axis")


def sum(x: Var, axis=None, keepdims: bool = False) -> Var:
    """Sum over ``axis`` (None: all axes; an int or a list).

    Example::

        total = rg.sum(x)                      # scalar
        rows = rg.sum(x, axis=1, keepdims=True)
    """
    return append_op("Sum", [x], {"axis": _axis_attr(axis), "keepdims": bool(keepdims)})[0]


def mean(x: Var, axis=None, keepdims: bool = False) -> Var:
    """Mean over ``axis`` (None: all axes). Example: ``loss = rg.mean(err * err)``."""
    return append_op("Mean", [x], {"axis": _axis_attr(axis), "keepdims": bool(keepdims)})[0]


# Shared with the other reductions (extrema.py).
reduce_rule = _reduce_rule
reduce_onnx = _reduce_onnx
axis_attr = _axis_attr


# --- logsumexp ------------------------------------------------------------------------------------

def _logsumexp_rule(ins, attrs):
    from ..core.shapes import require_float
    require_float(ins[0])
    return _reduce_rule(ins, attrs)


def _logsumexp_grad(g):
    from ..math.elementwise import exp, expand_as
    x = g.x[0]
    axes = normalize_axes(g.attrs["axis"], x.ndim)
    inserted = () if g.attrs["keepdims"] else axes
    return [expand_as(g.dy, x, axes=inserted) * exp(x - expand_as(g.y, x, axes=inserted))]


@defop("LogSumExp", infer=_logsumexp_rule, grad=_logsumexp_grad)
def _logsumexp(k, x):
    """``log(sum(exp(x)))`` over ``axis``, shifted by the maximum (no overflow); -inf over an
    empty axis, as torch.logsumexp."""
    axes = normalize_axes(k.attrs["axis"], x.ndim)
    if not axes:
        return k.xp.asarray(x, copy=True)
    return k.backend.logsumexp(x, axes, k.attrs["keepdims"])


@lowers("LogSumExp")
def _logsumexp_onnx(g):
    x, dtype = g.ins[0], g.in_vars[0].dtype
    axes = normalize_axes(g.attrs["axis"], g.in_vars[0].ndim)
    if not axes:
        return [g.node("Identity", [x])]
    top = g.node("ReduceMax", [x, axes_input(g, axes)], keepdims=1)
    finite = g.node("Not", [g.node("Or", [g.node("IsInf", [top]), g.node("IsNaN", [top])])])
    top = g.node("Where", [finite, top, g.const(0.0, dtype)])
    total = g.node("ReduceSum", [g.node("Exp", [g.node("Sub", [x, top])]), axes_input(g, axes)], keepdims=1)
    out = g.node("Add", [g.node("Log", [total]), top])
    if not g.attrs["keepdims"]:
        out = g.node("Squeeze", [out, axes_input(g, axes)])
    return [out]


def logsumexp(x: Var, axis=None, keepdims: bool = False) -> Var:
    """``log(sum(exp(x), axis))`` computed stably (shifted by the maximum), as torch.logsumexp;
    its gradient is the softmax of ``x`` over ``axis``.

    Example::

        log_z = rg.logsumexp(logits, axis=-1)       # [N, C] -> [N]
    """
    return append_op("LogSumExp", [x], {"axis": _axis_attr(axis), "keepdims": bool(keepdims)})[0]


# --- prod ---------------------------------------------------------------------------------------------

def _prod_grad(g):
    """d prod / d x_k = the product of the other elements, without dividing by x_k where it is 0:
    no zero in the slice: P / x_k; one zero at z: P at z and x_z * P / x_k elsewhere (0, with
    the right derivative in x_z); two or more zeros: 0 (P: the product of the nonzero elements)."""
    from ..math.elementwise import equal, expand_as, where
    from ..array.tensor import cast
    x = g.x[0]
    axes = normalize_axes(g.attrs["axis"], x.ndim)
    dy = expand_as(g.dy, x, axes=() if g.attrs["keepdims"] else axes)
    zero = equal(x, 0.0)
    zeros = sum(cast(zero, x.dtype), axis=list(axes), keepdims=True)
    safe = where(zero, 1.0, x)
    others = prod(safe, axis=list(axes), keepdims=True)
    zero_value = sum(where(zero, x, 0.0), axis=list(axes), keepdims=True)
    one_zero = where(zero, others, zero_value * others / safe)
    factor = where(equal(zeros, 0.0), others / safe, where(equal(zeros, 1.0), one_zero, 0.0))
    return [dy * factor]


@defop("Prod", infer=_sum_rule, grad=_prod_grad)
def _prod(k, x):
    axes = normalize_axes(k.attrs["axis"], x.ndim)
    dtype = k.xp.int64 if x.dtype == k.xp.bool else x.dtype
    return k.xp.prod(x, axis=axes, keepdims=k.attrs["keepdims"], dtype=dtype)


@lowers("Prod")
def _prod_onnx(g):
    x = g.ins[0] if g.in_vars[0].dtype != "bool" else g.cast(g.ins[0], "int64")
    return [_reduce_onnx(g, "ReduceProd", x)]


def prod(x: Var, axis=None, keepdims: bool = False) -> Var:
    """Product over ``axis`` (None: all axes). Its gradient is exact with zeros in ``x`` (the
    product of the other elements, never a division by a zero); so is its second derivative,
    except in a slice holding two or more zeros (there the second derivative is taken as 0).

    Example::

        volume = rg.prod(sides, axis=-1)
    """
    return append_op("Prod", [x], {"axis": _axis_attr(axis), "keepdims": bool(keepdims)})[0]
