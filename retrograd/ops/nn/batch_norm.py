"""Batch norm over the channels of ``x [N, C, ...]``, as ``torch.nn.functional.batch_norm``.

``BatchNorm`` normalizes per channel. In training it uses the batch's
statistics (biased variance) and outputs them, and ``BatchNormStats`` (a
separate op, like an optimizer update) writes the running statistics in place
with torch's momentum convention and the unbiased variance: an ordinary op
whose outputs name the persistables it reads, so the executor writes them back
and an exported model outputs them as ``<name>.new``. In evaluation
(``training=False``, or ``is_test`` in a program from ``clone(for_test=True)``)
it uses the running statistics, and the builder (or the test clone) has no
``BatchNormStats``. Its gradient is one fused op, ``BatchNormGrad``, whose
own gradient maker is written with ordinary ops (any order works).
"""
from __future__ import annotations

import math

from ...errors import ProgramError, ShapeError
from ...ir.program import Var, as_float
from ..core.lowering import lowers
from ..math.elementwise import expand_as, sqrt, square
from .norm import kernel_result, same_shape, split_params, sum_present
from ..reduce.reductions import mean as reduce_mean, sum as reduce_sum
from ..core.registry import append_op, defop
from ..core.shapes import require_float
from ..array.tensor import reshape


# --- BatchNorm -------------------------------------------------------------------------------

def _channel_axes(ndim: int) -> list[int]:
    """The axes batch norm reduces over: every axis of ``[N, C, ...]`` but C."""
    return [0] + list(range(2, ndim))


def _batch_norm_rule(ins, attrs):
    x, running_mean, running_var, *params = ins
    require_float(x)
    if x.ndim < 2:
        raise ShapeError(f"batch_norm needs x [N, C] or [N, C, ...], got '{x.name}': {x.type_str()}")
    channels = x.shape[1]
    for v in (running_mean, running_var, *params):
        if v.dtype != x.dtype or v.ndim != 1 or (v.shape[0] >= 0 and channels >= 0 and v.shape[0] != channels):
            raise ShapeError(f"'{v.name}' must be {x.dtype}[{channels}] (one value per channel of "
                             f"'{x.name}': {x.type_str()}), got {v.type_str()}")
    return [(x.shape, x.dtype), ((channels,), x.dtype), ((channels,), x.dtype)]


def _values_per_channel(x) -> int:
    return math.prod(x.shape) // x.shape[1] if x.shape[1] else 0


def _uses_batch_stats(attrs) -> bool:
    return attrs["training"] and not attrs.get("is_test", False)


@defop("BatchNorm", inputs=("x", "running_mean", "running_var", "params*"), outputs=("y", "mean", "var"),
       infer=_batch_norm_rule, nondiff=(1, 2), grad=lambda g: _batch_norm_grad(g), test_mode=True)
def _batch_norm(k, x, running_mean, running_var, *params):
    """Per channel ``(x - mean) / sqrt(var + eps) * weight + bias``; ``mean`` and ``var`` (biased)
    are the batch's in training, the running statistics otherwise, and are outputs too."""
    if _uses_batch_stats(k.attrs):
        if _values_per_channel(x) < 2:
            raise ValueError(f"training needs more than one value per channel, got input shape "
                             f"{list(x.shape)}")
        mean, var = k.backend.channel_stats(x)
    else:
        mean, var = running_mean, running_var
    weight, bias = split_params(k.attrs, params)
    return k.backend.batch_norm(x, mean, var, weight, bias, k.attrs["eps"]), mean, var


@lowers("BatchNorm")
def _batch_norm_onnx(g):
    x, running_mean, running_var, *params = g.ins
    dtype, ndim = g.in_vars[0].dtype, g.in_vars[0].ndim
    shape = g.const([1, -1] + [1] * (ndim - 2), "int64")

    def per_channel(v):
        return g.node("Reshape", [v, shape])
    if _uses_batch_stats(g.attrs):
        axes = g.const(_channel_axes(ndim), "int64")
        mean = g.node("ReduceMean", [x, axes], keepdims=0)
        centred = g.node("Sub", [x, per_channel(mean)])
        var = g.node("ReduceMean", [g.node("Mul", [centred, centred]), axes], keepdims=0)
    else:
        mean, var = g.node("Identity", [running_mean]), g.node("Identity", [running_var])
        centred = g.node("Sub", [x, per_channel(mean)])
    scale = g.node("Reciprocal", [g.node("Sqrt", [g.node("Add", [var, g.const(g.attrs["eps"], dtype)])])])
    weight, bias = split_params(g.attrs, params)
    if weight is not None:
        scale = g.node("Mul", [scale, weight])
    y = g.node("Mul", [centred, per_channel(scale)])
    if bias is not None:
        y = g.node("Add", [y, per_channel(bias)])
    return [y, mean, var]


def _batch_norm_grad(g):
    """The fused ``BatchNormGrad`` for the output's gradient, plus (training) what reaches the
    batch statistics, which are outputs too."""
    x, running_mean, running_var, *params = g.x
    weight, bias = split_params(g.attrs, params)
    _, mean, var = g.out
    dy, dmean, dvar = g.dout
    training = _uses_batch_stats(g.attrs)
    if not training:
        mean, var = running_mean, running_var
    want_weight = weight is not None and g.wanted[3]
    want_bias = bias is not None and g.wanted[3 + (weight is not None)]
    dx, dweight, dbias = None, None, None
    if dy is not None:
        grads = batch_norm_grad(dy, x, mean, var, weight, g.attrs["eps"], training, want_weight, want_bias)
        dx, rest = grads[0], grads[1:]
        dweight = rest.pop(0) if want_weight else None
        dbias = rest.pop(0) if want_bias else None
    if training:
        axes = _channel_axes(x.ndim)
        if dmean is not None:
            dx = sum_present(dx, expand_as(_per_channel(dmean, x.ndim), x, mean_axes=axes))
        if dvar is not None:
            centred = x - _per_channel(mean, x.ndim)
            dx = sum_present(dx, 2.0 * centred * expand_as(_per_channel(dvar, x.ndim), x, mean_axes=axes))
    return ([dx, None, None] + ([dweight] if weight is not None else [])
            + ([dbias] if bias is not None else []))


def _per_channel(v: Var, ndim: int) -> Var:
    """``v [C]`` as ``[1, C, 1, ...]``, to broadcast against ``[N, C, ...]``."""
    return reshape(v, [1, -1] + [1] * (ndim - 2))


# --- BatchNormGrad: the fused gradient, differentiable by ordinary ops ------------------------

def _batch_norm_grad_rule(ins, attrs):
    dy, x, mean, var, *weight = ins
    if dy.dtype != x.dtype or not same_shape(dy, x) or x.ndim < 2:
        raise ShapeError(f"gradient '{dy.name}' {dy.type_str()} does not match '{x.name}' {x.type_str()}")
    n_params = int(attrs["want_weight"]) + int(attrs["want_bias"])
    return [(x.shape, x.dtype)] + [((x.shape[1],), x.dtype)] * n_params


def _batch_norm_grad_grad(g):
    """Gradient of BatchNormGrad: in training, ``_layer_norm_grad_grad``'s formulas with the
    channel's values (every axis but 1) in place of a row, and the statistics recomputed
    from x; in evaluation (fixed statistics) the op is linear in dy and xhat."""
    dy, x, mean, var, *weight = g.x
    weight = weight[0] if weight else None
    a, *rest = g.dout
    c = rest.pop(0) if g.attrs["want_weight"] else None
    e = rest.pop(0) if g.attrs["want_bias"] else None
    eps, training, ndim = g.attrs["eps"], g.attrs["training"], x.ndim
    axes = _channel_axes(ndim)

    def channel_mean(v):
        return reduce_mean(v, axis=axes, keepdims=True)
    w = _per_channel(weight, ndim) if weight is not None else None
    if training:
        xc = x - channel_mean(x)
        r = 1.0 / sqrt(channel_mean(square(xc)) + eps)
        xhat = xc * r
    else:
        r = 1.0 / sqrt(_per_channel(var, ndim) + eps)
        xhat = (x - _per_channel(mean, ndim)) * r
    gw = dy * w if w is not None else dy
    d_gw, d_xhat, d_x = None, None, None
    if a is not None:
        if training:
            b = a * r
            m2 = channel_mean(gw * xhat)
            u = gw - channel_mean(gw) - xhat * m2
            d_gw = batch_norm_grad(a, x, mean, var, None, eps, True)[0]
            d_xhat = -(b * m2 + gw * channel_mean(b * xhat))
            d_x = channel_mean(a * u) * (-(r * r)) * xhat
        else:
            d_gw = a * r
    if c is not None:
        d_xhat = sum_present(d_xhat, _per_channel(c, ndim) * dy)
    if d_xhat is not None:
        d_x = sum_present(d_x, batch_norm_grad(d_xhat, x, mean, var, None, eps, True)[0] if training
                     else d_xhat * r)
    d_dy = sum_present(None if d_gw is None else (d_gw * w if w is not None else d_gw),
                  None if c is None else _per_channel(c, ndim) * xhat,
                  None if e is None else expand_as(_per_channel(e, ndim), dy))
    d_weight = None if weight is None or d_gw is None else reduce_sum(d_gw * dy, axis=axes)
    return [d_dy, d_x, None, None] + ([d_weight] if weight is not None else [])


@defop("BatchNormGrad", inputs=("dy", "x", "mean", "var", "weight?"), outputs=("dx", "dparams*"),
       infer=_batch_norm_grad_rule, nondiff=(2, 3), grad=_batch_norm_grad_grad)
def _batch_norm_grad_op(k, dy, x, mean, var, weight=None):
    """BatchNorm's input gradients in one kernel, from the statistics it used."""
    a = k.attrs
    return kernel_result(k.backend.batch_norm_backward(dy, x, mean, var, weight, a["eps"], a["training"],
                                                       a["want_weight"], a["want_bias"]))


@lowers("BatchNormGrad")
def _batch_norm_grad_onnx(g):
    dy, x, mean, var, *weight = g.ins
    ndim, dtype = g.in_vars[1].ndim, g.in_vars[1].dtype
    shape = g.const([1, -1] + [1] * (ndim - 2), "int64")
    axes = g.const(_channel_axes(ndim), "int64")

    def per_channel(v):
        return g.node("Reshape", [v, shape])

    def channel_mean(v):
        return g.node("ReduceMean", [v, axes], keepdims=1)
    invstd = per_channel(g.node("Reciprocal", [g.node("Sqrt", [g.node("Add", [var, g.const(g.attrs["eps"], dtype)])])]))
    xhat = g.node("Mul", [g.node("Sub", [x, per_channel(mean)]), invstd])
    gw = g.node("Mul", [dy, per_channel(weight[0])]) if weight else dy
    if g.attrs["training"]:
        centred = g.node("Sub", [gw, channel_mean(gw)])
        gw = g.node("Sub", [centred, g.node("Mul", [xhat, channel_mean(g.node("Mul", [gw, xhat]))])])
    outs = [g.node("Mul", [gw, invstd])]
    if g.attrs["want_weight"]:
        outs.append(g.node("ReduceSum", [g.node("Mul", [dy, xhat]), axes], keepdims=0))
    if g.attrs["want_bias"]:
        outs.append(g.node("ReduceSum", [dy, axes], keepdims=0))
    return outs


def batch_norm_grad(dy: Var, x: Var, mean: Var, var: Var, weight: Var | None, eps: float, training: bool,
                    want_weight: bool = False, want_bias: bool = False) -> list[Var]:
    """``[dx, (dweight), (dbias)]`` of ``batch_norm`` from the statistics it used (``training``:
    the batch's, which depend on x; otherwise fixed running ones)."""
    ins = [dy, x, mean, var] + ([weight] if weight is not None else [])
    attrs = {"eps": float(eps), "training": bool(training),
             "want_weight": bool(want_weight and weight is not None), "want_bias": bool(want_bias)}
    return append_op("BatchNormGrad", ins, attrs, name="batch_norm_grad")


# --- BatchNormStats: the running statistics, written in place ----------------------------------

def _batch_norm_stats_rule(ins, attrs):
    running_mean, running_var, mean, var, x = ins
    for v in (running_var, mean, var):
        if v.dtype != running_mean.dtype or not same_shape(v, running_mean):
            raise ShapeError(f"'{v.name}' {v.type_str()} does not match '{running_mean.name}' "
                             f"{running_mean.type_str()}")
    return [(running_mean.shape, running_mean.dtype), (running_var.shape, running_var.dtype)]


@defop("BatchNormStats", inputs=("running_mean", "running_var", "mean", "var", "x"),
       outputs=("running_mean_out", "running_var_out"), infer=_batch_norm_stats_rule, shape_only=(4,),
       updates=(0, 1), recomputable=False)
def _batch_norm_stats(k, running_mean, running_var, mean, var, x):
    """``running = (1 - momentum) * running + momentum * batch`` (torch's convention), with the
    batch variance made unbiased: ``var * n / (n - 1)``, n values per channel of ``x``."""
    m = k.attrs["momentum"]
    count = _values_per_channel(x)
    return (1.0 - m) * running_mean + m * mean, (1.0 - m) * running_var + (m * count / (count - 1)) * var


@lowers("BatchNormStats")
def _batch_norm_stats_onnx(g):
    running_mean, running_var, mean, var, x = g.ins
    dtype = g.in_vars[0].dtype
    m = g.attrs["momentum"]
    count = g.cast(g.node("Div", [g.node("ReduceProd", [g.shape(x)], keepdims=0), g.scalar_dim(x, 1)]), dtype)
    unbiased = g.node("Div", [g.node("Mul", [var, count]), g.node("Sub", [count, g.const(1.0, dtype)])])

    def blend(running, batch):
        return g.node("Add", [g.node("Mul", [g.const(1.0 - m, dtype), running]),
                              g.node("Mul", [g.const(m, dtype), batch])])
    return [blend(running_mean, mean), blend(running_var, unbiased)]


def batch_norm(x: Var, running_mean: Var, running_var: Var, weight: Var | None = None,
               bias: Var | None = None, training: bool = True, momentum: float = 0.1,
               eps: float = 1e-5) -> Var:
    """Normalize ``x [N, C]`` or ``[N, C, ...]`` per channel, as ``torch.nn.functional.batch_norm``.

    In training, with the batch's mean and (biased) variance, and the running
    statistics (``[C]``, persistable) are updated in place when the program runs:
    ``running = (1 - momentum) * running + momentum * batch`` (unbiased variance
    for ``running_var``). Otherwise (``training=False``, or in a program from
    ``clone(for_test=True)``) with the running statistics, which nothing writes.
    ``weight`` and ``bias`` are ``[C]`` or None. ``rg.layers.batch_norm`` creates
    all four.

    Example::

        y = rg.batch_norm(x, bn_mean, bn_var, w, b)     # x [N, C, H, W]
    """
    momentum = as_float(momentum, "batch_norm: momentum")
    if not 0.0 <= momentum <= 1.0:
        raise ProgramError(f"batch_norm of '{x.name}': momentum must be in [0, 1], got {momentum}")
    running_mean.stop_gradient = running_var.stop_gradient = True
    ins = [x, running_mean, running_var] + [p for p in (weight, bias) if p is not None]
    attrs = {"eps": as_float(eps, "batch_norm: eps"), "training": bool(training),
             "has_weight": weight is not None, "has_bias": bias is not None}
    y, mean, var = append_op("BatchNorm", ins, attrs, name="batch_norm")
    if training:
        append_op("BatchNormStats", [running_mean, running_var, mean, var, x], {"momentum": momentum},
                  outputs=[running_mean, running_var])
    return y
