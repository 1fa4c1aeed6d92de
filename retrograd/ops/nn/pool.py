"""Pooling: ``MaxPool`` and ``AvgPool`` over NCHW inputs, with differentiable gradient ops.

``MaxPool`` returns the window maxima and, as a second output, where each one
is: a flat index into its ``(n, c)`` plane of the unpadded input (torch's and
onnxruntime's convention). The gradient goes to that one element of each
window; ties go to the first maximal element in the window's row-major order
(``torch.nn.functional.max_pool2d`` does the same). Where windows overlap an
element collects the gradient of every window it is the maximum of::

    dx  = MaxPoolGrad(dy, indices; like x)        scatter-add at the indices
    d MaxPoolGrad:   d dy = MaxPoolGather(ddx, indices)   (read ddx at the indices)
    d MaxPoolGather: d v  = MaxPoolGrad(dv, indices; like v)

``AvgPool`` counts the zero padding in each window's divisor (torch's default
``count_include_pad=True``); its gradient ``AvgPoolGrad`` is linear in ``dy``
and its gradient is ``AvgPool`` again.
"""
from __future__ import annotations

from ...errors import ShapeError
from ...ir.program import Var
from . import windows_onnx as wo
from .conv import build_error, pads_of, per_axis, spatial_out
from ..core.lowering import lowers
from ..core.registry import append_op, defop
from ..core.shapes import require_float


def _pool_attrs(attrs: dict) -> tuple:
    return attrs["kernel"], attrs["strides"], attrs["pads"]


def _pool_rule(ins, attrs):
    x = ins[0]
    nd = len(attrs["kernel"])
    require_float(x)
    if x.ndim != nd + 2:
        raise ShapeError(f"{nd}-d pooling needs x [N, C, {nd} spatial axes], got {x.type_str()}")
    return x.shape[:2] + spatial_out(x.shape[2:], attrs["kernel"], attrs), x.dtype


def _like_rule(ins, attrs):
    return [(ins[-1].shape, ins[0].dtype)]


# --- MaxPool ---------------------------------------------------------------------------------

def _max_pool_rule(ins, attrs):
    shape, dtype = _pool_rule(ins, attrs)
    return [(shape, dtype), (shape, "int64")]


def _max_pool_grad_maker(g):
    if g.dy is None:
        return [None]
    return [max_pool_grad(g.dy, g.out[1], g.x[0], g.attrs)]


@defop("MaxPool", infer=_max_pool_rule, outputs=("out", "indices"), grad=_max_pool_grad_maker)
def _max_pool(k, x):
    """Window maxima and their flat indices into each ``(n, c)`` plane (ties: the first)."""
    return k.backend.max_pool(x, *_pool_attrs(k.attrs))


@lowers("MaxPool")
def _max_pool_onnx(g):
    kernel, strides, pads = _pool_attrs(g.attrs)
    y, flat = g.node("MaxPool", g.ins, n_out=2, kernel_shape=list(kernel), strides=list(strides),
                     pads=list(pads))
    plane = g.node("ReduceProd", [g.node("Shape", g.ins, start=2)], keepdims=1)
    return [y, g.node("Mod", [flat, plane])]          # ONNX counts over the whole tensor


def _max_pool_grad_grad(g):
    dy, indices, x = g.x
    return [max_pool_gather(g.dy, indices, g.attrs), None, None]


@defop("MaxPoolGrad", inputs=("dy", "indices", "x_like"), infer=_like_rule, nondiff=(1, 2),
       shape_only=(2,), grad=_max_pool_grad_grad)
def _max_pool_grad(k, dy, indices, x_like):
    """``dy`` added into zeros shaped like ``x_like`` at each window's argmax."""
    return k.backend.max_pool_grad(dy, indices, x_like, *_pool_attrs(k.attrs))


@lowers("MaxPoolGrad")
def _max_pool_grad_onnx(g):
    dy, indices, x_like = g.ins
    planes = g.node("Concat", [g.node("Shape", [x_like], end=2), g.const([-1], "int64")], axis=0)
    zeros = g.fill(g.node("Shape", [g.node("Reshape", [x_like, planes])]), 0, g.out_vars[0].dtype)
    rows = [wo.reshape(g, v, [0, 0, -1]) for v in (indices, dy)]
    summed = g.node("ScatterElements", [zeros, *rows], axis=2, reduction="add")
    return [g.node("Reshape", [summed, g.shape(x_like)])]


def _max_pool_gather_grad(g):
    v, indices = g.x
    return [max_pool_grad(g.dy, indices, v, g.attrs), None]


def _gather_rule(ins, attrs):
    return [(ins[1].shape, ins[0].dtype)]


@defop("MaxPoolGather", inputs=("v", "indices"), infer=_gather_rule, nondiff=(1,), grad=_max_pool_gather_grad)
def _max_pool_gather(k, v, indices):
    """``v`` read at each window's argmax (the gradient of ``MaxPoolGrad`` for ``dy``)."""
    return k.backend.max_pool_gather(v, indices)


@lowers("MaxPoolGather")
def _max_pool_gather_onnx(g):
    v, indices = g.ins
    picked = g.node("GatherElements", [wo.reshape(g, v, [0, 0, -1]), wo.reshape(g, indices, [0, 0, -1])],
                    axis=2)
    return [g.node("Reshape", [picked, g.shape(indices)])]


def max_pool_grad(dy: Var, indices: Var, x_like: Var, attrs: dict) -> Var:
    """The gradient of ``MaxPool`` (``attrs``) for its input, given ``dy`` and its ``indices``.

    Example::

        dx = max_pool_grad(dy, indices, x, pool_op.attrs)
    """
    return append_op("MaxPoolGrad", [dy, indices, x_like], dict(attrs))[0]


def max_pool_gather(v: Var, indices: Var, attrs: dict) -> Var:
    """``v`` read at a ``MaxPool``'s ``indices`` (``attrs``: that op's).

    Example::

        picked = max_pool_gather(v, indices, pool_op.attrs)     # shaped like indices
    """
    return append_op("MaxPoolGather", [v, indices], dict(attrs))[0]


# --- AvgPool ---------------------------------------------------------------------------------

@defop("AvgPool", infer=lambda ins, attrs: [_pool_rule(ins, attrs)],
       grad=lambda g: [avg_pool_grad(g.dy, g.x[0], g.attrs)])
def _avg_pool(k, x):
    """Window means, the zero padding counted in the divisor."""
    return k.backend.avg_pool(x, *_pool_attrs(k.attrs))


@lowers("AvgPool")
def _avg_pool_onnx(g):
    kernel, strides, pads = _pool_attrs(g.attrs)
    dtype = g.out_vars[0].dtype
    if dtype == "float32":
        return [g.node("AveragePool", g.ins, kernel_shape=list(kernel), strides=list(strides), pads=list(pads),
                       count_include_pad=1)]
    ones = [1] * len(kernel)                           # onnxruntime: AveragePool is float32 only
    pieces = wo.im2col(g, wo.pad(g, g.ins[0], pads, dtype), kernel, strides, ones)
    total = pieces[0] if len(pieces) == 1 else g.node("Sum", pieces)
    return [g.node("Div", [total, g.const(wo.prod(kernel), dtype)])]


@defop("AvgPoolGrad", inputs=("dy", "x_like"), infer=_like_rule, nondiff=(1,), shape_only=(1,),
       grad=lambda g: [_avg_pool_op(g.dy, g.attrs), None])
def _avg_pool_grad(k, dy, x_like):
    """Each window's gradient shared evenly by its taps, added back where they were read."""
    return k.backend.avg_pool_grad(dy, x_like, *_pool_attrs(k.attrs))


@lowers("AvgPoolGrad")
def _avg_pool_grad_onnx(g):
    dy, x_like = g.ins
    kernel, strides, pads = _pool_attrs(g.attrs)
    share = g.node("Div", [dy, g.const(wo.prod(kernel), g.out_vars[0].dtype)])
    spread = wo.dilate(g, share, 2, strides)
    return [wo.col2im(g, [spread] * wo.prod(kernel), x_like, pads, kernel, [1] * len(kernel))]


def avg_pool_grad(dy: Var, x_like: Var, attrs: dict) -> Var:
    """The gradient of ``AvgPool`` (``attrs``) for its input, given ``dy``.

    Example::

        dx = avg_pool_grad(dy, x, pool_op.attrs)
    """
    return append_op("AvgPoolGrad", [dy, x_like], dict(attrs))[0]


def _avg_pool_op(x: Var, attrs: dict) -> Var:
    return append_op("AvgPool", [x], dict(attrs))[0]


# --- builders ----------------------------------------------------------------------------------

def _pool2d_attrs(what: str, kernel_size, stride, padding) -> dict:
    """``MaxPool``/``AvgPool`` attributes; padding at most half the kernel (torch's rule: every
    window keeps an element of the input)."""
    kernel = per_axis(kernel_size, 2, "kernel_size", what)
    strides = kernel if stride is None else per_axis(stride, 2, "stride", what)
    pads = pads_of(padding, 2, what)
    if any(p > k // 2 for p, k in zip(pads, kernel + kernel)):
        raise build_error(what, f"padding {padding!r} must be at most half the kernel {kernel}")
    return {"kernel": kernel, "strides": strides, "pads": pads}


def _pool2d(op_type: str, what: str, x, kernel_size, stride, padding):
    if not isinstance(x, Var):
        raise build_error(what, f"x must be a Var, got {type(x).__name__}")
    return append_op(op_type, [x], _pool2d_attrs(what, kernel_size, stride, padding), name=what)


def max_pool2d(x: Var, kernel_size, stride=None, padding=0) -> Var:
    """Maximum over ``kernel_size`` windows of ``x [N, C, H, W]`` (``torch.nn.functional.max_pool2d``).

    ``stride`` defaults to ``kernel_size``; ``padding`` (an int or ``(ph, pw)``,
    at most half the kernel) pads with -inf. The gradient goes to one maximal
    element per window: the first in the window's row-major order when several
    tie.

    Example::

        h = rg.max_pool2d(h, 2)                      # [N, C, 32, 32] -> [N, C, 16, 16]
    """
    return _pool2d("MaxPool", "max_pool2d", x, kernel_size, stride, padding)[0]


def avg_pool2d(x: Var, kernel_size, stride=None, padding=0) -> Var:
    """Mean over ``kernel_size`` windows of ``x [N, C, H, W]`` (``torch.nn.functional.avg_pool2d``
    with its default ``count_include_pad=True``: padded zeros count in the divisor).

    Example::

        h = rg.avg_pool2d(h, 3, stride=1, padding=1)  # same spatial size
    """
    return _pool2d("AvgPool", "avg_pool2d", x, kernel_size, stride, padding)[0]
