"""Sliding-window kernels (convolution, pooling) written once with Array API calls.

The general path of ``Backend.conv`` and friends, used by the NumPy and CuPy
backends (torch has its own routines, ``torch_backend``). Layout, for an
input ``x [N, C, *spatial]`` and a kernel of ``K`` taps (``K = kh * kw``)::

    x_pad [N, C, *padded]         zero padding (-inf for max pooling)
    cols  [N, C, K, *out]         cols[:, :, t] = x_pad at tap t of every window (im2col:
                                  one strided slice per tap, no loop over pixels)
    conv: [N, G, F/G, C/G*K] = w [G, F/G, C/G*K] @ cols [N, G, C/G*K, P]     (P = prod(out))

The input gradient is the transpose: ``w^T @ dy`` gives the columns' gradient,
which ``col2im`` adds back tap by tap into a zero padded input. ``pads`` is
ONNX's order: the ``before`` pads of every spatial axis, then the ``after`` ones.
"""
from __future__ import annotations

import itertools
import math
from typing import Sequence


def out_size(size: int, kernel: int, stride: int, before: int, after: int, dilation: int = 1) -> int:
    """Windows along one axis: ``floor((size + pads - dilation*(kernel-1) - 1) / stride) + 1``.

    Example::

        out_size(32, 3, 2, 1, 1)        # 16
    """
    return (size + before + after - dilation * (kernel - 1) - 1) // stride + 1


def out_sizes(sizes, kernel, strides, pads, dilations) -> tuple[int, ...]:
    nd = len(kernel)
    return tuple(out_size(sizes[i], kernel[i], strides[i], pads[i], pads[nd + i], dilations[i])
                 for i in range(nd))


def check_out_sizes(sizes, kernel, strides, pads, dilations, what: str) -> tuple[int, ...]:
    """The output's spatial sizes; ValueError (an ExecutionError naming the op) for a kernel
    larger than the padded input, which a shape known only at run time lets through."""
    outs = out_sizes(sizes, kernel, strides, pads, dilations)
    if min(outs, default=1) < 1:
        nd = len(kernel)
        padded = [sizes[i] + pads[i] + pads[nd + i] for i in range(nd)]
        extent = [dilations[i] * (kernel[i] - 1) + 1 for i in range(nd)]
        raise ValueError(f"{what}: the kernel spans {extent}, larger than the padded input {padded}")
    return outs


def pad_spatial(xp, x, pads: Sequence[int], value: float = 0.0):
    """``x [N, C, *spatial]`` with ``pads`` (ONNX order) filled with ``value`` around its spatial axes.

    Example::

        pad_spatial(np, x, [1, 0, 1, 2])        # H: 1 before, 1 after; W: 0 before, 2 after
    """
    nd = x.ndim - 2
    if not any(pads):
        return x
    inner = tuple(slice(pads[i], pads[i] + x.shape[2 + i]) for i in range(nd))
    shape = tuple(x.shape[:2]) + tuple(x.shape[2 + i] + pads[i] + pads[nd + i] for i in range(nd))
    out = xp.full(shape, value, dtype=x.dtype)
    out[(slice(None), slice(None)) + inner] = x
    return out


def tap_slices(kernel, strides, dilations, outs):
    """One index per tap: the strided slice of the padded input it reads in every window."""
    for tap in itertools.product(*(range(k) for k in kernel)):
        yield (slice(None), slice(None)) + tuple(
            slice(t * d, t * d + s * (o - 1) + 1, s) for t, s, d, o in zip(tap, strides, dilations, outs))


def im2col(xp, x_pad, kernel, strides, dilations, outs):
    """``cols [N, C, K, *out]``: every tap's view of every window.

    Example::

        cols = im2col(np, x_pad, (3, 3), (1, 1), (1, 1), (32, 32))    # [N, C, 9, 32, 32]
    """
    return xp.stack([x_pad[index] for index in tap_slices(kernel, strides, dilations, outs)], axis=2)


def col2im(xp, cols, padded_shape, kernel, strides, dilations, outs):
    """The adjoint of ``im2col``: each tap's ``cols[:, :, t]`` added back where it was read."""
    out = xp.zeros(tuple(padded_shape), dtype=cols.dtype)
    for t, index in enumerate(tap_slices(kernel, strides, dilations, outs)):
        out[index] += cols[:, :, t, ...]
    return out


def crop(x_pad, pads, sizes):
    nd = len(sizes)
    return x_pad[(slice(None), slice(None)) + tuple(slice(pads[i], pads[i] + sizes[i]) for i in range(nd))]


def padded_shape(shape, pads):
    nd = len(shape) - 2
    return tuple(shape[:2]) + tuple(shape[2 + i] + pads[i] + pads[nd + i] for i in range(nd))


# --- convolution ------------------------------------------------------------------------------

def conv(xp, x, w, strides, pads, dilations, groups: int):
    """``y [N, F, *out]`` of ``x [N, C, *spatial]`` and ``w [F, C/groups, *kernel]``.

    Example::

        y = conv(np, x, w, strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], groups=1)
    """
    kernel = tuple(w.shape[2:])
    outs = check_out_sizes(x.shape[2:], kernel, strides, pads, dilations, "conv")
    cols = _grouped_cols(xp, x, kernel, strides, pads, dilations, outs, groups)
    y = xp.matmul(_grouped_weight(xp, w, groups), cols)          # [N, G, F/G, P]
    return xp.reshape(y, (x.shape[0], w.shape[0]) + outs)


def conv_input_grad(xp, dy, w, x_shape, strides, pads, dilations, groups: int):
    """``dx [*x_shape]``: the transposed convolution of ``dy`` with ``w`` (col2im of w^T @ dy)."""
    kernel, n, outs = tuple(w.shape[2:]), dy.shape[0], tuple(dy.shape[2:])
    dy = xp.reshape(dy, (n, groups, w.shape[0] // groups, math.prod(outs)))
    dcols = xp.matmul(_grouped_weight(xp, w, groups, transpose=True), dy)   # [N, G, C/G*K, P]
    dcols = xp.reshape(dcols, (n, x_shape[1], math.prod(kernel)) + outs)
    dx_pad = col2im(xp, dcols, padded_shape(x_shape, pads), kernel, strides, dilations, outs)
    return crop(dx_pad, pads, x_shape[2:])


def conv_weight_grad(xp, x, dy, w_shape, strides, pads, dilations, groups: int):
    """``dw [*w_shape]``: the sum over the batch of dy @ cols^T."""
    kernel, n, f, outs = tuple(w_shape[2:]), dy.shape[0], w_shape[0], tuple(dy.shape[2:])
    cols = _grouped_cols(xp, x, kernel, strides, pads, dilations, outs, groups)
    dy = xp.reshape(dy, (n, groups, f // groups, math.prod(outs)))
    dw = xp.sum(xp.matmul(dy, xp.matrix_transpose(cols)), axis=0)      # [G, F/G, C/G*K]
    return xp.reshape(dw, tuple(w_shape))


def _grouped_cols(xp, x, kernel, strides, pads, dilations, outs, groups):
    """``[N, G, C/G*K, P]``, the (channel, tap) rows of each group next to each other."""
    cols = im2col(xp, pad_spatial(xp, x, pads), kernel, strides, dilations, outs)
    n, c = x.shape[:2]
    return xp.reshape(cols, (n, groups, (c // groups) * math.prod(kernel), math.prod(outs)))


def _grouped_weight(xp, w, groups, transpose=False):
    """``w [F, C/G, *kernel]`` as ``[G, F/G, C/G*K]`` (or its transpose ``[G, C/G*K, F/G]``)."""
    f = w.shape[0]
    wg = xp.reshape(w, (groups, f // groups, math.prod(w.shape[1:])))
    return xp.matrix_transpose(wg) if transpose else wg


# --- pooling ------------------------------------------------------------------------------

def max_pool(xp, x, kernel, strides, pads, dilations=None):
    """``(y, indices)``: each window's maximum and where it is, as a flat index into its
    ``(n, c)`` plane of the unpadded input (torch's and onnxruntime's convention). Ties go
    to the first maximal element in the window's row-major order. ``dilations``: the spacing
    of a window's taps (1 by default).

    Example::

        y, indices = max_pool(np, x, kernel=(2, 2), strides=(2, 2), pads=[0, 0, 0, 0])
    """
    nd = len(kernel)
    dilations = tuple(dilations or (1,) * nd)
    outs = check_out_sizes(x.shape[2:], kernel, strides, pads, dilations, "max_pool")
    cols = im2col(xp, pad_spatial(xp, x, pads, -math.inf), kernel, strides, dilations, outs)
    tap = xp.argmax(cols, axis=2)                               # [N, C, *out], first maximum
    y = xp.max(cols, axis=2)
    flat = xp.zeros(tap.shape, dtype=xp.int64)
    rest = xp.astype(tap, xp.int64)
    for i in reversed(range(nd)):                               # unravel the tap, then ravel
        tap_i = rest % kernel[i]                                # the input coordinate
        rest = rest // kernel[i]
        coord = _window_starts(xp, outs, i, strides[i], pads[i]) + tap_i * dilations[i]
        flat = flat + coord * math.prod(x.shape[3 + i:])
    return y, flat


def _window_starts(xp, outs, axis, stride, before):
    """First input coordinate of each window along ``axis``, shaped to broadcast over [*out]."""
    starts = xp.arange(outs[axis], dtype=xp.int64) * stride - before
    return xp.reshape(starts, tuple(o if j == axis else 1 for j, o in enumerate(outs)))


def plane_ids(xp, indices, plane: int):
    """Plane indices ``[N, C, *out]`` as flat ids into the whole ``[N*C*plane]`` input."""
    n, c = indices.shape[:2]
    offsets = xp.reshape(xp.arange(n * c, dtype=xp.int64) * plane, (n, c) + (1,) * (indices.ndim - 2))
    return xp.reshape(indices + offsets, (-1,))


def max_pool_gather(xp, v, indices):
    """``v [N, C, *spatial]`` read at each window's argmax ``indices [N, C, *out]``."""
    flat = xp.reshape(v, (-1,))
    return xp.reshape(xp.take(flat, plane_ids(xp, indices, math.prod(v.shape[2:]))), indices.shape)


def avg_pool(xp, x, kernel, strides, pads):
    """Window means with the zero padding counted (torch's ``count_include_pad=True``).

    Example::

        y = avg_pool(np, x, kernel=(3, 3), strides=(1, 1), pads=[1, 1, 1, 1])
    """
    ones = (1,) * len(kernel)
    outs = check_out_sizes(x.shape[2:], kernel, strides, pads, ones, "avg_pool")
    x_pad = pad_spatial(xp, x, pads)
    total = None
    for index in tap_slices(kernel, strides, ones, outs):
        total = x_pad[index] if total is None else total + x_pad[index]
    return total / math.prod(kernel)


def avg_pool_grad(xp, dy, x_shape, kernel, strides, pads):
    """Each window's gradient shared evenly by its ``K`` taps, added back where they were read."""
    ones, outs = (1,) * len(kernel), tuple(dy.shape[2:])
    share = dy / math.prod(kernel)
    dx_pad = xp.zeros(padded_shape(x_shape, pads), dtype=dy.dtype)
    for index in tap_slices(kernel, strides, ones, outs):
        dx_pad[index] += share
    return crop(dx_pad, pads, x_shape[2:])
