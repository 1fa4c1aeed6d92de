"""Gradient clipping by global norm, built from ordinary ops (so it prints and runs like any op).

The norm of all gradients is one ``GlobalNorm`` op (a multi-tensor reduction: torch runs
``_foreach_norm``, as ``torch.nn.utils.clip_grad_norm_``), not a square and a sum per
gradient: a transformer's 38 parameters made 77 ops of it (issue 22).
"""
from __future__ import annotations

from typing import Sequence

from ..errors import ProgramError, ShapeError
from ..ir.program import Var
from ..ops.core.lowering import lowers
from ..ops.math.elementwise import add_n, minimum, sqrt, square
from ..ops.reduce.reductions import sum as reduce_sum
from ..ops.core.registry import append_op, defop
from ..ops.core.shapes import require_float

# PyTorch's clip_grad_norm_ adds this to the norm before dividing.
NORM_EPS = 1e-6


def global_norm(grads: Sequence[Var]) -> Var:
    """``sqrt(sum_i sum(g_i ** 2))``: the 2-norm of all gradients taken as one vector.

    Example::

        norm = rg.optim.global_norm([g for _, g in params_grads])
    """
    if not grads:
        raise ProgramError("global_norm needs at least one gradient")
    if len({g.dtype for g in grads}) == 1:
        return append_op("GlobalNorm", list(grads), name="global_norm")[0]
    squares = [reduce_sum(square(g)) for g in grads]      # mixed dtypes: add_n says what it needs
    return sqrt(squares[0] if len(squares) == 1 else add_n(squares))


def _global_norm_rule(ins, attrs):
    for x in ins:
        require_float(x)
    if not ins or len({x.dtype for x in ins}) != 1:
        raise ShapeError(f"GlobalNorm needs one or more tensors of one float dtype, got "
                         f"{', '.join(x.type_str() for x in ins) or 'none'}")
    return [((), ins[0].dtype)]


def _global_norm_grad(g):
    scale = g.dy / g.y
    return [None if x is None else x * scale for x in g.x]


@defop("GlobalNorm", inputs=("xs*",), infer=_global_norm_rule, grad=_global_norm_grad)
def _global_norm(k, *xs):
    """``sqrt(sum_i sum(x_i ** 2))`` in the inputs' dtype (``Backend.global_norm``)."""
    return k.backend.global_norm(list(xs))


@lowers("GlobalNorm")
def _global_norm_onnx(g):
    flat = g.const([-1], "int64")
    sums = [g.node("ReduceSum", [g.node("Reshape", [g.node("Mul", [x, x]), flat])], keepdims=0)
            for x in g.ins]
    return [g.node("Sqrt", [sums[0] if len(sums) == 1 else g.node("Sum", sums)])]


def clip_by_global_norm(grads: Sequence[Var], clip_norm: float) -> tuple[list[Var], Var]:
    """Scale every gradient by ``min(1, clip_norm / (norm + 1e-6))``; return them and the norm.

    The same rule as ``torch.nn.utils.clip_grad_norm_``: when the global norm
    exceeds ``clip_norm`` all gradients shrink together, keeping their
    direction; otherwise they are unchanged. The returned norm (before
    clipping) can be fetched to watch training.

    Example::

        clipped, norm = rg.optim.clip_by_global_norm([g for _, g in params_grads], 5.0)
    """
    if not clip_norm > 0:
        raise ProgramError(f"clip_norm must be positive, got {clip_norm}")
    norm = global_norm(grads)
    scale = minimum(float(clip_norm) / (norm + NORM_EPS), 1.0)
    return [g * scale for g in grads], norm
