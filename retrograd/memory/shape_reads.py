"""Gradient ops that read a forward value only for its shape read a one-element stand-in instead.

Many gradients need an input's run-time shape and nothing else: the gradient
of ``mean(x)`` is ``ExpandAs(dy, x)``, of a broadcast add ``SumTo(dy, a)``.
Read as it is, ``x`` stays alive from the forward until late in the backward.
Ops mark such inputs ``shape_only`` (``OpDef.extra``); this pass gives every
forward value read that way by a gradient op a ``ShapeStandIn`` written right
after the value (a zero-stride view of one zero with the value's run-time
shape and dtype) and makes those inputs read it, so the value dies at its last
real use. Before/after, for ``loss = mean(h * h)``::

    before                                  after
    m = Mul(h, h)                           m = Mul(h, h)
                                            m.shape = ShapeStandIn(m)
    loss = Mean(m)                          loss = Mean(m)
    ...                                     ...
    m.grad = ExpandAs(loss.grad, m)         m.grad = ExpandAs(loss.grad, m.shape)

A value gets a stand-in only when that shortens its life: some shape-only read
by the backward comes after every other read of it, and it may hold more
than one element. Stand-ins have no gradient and their input none either:
gradients of gradients never need the value behind a shape.
``append_backward`` and ``gradients`` apply the pass to the backward they build.
"""
from __future__ import annotations

import math

from ..autodiff.rewrites import register_backward_rewrite
from ..ir.analysis import op_reads
from ..ir.builder import block_guard, capture_ops
from ..ir.program import Block, Op
from ..ops.array.creation import shape_stand_in
from ..ops.core.registry import get_op_def
from .lifetimes import ForwardValues


def shape_only_positions(op: Op) -> frozenset[int]:
    """Input positions ``op`` reads only for their run-time shape (``OpDef.extra['shape_only']``)."""
    return frozenset(get_op_def(op.type).extra.get("shape_only", ()))


def stand_in_names(block: Block) -> set[str]:
    """Values of ``block`` written by ops that make stand-ins (``OpDef.extra['stand_in']``): they
    cost one element whatever their declared shape."""
    return {name for op in block.ops if get_op_def(op.type).extra.get("stand_in", False) for name in op.outputs}


@register_backward_rewrite("shape_stand_ins")
def bind_shape_stand_ins(block: Block, n_forward: int, positions=None) -> int:
    """Make the ops after ``block.ops[:n_forward]`` read shapes of forward values from stand-ins.

    A backward op that reads a forward value only for its shape (``shape_only``
    inputs, e.g. ``ExpandAs(dy, h)``) reads a one-element ``ShapeStandIn`` of it
    instead, so the value itself can be freed early.

    Args:
        block: The block.
        n_forward: How many of its first ops are the forward.
        positions: ``positions(op)``: the input positions ``op`` reads for their shape only
            (default: what the op declares, ``shape_only_positions``; a memory policy may
            know more, ``policies.py``).

    Returns:
        How many stand-in ops were inserted into the forward part (the backward
        now starts at ``n_forward`` plus that).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [-1, 4])
            h = rg.tanh(x)
            y = rg.exp(h)                                  # the forward
        block = main.global_block()
        n = len(block.ops)
        with rg.program_guard(main):
            z = rg.zeros_like(h)                           # reads h for its shape only
        n += rg.memory.bind_shape_stand_ins(block, n)
        assert block.ops[-1].inputs == [h.name + ".shape"]
        (out,) = rg.Executor().run(main, feed={"x": np.ones((3, 4), "float32")}, fetch_list=[z])
        assert out.shape == (3, 4)
        ```
    """
    info = ForwardValues.of(block, n_forward)
    shape_reads: dict[str, list[tuple[Op, int]]] = {}   # forward value -> (backward op, input position)
    last_shape_read: dict[str, int] = {}
    last_other_read: dict[str, int] = {}
    for i, op in enumerate(block.ops):
        only = (positions or shape_only_positions)(op) if i >= n_forward else frozenset()
        if not only:                    # most ops: every read a real one
            others = op_reads(op)
        else:
            for j, name in enumerate(op.inputs):
                if j in only:
                    shape_reads.setdefault(name, []).append((op, j))
                    last_shape_read[name] = i
            others = [n for j, n in enumerate(op.inputs) if j not in only] + op_reads(op)[len(op.inputs):]
        for name in others:
            last_other_read[name] = i
    chosen = [name for name in shape_reads if _worth_a_stand_in(info, name)
              and last_other_read.get(name, -1) < last_shape_read[name]]
    for name in sorted(chosen, key=info.producer, reverse=True):
        with block_guard(block), capture_ops() as ops:
            stand_in = shape_stand_in(block.var(name))
        for k, op in enumerate(ops):
            block.insert_op(info.producer(name) + 1 + k, op)
        for op, j in shape_reads[name]:
            op.inputs[j] = stand_in.name
    if chosen:
        block.program.bump()
    return len(chosen)


def _worth_a_stand_in(info: ForwardValues, name: str) -> bool:
    """A value the forward computes once, not persistable, not a stand-in, possibly bigger than one element."""
    if not info.is_temporary(name):
        return False
    producer = info.block.ops[info.producer(name)]
    if get_op_def(producer.type).extra.get("stand_in", False):
        return False
    shape = info.block.var(name).shape
    return any(d < 0 for d in shape) or math.prod(shape) > 1
