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
    """A 2-D convolution layer: ``act(conv2d(x, w) + b)`` over ``x [N, C, H, W]``.

    Creates ``<name>.w [num_filters, C, kh, kw]`` and ``<name>.b [num_filters]``,
    both ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` with ``fan_in = C * kh * kw``
    (``torch.nn.Conv2d``'s initialisation). The same name again shares the
    parameters; a name given also names the output Var (as ``fc`` does).

    Args:
        x: A float Var ``[N, C, H, W]``.
        num_filters: The number of output channels.
        kernel_size: An int or a pair ``(kh, kw)``.
        stride: An int or a pair.
        padding: As ``rg.conv2d`` takes it.
        act: One of ``rg.layers.common.ACTIVATIONS`` (as for ``fc``), or None.
        name: The parameters' prefix.

    Returns:
        A Var ``[N, num_filters, H_out, W_out]``.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 1, 8, 8])
            h = rg.layers.conv2d(x, 4, 3, padding=1, act="relu", name="c1")   # [?, 4, 8, 8]
        exe = rg.Executor()
        exe.run(startup)
        (out,) = exe.run(main, feed={"x": np.ones((2, 1, 8, 8), "float32")}, fetch_list=[h])
        assert out.shape == (2, 4, 8, 8) and (out >= 0).all()
        ```
    """
    return _conv_layer(2, "conv2d", x, num_filters, kernel_size, stride, padding, act, name)


def conv1d(x: Var, num_filters: int, kernel_size, stride=1, padding=0, act: str | None = None,
           name: str | None = None) -> Var:
    """A 1-D convolution layer: ``act(conv1d(x, w) + b)`` over ``x [N, C, W]``.

    Creates ``<name>.w [num_filters, C, k]`` and ``<name>.b [num_filters]``,
    initialised like ``torch.nn.Conv1d`` (``U(-1/sqrt(C*k), 1/sqrt(C*k))``).

    Args:
        x: A float Var ``[N, C, W]``.
        num_filters: The number of output channels.
        kernel_size: The kernel width.
        stride: The stride.
        padding: As ``rg.conv1d`` takes it.
        act: An activation name (as for ``fc``), or None.
        name: The parameters' prefix.

    Returns:
        A Var ``[N, num_filters, W_out]``.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 3, 20])                      # [N, channels, time]
            h = rg.layers.conv1d(x, 8, 5, padding=2, act="relu", name="tc1")
        exe = rg.Executor()
        exe.run(startup)
        (out,) = exe.run(main, feed={"x": np.ones((2, 3, 20), "float32")}, fetch_list=[h])
        assert out.shape == (2, 8, 20)
        ```
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
    fan_in = channels * math.prod(kernel)
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0     # torch.nn.Conv2d: 0 input channels, zero bias
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

