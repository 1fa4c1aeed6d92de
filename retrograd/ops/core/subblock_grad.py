"""The backward of a sub-block, detached into a block of its own for a control-flow gradient op.

Gradients of control-flow ops are the same kind of op over a derived block
(the backward of the sub-block, built by ``autodiff.build_backward``). The
gradient maker decides which forward values the backward block reads and
rewrites the forward op to output them: nothing is kept unless a gradient is
built, and then only what the backward reads.
"""
from __future__ import annotations

from typing import Callable, Sequence

from ...ir.analysis import free_reads
from ...ir.program import Block, Op, Var
from ..math.elementwise import add_n
from .registry import build_sub_backward, get_op_def
from .subblocks import build_into, unique


def run_backward(grad_block: Block, fwd: Block, parts: dict[str, list[Var]], wrt: list[str],
                 callbacks: Sequence[Callable] = ()) -> dict:
    """Build into ``grad_block`` (a child of ``fwd``) the backward of ``fwd`` from the gradients
    ``parts`` (summed per forward name) to ``wrt``; the gradient Var (or None) per name.
    ``callbacks`` (``append_backward``'s) are called for its gradient ops too."""
    with build_into(grad_block):
        targets = {name: vs[0] if len(vs) == 1 else add_n(vs) for name, vs in parts.items()}
    if not targets or not wrt:
        return {name: None for name in wrt}
    return dict(build_sub_backward(list(fwd.ops), fwd, grad_block, targets, list(wrt), callbacks=callbacks).grads)


def report_ops(block: Block, ops: Sequence[Op], callbacks: Sequence[Callable]) -> None:
    """Call ``append_backward``'s callbacks for gradient ops a maker appended itself."""
    for op in ops:
        for cb in callbacks:
            cb(block, {"__current_op__": op, "__current_op_desc__": op})


def _recomputable(op: Op) -> bool:
    """Cheaper to run again in the backward block than to keep: ops that read nothing (constants)."""
    return not op.inputs and not op.sub_blocks() and not get_op_def(op.type).random


def detach(grad_block: Block, fwd: Block, parent: Block, fetch: Sequence[str],
            bound: Sequence[str]) -> tuple[list[str], set[str]]:
    """Move ``grad_block`` (built as a child of ``fwd`` to see its values) under ``parent``.

    The values of ``fwd`` it reads become variables of its own: constants are
    recomputed there, the rest are bound by the gradient op to values the
    forward op saves. Returns the names of those saved values, and the subset
    read only for their shape (the ``like`` of ``SumTo``). Variables that
    gradient makers declared for results nobody wanted (no op writes them) go.
    """
    written = {name for op in grad_block.ops for name in op.outputs}
    for name in [n for n in grad_block.vars if n not in written and n not in bound]:
        del grad_block.vars[name]
    wanted = [n for n in unique(free_reads(grad_block) + list(fetch))
              if n not in grad_block.vars and n in fwd.vars]
    producer = {name: op for op in fwd.ops for name in op.outputs}
    saved, remade = [], []
    for name in wanted:
        op = producer.get(name)
        if op is not None and _recomputable(op):
            if not any(op is r for r in remade):
                remade.append(op)
        else:
            saved.append(name)
    for i, op in enumerate(remade):
        for name in op.outputs:
            var = fwd.vars[name]
            grad_block.create_var(name, var.shape, var.dtype)
        grad_block.insert_op(i, Op(op.type, [], list(op.outputs), dict(op.attrs), location=op.location))
    for name in saved:
        var = fwd.vars[name]
        grad_block.create_var(name, var.shape, var.dtype)
    grad_block.parent_idx = parent.idx
    grad_block.program.bump()
    return saved, _read_only_for_shape(grad_block, fetch) & set(saved)


def _read_only_for_shape(block: Block, fetch: Sequence[str]) -> set[str]:
    """Names the ops of ``block`` read only through inputs their op marks ``shape_only``."""
    full, shape = set(fetch), set()
    for op in block.ops:
        only = get_op_def(op.type).extra.get("shape_only", ())
        for i, name in enumerate(op.inputs):
            (shape if i in only else full).add(name)
        for sub in op.sub_blocks():
            full.update(free_reads(sub))
    return shape - full
