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
    """``rg.layer_norm`` over the last axis with ``<name>.w`` (ones) and ``<name>.b`` (zeros),
    both ``[D]``: ``torch.nn.LayerNorm(D)``.

    Example::

        h = rg.layers.layer_norm(x, name="ln1")       # x [N, L, D]; ln1.w, ln1.b [D]
    """
    name = _name(name, "layer_norm")
    width = _width(x, -1, "layer_norm", name)
    w = create_parameter(f"{name}.w", [width], dtype=x.dtype, init="ones")
    b = create_parameter(f"{name}.b", [width], dtype=x.dtype, init="zeros")
    return layer_norm_op(x, w, b, eps=eps)


def rms_norm(x: Var, name: str | None = None, eps: float = 1e-6) -> Var:
    """``rg.rms_norm`` over the last axis with ``<name>.w [D]`` (ones): ``torch.nn.RMSNorm(D, eps)``.

    Example::

        h = rg.layers.rms_norm(x, name="rn1")         # rn1.w [D]
    """
    name = _name(name, "rms_norm")
    width = _width(x, -1, "rms_norm", name)
    w = create_parameter(f"{name}.w", [width], dtype=x.dtype, init="ones")
    return rms_norm_op(x, w, eps=eps)


def batch_norm(x: Var, name: str | None = None, momentum: float = 0.1, eps: float = 1e-5) -> Var:
    """``rg.batch_norm`` of ``x [N, C]`` or ``[N, C, ...]`` with ``<name>.w`` (ones), ``<name>.b``
    (zeros) and the persistable, non-trainable running statistics ``<name>.mean`` (zeros) and
    ``<name>.var`` (ones), all ``[C]``: ``torch.nn.BatchNorm1d/2d(C, eps, momentum)``.

    A run of the training program normalizes with the batch's statistics and
    updates the running ones; its ``clone(for_test=True)`` normalizes with the
    running ones and leaves them as they are.

    Example::

        h = rg.layers.batch_norm(rg.conv2d(x, w), name="bn1")
        test_program = main.clone(for_test=True)
    """
    name = _name(name, "batch_norm")
    channels = _width(x, 1, "batch_norm", name)
    momentum = as_float(momentum, f"batch_norm '{name}': momentum")
    w = create_parameter(f"{name}.w", [channels], dtype=x.dtype, init="ones")
    b = create_parameter(f"{name}.b", [channels], dtype=x.dtype, init="zeros")
    mean = create_parameter(f"{name}.mean", [channels], dtype=x.dtype, init="zeros", trainable=False)
    var = create_parameter(f"{name}.var", [channels], dtype=x.dtype, init="ones", trainable=False)
    return batch_norm_op(x, mean, var, w, b, training=True, momentum=momentum, eps=eps)
