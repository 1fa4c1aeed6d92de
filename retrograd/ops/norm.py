"""Normalization ops: layer norm and RMS norm over the last axis, batch norm over channels.

``LayerNorm`` and ``RMSNorm`` keep their per-row statistics (``mean``,
``rstd = 1 / sqrt(var + eps)``, shaped ``[..., 1]`` as torch keeps them) for
one fused gradient op each (``LayerNormGrad``, ``RMSNormGrad``: one kernel,
torch's own on the torch backend). Those gradient ops have gradient makers
written with the builders users call, recomputing the statistics from ``x``,
so gradients of any order work.

``BatchNorm`` normalizes ``x [N, C, ...]`` per channel. In training it uses
the batch's statistics (biased variance) and outputs them, and
``BatchNormStats`` (a separate op, like an optimizer update) writes the running
statistics in place with torch's momentum convention and the unbiased
variance. In evaluation (``training=False``, or ``is_test`` in a program from
``clone(for_test=True)``) it uses the running statistics, and the builder (or
the test clone) has no ``BatchNormStats``. Its gradient is one fused op too,
``BatchNormGrad``, differentiable the same way.
"""
from __future__ import annotations

import math

from ..errors import ProgramError, ShapeError
from ..ir.program import Var, as_float
from .lowering import lowers
from .math import expand_as, sqrt, square
from .reduce import mean as reduce_mean, sum as reduce_sum
from .registry import append_op, defop
from .shapes import require_float
from .tensor import reshape


def _check_params(x: Var, params: list[Var], what: str) -> None:
    """Each of ``params`` (weight, bias) must be ``[D]`` for ``x [..., D]``, in ``x``'s dtype."""
    for p in params:
        if p.dtype != x.dtype or p.ndim != 1 or (p.shape[0] >= 0 and x.shape[-1] >= 0
                                                and p.shape[0] != x.shape[-1]):
            raise ShapeError(f"{what} '{p.name}' must be {x.dtype}[{x.shape[-1]}] for "
                             f"'{x.name}': {x.type_str()}, got {p.type_str()}")


def _stats_shape(x: Var) -> tuple[int, ...]:
    return x.shape[:-1] + (1,)


def _rows_rule(n_stats: int):
    """The rule of LayerNorm (2 statistics) and RMSNorm (1): x [..., D] and its [D] params."""
    def rule(ins, attrs):
        x, *params = ins
        require_float(x)
        if x.ndim < 1:
            raise ShapeError(f"'{x.name}' needs a last axis to normalize over, got a scalar")
        _check_params(x, params, "weight or bias")
        return [(x.shape, x.dtype)] + [(_stats_shape(x), x.dtype)] * n_stats
    return rule


def _leading_sum(v: Var) -> Var:
    """``v [..., D]`` summed over every axis but the last: a parameter's gradient."""
    return reduce_sum(v, axis=list(range(v.ndim - 1))) if v.ndim > 1 else v


def _row_mean(v: Var) -> Var:
    return reduce_mean(v, axis=-1, keepdims=True)


def _total(*terms):
    """The sum of the terms that are not None (None if all are)."""
    present = [t for t in terms if t is not None]
    if not present:
        return None
    out = present[0]
    for t in present[1:]:
        out = out + t
    return out


# --- LayerNorm -------------------------------------------------------------------------------

def _layer_norm_grad(g):
    x, *params = g.x
    has_weight, has_bias = g.attrs["has_weight"], g.attrs["has_bias"]
    weight = params[0] if has_weight else None
    _, mean, rstd = g.out
    want_weight = has_weight and g.wanted[1]
    want_bias = has_bias and g.wanted[1 + has_weight]
    grads = layer_norm_grad(g.dy, x, mean, rstd, weight, g.attrs["eps"], want_weight, want_bias)
    dx, rest = grads[0], grads[1:]
    dweight = rest.pop(0) if want_weight else None
    dbias = rest.pop(0) if want_bias else None
    return [dx] + ([dweight] if has_weight else []) + ([dbias] if has_bias else [])


@defop("LayerNorm", inputs=("x", "params*"), outputs=("y", "mean", "rstd"), infer=_rows_rule(2),
       grad=_layer_norm_grad)
def _layer_norm(k, x, *params):
    """``(x - mean) * rstd * weight + bias`` over the last axis; also the statistics."""
    weight, bias = _split_params(k.attrs, params)
    return tuple(k.backend.layer_norm(x, weight, bias, k.attrs["eps"]))


def _split_params(attrs, params):
    params = list(params)
    weight = params.pop(0) if attrs["has_weight"] else None
    bias = params.pop(0) if attrs["has_bias"] else None
    return weight, bias


@lowers("LayerNorm")
def _layer_norm_onnx(g):
    """ONNX LayerNormalization for float32; onnxruntime's keeps float64 statistics in float32,
    so float64 takes the formula."""
    x = g.ins[0]
    weight, bias = _split_params(g.attrs, g.ins[1:])
    dtype = g.in_vars[0].dtype
    if dtype != "float32":
        return _layer_norm_formula_onnx(g, x, weight, bias, dtype)
    if weight is None:
        weight = g.fill(g.dim(x, -1), 1, dtype)
    ins = [x, weight] + ([bias] if bias is not None else [])
    return g.nodes("LayerNormalization", ins, n_out=3, axis=-1, epsilon=g.attrs["eps"], stash_type=1)


def _layer_norm_formula_onnx(g, x: str, weight, bias, dtype: str) -> list[str]:
    mean = _row_mean_onnx(g, x)
    xc = g.node("Sub", [x, mean])
    var = _row_mean_onnx(g, g.node("Mul", [xc, xc]))
    rstd = g.node("Reciprocal", [g.node("Sqrt", [g.node("Add", [var, g.const(g.attrs["eps"], dtype)])])])
    y = g.node("Mul", [xc, rstd])
    if weight is not None:
        y = g.node("Mul", [y, weight])
    if bias is not None:
        y = g.node("Add", [y, bias])
    return [y, mean, rstd]


def layer_norm(x: Var, weight: Var | None = None, bias: Var | None = None, eps: float = 1e-5) -> Var:
    """Normalize ``x [..., D]`` over its last axis: ``(x - mean) / sqrt(var + eps) * weight + bias``
    (biased variance; ``torch.nn.functional.layer_norm(x, [D], weight, bias, eps)``).
    ``weight`` and ``bias`` are ``[D]`` or None.

    Example::

        h = rg.layer_norm(x, w, b)          # x [N, L, D], w and b [D]
    """
    ins = [x] + [p for p in (weight, bias) if p is not None]
    attrs = {"eps": as_float(eps, "layer_norm: eps"), "has_weight": weight is not None,
             "has_bias": bias is not None}
    y, mean, rstd = append_op("LayerNorm", ins, attrs, name="layer_norm")
    mean.stop_gradient = rstd.stop_gradient = True   # the gradient op recomputes them from x
    return y


# --- LayerNormGrad: the fused gradient, differentiable by ordinary ops -----------------------

def _grad_op_rule(n_stats: int):
    """LayerNormGrad (2 statistics) / RMSNormGrad (1): dx like x, then the wanted [D] grads."""
    def rule(ins, attrs):
        dy, x, *stats_and_weight = ins
        weight = stats_and_weight[n_stats:]
        if dy.dtype != x.dtype or not _same_rank(dy, x):
            raise ShapeError(f"gradient '{dy.name}' {dy.type_str()} does not match '{x.name}' {x.type_str()}")
        _check_params(x, weight, "weight")
        n_params = int(attrs["want_weight"]) + int(attrs.get("want_bias", False))
        return [(x.shape, x.dtype)] + [((x.shape[-1],), x.dtype)] * n_params
    return rule


def _same_rank(a: Var, b: Var) -> bool:
    return a.ndim == b.ndim and all(p < 0 or q < 0 or p == q for p, q in zip(a.shape, b.shape))


def _recomputed_rows(x: Var, eps: float, centre: bool) -> tuple[Var, Var]:
    """``(xhat, rstd)`` from ``x`` with ordinary ops (so their own gradients exist)."""
    xc = x - _row_mean(x) if centre else x
    rstd = 1.0 / sqrt(_row_mean(square(xc)) + eps)
    return xc * rstd, rstd


def _layer_norm_grad_grad(g):
    """Gradient of ``dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))`` (gw = dy * weight),
    ``dweight = sum(dy * xhat)``, ``dbias = sum(dy)`` with respect to dy, x and weight.

    With ``u = dx / rstd`` and the incoming gradients A (of dx), C (of dweight), E (of dbias):
    ``d gw = LNGrad(A)``, ``d xhat = C*dy - (A*rstd) * mean(gw*xhat) - gw * mean(A*rstd*xhat)``,
    ``d rstd = sum(A*u)``; then x gets ``LNGrad(d xhat)`` (xhat's own gradient) plus
    ``d rstd * -rstd^2 * xhat / D`` (rstd's), where LNGrad is this op without weight.
    """
    dy, x, mean, rstd, *weight = g.x
    weight = weight[0] if weight else None
    a, *rest = g.dout
    c = rest.pop(0) if g.attrs["want_weight"] else None
    e = rest.pop(0) if g.attrs["want_bias"] else None
    xhat, r = _recomputed_rows(x, g.attrs["eps"], centre=True)
    gw = dy * weight if weight is not None else dy
    d_gw, d_xhat, d_x = None, None, None
    if a is not None:
        b = a * r
        m2 = _row_mean(gw * xhat)
        u = gw - _row_mean(gw) - xhat * m2
        d_gw = layer_norm_grad(a, x, mean, rstd, None, g.attrs["eps"])[0]
        d_xhat = -(b * m2 + gw * _row_mean(b * xhat))
        d_x = _row_mean(a * u) * (-(r * r)) * xhat
    if c is not None:
        d_xhat = _total(d_xhat, c * dy)
    if d_xhat is not None:
        d_x = _total(d_x, layer_norm_grad(d_xhat, x, mean, rstd, None, g.attrs["eps"])[0])
    d_dy = _total(None if d_gw is None else (d_gw * weight if weight is not None else d_gw),
                  None if c is None else c * xhat,
                  None if e is None else expand_as(e, dy))
    d_weight = None if weight is None or d_gw is None else _leading_sum(d_gw * dy)
    return [d_dy, d_x, None, None] + ([d_weight] if weight is not None else [])


@defop("LayerNormGrad", inputs=("dy", "x", "mean", "rstd", "weight?"), outputs=("dx", "dparams*"),
       infer=_grad_op_rule(2), nondiff=(2, 3), grad=_layer_norm_grad_grad)
def _layer_norm_grad_op(k, dy, x, mean, rstd, weight=None):
    """LayerNorm's input gradients in one kernel, from the forward's statistics."""
    a = k.attrs
    grads = k.backend.layer_norm_backward(dy, x, mean, rstd, weight, a["want_weight"], a["want_bias"])
    return _one_or_tuple(grads)


def _one_or_tuple(grads):
    """The kernel's result: dx alone, or dx and the parameter gradients computed."""
    present = tuple(v for v in grads if v is not None)
    return present[0] if len(present) == 1 else present


@lowers("LayerNormGrad")
def _layer_norm_grad_onnx(g):
    dy, x, mean, rstd, *weight = g.ins
    xhat = g.node("Mul", [g.node("Sub", [x, mean]), rstd])
    gw = g.node("Mul", [dy, weight[0]]) if weight else dy
    centred = g.node("Sub", [gw, _row_mean_onnx(g, gw)])
    dx = g.node("Mul", [g.node("Sub", [centred, g.node("Mul", [xhat, _row_mean_onnx(g, g.node("Mul", [gw, xhat]))])]),
                        rstd])
    outs = [dx]
    if g.attrs["want_weight"]:
        outs.append(_leading_sum_onnx(g, g.node("Mul", [dy, xhat])))
    if g.attrs["want_bias"]:
        outs.append(_leading_sum_onnx(g, dy))
    return outs


def _row_mean_onnx(g, v: str) -> str:
    return g.node("ReduceMean", [v, g.const([-1], "int64")], keepdims=1)


def _leading_sum_onnx(g, v: str) -> str:
    ndim = g.in_vars[1].ndim
    if ndim == 1:
        return g.node("Identity", [v])
    return g.node("ReduceSum", [v, g.const(list(range(ndim - 1)), "int64")], keepdims=0)


def layer_norm_grad(dy: Var, x: Var, mean: Var, rstd: Var, weight: Var | None, eps: float,
                    want_weight: bool = False, want_bias: bool = False) -> list[Var]:
    """``[dx, (dweight), (dbias)]`` of ``layer_norm`` from its saved ``mean`` and ``rstd``."""
    ins = [dy, x, mean, rstd] + ([weight] if weight is not None else [])
    attrs = {"eps": float(eps), "want_weight": bool(want_weight and weight is not None),
             "want_bias": bool(want_bias)}
    return append_op("LayerNormGrad", ins, attrs, name="layer_norm_grad")


# --- RMSNorm ---------------------------------------------------------------------------------

def _rms_norm_grad(g):
    x, *weight = g.x
    weight = weight[0] if weight else None
    want_weight = weight is not None and g.wanted[1]
    grads = rms_norm_grad(g.dy, x, g.out[1], weight, g.attrs["eps"], want_weight)
    return [grads[0]] + ([grads[1] if want_weight else None] if weight is not None else [])


@defop("RMSNorm", inputs=("x", "weight?"), outputs=("y", "rstd"), infer=_rows_rule(1), grad=_rms_norm_grad)
def _rms_norm(k, x, weight=None):
    """``x * rstd * weight`` with ``rstd = 1 / sqrt(mean(x^2) + eps)`` over the last axis."""
    return tuple(k.backend.rms_norm(x, weight, k.attrs["eps"]))


@lowers("RMSNorm")
def _rms_norm_onnx(g):
    x, *weight = g.ins
    dtype = g.in_vars[0].dtype
    ms = _row_mean_onnx(g, g.node("Mul", [x, x]))
    rstd = g.node("Reciprocal", [g.node("Sqrt", [g.node("Add", [ms, g.const(g.attrs["eps"], dtype)])])])
    y = g.node("Mul", [x, rstd])
    if weight:
        y = g.node("Mul", [y, weight[0]])
    return [y, rstd]


def rms_norm(x: Var, weight: Var | None = None, eps: float = 1e-6) -> Var:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis of ``x [..., D]``
    (``torch.nn.functional.rms_norm(x, [D], weight, eps)``); ``weight`` is ``[D]`` or None.

    Example::

        h = rg.rms_norm(x, w)               # x [N, L, D], w [D]
    """
    ins = [x] + ([weight] if weight is not None else [])
    y, rstd = append_op("RMSNorm", ins, {"eps": as_float(eps, "rms_norm: eps")}, name="rms_norm")
    rstd.stop_gradient = True                  # the gradient op recomputes it from x
    return y


def _rms_norm_grad_grad(g):
    """Gradient of ``dx = rstd * (gw - xn * mean(gw * xn))`` (gw = dy * weight, xn = x * rstd)
    and ``dweight = sum(dy * xn)``, as ``_layer_norm_grad_grad`` (without the centring)."""
    dy, x, rstd, *weight = g.x
    weight = weight[0] if weight else None
    a, *rest = g.dout
    c = rest[0] if g.attrs["want_weight"] else None
    eps = g.attrs["eps"]
    xn, r = _recomputed_rows(x, eps, centre=False)
    gw = dy * weight if weight is not None else dy
    d_gw, d_xn, d_x = None, None, None
    if a is not None:
        b = a * r
        m = _row_mean(gw * xn)
        d_gw = rms_norm_grad(a, x, rstd, None, eps)[0]
        d_xn = -(b * m + gw * _row_mean(b * xn))
        d_x = _row_mean(a * (gw - xn * m)) * (-(r * r)) * xn
    if c is not None:
        d_xn = _total(d_xn, c * dy)
    if d_xn is not None:
        d_x = _total(d_x, rms_norm_grad(d_xn, x, rstd, None, eps)[0])
    d_dy = _total(None if d_gw is None else (d_gw * weight if weight is not None else d_gw),
                  None if c is None else c * xn)
    d_weight = None if weight is None or d_gw is None else _leading_sum(d_gw * dy)
    return [d_dy, d_x, None] + ([d_weight] if weight is not None else [])


@defop("RMSNormGrad", inputs=("dy", "x", "rstd", "weight?"), outputs=("dx", "dweight*"),
       infer=_grad_op_rule(1), nondiff=(2,), grad=_rms_norm_grad_grad)
def _rms_norm_grad_op(k, dy, x, rstd, weight=None):
    """RMSNorm's input gradients in one kernel, from the forward's ``rstd``."""
    return _one_or_tuple(k.backend.rms_norm_backward(dy, x, rstd, weight, k.attrs["want_weight"]))


@lowers("RMSNormGrad")
def _rms_norm_grad_onnx(g):
    dy, x, rstd, *weight = g.ins
    xn = g.node("Mul", [x, rstd])
    gw = g.node("Mul", [dy, weight[0]]) if weight else dy
    m = _row_mean_onnx(g, g.node("Mul", [gw, xn]))
    dx = g.node("Mul", [g.node("Sub", [gw, g.node("Mul", [xn, m])]), rstd])
    return [dx] + ([_leading_sum_onnx(g, g.node("Mul", [dy, xn]))] if g.attrs["want_weight"] else [])


def rms_norm_grad(dy: Var, x: Var, rstd: Var, weight: Var | None, eps: float,
                  want_weight: bool = False) -> list[Var]:
    """``[dx, (dweight)]`` of ``rms_norm`` from its saved ``rstd``."""
    ins = [dy, x, rstd] + ([weight] if weight is not None else [])
    attrs = {"eps": float(eps), "want_weight": bool(want_weight and weight is not None)}
    return append_op("RMSNormGrad", ins, attrs, name="rms_norm_grad")


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
    weight, bias = _split_params(k.attrs, params)
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
    weight, bias = _split_params(g.attrs, params)
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
    weight, bias = _split_params(g.attrs, params)
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
            dx = _total(dx, expand_as(_per_channel(dmean, x.ndim), x, mean_axes=axes))
        if dvar is not None:
            centred = x - _per_channel(mean, x.ndim)
            dx = _total(dx, 2.0 * centred * expand_as(_per_channel(dvar, x.ndim), x, mean_axes=axes))
    return ([dx, None, None] + ([dweight] if weight is not None else [])
            + ([dbias] if bias is not None else []))


def _per_channel(v: Var, ndim: int) -> Var:
    """``v [C]`` as ``[1, C, 1, ...]``, to broadcast against ``[N, C, ...]``."""
    return reshape(v, [1, -1] + [1] * (ndim - 2))


# --- BatchNormGrad: the fused gradient, differentiable by ordinary ops ------------------------

def _batch_norm_grad_rule(ins, attrs):
    dy, x, mean, var, *weight = ins
    if dy.dtype != x.dtype or not _same_rank(dy, x) or x.ndim < 2:
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
        d_xhat = _total(d_xhat, _per_channel(c, ndim) * dy)
    if d_xhat is not None:
        d_x = _total(d_x, batch_norm_grad(d_xhat, x, mean, var, None, eps, True)[0] if training
                     else d_xhat * r)
    d_dy = _total(None if d_gw is None else (d_gw * w if w is not None else d_gw),
                  None if c is None else _per_channel(c, ndim) * xhat,
                  None if e is None else expand_as(_per_channel(e, ndim), dy))
    d_weight = None if weight is None or d_gw is None else reduce_sum(d_gw * dy, axis=axes)
    return [d_dy, d_x, None, None] + ([d_weight] if weight is not None else [])


@defop("BatchNormGrad", inputs=("dy", "x", "mean", "var", "weight?"), outputs=("dx", "dparams*"),
       infer=_batch_norm_grad_rule, nondiff=(2, 3), grad=_batch_norm_grad_grad)
def _batch_norm_grad_op(k, dy, x, mean, var, weight=None):
    """BatchNorm's input gradients in one kernel, from the statistics it used."""
    a = k.attrs
    return _one_or_tuple(k.backend.batch_norm_backward(dy, x, mean, var, weight, a["eps"], a["training"],
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
        if v.dtype != running_mean.dtype or not _same_rank(v, running_mean):
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
