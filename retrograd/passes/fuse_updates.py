"""``fuse_optimizer_updates``: a program's Adam updates as one ``FusedAdamUpdate`` op.

A training program ends with one ``AdamUpdate`` per parameter. The ones that
share their hyper-parameters (lr, betas, eps, weight decay, AdamW's decoupling), their
learning-rate input (a schedule's Var, if any) and dtype become one op (``retrograd/optim/fused.py``), placed where the last of them was.
Moving an earlier update down to that place is safe only when nothing in
between reads or writes what it reads or writes; updates for which that does
not hold stay as they are.
"""
from __future__ import annotations

from ..ir.analysis import op_reads
from ..ir.program import Block, Op, Program
from ..ops.optim.fused_adam import GROUPS

ATTRS = ("lr", "beta1", "beta2", "eps", "weight_decay", "decoupled")


def fuse_optimizer_updates(program: Program, keep=frozenset()) -> int:
    """Fuse the global block's ``AdamUpdate`` ops in place; return how many ops were removed.
    (``keep``, the names a run fetches, is the passes' common argument: this pass removes no
    value.)

    Example::

        removed = rg.passes.fuse_optimizer_updates(main)
    """
    block = program.global_block()
    removed = 0
    for group in _groups(block):
        written = [name for op in group for name in op.outputs]
        if len(set(written)) != len(written):    # one parameter updated twice: keep the order as it is
            continue
        movable = _movable(block, group)
        if len(movable) >= 2:
            _replace(block, movable)
            removed += len(movable) - 1
    return removed


def _groups(block: Block) -> list[list[Op]]:
    """AdamUpdate ops keyed by their hyper-parameters and the parameter's dtype, in program order."""
    groups: dict[tuple, list[Op]] = {}
    for op in block.ops:
        # Updates reading a rate Var (a schedule's) fuse with those reading the same one.
        if op.type == "AdamUpdate" and len(op.inputs) in (len(GROUPS), len(GROUPS) + 1):
            key = tuple(op.attrs.get(a, 0.0) for a in ATTRS) + (block.find_var(op.inputs[0]).dtype,
                                                                 tuple(op.inputs[len(GROUPS):]))
            groups.setdefault(key, []).append(op)
    return list(groups.values())


def _movable(block: Block, group: list[Op]) -> list[Op]:
    """The ops of ``group`` that can move down to the last one's place unchanged in meaning."""
    last = group[-1]
    end = last.index()
    kept = [last]
    for op in reversed(group[:-1]):
        touched = set(op.inputs) | set(op.outputs)
        between = block.ops[op.index() + 1:end]
        if all(not (touched & (set(op_reads(other)) | set(other.outputs))) for other in between
               if other not in kept):
            kept.insert(0, op)
    return kept


def _replace(block: Block, ops: list[Op]) -> None:
    """Remove ``ops`` and put one FusedAdamUpdate where the last of them was."""
    inputs = [op.inputs[i] for i in range(len(GROUPS)) for op in ops] + list(ops[0].inputs[len(GROUPS):])
    outputs = [op.outputs[i] for i in range(4) for op in ops]
    attrs = {a: ops[0].attrs[a] for a in ATTRS if a in ops[0].attrs}
    attrs["n"] = len(ops)
    fused = Op("FusedAdamUpdate", inputs, outputs, attrs, location=ops[-1].location)
    position = ops[-1].index()
    for op in reversed(ops):
        block.remove_op(op.index())
        position -= 1
    block.insert_op(position + 1, fused)
