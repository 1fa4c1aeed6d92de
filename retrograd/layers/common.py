"""Fully connected and embedding layers."""
from __future__ import annotations

import numbers
from typing import Callable

from ..errors import ProgramError
from ..ir.builder import default_main_program
from ..ir.program import Var
from ..ops.creation import create_parameter
from ..ops.math import matmul, relu, sigmoid, tanh
from ..ops.nn import softmax
from ..ops.rnn_cells import seq_linear
from ..ops.tensor import gather

ACTIVATIONS: dict[str | None, Callable[[Var], Var] | None] = {
    None: None, "tanh": tanh, "sigmoid": sigmoid, "relu": relu, "softmax": softmax,
    "identity": None, "linear": None}


def _layer_name(name: str | None, kind: str) -> str:
    return name if name is not None else default_main_program().unique_name(kind)


def fc(x: Var, size: int, act: str | None = None, name: str | None = None) -> Var:
    """``act(x @ w + b)`` over the last axis of a 2-D ``[N, D]`` or 3-D ``[T, N, D]`` input.

    Creates ``<name>.w [D, size]`` (Xavier-uniform) and ``<name>.b [size]``
    (zeros) in ``x``'s dtype; ``act`` is None, "tanh", "sigmoid", "relu" or
    "softmax" (over the last axis). Calling again with the same name shares
    the parameters.

    Example::

        x = rg.data("x", [-1, 8])
        h = rg.layers.fc(x, 16, act="tanh", name="fc1")     # [?, 16]
    """
    if act not in ACTIVATIONS:
        raise ProgramError(f"fc: unknown act {act!r}; use one of None, "
                           + ", ".join(repr(a) for a in ACTIVATIONS if a))
    if x.ndim not in (2, 3) or x.shape[-1] < 0:
        raise ProgramError(f"fc needs a 2-D or 3-D input with a known last dimension, "
                           f"got '{x.name}': {x.type_str()}")
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
        raise ProgramError(f"fc: size must be a positive int, got {size!r}")
    name = _layer_name(name, "fc")
    w = create_parameter(f"{name}.w", [x.shape[-1], int(size)], dtype=x.dtype)
    b = create_parameter(f"{name}.b", [int(size)], dtype=x.dtype, init="zeros")
    # A [T, N, D] input is one [T*N, D] GEMM (and one GEMM for w's gradient), not T of them.
    out = (matmul(x, w) if x.ndim == 2 else seq_linear(x, w)) + b
    activation = ACTIVATIONS[act]
    return out if activation is None else activation(out)


def embedding(ids: Var, vocab: int, dim: int, name: str | None = None, dtype: str = "float32") -> Var:
    """Rows of ``<name>.w [vocab, dim]`` picked by integer ``ids`` of any shape: ``ids.shape + [dim]``.

    The table starts as Normal(0, 1), like ``torch.nn.Embedding``; an id
    outside ``[0, vocab)`` fails the run.

    Example::

        ids = rg.data("ids", [-1, -1], dtype="int64")             # [T, N]
        e = rg.layers.embedding(ids, vocab=1000, dim=32, name="emb")  # [T, N, 32]
    """
    name = _layer_name(name, "embedding")
    w = create_parameter(f"{name}.w", [int(vocab), int(dim)], dtype=dtype, init=("normal", 0.0, 1.0))
    return gather(w, ids)
