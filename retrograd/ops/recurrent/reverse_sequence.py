"""``reverse_sequence``: each example's first ``length`` time steps in reverse order.

``x`` is ``[T, N, ...]`` (time first, as ``rg.recurrent`` takes it). Without
``lengths`` the whole time axis is reversed; with ``lengths`` (int ``[N]``)
example ``n`` has its steps ``0 .. lengths[n]-1`` reversed and the rest left
in place (TensorFlow's and ONNX's ``ReverseSequence``). The op is its own
inverse, and so is its gradient. ``rg.recurrent(..., reverse=True)`` runs a
recurrence right to left with it.
"""
from __future__ import annotations

from ...errors import ShapeError
from ...ir.program import Var
from ..core.lowering import lowers
from ..core.registry import append_op, defop


def _rule(ins: list[Var], attrs: dict):
    x = ins[0]
    if x.ndim < 1:
        raise ShapeError(f"'{x.name}' must have a time axis [T, ...], got {x.type_str()}")
    if len(ins) > 1:
        lengths = ins[1]
        if lengths.dtype not in ("int32", "int64") or lengths.ndim != 1 or x.ndim < 2:
            raise ShapeError(f"lengths '{lengths.name}' must be int [N] for a [T, N, ...] input, got "
                             f"{lengths.type_str()} for {x.type_str()}")
    return [(x.shape, x.dtype)]


@defop("ReverseSequence", inputs=("x", "lengths?"), infer=_rule, nondiff=(1,),
       grad=lambda g: [reverse_sequence(g.dy, *g.x[1:])] + [None] * (len(g.x) - 1))
def _reverse_sequence(k, x, lengths=None):
    xp = k.xp
    if lengths is None:
        return xp.flip(x, axis=0)
    steps = x.shape[0]
    t = xp.reshape(xp.arange(steps, dtype=lengths.dtype), (steps, 1))
    n = xp.reshape(lengths, (1, -1))
    source = xp.where(t < n, n - 1 - t, t)                    # [T, N]: the step each slot reads
    source = xp.reshape(source, tuple(source.shape) + (1,) * (x.ndim - 2))
    return xp.take_along_axis(x, xp.broadcast_to(source, x.shape), axis=0)


@lowers("ReverseSequence")
def _reverse_sequence_onnx(g):
    if len(g.ins) == 1:
        ends = g.const([-(2 ** 63)], "int64")
        return [g.node("Slice", [g.ins[0], g.const([-1], "int64"), ends, g.const([0], "int64"),
                                 g.const([-1], "int64")])]
    lengths = g.ins[1] if g.in_vars[1].dtype == "int64" else g.cast(g.ins[1], "int64")
    return [g.node("ReverseSequence", [g.ins[0], lengths], batch_axis=1, time_axis=0)]


def reverse_sequence(x: Var, lengths: Var | None = None) -> Var:
    """``x [T, N, ...]`` with each example's first ``lengths[n]`` steps reversed (all T without).

    Example::

        backwards = rg.reverse_sequence(x, lengths)     # then rg.recurrent over it
    """
    return append_op("ReverseSequence", [x] + ([lengths] if lengths is not None else []))[0]
