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


def _dilations(attrs: dict):
    """MaxPool's tap spacing (``dilations``, absent where 1), None where absent."""
    return attrs.get("dilations")


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
    return k.backend.max_pool(x, *_pool_attrs(k.attrs), _dilations(k.attrs))


def _pads_fit_onnx(kernel, pads) -> bool:
    """onnxruntime's pooling takes pads smaller than the kernel only (ceil mode's can be larger)."""
    nd = len(kernel)
    return all(pads[i] < kernel[i] and pads[nd + i] < kernel[i] for i in range(nd))


def _channels_folded_onnx(g, x: str, pool) -> list[str]:
    """``pool(x)``'s outputs; where the channels may be 0 at run time, with them folded into the
    batch (``[N * C, 1, ...]``, then back): onnxruntime's pooling refuses 0 channels, a batch of 0
    it takes. Flat indices into each plane are the same either way."""
    if g.in_vars[0].shape[1] > 0:
        return pool(x)
    batch = g.node("Mul", [g.node("Shape", [x], start=0, end=1), g.node("Shape", [x], start=1, end=2)])
    spatial = g.node("Shape", [x], start=2)
    folded = g.node("Reshape", [x, g.node("Concat", [batch, g.const([1], "int64"), spatial], axis=0)],
                    allowzero=1)
    head = g.node("Shape", [x], start=0, end=2)
    return [g.node("Reshape", [y, g.node("Concat", [head, g.node("Shape", [y], start=2)], axis=0)], allowzero=1)
            for y in pool(folded)]


@lowers("MaxPool")
def _max_pool_onnx(g):
    return _channels_folded_onnx(g, g.ins[0], lambda x: _max_pool_nodes(g, x))


def _max_pool_nodes(g, x: str) -> list[str]:
    kernel, strides, pads = _pool_attrs(g.attrs)
    dilations = list(_dilations(g.attrs) or [1] * len(kernel))
    fits = _pads_fit_onnx(kernel, pads)
    x_in = x if fits else wo.pad(g, x, pads, g.in_vars[0].dtype, -float("inf"))
    y, flat = g.node("MaxPool", [x_in], n_out=2, kernel_shape=list(kernel), strides=list(strides),
                     pads=list(pads) if fits else [0] * len(pads), dilations=dilations)
    plane = g.node("ReduceProd", [g.node("Shape", [x_in], start=2)], keepdims=1)
    flat = g.node("Mod", [flat, plane])               # ONNX counts over the whole tensor
    return [y, flat if fits else _unpadded_index_onnx(g, flat, x_in, x, pads)]


def _unpadded_index_onnx(g, flat: str, x_pad: str, x: str, pads) -> str:
    """Flat indices into each plane of ``x_pad`` as flat indices into ``x``'s (no max is padding)."""
    nd = len(pads) // 2
    rest, coords = flat, [None] * nd
    for i in reversed(range(nd)):
        size = g.scalar_dim(x_pad, 2 + i)
        coords[i] = g.node("Sub", [g.node("Mod", [rest, size]), g.const(pads[i], "int64")])
        rest = g.node("Div", [rest, size])
    out = coords[0]
    for i in range(1, nd):
        out = g.node("Add", [g.node("Mul", [out, g.scalar_dim(x, 2 + i)]), coords[i]])
    return out


def _max_pool_grad_grad(g):
    dy, indices, x = g.x
    return [max_pool_gather(g.dy, indices, g.attrs), None, None]


@defop("MaxPoolGrad", inputs=("dy", "indices", "x_like"), infer=_like_rule, nondiff=(1, 2),
       shape_only=(2,), grad=_max_pool_grad_grad)
def _max_pool_grad(k, dy, indices, x_like):
    """``dy`` added into zeros shaped like ``x_like`` at each window's argmax."""
    return k.backend.max_pool_grad(dy, indices, x_like, *_pool_attrs(k.attrs), _dilations(k.attrs))


@lowers("MaxPoolGrad")
def _max_pool_grad_onnx(g):
    dy, indices, x_like = g.ins
    plane = g.node("ReduceProd", [g.node("Shape", [x_like], start=2)], keepdims=1)
    zeros = g.fill(g.node("Concat", [g.node("Shape", [x_like], end=2), plane], axis=0), 0, g.out_vars[0].dtype)
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
    return _channels_folded_onnx(g, g.ins[0], lambda x: _avg_pool_nodes(g, x))


def _avg_pool_nodes(g, x: str) -> list[str]:
    kernel, strides, pads = _pool_attrs(g.attrs)
    dtype = g.out_vars[0].dtype
    if dtype == "float32" and _pads_fit_onnx(kernel, pads):
        return [g.node("AveragePool", [x], kernel_shape=list(kernel), strides=list(strides), pads=list(pads),
                       count_include_pad=1)]
    if dtype == "float32":                             # padded zeros as data: the same divisor K
        return [g.node("AveragePool", [wo.pad(g, x, pads, dtype)], kernel_shape=list(kernel),
                       strides=list(strides), pads=[0] * len(pads))]
    ones = [1] * len(kernel)                           # onnxruntime: AveragePool is float32 only
    pieces = wo.im2col(g, wo.pad(g, x, pads, dtype), kernel, strides, ones)
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
#
# torch's options are built from the ops above: ``ceil_mode`` adds the extra window(s) as padding at
# the end of each spatial axis (its size must be known when built), ``count_include_pad=False`` and
# ceil mode's divisor (padding counted, the ceil-mode extra not) divide window sums by the count of
# counted cells, itself an AvgPool over a plane of ones.

def _pool2d_attrs(what: str, kernel_size, stride, padding, dilation=1) -> dict:
    """``MaxPool``/``AvgPool`` attributes; padding at most half the kernel (torch's rule: every
    window keeps an element of the input)."""
    kernel = per_axis(kernel_size, 2, "kernel_size", what)
    strides = kernel if stride is None else per_axis(stride, 2, "stride", what)
    pads = pads_of(padding, 2, what)
    dilations = per_axis(dilation, 2, "dilation", what)
    extents = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    if any(p > e // 2 for p, e in zip(pads, extents + extents)):
        raise build_error(what, f"padding {padding!r} must be at most half the kernel {kernel}")
    attrs = {"kernel": kernel, "strides": strides, "pads": pads}
    if dilations != [1, 1]:
        attrs["dilations"] = dilations
    return attrs


def _ceil_extra(what: str, x: Var, attrs: dict) -> list[int]:
    """Per spatial axis, the padding at the end that ceil mode's last windows read (torch's rule:
    a last window must start inside the input or its left padding)."""
    kernel, strides, pads = _pool_attrs(attrs)
    dilations = attrs.get("dilations", [1, 1])
    extra = []
    if x.ndim != 4:
        return [0, 0]                      # the op's rule says what is wrong with x
    for i, size in enumerate(x.shape[2:]):
        if size < 0:
            raise build_error(what, f"ceil_mode=True needs the spatial sizes of '{x.name}' {x.type_str()} "
                                    "known when the program is built")
        span = dilations[i] * (kernel[i] - 1) + 1
        out = -(-(size + pads[i] + pads[2 + i] - span) // strides[i]) + 1
        if (out - 1) * strides[i] >= size + pads[i]:
            out -= 1
        extra.append(max(0, (out - 1) * strides[i] + span - (size + pads[i] + pads[2 + i])))
    return extra


def _check_x(what: str, x) -> None:
    if not isinstance(x, Var):
        raise build_error(what, f"x must be a Var, got {type(x).__name__}")


def _with_extra(attrs: dict, extra: list[int]) -> dict:
    pads = list(attrs["pads"])
    return {**attrs, "pads": pads[:2] + [p + e for p, e in zip(pads[2:], extra)]}


def max_pool2d(x: Var, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False) -> Var:
    """Maximum over ``kernel_size`` windows of ``x [N, C, H, W]`` (``torch.nn.functional.max_pool2d``).

    The gradient goes to one maximal element per window: the first in the
    window's row-major order when several tie.

    Args:
        x: A float Var ``[N, C, H, W]``.
        kernel_size: An int or ``(kh, kw)``.
        stride: An int or a pair; ``kernel_size`` by default.
        padding: An int or ``(ph, pw)``, at most half the kernel; pads with -inf.

        dilation: An int or a pair: the spacing of a window's taps.
        ceil_mode: Add a last partial window where the input leaves one
            (torch's rule); the spatial sizes must then be known when built.

    Returns:
        A Var ``[N, C, H_out, W_out]``.

    Raises:
        ProgramError: padding over half the (dilated) kernel, or ``ceil_mode``
            with spatial sizes known only at run time.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [-1, 1, 4, 4])
            h = rg.max_pool2d(x, 2)                        # [N, C, 4, 4] -> [N, C, 2, 2]
            c = rg.max_pool2d(x, 3, stride=2, ceil_mode=True)   # [N, C, 4, 4] -> [N, C, 2, 2]
        xv = np.arange(16, dtype="float32").reshape(1, 1, 4, 4)
        out, out_c = rg.Executor().run(main, feed={"x": xv}, fetch_list=[h, c])
        assert out.tolist() == [[[[5.0, 7.0], [13.0, 15.0]]]]
        assert out_c.tolist() == [[[[10.0, 11.0], [14.0, 15.0]]]]
        ```
    """
    _check_x("max_pool2d", x)
    attrs = _pool2d_attrs("max_pool2d", kernel_size, stride, padding, dilation)
    if ceil_mode:
        attrs = _with_extra(attrs, _ceil_extra("max_pool2d", x, attrs))
    return append_op("MaxPool", [x], attrs, name="max_pool2d")[0]


def avg_pool2d(x: Var, kernel_size, stride=None, padding=0, count_include_pad: bool = True,
               ceil_mode: bool = False) -> Var:
    """Mean over ``kernel_size`` windows of ``x [N, C, H, W]`` (``torch.nn.functional.avg_pool2d``).

    By default (``count_include_pad=True``, torch's default) padded zeros count in the divisor.

    Args:
        x: A float Var ``[N, C, H, W]``.
        kernel_size: An int or ``(kh, kw)``.
        stride: An int or a pair; ``kernel_size`` by default.
        padding: An int or ``(ph, pw)``: zeros on both sides.
        count_include_pad: False: only the input's cells count in a window's divisor.
        ceil_mode: Add a last partial window where the input leaves one, its
            divisor counting the cells it covers (torch's rule); the spatial
            sizes must then be known when built.

    Returns:
        A Var ``[N, C, H_out, W_out]``.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [-1, 1, 3, 3])
            same = rg.avg_pool2d(x, 3, stride=1, padding=1)    # same spatial size
            inner = rg.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)
        ones = np.ones((1, 1, 3, 3), "float32")
        out, out_inner = rg.Executor().run(main, feed={"x": ones}, fetch_list=[same, inner])
        assert out.shape == (1, 1, 3, 3) and np.isclose(out[0, 0, 1, 1], 1.0) and np.isclose(out[0, 0, 0, 0], 4 / 9)
        assert np.allclose(out_inner, 1.0)                    # the padding is not counted
        ```
    """
    what = "avg_pool2d"
    _check_x(what, x)
    attrs = _pool2d_attrs(what, kernel_size, stride, padding)
    extra = _ceil_extra(what, x, attrs) if ceil_mode else [0, 0]
    if not any(extra) and (count_include_pad or not any(attrs["pads"])):     # every divisor is K
        return append_op("AvgPool", [x], attrs, name=what)[0]
    wide = _with_extra(attrs, extra)
    summed = append_op("AvgPool", [x], wide, name=what)[0]          # window sums / K
    return summed / _counted_share(x, attrs, extra, count_include_pad)


def _counted_share(x: Var, attrs: dict, extra: list[int], count_include_pad: bool) -> Var:
    """``[1|N, 1, H', W']``: each window's count of counted cells over K (the divisor's share)."""
    from ..array.creation import fill_like
    from ..array.shape_ops import pad
    ones = fill_like(x[:1, :1], 1.0)
    if count_include_pad:         # the padding counts, ceil mode's extra does not
        p = attrs["pads"]
        ones = pad(ones, [(0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])], 1.0)
        attrs = {**attrs, "pads": [0, 0, extra[0], extra[1]]}
    else:
        attrs = _with_extra(attrs, extra)
    return append_op("AvgPool", [ones], attrs, name="avg_pool2d_count")[0]
