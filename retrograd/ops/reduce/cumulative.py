"""Cumulative sums and products along an axis: ``cumsum``, ``cumprod`` (``reverse``: from the end).

The gradient of ``cumsum`` is the cumulative sum of the output gradient the
other way. The gradient of ``cumprod`` is exact with zeros in ``x``: before
the first zero (in the scan's direction) it is ``cumsum_back(dy * y) / x``;
at the first zero, ``cumsum_back(dy * y')`` with ``y'`` the cumulative product
with that zero replaced by 1; after it, 0. Both are built with rg ops, so
they differentiate again (at an exact zero the second derivative leaves out
the terms through the zero itself).
"""
from __future__ import annotations

from ...errors import ShapeError
from ...ir.program import Var, as_int
from ..core.lowering import lowers
from ..core.registry import append_op, defop
from ..core.shapes import normalize_axis


def _cumulative_rule(ins, attrs):
    x = ins[0]
    if x.ndim == 0:
        raise ShapeError(f"a cumulative op needs at least one axis, '{x.name}' is a scalar")
    normalize_axis(attrs["axis"], x.ndim)
    return [(x.shape, "int64" if x.dtype == "bool" else x.dtype)]


def _along(xp, fn, x, axis: int, reverse: bool):
    """``fn(x, axis)`` (a backend's cumsum or cumprod), from the end when ``reverse``."""
    if x.dtype == xp.bool:
        x = xp.astype(x, xp.int64)
    if not reverse:
        return fn(x, axis)
    return xp.flip(fn(xp.flip(x, axis=axis), axis), axis=axis)


# --- cumsum -----------------------------------------------------------------------------------------

def _exclusive(xp, y, axis: int, reverse: bool):
    """The inclusive running sums ``y`` shifted one place in the scan's direction, a zero in
    front: each entry leaves itself out (ONNX CumSum's ``exclusive``)."""
    n = y.shape[axis]
    if n == 0:
        return y
    kept = tuple(slice(1, None) if (a == axis and reverse) else slice(0, n - 1) if a == axis else slice(None)
                 for a in range(y.ndim))
    zero = xp.zeros(tuple(1 if a == axis else d for a, d in enumerate(y.shape)), dtype=y.dtype)
    return xp.concat([y[kept], zero] if reverse else [zero, y[kept]], axis=axis)


def _cumsum_grad(g):
    attrs = g.attrs
    return [cumsum(g.dy, attrs["axis"], reverse=not attrs["reverse"], exclusive=attrs.get("exclusive", False))]


@defop("CumSum", infer=_cumulative_rule, grad=_cumsum_grad)
def _cumsum(k, x):
    axis, reverse = k.attrs["axis"] % x.ndim, k.attrs["reverse"]
    y = _along(k.xp, k.backend.cumsum, x, axis, reverse)
    return _exclusive(k.xp, y, axis, reverse) if k.attrs.get("exclusive", False) else y


@lowers("CumSum")
def _cumsum_onnx(g):
    x = g.ins[0] if g.in_vars[0].dtype != "bool" else g.cast(g.ins[0], "int64")
    axis = g.const(g.attrs["axis"] % g.ndim(0), "int64")
    return [g.node("CumSum", [x, axis], reverse=int(g.attrs["reverse"]),
                   exclusive=int(g.attrs.get("exclusive", False)))]


def cumsum(x: Var, axis: int, reverse: bool = False, exclusive: bool = False) -> Var:
    """Running sums of ``x`` along ``axis``.

    Args:
        x: A numeric Var.
        axis: The axis to accumulate along.
        reverse: From the end: ``out[i] = sum(x[i:])``.

        exclusive: Each entry leaves itself out: ``out[i] = sum(x[:i])`` (ONNX
            CumSum's and ``tf.math.cumsum``'s option).

    Returns:
        A Var of ``x``'s shape and dtype.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [-1, 3])
            forward = rg.cumsum(x, axis=1)
            backward = rg.cumsum(x, axis=1, reverse=True)
            before = rg.cumsum(x, axis=1, exclusive=True)
        xv = np.array([[1.0, 2.0, 3.0]], "float32")
        f, b, e = rg.Executor().run(main, feed={"x": xv}, fetch_list=[forward, backward, before])
        assert f.tolist() == [[1.0, 3.0, 6.0]] and b.tolist() == [[6.0, 5.0, 3.0]]
        assert e.tolist() == [[0.0, 1.0, 3.0]]
        ```
    """
    attrs = {"axis": as_int(axis, "cumsum: axis"), "reverse": bool(reverse)}
    if exclusive:
        attrs["exclusive"] = True
    return append_op("CumSum", [x], attrs)[0]


# --- cumprod ----------------------------------------------------------------------------------------

def _cumprod_grad(g):
    from ..math.elementwise import equal, logical_and, where
    from ..array.tensor import cast
    x, y, dy = g.x[0], g.y, g.dy
    axis, reverse = g.attrs["axis"], g.attrs["reverse"]
    zero = equal(x, 0.0)
    seen = cumsum(cast(zero, x.dtype), axis, reverse=reverse)       # zeros so far, inclusive
    before = equal(seen, 0.0)
    first = logical_and(zero, equal(seen, 1.0))
    unzeroed = cumprod(where(first, 1.0, x), axis, reverse=reverse)
    back = not reverse
    plain = cumsum(dy * y, axis, reverse=back) / where(before, x, 1.0)
    at_zero = cumsum(dy * unzeroed, axis, reverse=back)
    return [where(before, plain, where(first, at_zero, 0.0))]


@defop("CumProd", infer=_cumulative_rule, grad=_cumprod_grad)
def _cumprod(k, x):
    return _along(k.xp, k.backend.cumprod, x, k.attrs["axis"] % x.ndim, k.attrs["reverse"])


@lowers("CumProd")
def _cumprod_onnx(g):
    """A Scan over the axis carrying the running product (ONNX has no CumProd), behind an If
    for an empty axis (onnxruntime's Scan cannot run zero iterations)."""
    x, var = g.ins[0], g.in_vars[0]
    dtype = "int64" if var.dtype == "bool" else var.dtype
    if var.dtype == "bool":
        x = g.cast(x, "int64")
    axis = g.attrs["axis"] % var.ndim
    scan = g.child()
    rest = [scan.node("Shape", [x], start=0, end=axis), scan.node("Shape", [x], start=axis + 1)]
    ones = scan.fill(scan.node("Concat", rest, axis=0), 1, dtype)
    body = scan.child()
    carry = body.input("carry", dtype)
    item = body.input("item", dtype)
    running = body.node("Mul", [carry, item])
    direction = [int(g.attrs["reverse"])]
    _, out = scan.nodes("Scan", [ones, x], 2, num_scan_inputs=1, scan_input_axes=[axis],
                        scan_output_axes=[axis], scan_input_directions=direction,
                        scan_output_directions=direction,
                        body=body.finish(f"{g.op.outputs[0]}.step", [(running, dtype, None), (running, dtype, None)]))
    empty = g.child()
    copy = empty.node("Identity", [x])
    is_empty = g.node("Equal", [g.scalar_dim(x, axis), g.const(0, "int64")])
    return [g.node("If", [is_empty], then_branch=empty.finish(f"{g.op.outputs[0]}.empty", [(copy, dtype, None)]),
                   else_branch=scan.finish(f"{g.op.outputs[0]}.scan", [(out, dtype, None)]))]


def cumprod(x: Var, axis: int, reverse: bool = False, exclusive: bool = False) -> Var:
    """Running products of ``x`` along ``axis``.

    The gradient is exact where ``x`` holds zeros (no division by them).

    Args:
        x: A numeric Var.
        axis: The axis to accumulate along.
        reverse: From the end: ``out[i] = prod(x[i:])``.
        exclusive: Each entry leaves itself out: ``out[i] = prod(x[:i])``
            (``tf.math.cumprod``'s option; a 1 shifted in with Pad and a slice).

    Returns:
        A Var of ``x``'s shape and dtype.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            hazard = rg.data("hazard", [-1, 3])
            survival = rg.cumprod(1.0 - hazard, axis=1)
            before = rg.cumprod(1.0 - hazard, axis=1, exclusive=True)
        feed = {"hazard": np.array([[0.5, 0.5, 0.0]], "float32")}
        out, ex = rg.Executor().run(main, feed=feed, fetch_list=[survival, before])
        assert out.tolist() == [[0.5, 0.25, 0.25]] and ex.tolist() == [[1.0, 0.5, 0.25]]
        ```
    """
    axis = as_int(axis, "cumprod: axis")
    if exclusive:             # the product of x shifted one place in, a 1 in front (Pad and a slice)
        x = _shifted_in(x, axis, bool(reverse), 1)
    return append_op("CumProd", [x], {"axis": axis, "reverse": bool(reverse)})[0]


def _shifted_in(x: Var, axis: int, reverse: bool, value) -> Var:
    """``x`` moved one place along ``axis`` in the scan's direction, ``value`` entering."""
    from ..array.shape_ops import pad
    from ..array.tensor import cast
    if x.ndim == 0:
        raise ShapeError(f"a cumulative op needs at least one axis, '{x.name}' is a scalar")
    axis = normalize_axis(axis, x.ndim)
    if x.dtype == "bool":
        x = cast(x, "int64")
    pads = [(0, 1) if (a == axis and reverse) else (1, 0) if a == axis else (0, 0) for a in range(x.ndim)]
    kept = tuple(slice(1, None) if (a == axis and reverse) else slice(None, -1) if a == axis else slice(None)
                 for a in range(x.ndim))
    return pad(x, pads, value)[kept]
