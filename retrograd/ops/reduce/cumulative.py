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

@defop("CumSum", infer=_cumulative_rule,
       grad=lambda g: [cumsum(g.dy, g.attrs["axis"], reverse=not g.attrs["reverse"])])
def _cumsum(k, x):
    return _along(k.xp, k.backend.cumsum, x, k.attrs["axis"] % x.ndim, k.attrs["reverse"])


@lowers("CumSum")
def _cumsum_onnx(g):
    x = g.ins[0] if g.in_vars[0].dtype != "bool" else g.cast(g.ins[0], "int64")
    axis = g.const(g.attrs["axis"] % g.ndim(0), "int64")
    return [g.node("CumSum", [x, axis], reverse=int(g.attrs["reverse"]))]


def cumsum(x: Var, axis: int, reverse: bool = False) -> Var:
    """Running sums along ``axis`` (``reverse``: from the end, ``out[i] = sum(x[i:])``).

    Example::

        positions = rg.cumsum(mask_as_int, axis=1)
    """
    return append_op("CumSum", [x], {"axis": as_int(axis, "cumsum: axis"), "reverse": bool(reverse)})[0]


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


def cumprod(x: Var, axis: int, reverse: bool = False) -> Var:
    """Running products along ``axis`` (``reverse``: from the end). The gradient is exact
    where ``x`` holds zeros (no division by them).

    Example::

        survival = rg.cumprod(1.0 - hazard, axis=1)
    """
    return append_op("CumProd", [x], {"axis": as_int(axis, "cumprod: axis"), "reverse": bool(reverse)})[0]
