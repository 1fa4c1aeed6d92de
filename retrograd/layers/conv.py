"""Convolution layers: ``conv1d`` and ``conv2d`` with their filters and bias as parameters.

Initialised like ``torch.nn.Conv1d``/``Conv2d``: kaiming-uniform with
``a = sqrt(5)``, which is ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` with
``fan_in = C * prod(kernel)``, for the filters and the bias alike.
"""
from __future__ import annotations

import math
import numbers

from ..errors import ShapeError
from ..ir.builder import current_block
from ..ir.program import Var
from ..ops.nn.conv import build_error, convolution, per_axis
from ..ops.array.creation import create_parameter
from ..ops.core.registry import append_op
from ..ops.array.tensor import reshape
from .common import ACTIVATIONS


def conv2d(x: Var, num_filters: int, kernel_size, stride=1, padding=0, act: str | None = None,
           name: str | None = None) -> Var:
    """``act(conv2d(x, w) + b)`` over ``x [N, C, H, W]``: ``[N, num_filters, H_out, W_out]``.

    Creates ``<name>.w [num_filters, C, kh, kw]`` and ``<name>.b [num_filters]``,
    both ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` with ``fan_in = C * kh * kw``
    (``torch.nn.Conv2d``'s initialisation). ``kernel_size``, ``stride``: an
    int or a pair; ``padding`` as ``rg.conv2d`` takes it; ``act`` one of
    ``rg.layers.common.ACTIVATIONS``. The same name again shares the parameters;
    a name given also names the output Var (as ``fc`` does).

    Example::

        x = rg.data("x", [-1, 1, 28, 28])
        h = rg.layers.conv2d(x, 16, 3, padding=1, act="relu", name="c1")   # [?, 16, 28, 28]
    """
    return _conv_layer(2, "conv2d", x, num_filters, kernel_size, stride, padding, act, name)


def conv1d(x: Var, num_filters: int, kernel_size, stride=1, padding=0, act: str | None = None,
           name: str | None = None) -> Var:
    """``act(conv1d(x, w) + b)`` over ``x [N, C, W]``: ``[N, num_filters, W_out]``.

    Creates ``<name>.w [num_filters, C, k]`` and ``<name>.b [num_filters]``,
    initialised like ``torch.nn.Conv1d`` (``U(-1/sqrt(C*k), 1/sqrt(C*k))``).

    Example::

        x = rg.data("x", [-1, 8, 100])                     # [N, channels, time]
        h = rg.layers.conv1d(x, 32, 5, padding=2, act="relu", name="tc1")
    """
    return _conv_layer(1, "conv1d", x, num_filters, kernel_size, stride, padding, act, name)


def _conv_layer(nd, kind, x, num_filters, kernel_size, stride, padding, act, name) -> Var:
    named = name is not None and not current_block().program.has_name(name)
    name = name if name is not None else current_block().program.unique_name(kind)
    what = f"layers.{kind} '{name}'"
    _check_input(x, nd, what)
    if act not in ACTIVATIONS:
        raise build_error(what, f"unknown act {act!r}; use one of None, "
                     + ", ".join(repr(a) for a in ACTIVATIONS if a))
    if isinstance(num_filters, bool) or not isinstance(num_filters, numbers.Integral) or num_filters < 1:
        raise build_error(what, f"num_filters must be a positive int, got {num_filters!r}")
    kernel = per_axis(kernel_size, nd, "kernel_size", what)
    channels = x.shape[1]
    bound = 1.0 / math.sqrt(channels * math.prod(kernel))
    w = create_parameter(f"{name}.w", [int(num_filters), channels, *kernel], dtype=x.dtype,
                         init=("uniform", -bound, bound))
    b = create_parameter(f"{name}.b", [int(num_filters)], dtype=x.dtype, init=("uniform", -bound, bound))
    try:
        y = convolution(x, w, None, stride, padding, what=what)
    except ShapeError as exc:
        raise ShapeError(f"{what}: {exc}") from None
    activation = ACTIVATIONS[act]
    target = [current_block().create_var(name, y.shape, y.dtype)] if named else None
    out = append_op("Add", [y, reshape(b, [-1] + [1] * nd)], outputs=None if activation else target)[0]
    if activation is not None:
        out = append_op(activation[0], [out], activation[1], outputs=target)[0]
    return out


def _check_input(x, nd: int, what: str) -> None:
    if not isinstance(x, Var) or x.ndim != nd + 2 or x.shape[1] < 0:
        shown = x.type_str() if isinstance(x, Var) else type(x).__name__
        raise build_error(what, f"needs x [N, C, {nd} spatial axes] with a known channel count C, got {shown}")

