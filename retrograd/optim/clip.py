"""Gradient clipping by global norm, built from ordinary ops (so it prints and runs like any op)."""
from __future__ import annotations

from typing import Sequence

from ..errors import ProgramError
from ..ir.program import Var
from ..ops.math import add_n, minimum, sqrt, square
from ..ops.reduce import sum as reduce_sum

# PyTorch's clip_grad_norm_ adds this to the norm before dividing.
NORM_EPS = 1e-6


def global_norm(grads: Sequence[Var]) -> Var:
    """``sqrt(sum_i sum(g_i ** 2))``: the 2-norm of all gradients taken as one vector.

    Example::

        norm = rg.optim.global_norm([g for _, g in params_grads])
    """
    if not grads:
        raise ProgramError("global_norm needs at least one gradient")
    squares = [reduce_sum(square(g)) for g in grads]
    return sqrt(squares[0] if len(squares) == 1 else add_n(squares))


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
