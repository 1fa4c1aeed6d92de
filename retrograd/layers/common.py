"""Fully connected and embedding layers."""
from __future__ import annotations

import numbers
from ..errors import ProgramError
from ..ir.builder import current_block, default_main_program
from ..ir.program import Var
from ..ops.array.creation import create_parameter
from ..ops.math.elementwise import matmul
from ..ops.core.registry import append_op
from ..ops.recurrent.cells import seq_linear
from ..ops.array.tensor import gather

# act -> the op fc ends with (type, attrs), None for none: fc appends it itself, so that it can
# write the Var named after the layer.
ACTIVATIONS: dict[str | None, tuple[str, dict] | None] = {
    None: None, "tanh": ("Tanh", {}), "sigmoid": ("Sigmoid", {}), "relu": ("Relu", {}),
    "softmax": ("Softmax", {"axis": -1}), "identity": None, "linear": None,
    "gelu": ("Gelu", {"approximate": "none"}), "silu": ("Silu", {}),
    "leaky_relu": ("LeakyRelu", {"negative_slope": 0.01}), "elu": ("Elu", {"alpha": 1.0}),
    "softplus": ("Softplus", {})}


def _layer_name(name: str | None, kind: str) -> str:
    return name if name is not None else default_main_program().unique_name(kind)


def fc(x: Var, size: int, act: str | None = None, name: str | None = None) -> Var:
    """``act(x @ w + b)`` over the last axis of a 2-D ``[N, D]`` or 3-D ``[T, N, D]`` input.

    Creates ``<name>.w [D, size]`` (Xavier-uniform) and ``<name>.b [size]``
    (zeros) in ``x``'s dtype; ``act`` is None, "tanh", "sigmoid", "relu",
    "softmax" (over the last axis), "gelu", "silu", "leaky_relu" (slope 0.01),
    "elu" (alpha 1) or "softplus", each with ``rg.<act>``'s defaults. Calling
    again with the same name shares the parameters. A ``name`` given (and not yet used) also names the output
    Var, so it can be fetched by that name (``fetch_list=["fc1"]``, or the
    output of an exported ONNX model).

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
    named = name is not None and not current_block().program.has_name(name)
    name = _layer_name(name, "fc")
    w = create_parameter(f"{name}.w", [x.shape[-1], int(size)], dtype=x.dtype)
    b = create_parameter(f"{name}.b", [int(size)], dtype=x.dtype, init="zeros")
    # A [T, N, D] input is one [T*N, D] GEMM (and one GEMM for w's gradient), not T of them.
    out = matmul(x, w) if x.ndim == 2 else seq_linear(x, w)
    activation = ACTIVATIONS[act]
    # The last op writes a Var named after the layer (when no variable has that name yet), so the
    # output can be fetched by name, e.g. sess.run(["logits"], ...) on an exported model.
    target = [current_block().create_var(name, [*x.shape[:-1], int(size)], x.dtype)] if named else None
    out = append_op("Add", [out, b], outputs=None if activation else target)[0]
    if activation is not None:
        out = append_op(activation[0], [out], activation[1], outputs=target)[0]
    return out


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
