"""Per-step outputs of ``rg.recurrent`` that are not states (PaddlePaddle's ``step_output``).

``step_fn`` may return ``(new_states, outputs)``; each output becomes a state
that the step never reads, so the op stacks it over time like any state (its
``all``), with gradients, budgets, ONNX export and every backend unchanged.
Its initial value (slot 0, never read) is zeros ``[N, ...]``, ``N`` taken at
run time from the first input sequence ``[T, N, ...]`` (also when T = 0).
"""
from __future__ import annotations

import math

from ...errors import ProgramError
from ...ir.program import Var
from ..array.creation import fill, fill_like
from ..reduce.reductions import sum as reduce_sum
from ..array.tensor import reshape, slice


def split_step_result(result) -> tuple[object, list | None]:
    """``(new_states, outputs)`` when ``step_fn`` returned two lists, else ``(result, None)``."""
    if isinstance(result, tuple) and len(result) == 2 and all(isinstance(r, (list, tuple)) for r in result):
        return list(result[0]), list(result[1])
    return result, None


def output_init(output: Var, seq: Var, what: str) -> Var:
    """Zeros shaped like one step of ``output``: ``[N, ...]`` with ``N`` from ``seq [T, N, ...]``."""
    rest = output.shape[1:]
    if output.ndim < 1 or any(d < 0 for d in rest) or seq.ndim < 2:
        raise ProgramError(f"recurrent(): {what} '{output.name}' is {output.type_str()}; a per-step output "
                           "must be [N, ...] with its sizes after the batch axis known, for an input "
                           "sequence [T, N, ...]")
    # N from a sum over time (and features) of zeros [T, N, 1, ...]: an empty sequence has it too.
    feature_axes = list(range(2, seq.ndim))
    thin = slice(seq, feature_axes, [0] * len(feature_axes), [1] * len(feature_axes)) if feature_axes else seq
    zero = 0.0 if output.dtype.startswith("float") else 0
    column = reshape(reduce_sum(fill_like(thin, zero, dtype=output.dtype), axis=[0] + feature_axes), [-1, 1])
    zeros = column + fill([1, math.prod(rest)], zero, dtype=output.dtype)   # [N, prod(rest)]
    return reshape(zeros, [-1] + list(rest))
