"""Convolution: ``Conv`` and its two gradient ops, each with a gradient maker of conv ops.

``y = Conv(x, w)`` over ``x [N, C, *spatial]`` (NCW for conv1d, NCHW for
conv2d) and ``w [F, C/groups, *kernel]``, with per-axis ``strides``,
``dilations`` and ``pads`` (ONNX order: every axis' before, then every axis'
after). Its gradients are ops of their own, linear in each operand, so their
gradients are again conv ops (second order works)::

    dx = ConvInputGrad(dy, w; like x)       the transposed convolution
    dw = ConvWeightGrad(x, dy; like w)
    d ConvInputGrad:  d dy = Conv(ddx, w),            d w = ConvWeightGrad(ddx, dy)
    d ConvWeightGrad: d x  = ConvInputGrad(dy, ddw),  d dy = Conv(x, ddw)

Kernels call the backend (``Backend.conv`` and friends): the im2col + GEMM
path of ``backends/windows.py`` on NumPy/CuPy, torch's ``conv*d`` and
``aten.convolution_backward`` on torch.
"""
from __future__ import annotations

import math
import numbers

from ...errors import ProgramError, ShapeError
from ...ir.location import here
from ...ir.program import Var
from ...backends.windows import out_size
from . import windows_onnx as wo
from ..core.lowering import lowers
from ..core.registry import append_op, defop
from ..core.shapes import require_float
from ..array.tensor import reshape


# --- hyper-parameters ---------------------------------------------------------------------

def build_error(what: str, message: str) -> ProgramError:
    """A ProgramError naming the builder and the user's line.

    Example::

        raise build_error("conv2d", "stride must be >= 1")   # "train.py:12: conv2d: stride must ..."
    """
    location = here()
    return ProgramError(f"{location + ': ' if location else ''}{what}: {message}")


def per_axis(value, nd: int, name: str, what: str, minimum: int = 1) -> list[int]:
    """An int, or one int per spatial axis, each >= ``minimum``.

    Example::

        per_axis(2, 2, "stride", "conv2d")          # [2, 2]
    """
    values = [value] * nd if _is_int(value) else value
    if (not isinstance(values, (list, tuple)) or len(values) != nd
            or not all(_is_int(v) and v >= minimum for v in values)):
        raise build_error(what, f"{name} must be an int >= {minimum} or {nd} of them, got {value!r}")
    return [int(v) for v in values]


def pads_of(padding, nd: int, what: str, kernel=None, dilations=None, strides=None) -> list[int]:
    """ONNX-order pads from ``padding``: an int, one int per axis, one ``(before, after)`` pair per
    axis, ``2 * nd`` ints ``(before, after)`` axis by axis, or "valid" / "same" (stride 1 only).

    Example::

        pads_of(((1, 0), (2, 2)), 2, "conv2d")      # [1, 2, 0, 2]: befores, then afters
    """
    if padding == "valid":
        return [0] * 2 * nd
    if padding == "same":
        return _same_pads(nd, what, kernel, dilations, strides)
    if _is_int(padding):
        return per_axis(padding, nd, "padding", what, 0) * 2
    items = list(padding) if isinstance(padding, (list, tuple)) else None
    if items is not None and len(items) == nd and all(_is_int(p) for p in items):
        return per_axis(items, nd, "padding", what, 0) * 2
    if items is not None and len(items) == nd and all(isinstance(p, (list, tuple)) for p in items):
        items = [v for pair in items for v in pair] if all(len(p) == 2 for p in items) else None
    if items is not None and len(items) == 2 * nd and all(_is_int(p) and p >= 0 for p in items):
        return [int(v) for v in items[0::2]] + [int(v) for v in items[1::2]]
    raise build_error(what, f"padding must be 'valid', 'same', an int >= 0, {nd} of them, or one "
                      f"(before, after) pair per spatial axis, got {padding!r}")


def _same_pads(nd, what, kernel, dilations, strides) -> list[int]:
    if kernel is None or min(kernel) < 0 or any(s != 1 for s in strides):
        raise build_error(what, "padding='same' needs stride 1 and a weight of known shape")
    total = [d * (k - 1) for k, d in zip(kernel, dilations)]
    return [t // 2 for t in total] + [t - t // 2 for t in total]


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _window_attrs(attrs: dict) -> tuple:
    return attrs["strides"], attrs["pads"], attrs["dilations"], attrs["groups"]


# --- shape rules ---------------------------------------------------------------------------

def spatial_out(sizes, kernel, attrs) -> tuple[int, ...]:
    """Output sizes per spatial axis (-1 where unknown); ShapeError where no window fits.

    Example::

        spatial_out([32, -1], [3, 3], {"strides": [2, 2], "pads": [1, 1, 1, 1]})   # (16, -1)
    """
    strides, pads = attrs["strides"], attrs["pads"]
    dilations = attrs.get("dilations", [1] * len(strides))
    nd, outs = len(strides), []
    for i, (size, k) in enumerate(zip(sizes, kernel)):
        if size < 0 or k < 0:
            outs.append(-1)
            continue
        out = out_size(size, k, strides[i], pads[i], pads[nd + i], dilations[i])
        if out < 1:
            raise ShapeError(f"the kernel spans {dilations[i] * (k - 1) + 1} along spatial axis {i}, "
                             f"more than the padded input's {size + pads[i] + pads[nd + i]}")
        outs.append(out)
    return tuple(outs)


def _conv_rule(ins, attrs):
    x, w = ins
    nd, groups = len(attrs["strides"]), attrs["groups"]
    require_float(x)
    if w.dtype != x.dtype:
        raise ShapeError("x and w must share a dtype")
    if x.ndim != nd + 2 or w.ndim != nd + 2:
        raise ShapeError(f"a {nd}-d convolution needs x [N, C, {nd} spatial] and w [F, C/groups, "
                         f"{nd} kernel] axes")
    f, c, cg = w.shape[0], x.shape[1], w.shape[1]
    if f >= 0 and f % groups:
        raise ShapeError(f"groups={groups} does not divide the {f} filters")
    if c >= 0 and c % groups:
        raise ShapeError(f"groups={groups} does not divide the input's {c} channels")
    if c >= 0 and cg >= 0 and c != cg * groups:
        raise ShapeError(f"x has {c} channels but w expects {cg * groups} (C/groups = {cg}, "
                         f"groups={groups})")
    return [((x.shape[0], f) + spatial_out(x.shape[2:], w.shape[2:], attrs), x.dtype)]


def _like_rule(ins, attrs):
    """A gradient op's result: the shape of its last input (the forward operand)."""
    like = ins[-1]
    return [(like.shape, ins[0].dtype)]


# --- Conv ------------------------------------------------------------------------------------

def _conv_grad(g):
    x, w = g.x
    return [conv_input_grad(g.dy, w, x, g.attrs), conv_weight_grad(x, g.dy, w, g.attrs)]


def _conv_flops(ins, outs, attrs) -> int:
    return 2 * math.prod(outs[0]) * math.prod(ins[1][1:])     # each output: C/groups x kernel products


@defop("Conv", inputs=("x", "w"), infer=_conv_rule, grad=_conv_grad, flops=_conv_flops)
def _conv(k, x, w):
    """Cross-correlation of ``x [N, C, *spatial]`` with ``w [F, C/groups, *kernel]``."""
    return k.backend.conv(x, w, *_window_attrs(k.attrs))


@lowers("Conv")
def _conv_onnx(g):
    strides, pads, dilations, groups = _window_attrs(g.attrs)
    if g.out_vars[0].dtype == "float32":
        return [g.node("Conv", g.ins, strides=strides, pads=pads, dilations=dilations, group=groups)]
    return [_conv_general_onnx(g, g.ins[0], g.ins[1], g.in_vars[1])]   # onnxruntime: Conv is float32 only


def _conv_general_onnx(g, x: str, w: str, w_var: Var) -> str:
    """im2col + MatMul: ``w [G, F/G, C/G*K] @ cols [N, G, C/G*K, P]``, reshaped to ``[N, F, *out]``."""
    strides, pads, dilations, groups = _window_attrs(g.attrs)
    kernel = wo.static_kernel(g, w_var, "Conv")
    f, cg = w_var.shape[:2]
    pieces = wo.im2col(g, wo.pad(g, x, pads, w_var.dtype), kernel, strides, dilations)
    # (exact sizes: with 0 channels or filters no -1 can be inferred)
    cols = wo.reshape_exact(g, wo.stack_taps(g, pieces), [g.dim(x, 0), groups, cg * wo.prod(kernel),
                                                          wo.positions(g, pieces[0])])
    y = g.node("MatMul", [wo.reshape_exact(g, w, [groups, f // groups, cg * wo.prod(kernel)]), cols])
    return wo.reshape_exact(g, y, [g.dim(x, 0), f, g.node("Shape", [pieces[0]], start=2)])


# --- ConvBias: Conv with its bias added as it writes (passes.fuse_conv_bias) --------------------

def _conv_bias_rule(ins, attrs):
    x, w, b = ins
    out = _conv_rule([x, w], attrs)
    if b.ndim != 1 or b.dtype != x.dtype or (b.shape[0] >= 0 and w.shape[0] >= 0 and b.shape[0] != w.shape[0]):
        raise ShapeError(f"the bias must be [F] of x's dtype for w {w.type_str()}, got {b.type_str()}")
    return out


def _conv_bias_grad(g):
    from ..reduce.reductions import sum as reduce_sum      # (reductions import this family)
    x, w, b = g.x
    axes = [0] + list(range(2, x.ndim))
    return [conv_input_grad(g.dy, w, x, g.attrs), conv_weight_grad(x, g.dy, w, g.attrs),
            reduce_sum(g.dy, axes)]


@defop("ConvBias", inputs=("x", "w", "b"), infer=_conv_bias_rule, grad=_conv_bias_grad, flops=_conv_flops)
def _conv_bias(k, x, w, b):
    """``Conv(x, w)`` plus ``b [F]`` on each filter's plane, in one kernel where the backend has one."""
    return k.backend.conv_bias(x, w, b, *_window_attrs(k.attrs))


@lowers("ConvBias")
def _conv_bias_onnx(g):
    strides, pads, dilations, groups = _window_attrs(g.attrs)
    if g.out_vars[0].dtype == "float32":
        return [g.node("Conv", g.ins, strides=strides, pads=pads, dilations=dilations, group=groups)]
    y = _conv_general_onnx(g, g.ins[0], g.ins[1], g.in_vars[1])
    nd = len(strides)
    return [g.node("Add", [y, wo.reshape(g, g.ins[2], [-1] + [1] * nd)])]


# --- ConvInputGrad: the transposed convolution --------------------------------------------------

def _conv_input_grad_grad(g):
    dy, w, x = g.x
    ddx = g.dy
    return [_conv_op(ddx, w, g.attrs), conv_weight_grad(ddx, dy, w, g.attrs), None]


@defop("ConvInputGrad", inputs=("dy", "w", "x_like"), infer=_like_rule, nondiff=(2,), shape_only=(2,),
       grad=_conv_input_grad_grad)
def _conv_input_grad(k, dy, w, x_like):
    """The gradient of ``Conv`` for ``x`` (a transposed convolution), shaped like ``x_like``."""
    return k.backend.conv_input_grad(dy, w, x_like, *_window_attrs(k.attrs))


@lowers("ConvInputGrad")
def _conv_input_grad_onnx(g):
    """ConvTranspose (float32) or col2im of ``w^T @ dy`` (onnxruntime's ConvTranspose is float32 only)."""
    if g.out_vars[0].dtype == "float32":
        return [_conv_transpose_onnx(g)]
    dy, w, x_like = g.ins
    strides, pads, dilations, groups = _window_attrs(g.attrs)
    w_var = g.in_vars[1]
    kernel = wo.static_kernel(g, w_var, "ConvInputGrad")
    f, cg = w_var.shape[:2]
    wt = g.node("Transpose", [wo.reshape_exact(g, w, [groups, f // groups, cg * wo.prod(kernel)])],
                perm=[0, 2, 1])
    dcols = g.node("MatMul", [wt, wo.reshape_exact(g, dy, [g.dim(dy, 0), groups, f // groups,
                                                           wo.positions(g, dy)])])   # [N, G, C/G*K, P]
    dcols = wo.reshape_exact(g, dcols, [g.dim(dy, 0), cg * groups, wo.prod(kernel), g.node("Shape", [dy], start=2)])
    spread = wo.dilate(g, dcols, 3, strides)
    pieces = [g.node("Gather", [spread, g.const(t, "int64")], axis=2) for t in range(wo.prod(kernel))]
    return [wo.col2im(g, pieces, x_like, pads, kernel, dilations)]


def _conv_transpose_onnx(g) -> str:
    """ConvTranspose without pads (every window's full extent, ``stride * (out - 1) + dilation *
    (kernel - 1) + 1``), zero-extended to the padded input's size, the padding cropped."""
    dy, w, x_like = g.ins
    strides, pads, dilations, groups = _window_attrs(g.attrs)
    nd = len(strides)
    full = g.node("ConvTranspose", [dy, w], strides=strides, dilations=dilations, group=groups)
    padded = g.node("Add", [g.node("Shape", [x_like], start=2),
                            g.const([pads[i] + pads[nd + i] for i in range(nd)], "int64")])
    rest = g.node("Sub", [padded, g.node("Shape", [full], start=2)])
    widths = g.node("Concat", [g.const([0] * (nd + 4), "int64"), rest], axis=0)   # before: 0; after: rest
    dx_pad = g.node("Pad", [full, widths])
    starts = g.const(list(pads[:nd]), "int64")
    ends = g.node("Add", [starts, g.node("Shape", [x_like], start=2)])
    return g.node("Slice", [dx_pad, starts, ends, g.const(list(range(2, 2 + nd)), "int64")])


# --- ConvWeightGrad ---------------------------------------------------------------------------

def _conv_weight_grad_grad(g):
    x, dy, w = g.x
    ddw = g.dy
    return [conv_input_grad(dy, ddw, x, g.attrs), _conv_op(x, ddw, g.attrs), None]


@defop("ConvWeightGrad", inputs=("x", "dy", "w_like"), infer=_like_rule, nondiff=(2,), shape_only=(2,),
       grad=_conv_weight_grad_grad)
def _conv_weight_grad(k, x, dy, w_like):
    """The gradient of ``Conv`` for ``w``, shaped like ``w_like``."""
    return k.backend.conv_weight_grad(x, dy, w_like, *_window_attrs(k.attrs))


@lowers("ConvWeightGrad")
def _conv_weight_grad_onnx(g):
    """``sum over N of dy [N, G, F/G, P] @ cols^T``, reshaped to ``w``'s shape."""
    x, dy, w_like = g.ins
    strides, pads, dilations, groups = _window_attrs(g.attrs)
    w_var = g.in_vars[2]
    kernel = wo.static_kernel(g, w_var, "ConvWeightGrad")
    f, cg = w_var.shape[:2]
    if 0 in w_var.shape:       # an empty weight's gradient (the MatMul below cannot form it)
        return [g.fill(g.shape(w_like), 0, w_var.dtype)]
    pieces = wo.im2col(g, wo.pad(g, x, pads, w_var.dtype), kernel, strides, dilations)
    cols = wo.reshape_exact(g, wo.stack_taps(g, pieces), [g.dim(x, 0), groups, cg * wo.prod(kernel),
                                                          wo.positions(g, pieces[0])])
    dy = wo.reshape_exact(g, dy, [g.dim(dy, 0), groups, f // groups, wo.positions(g, dy)])
    dw = g.node("MatMul", [dy, g.node("Transpose", [cols], perm=[0, 1, 3, 2])])
    dw = g.node("ReduceSum", [dw, g.const([0], "int64")], keepdims=0)
    return [g.node("Reshape", [dw, g.shape(w_like)])]


# --- builders ----------------------------------------------------------------------------------

def _conv_op(x: Var, w: Var, attrs: dict) -> Var:
    return append_op("Conv", [x, w], dict(attrs), name="conv")[0]


def conv_input_grad(dy: Var, w: Var, x_like: Var, attrs: dict) -> Var:
    """``d loss / d x`` of ``Conv(x, w)`` with ``attrs`` given ``dy`` (a transposed convolution).

    Example::

        dx = conv_input_grad(dy, w, x, conv_op.attrs)
    """
    return append_op("ConvInputGrad", [dy, w, x_like], dict(attrs))[0]


def conv_weight_grad(x: Var, dy: Var, w_like: Var, attrs: dict) -> Var:
    """``d loss / d w`` of ``Conv(x, w)`` with ``attrs`` given ``dy``.

    Example::

        dw = conv_weight_grad(x, dy, w, conv_op.attrs)
    """
    return append_op("ConvWeightGrad", [x, dy, w_like], dict(attrs))[0]


def _conv_attrs(nd: int, what: str, w: Var | None, stride, padding, dilation, groups) -> dict:
    """The ``Conv`` attributes of an ``nd``-d convolution from the user's hyper-parameters."""
    strides = per_axis(stride, nd, "stride", what)
    dilations = per_axis(dilation, nd, "dilation", what)
    if not _is_int(groups) or groups < 1:
        raise build_error(what, f"groups must be an int >= 1, got {groups!r}")
    kernel = tuple(w.shape[2:]) if isinstance(w, Var) else None
    pads = pads_of(padding, nd, what, kernel, dilations, strides)
    return {"strides": strides, "pads": pads, "dilations": dilations, "groups": int(groups)}


def convolution(x: Var, w: Var, b: Var | None = None, stride=1, padding=0, dilation=1, groups=1,
                what: str | None = None) -> Var:
    """The convolution of ``conv1d``/``conv2d`` with as many spatial axes as ``w`` has kernel axes;
    ``what`` names the caller in error messages (a layer passes its own name).

    Example::

        y = convolution(x, w, padding=1, what="layers.conv2d 'c1'")
    """
    if not isinstance(w, Var) or w.ndim < 3:
        raise build_error(what or "convolution", f"w must be a Var [F, C/groups, *kernel], got {w!r:.60}")
    nd = w.ndim - 2
    what = what or f"conv{nd}d"
    if not isinstance(x, Var):
        raise build_error(what, f"x must be a Var, got {type(x).__name__}")
    y = _conv_op(x, w, _conv_attrs(nd, what, w, stride, padding, dilation, groups))
    if b is None:
        return y
    if not isinstance(b, Var) or b.ndim != 1 or (b.shape[0] >= 0 and w.shape[0] >= 0 and b.shape[0] != w.shape[0]):
        shown = b.type_str() if isinstance(b, Var) else type(b).__name__
        raise ShapeError(f"{here() or '?'}: {what}: bias b {shown} must be [F] for w {w.type_str()}")
    return y + reshape(b, [-1] + [1] * nd)


def _conv_nd(nd: int, what: str, x, w, b, stride, padding, dilation, groups) -> Var:
    if isinstance(w, Var) and w.ndim != nd + 2:
        raise ShapeError(f"{here() or '?'}: {what}: w {w.type_str()} must have {nd + 2} axes "
                         f"[F, C/groups, {nd} kernel axes] (x: {getattr(x, 'type_str', lambda: x)()})")
    return convolution(x, w, b, stride, padding, dilation, groups, what)


def conv1d(x: Var, w: Var, b: Var | None = None, stride=1, padding=0, dilation=1, groups=1) -> Var:
    """1-d convolution (cross-correlation, as ``torch.nn.functional.conv1d``) of ``x [N, C, W]``.

    ``W_out = (W + left + right - dilation * (k - 1) - 1) // stride + 1``.

    Args:
        x: A float Var ``[N, C, W]``.
        w: The filters ``[F, C/groups, k]``.
        b: The bias ``[F]``, or None.
        stride: An int.
        padding: An int (both sides), a ``(left, right)`` pair, ``"valid"`` or
            ``"same"`` (stride 1).
        dilation: An int.
        groups: Split channels and filters into that many independent convolutions.

    Returns:
        A Var ``[N, F, W_out]``.

    Raises:
        ShapeError: Channel counts that do not match, a ``groups`` not dividing
            them, or a kernel larger than the padded input.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [-1, 1, 5])
            w = rg.data("w", [1, 1, 3])
            y = rg.conv1d(x, w, padding=1)                 # [?, 1, 5]
        xv = np.arange(5, dtype="float32").reshape(1, 1, 5)
        (out,) = rg.Executor().run(main, feed={"x": xv, "w": np.ones((1, 1, 3), "float32")}, fetch_list=[y])
        assert out.tolist() == [[[1.0, 3.0, 6.0, 9.0, 7.0]]]       # moving sums of 3
        ```
    """
    return _conv_nd(1, "conv1d", x, w, b, stride, padding, dilation, groups)


def conv2d(x: Var, w: Var, b: Var | None = None, stride=1, padding=0, dilation=1, groups=1) -> Var:
    """2-d convolution (cross-correlation, as ``torch.nn.functional.conv2d``) of ``x [N, C, H, W]``.

    ``groups`` splits channels and filters into that many independent
    convolutions (``groups == C``: depthwise).

    Args:
        x: A float Var ``[N, C, H, W]``.
        w: The filters ``[F, C/groups, kh, kw]``.
        b: The bias ``[F]``, or None.
        stride: An int or ``(sh, sw)``.
        padding: An int, ``(ph, pw)`` (both sides of each axis),
            ``((top, bottom), (left, right))`` or ``(top, bottom, left, right)``,
            ``"valid"``, or ``"same"`` (stride 1).
        dilation: An int or ``(dh, dw)``.
        groups: The number of groups.

    Returns:
        A Var ``[N, F, H_out, W_out]``.

    Raises:
        ShapeError: Channel counts that do not match, a ``groups`` not dividing
            them, or a kernel larger than the padded input (naming both shapes).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [-1, 3, 8, 8])
            w = rg.data("w", [4, 3, 3, 3])
            b = rg.data("b", [4])
            y = rg.conv2d(x, w, b, stride=2, padding=1)    # [?, 4, 4, 4]
        feed = {"x": np.ones((2, 3, 8, 8), "float32"), "w": np.ones((4, 3, 3, 3), "float32"),
                "b": np.zeros(4, "float32")}
        (out,) = rg.Executor().run(main, feed=feed, fetch_list=[y])
        assert out.shape == (2, 4, 4, 4) and out[0, 0, 1, 1] == 27.0 and out[0, 0, 0, 0] == 12.0
        ```
    """
    return _conv_nd(2, "conv2d", x, w, b, stride, padding, dilation, groups)
