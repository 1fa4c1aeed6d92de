"""Normalization layers: layer norm, RMS norm, batch norm, with their parameters.

Parameters start as torch's modules start them (``torch.nn.LayerNorm``,
``RMSNorm``, ``BatchNorm1d/2d``): weights 1, biases 0, running mean 0,
running variance 1. The running statistics are persistable and not trainable:
saved with the parameters, written by the training program's runs, read by its
``clone(for_test=True)``.
"""
from __future__ import annotations

from ..errors import ProgramError
from ..ir.builder import default_main_program
from ..ir.program import Var, as_float
from ..ops.array.creation import create_parameter
from ..ops.nn.batch_norm import batch_norm as batch_norm_op
from ..ops.nn.norm import layer_norm as layer_norm_op, rms_norm as rms_norm_op


def _width(x: Var, axis: int, layer: str, name: str) -> int:
    """The (known) size of ``x`` along ``axis``: the length of the layer's parameters."""
    if x.ndim <= max(axis, 0) or x.shape[axis] < 0:
        where = "last" if axis == -1 else "channel (second)"
        raise ProgramError(f"{layer} '{name}' needs an input with a known {where} dimension, got "
                           f"'{x.name}': {x.type_str()}")
    return x.shape[axis]


def _name(name: str | None, kind: str) -> str:
    return name if name is not None else default_main_program().unique_name(kind)


def layer_norm(x: Var, name: str | None = None, eps: float = 1e-5) -> Var:
    """``rg.layer_norm`` over the last axis with learned ``<name>.w`` and ``<name>.b``, as ``torch.nn.LayerNorm(D)``.

    Both parameters are ``[D]``: ``w`` starts at ones, ``b`` at zeros.

    Args:
        x: A float Var ``[..., D]``.
        name: The parameters' prefix.
        eps: Added to the variance.

    Returns:
        A Var of ``x``'s shape.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 4])
            h = rg.layers.layer_norm(x, name="ln1")       # ln1.w, ln1.b [4]
        exe = rg.Executor()
        exe.run(startup)
        (out,) = exe.run(main, feed={"x": np.array([[1.0, 2.0, 3.0, 4.0]], "float32")}, fetch_list=[h])
        assert np.allclose(out.mean(), 0.0, atol=1e-6) and np.allclose(out.std(), 1.0, atol=1e-4)
        ```
    """
    name = _name(name, "layer_norm")
    width = _width(x, -1, "layer_norm", name)
    w = create_parameter(f"{name}.w", [width], dtype=x.dtype, init="ones")
    b = create_parameter(f"{name}.b", [width], dtype=x.dtype, init="zeros")
    return layer_norm_op(x, w, b, eps=eps)


def rms_norm(x: Var, name: str | None = None, eps: float = 1e-6) -> Var:
    """``rg.rms_norm`` over the last axis with ``<name>.w [D]`` (ones), as ``torch.nn.RMSNorm(D, eps)``.

    Args:
        x: A float Var ``[..., D]``.
        name: The parameter's prefix.
        eps: Added to the mean square.

    Returns:
        A Var of ``x``'s shape.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 2])
            h = rg.layers.rms_norm(x, name="rn1")         # rn1.w [2]
        exe = rg.Executor()
        exe.run(startup)
        (out,) = exe.run(main, feed={"x": np.array([[3.0, 4.0]], "float32")}, fetch_list=[h])
        assert np.allclose(out, np.array([[3.0, 4.0]]) / np.sqrt(12.5), atol=1e-5)
        ```
    """
    name = _name(name, "rms_norm")
    width = _width(x, -1, "rms_norm", name)
    w = create_parameter(f"{name}.w", [width], dtype=x.dtype, init="ones")
    return rms_norm_op(x, w, eps=eps)


def batch_norm(x: Var, name: str | None = None, momentum: float = 0.1, eps: float = 1e-5) -> Var:
    """``rg.batch_norm`` with a learned scale and shift and running statistics (``torch.nn.BatchNorm1d/2d``).

    Parameters ``<name>.w`` (ones), ``<name>.b`` (zeros) and the persistable,
    non-trainable running statistics ``<name>.mean`` (zeros) and ``<name>.var``
    (ones), all ``[C]``. A run of the training program normalizes with the
    batch's statistics and updates the running ones; its
    ``clone(for_test=True)`` normalizes with the running ones and leaves them
    as they are.

    Args:
        x: A float Var ``[N, C]`` or ``[N, C, ...]``.
        name: The parameters' prefix.
        momentum: The running statistics' update rate (torch's convention).
        eps: Added to the variance.

    Returns:
        A Var of ``x``'s shape.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 2])
            h = rg.layers.batch_norm(x, name="bn1")
            y = h * 1.0
        test_program = main.clone(for_test=True)
        exe = rg.Executor()
        exe.run(startup)
        xv = np.array([[1.0, 10.0], [3.0, 30.0]], "float32")
        (train_out,) = exe.run(main, feed={"x": xv}, fetch_list=[h])
        assert np.allclose(train_out, [[-1.0, -1.0], [1.0, 1.0]], atol=1e-3)
        assert np.allclose(exe.scope.get("bn1.mean"), [0.2, 2.0])          # 0.9 * 0 + 0.1 * batch mean
        (test_out,) = exe.run(test_program, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(exe.scope.get("bn1.mean"), [0.2, 2.0])          # unchanged
        assert np.allclose(test_out[0], (xv[0] - [0.2, 2.0]) / np.sqrt(exe.scope.get("bn1.var") + 1e-5))
        ```
    """
    name = _name(name, "batch_norm")
    channels = _width(x, 1, "batch_norm", name)
    momentum = as_float(momentum, f"batch_norm '{name}': momentum")
    w = create_parameter(f"{name}.w", [channels], dtype=x.dtype, init="ones")
    b = create_parameter(f"{name}.b", [channels], dtype=x.dtype, init="zeros")
    mean = create_parameter(f"{name}.mean", [channels], dtype=x.dtype, init="zeros", trainable=False)
    var = create_parameter(f"{name}.var", [channels], dtype=x.dtype, init="ones", trainable=False)
    return batch_norm_op(x, mean, var, w, b, training=True, momentum=momentum, eps=eps)
