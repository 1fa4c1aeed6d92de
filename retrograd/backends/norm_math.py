"""Layer norm and RMS norm over the last axis (forward and backward), batch norm's statistics
and normalization over channels, in any Array API namespace.

The ``Backend`` methods of the same names call these; a backend with fused
routines of its own (torch's ``native_layer_norm``) overrides the methods.
``mean`` and ``rstd`` (``1 / sqrt(var + eps)``) are ``[..., 1]``, as torch keeps them.
"""
from __future__ import annotations


def _leading_axes(x) -> tuple[int, ...]:
    return tuple(range(x.ndim - 1))


def layer_norm(xp, x, weight, bias, eps: float):
    """``(y, mean, rstd)``: ``y = (x - mean) * rstd * weight + bias``."""
    mean = xp.mean(x, axis=-1, keepdims=True)
    y = x - mean
    var = xp.mean(y * y, axis=-1, keepdims=True)
    rstd = 1.0 / xp.sqrt(var + eps)
    y *= rstd
    if weight is not None:
        y *= weight
    if bias is not None:
        y += bias
    return y, mean, rstd


def layer_norm_backward(xp, dy, x, mean, rstd, weight, want_weight: bool, want_bias: bool):
    """``(dx, dweight or None, dbias or None)`` of ``layer_norm``:
    ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` with ``g = dy * weight``."""
    xhat = (x - mean) * rstd
    g = dy * weight if weight is not None else dy
    dx = g - xp.mean(g, axis=-1, keepdims=True)
    dx -= xhat * xp.mean(g * xhat, axis=-1, keepdims=True)
    dx *= rstd
    dweight = xp.sum(dy * xhat, axis=_leading_axes(x)) if want_weight else None
    dbias = xp.sum(dy, axis=_leading_axes(x)) if want_bias else None
    return dx, dweight, dbias


def rms_norm(xp, x, weight, eps: float):
    """``(y, rstd)``: ``y = x * rstd * weight`` with ``rstd = 1 / sqrt(mean(x^2) + eps)``."""
    rstd = 1.0 / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps)
    y = x * rstd
    if weight is not None:
        y *= weight
    return y, rstd


def rms_norm_backward(xp, dy, x, rstd, weight, want_weight: bool):
    """``(dx, dweight or None)`` of ``rms_norm``: ``dx = rstd * (g - xn * mean(g * xn))``,
    ``xn = x * rstd``, ``g = dy * weight``."""
    xn = x * rstd
    g = dy * weight if weight is not None else dy
    dx = g - xn * xp.mean(g * xn, axis=-1, keepdims=True)
    dx *= rstd
    dweight = xp.sum(dy * xn, axis=_leading_axes(x)) if want_weight else None
    return dx, dweight


def _per_channel(xp, v, ndim: int):
    """``v [C]`` shaped ``[1, C, 1, ...]`` to broadcast against ``x [N, C, ...]``."""
    return xp.reshape(v, (1, -1) + (1,) * (ndim - 2))


def channel_stats(xp, x):
    """``(mean, var)`` per channel of ``x [N, C, ...]`` (biased variance), each ``[C]``."""
    axes = (0,) + tuple(range(2, x.ndim))
    mean = xp.mean(x, axis=axes)
    centred = x - _per_channel(xp, mean, x.ndim)
    return mean, xp.mean(centred * centred, axis=axes)


def batch_norm(xp, x, mean, var, weight, bias, eps: float):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` per channel of ``x [N, C, ...]``."""
    scale = 1.0 / xp.sqrt(var + eps)
    if weight is not None:
        scale = scale * weight
    y = x - _per_channel(xp, mean, x.ndim)
    y *= _per_channel(xp, scale, x.ndim)
    if bias is not None:
        y += _per_channel(xp, bias, x.ndim)
    return y


def batch_norm_backward(xp, dy, x, mean, var, weight, eps: float, training: bool,
                        want_weight: bool, want_bias: bool):
    """``(dx, dweight or None, dbias or None)`` of ``batch_norm`` with the statistics it used:
    ``dx = invstd * (g - mean(g) - xhat * mean(g * xhat))`` over each channel's values in
    training (the statistics depend on x), ``dx = g * invstd`` otherwise; ``g = dy * weight``."""
    axes = (0,) + tuple(range(2, x.ndim))
    invstd = _per_channel(xp, 1.0 / xp.sqrt(var + eps), x.ndim)
    xhat = (x - _per_channel(xp, mean, x.ndim)) * invstd
    g = dy * _per_channel(xp, weight, x.ndim) if weight is not None else dy
    if training:
        dx = g - xp.mean(g, axis=axes, keepdims=True)
        dx -= xhat * xp.mean(g * xhat, axis=axes, keepdims=True)
        dx *= invstd
    else:
        dx = g * invstd
    dweight = xp.sum(dy * xhat, axis=axes) if want_weight else None
    dbias = xp.sum(dy, axis=axes) if want_bias else None
    return dx, dweight, dbias
