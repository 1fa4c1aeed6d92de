"""Normalization over the last axis: layer norm and RMS norm (batch norm: ``batch_norm.py``);
over several trailing axes (``normalized_ndim``) they fold those axes into one around the op.

``LayerNorm`` and ``RMSNorm`` keep their per-row statistics (``mean``,
``rstd = 1 / sqrt(var + eps)``, shaped ``[..., 1]`` as torch keeps them) for
one fused gradient op each (``LayerNormGrad``, ``RMSNormGrad``: one kernel,
torch's own on the torch backend). Those gradient ops have gradient makers
written with the builders users call, recomputing the statistics from ``x``,
so gradients of any order work.
"""
from __future__ import annotations

import math

from ...errors import ShapeError
from ...ir.program import Var, as_float, as_int
from ..core.lowering import lowers
from ..math.elementwise import expand_as, sqrt, square
from ..reduce.reductions import mean as reduce_mean, sum as reduce_sum
from ..core.registry import append_op, defop
from ..core.shapes import require_float
from ..array.tensor import reshape, reshape_as


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


def sum_present(*terms):
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
       grad=_layer_norm_grad, batch_rows=(0,))
def _layer_norm(k, x, *params):
    """``(x - mean) * rstd * weight + bias`` over the last axis; also the statistics."""
    weight, bias = split_params(k.attrs, params)
    return tuple(k.backend.layer_norm(x, weight, bias, k.attrs["eps"]))


def split_params(attrs, params):
    params = list(params)
    weight = params.pop(0) if attrs["has_weight"] else None
    bias = params.pop(0) if attrs["has_bias"] else None
    return weight, bias


@lowers("LayerNorm")
def _layer_norm_onnx(g):
    """ONNX LayerNormalization for float32; onnxruntime's keeps float64 statistics in float32,
    so float64 takes the formula, as does a last axis that may be empty (onnxruntime refuses it)."""
    x = g.ins[0]
    weight, bias = split_params(g.attrs, g.ins[1:])
    dtype = g.in_vars[0].dtype
    if dtype != "float32" or g.in_vars[0].shape[-1] <= 0:
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


def _trailing_ndim(x: Var, params, normalized_ndim, what: str) -> int:
    """How many trailing axes of ``x`` are normalised: ``normalized_ndim``, else the first
    parameter's rank, else 1; the parameters must have those axes' shape."""
    present = [p for p in params if p is not None]
    nd = normalized_ndim if normalized_ndim is not None else present[0].ndim if present else 1
    nd = as_int(nd, f"{what}: normalized_ndim")
    if nd == 1:
        return nd                            # one axis: the op's own rule checks x and the params
    if not 1 <= nd <= x.ndim:
        raise ShapeError(f"{what}: normalized_ndim must be in [1, {x.ndim}] for '{x.name}' {x.type_str()}, got {nd}")
    trailing = x.shape[x.ndim - nd:]
    for p in present:
        if p.ndim != nd or any(a >= 0 and b >= 0 and a != b for a, b in zip(p.shape, trailing)):
            raise ShapeError(f"{what}: '{p.name}' {p.type_str()} must have the shape of the {nd} normalised "
                             f"axes of '{x.name}' {x.type_str()}, {[d if d >= 0 else '?' for d in trailing]}")
    return nd


def _rows_of(x: Var, nd: int, what: str) -> Var:
    """``x`` with its ``nd`` trailing axes folded into one (the axis the norm ops normalise)."""
    lead, trailing = list(x.shape[:x.ndim - nd]), x.shape[x.ndim - nd:]
    if all(d >= 0 for d in trailing):
        size = math.prod(trailing)
        return reshape(x, lead + [size] if lead.count(-1) <= 1 else [-1, size])
    if all(d >= 0 for d in lead):
        return reshape(x, lead + [-1])
    raise ShapeError(f"{what}: normalising {nd} axes of '{x.name}' {x.type_str()} needs either the "
                     "normalised axes or the others known when the program is built")


def _over_trailing(norm, x: Var, params, nd: int, what: str) -> Var:
    """``norm(x_rows, *param_rows)`` over ``nd`` trailing axes folded into one, then unfolded."""
    if nd == 1:
        return norm(x, *params)
    if any(d == 0 for d in x.shape[x.ndim - nd:]):
        # No element to normalise over (known when built): the result is x's empty self, and
        # folding [..., 0] rows would need -1 beside a 0, which no reshape can infer.
        return x * 1.0
    folded = [None if p is None else reshape(p, [-1]) for p in params]
    return reshape_as(norm(_rows_of(x, nd, what), *folded), x)


def layer_norm(x: Var, weight: Var | None = None, bias: Var | None = None, eps: float = 1e-5,
               normalized_ndim: int | None = None) -> Var:
    """Normalize ``x`` over its trailing axes: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    The variance is the biased one, as ``torch.nn.functional.layer_norm(x, x.shape[-n:], weight, bias, eps)``.

    Args:
        x: A float Var.
        weight: The shape of the normalised axes (``[D]`` for the last one), or None.
        bias: The shape of the normalised axes, or None.
        eps: Added to the variance.
        normalized_ndim: How many trailing axes to normalise (``n`` in
            ``torch.nn.functional.layer_norm(x, x.shape[-n:], ...)``); by default
            ``weight``'s rank (else ``bias``'s, else 1).

    Returns:
        A Var of ``x``'s shape.

    Raises:
        ShapeError: ``weight`` or ``bias`` does not have the normalised axes' shape.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [-1, 4])
            w = rg.data("w", [4])
            h = rg.layer_norm(x, w, eps=0.0)
            both = rg.layer_norm(rg.reshape(x, [-1, 2, 2]), normalized_ndim=2, eps=0.0)   # over 2 axes
        xv = np.array([[1.0, 2.0, 3.0, 4.0]], "float32")
        out, out2 = rg.Executor().run(main, feed={"x": xv, "w": np.full(4, 2.0, "float32")}, fetch_list=[h, both])
        assert np.allclose(out, 2.0 * (xv - 2.5) / np.sqrt(1.25))
        assert np.allclose(out2.reshape(1, 4), out / 2.0)
        ```
    """
    nd = _trailing_ndim(x, (weight, bias), normalized_ndim, "layer_norm")
    return _over_trailing(lambda *a: _layer_norm_op(*a, eps), x, (weight, bias), nd, "layer_norm")


def _layer_norm_op(x: Var, weight: Var | None, bias: Var | None, eps: float) -> Var:
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
        if dy.dtype != x.dtype or not same_shape(dy, x):
            raise ShapeError(f"gradient '{dy.name}' {dy.type_str()} does not match '{x.name}' {x.type_str()}")
        _check_params(x, weight, "weight")
        n_params = int(attrs["want_weight"]) + int(attrs.get("want_bias", False))
        return [(x.shape, x.dtype)] + [((x.shape[-1],), x.dtype)] * n_params
    return rule


def same_shape(a: Var, b: Var) -> bool:
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
        d_xhat = sum_present(d_xhat, c * dy)
    if d_xhat is not None:
        d_x = sum_present(d_x, layer_norm_grad(d_xhat, x, mean, rstd, None, g.attrs["eps"])[0])
    d_dy = sum_present(None if d_gw is None else (d_gw * weight if weight is not None else d_gw),
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
    return kernel_result(grads)


def kernel_result(grads):
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


def rms_norm(x: Var, weight: Var | None = None, eps: float = 1e-6, normalized_ndim: int | None = None) -> Var:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the trailing axes of ``x``.

    As ``torch.nn.functional.rms_norm(x, x.shape[-n:], weight, eps)``.

    Args:
        x: A float Var.
        weight: The shape of the normalised axes (``[D]`` for the last one), or None.
        eps: Added to the mean square.
        normalized_ndim: How many trailing axes to normalise (``n``); by default
            ``weight``'s rank, else 1.

    Returns:
        A Var of ``x``'s shape.

    Raises:
        ShapeError: ``weight`` does not have the normalised axes' shape.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [-1, 2])
            h = rg.rms_norm(x, eps=0.0)
        (out,) = rg.Executor().run(main, feed={"x": np.array([[3.0, 4.0]], "float32")}, fetch_list=[h])
        assert np.allclose(out, np.array([[3.0, 4.0]]) / np.sqrt(12.5))
        ```
    """
    nd = _trailing_ndim(x, (weight,), normalized_ndim, "rms_norm")
    return _over_trailing(lambda *a: _rms_norm_op(*a, eps), x, (weight,), nd, "rms_norm")


def _rms_norm_op(x: Var, weight: Var | None, eps: float) -> Var:
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
        d_xn = sum_present(d_xn, c * dy)
    if d_xn is not None:
        d_x = sum_present(d_x, rms_norm_grad(d_xn, x, rstd, None, eps)[0])
    d_dy = sum_present(None if d_gw is None else (d_gw * weight if weight is not None else d_gw),
                  None if c is None else c * xn)
    d_weight = None if weight is None or d_gw is None else _leading_sum(d_gw * dy)
    return [d_dy, d_x, None] + ([d_weight] if weight is not None else [])


@defop("RMSNormGrad", inputs=("dy", "x", "rstd", "weight?"), outputs=("dx", "dweight*"),
       infer=_grad_op_rule(1), nondiff=(2,), grad=_rms_norm_grad_grad)
def _rms_norm_grad_op(k, dy, x, rstd, weight=None):
    """RMSNorm's input gradients in one kernel, from the forward's ``rstd``."""
    return kernel_result(k.backend.rms_norm_backward(dy, x, rstd, weight, k.attrs["want_weight"]))


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
