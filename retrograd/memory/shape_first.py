"""The first rung of the ``cheap_first`` memory policy (``policies.py``): store everything, with the
values the backward reads only for their shape freed at their last real use.

A store-all recurrence's gradient (``RecurrentNetworkGrad``) reads its sequences for their shape
alone when its backward step reads the step inputs nowhere (an LSTM's hoisted input projection
``[T, N, 4H]``), though the op does not declare them ``shape_only``; ``read_for_shape`` knows,
and ``shape_reads.bind_shape_stand_ins`` gives them one-element stand-ins. Nothing is recomputed.
"""
from __future__ import annotations

from ..errors import ProgramError
from ..ir.analysis import op_reads
from ..ir.program import Op, Var
from . import policies
from .peak import planned_peak
from .shape_reads import bind_shape_stand_ins, shape_only_positions


def read_for_shape(op: Op) -> frozenset[int]:
    """Input positions ``op`` reads only for their shape: what it declares, and for a store-all
    recurrence's gradient the sequences whose step input its backward step reads nowhere (and
    no time-batched product takes)."""
    declared = shape_only_positions(op)
    if op.type != "RecurrentNetworkGrad":
        return declared
    attrs = op.attrs
    reads = {name for inner in attrs["backward"].ops for name in op_reads(inner)}
    batched = {ref for _, kind, ref, _ in attrs["batched"] if kind == "seq"}
    return declared | {i for i, name in enumerate(attrs["inputs_t"]) if name not in reads and i not in batched}


def store_all_freeing_shape_reads(loss: Var, feed_shapes, build, budget: int) -> tuple[list, int] | None:
    """Store everything, the shape-only reads freed at their last real use, when that fits
    ``budget`` (tried on a copy): ``(pairs, planned peak)`` built into the program, else None."""
    if not policies.frees_shape_reads() or not any(op.type == "RecurrentNetwork" for op in loss.block.ops):
        return None
    scratch = loss.block.program.clone()
    block = scratch.global_block()
    pairs, n_forward = build(block.var(loss.name), real=False)
    if not bind_shape_stand_ins(block, n_forward, read_for_shape):
        return None
    try:
        peak = planned_peak(block, [loss.name] + [g.name for _, g in pairs], feed_shapes)
    except ProgramError:        # a while loop's trip count decides what storing everything takes
        return None
    if peak > budget:
        return None
    pairs, n_forward = build()
    bind_shape_stand_ins(loss.block, n_forward, read_for_shape)
    return pairs, peak
