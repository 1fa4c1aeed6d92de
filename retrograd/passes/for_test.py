"""``make_test_program``: a training program's evaluation form, for ``Program.clone(for_test=True)``.

A training program is its forward ops, then the backward, then the updates::

    forward    h = fc(x); h = dropout(h); loss = mean(...)      kept (dropout, batch_norm: is_test)
    backward   loss.grad = fill_like(loss); ... w.grad = ...      removed: they only feed the updates
    updates    AllReduce(w.grad); AdamUpdate(w, ...)             removed: they write persistables
                                                                 or only feed ops that do

Nothing marks which op is which, so the pass works from what ops do:

1. the roots of training are the ops of block 0 that write a persistable
   (optimizer updates, step counters, running-statistics updates) and the ops
   registered ``train_only=True``;
2. then, walking back, an op goes too when every op reading its outputs has
   gone (the gradient ops, the backward's seed, ``AllReduce`` of gradients, a
   learning-rate schedule). Reads only for the shape (``shape_only``: the seed
   ``fill_like(loss)``) do not make an op go, unless it is a shape stand-in
   made for the backward; so the loss itself stays, as does every forward
   value nothing reads (an accuracy, the logits): they remain fetchable.

Gradient ops that no update reads (a program with ``append_backward`` and no
optimizer) are not told apart from forward values nothing reads, so they
stay; clone such a program before ``append_backward`` instead (its Vars are
fetchable from the clone all the same).

Ops registered ``test_mode=True`` (``Dropout``, ``BatchNorm``) get
``attrs["is_test"] = True``; their kernels and lowerings read it.
"""
from __future__ import annotations

from ..ir.analysis import free_reads
from ..ir.program import Block, Op, Program, register_for_test_pass
from ..ir.verify import verify_program
from ..ops.core.registry import get_op_def


def make_test_program(program: Program) -> None:
    """Rewrite ``program`` (a fresh clone) in place into its forward-only evaluation form."""
    for block in program.blocks:
        for op in block.ops:
            if get_op_def(op.type).extra.get("test_mode", False):
                op.attrs["is_test"] = True
    block = program.global_block()
    dropped = _training_ops(block)
    written = {name for i in dropped for name in block.ops[i].outputs}
    block.ops = [op for i, op in enumerate(block.ops) if i not in dropped]
    _forget_unused_vars(program, written)
    program.bump()
    verify_program(program)


def _training_ops(block: Block) -> set[int]:
    """Indices of the ops of ``block`` that only serve training (see the module's docstring)."""
    ops = block.ops
    dropped = {i for i, op in enumerate(ops) if _is_training_root(op, block)}
    readers: dict[str, set[int]] = {}        # name -> ops reading it (for its value or its shape)
    value_readers: dict[str, set[int]] = {}  # name -> ops reading its value
    for j, op in enumerate(ops):
        values = _value_reads(op)
        for name in (*op.inputs, *values):
            readers.setdefault(name, set()).add(j)
        for name in values:
            value_readers.setdefault(name, set()).add(j)
    for i in reversed(range(len(ops))):
        if i in dropped:
            continue
        consumers = {j for name in ops[i].outputs for j in readers.get(name, ()) if j > i}
        fed = {j for name in ops[i].outputs for j in value_readers.get(name, ()) if j > i}
        if consumers and consumers <= dropped and (fed or _is_stand_in(ops[i])):
            dropped.add(i)
    return dropped


def _is_stand_in(op: Op) -> bool:
    """An op made for the backward that stands in for a value's shape (``ShapeStandIn``)."""
    return get_op_def(op.type).extra.get("stand_in", False)


def _is_training_root(op: Op, block: Block) -> bool:
    if get_op_def(op.type).extra.get("train_only", False):
        return True
    return any(block.var(name).persistable for name in op.outputs)


def _value_reads(op: Op) -> list[str]:
    """The names ``op`` reads for their values: its inputs but those read only for their shape,
    and what its sub-blocks read from outside."""
    shape_only = get_op_def(op.type).extra.get("shape_only", ())
    names = [n for i, n in enumerate(op.inputs) if i not in shape_only]
    for sub in op.sub_blocks():
        names.extend(free_reads(sub))
    return names


def _forget_unused_vars(program: Program, written: set[str]) -> None:
    """Undeclare the temporaries of block 0 that only the dropped ops wrote and used (gradients,
    clipped gradients). (The sub-blocks of dropped ops stay, unreferenced, with what they name.)"""
    used = {name for block in program.blocks for op in block.ops for name in (*op.inputs, *op.outputs)}
    block = program.global_block()
    for name in written - used:
        var = block.vars.get(name)
        if var is not None and not var.persistable:
            del block.vars[name]


register_for_test_pass(make_test_program)
