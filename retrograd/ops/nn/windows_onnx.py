"""ONNX building blocks for sliding-window lowerings where no ONNX op fits.

onnxruntime's CPU ``Conv``, ``ConvTranspose`` and ``AveragePool`` take float32
only, and ONNX has no operator for a convolution's weight gradient, so these
lowerings write the kernels' im2col + GEMM formulation (``backends/windows.py``)
out of ``Pad``, strided ``Slice``, ``MatMul`` and (for the transposes) one ``Pad``
per kernel tap summed. Spatial sizes are read at run time (``Shape``), so any
input size the program accepts works; the kernel's shape must be static.
"""
from __future__ import annotations

import itertools
import math


def pad(g, x: str, pads, dtype: str, value: float = 0.0) -> str:
    """``x [N, C, *spatial]`` padded by ``pads`` (ONNX order, spatial axes only) with ``value``."""
    nd = len(pads) // 2
    if not any(pads):
        return x
    full = [0, 0, *pads[:nd], 0, 0, *pads[nd:]]
    return g.node("Pad", [x, g.const(full, "int64"), g.const(value, dtype)])


def spans(g, x_pad: str, kernel, strides, dilations) -> str:
    """int64 ``[nd]``: how far each axis' last window start reaches, ``stride * (out - 1) + 1``."""
    nd = len(kernel)
    sizes = g.node("Shape", [x_pad], start=2)
    extent = g.const([d * (k - 1) + 1 for k, d in zip(kernel, dilations)], "int64")
    steps = g.const(list(strides), "int64")
    last = g.node("Div", [g.node("Sub", [sizes, extent]), steps])          # out - 1, never negative
    return g.node("Add", [g.node("Mul", [last, steps]), g.const([1] * nd, "int64")])


def taps(kernel, dilations):
    """Each tap's offsets into a window, row-major over the kernel."""
    for tap in itertools.product(*(range(k) for k in kernel)):
        yield [t * d for t, d in zip(tap, dilations)]


def im2col(g, x_pad: str, kernel, strides, dilations) -> list[str]:
    """One ``[N, C, *out]`` value per tap: the padded input read at that tap of every window."""
    nd = len(kernel)
    reach = spans(g, x_pad, kernel, strides, dilations)
    axes, steps = g.const(list(range(2, 2 + nd)), "int64"), g.const(list(strides), "int64")
    pieces = []
    for offsets in taps(kernel, dilations):
        starts = g.const(offsets, "int64")
        pieces.append(g.node("Slice", [x_pad, starts, g.node("Add", [starts, reach]), axes, steps]))
    return pieces


def stack_taps(g, pieces: list[str]) -> str:
    """``[N, C, K, *out]`` from the per-tap values."""
    axis = g.const([2], "int64")
    return g.node("Concat", [g.node("Unsqueeze", [p, axis]) for p in pieces], axis=2)


def dilate(g, t: str, first_axis: int, strides) -> str:
    """``t``'s axes from ``first_axis`` on spread by their stride: ``stride - 1`` zeros between
    neighbours, so element ``o`` lands at ``stride * o`` (a tensor of ``stride * (out - 1) + 1``)."""
    rank = first_axis + len(strides)
    for i, s in enumerate(strides):
        if s == 1:
            continue
        axis = first_axis + i
        t = g.node("Unsqueeze", [t, g.const([axis + 1], "int64")])
        gaps = [0] * (rank + 1) * 2
        gaps[rank + 1 + axis + 1] = s - 1
        t = g.node("Pad", [t, g.const(gaps, "int64")])
        merged = g.node("Concat", [g.node("Shape", [t], end=axis), g.const([-1], "int64"),
                                   g.node("Shape", [t], start=axis + 2)], axis=0)
        t = g.node("Reshape", [t, merged])
        t = g.node("Slice", [t, g.const([0], "int64"), g.const([1 - s], "int64"), g.const([axis], "int64")])
    return t


def col2im(g, pieces: list[str], x_like: str, pads, kernel, dilations) -> str:
    """The adjoint of ``im2col``: each tap's stride-dilated ``[N, C, *span]`` piece placed at its
    offset in the zero padded input and summed, then the padding cropped: ``x_like``'s shape."""
    nd = len(kernel)
    padded = g.node("Add", [g.node("Shape", [x_like], start=2),
                            g.const([pads[i] + pads[nd + i] for i in range(nd)], "int64")])
    rest = g.node("Sub", [padded, g.node("Shape", [pieces[0]], start=2)])
    placed = []
    for piece, offsets in zip(pieces, taps(kernel, dilations)):
        before = g.const([0, 0, *offsets], "int64")
        after = g.node("Concat", [g.const([0, 0], "int64"),
                                  g.node("Sub", [rest, g.const(offsets, "int64")])], axis=0)
        placed.append(g.node("Pad", [piece, g.node("Concat", [before, after], axis=0)]))
    total = placed[0] if len(placed) == 1 else g.node("Sum", placed)
    if not any(pads):
        return total
    starts = g.const(list(pads[:nd]), "int64")
    ends = g.node("Add", [starts, g.node("Shape", [x_like], start=2)])
    return g.node("Slice", [total, starts, ends, g.const(list(range(2, 2 + nd)), "int64")])


def static_kernel(g, w_var, what: str) -> tuple[int, ...]:
    """The kernel's spatial shape, which the tap loop needs at export time."""
    kernel = tuple(w_var.shape[2:])
    if min(kernel, default=1) < 0 or min(w_var.shape[:2]) < 0:
        g.fail(f"{what} needs the weight's shape at export time, got {w_var.type_str()}")
    return kernel


def reshape(g, x: str, dims) -> str:
    """Reshape to ``dims``: ints (0 copies the input's size there, -1 is inferred) or int64 values."""
    if all(isinstance(d, int) for d in dims):
        return g.node("Reshape", [x, g.const(list(dims), "int64")])
    parts = [g.const([d], "int64") if isinstance(d, int) else d for d in dims]
    return g.node("Reshape", [x, g.node("Concat", parts, axis=0)])


def prod(values) -> int:
    return math.prod(values)
