"""A batch-separable forward in micro-batches, each one's backward right after its forward: a
transformer stack under a memory budget.

Every op of a transformer language model computes each sequence of the batch
from that sequence alone (embedding, layer norms, projections, attention over
the sequence's own positions, the MLP, the output layer and its loss): its ops
are *batch-separable* over axis 0 of the fed ``[N, ...]`` values. When the
loss is the mean (or sum) of their per-row result, the gradient of one
micro-batch of ``N / C`` rows needs nothing of the others, so the forward and
the backward of each micro-batch run one after the other and their
parameter gradients are summed (gradient accumulation inside one step)::

    Before:   x = Gather(emb, ids); ...blocks...; xent = SoftmaxCrossEntropy(head, labels); loss = Mean(xent)
              <the backward of loss>
    After:    ids.mb0.* = Split(ids, C); x.mb0 = Gather(emb, ids.mb0.0); ...; xent.mb0 = ...
              m0 = Mean(xent.mb0);  <the backward of m0 / C>                       -> w.grad
              ids.mb1.* = Split(ids, C); ...; m1 = Mean(xent.mb1);  <its backward> -> w.grad_1
              w.grad + w.grad_1 ...
              xent = Concat(xent.mb0, .., xent.mb{C-1});  loss = Mean(xent)

One micro-batch's activations live at a time and nothing is recomputed: the
peak falls by about ``(C - 1) / C`` of the activations for a few more, smaller
GEMMs. The whole-program budget (``budget.py``) takes the fewest micro-batches
that fit for a transformer stack (``Region.attends``), whose sub-layers over
the whole batch were the units a recompute schedule re-ran (the attention
among them) and held whole.
Gradients are store-all's to rounding (sums over rows run in another order).

A program is split only when the ops reading the batch read it along axis 0,
are all declared ``row_wise`` or ``batch_rows`` with their ops (no random op: its draws would differ) up to one
value they give the rest of the program, no larger than the fed batch, which
one ``Mean`` or ``Sum`` over all axes turns into the loss. ``N`` must divide by
``C`` at run time (``Split``'s rule).

The batch may also come on another axis (time-major ``[T, N]`` windows, as ``retrograd train``
feeds them: the fed value's one ``-1`` axis): layout ops that declare where they move it
(``defop(batch_axis=)``: ``Transpose``; a ``Reshape`` folding fixed leading axes into the rows,
``[T, N, V] -> [T * N, V]``, whose rows are then ordered (time step, batch element)) carry it
to axis 0 or back, and the joined rows are put back in that order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ProgramError
from ..ir.analysis import op_reads
from ..ir.program import Block, Op, Program, Var
from ..ops.core.registry import ROW_WISE_ELEMENTWISE, get_op_def
from .sizes import Shapes

ATTENTION = "ScaledDotProductAttention"
JOIN = "Concat"                # the micro-batches' rows joined for the rest of the program
MOST_MICRO_BATCHES = 16      # more would multiply the ops (and the planning) for little less memory


def micro_batch_counts(rows: int) -> list[int]:
    """The micro-batch counts tried for a batch of ``rows``, fewest first: those dividing it, up to
    ``MOST_MICRO_BATCHES``."""
    return [c for c in range(2, min(rows, MOST_MICRO_BATCHES) + 1) if rows % c == 0]


ROWS = (0, 1)      # a value's batch layout: (its batch axis, fixed groups ordering its rows before it)


@dataclass
class Region:
    """The separable ops of a forward (indices), the fed values they split (with their batch axes),
    the one value joined and its batch layout."""
    ops: list[int]
    feeds: list[str]
    joined: str
    rows: int                                     # N at the feed shapes
    attends: bool = False                         # attention among the ops (a transformer stack)
    feed_axes: dict[str, int] | None = None       # a fed value -> its batch axis (None: all 0)
    joined_layout: tuple[int, int] = ROWS         # (batch axis, groups) of the joined value


def separable_region(block: Block, shapes: Shapes) -> Region | None:
    """The batch-separable ops of ``block`` (all its ops: call before building the backward), or
    None when the program cannot be split (see the module's rules)."""
    axes = {name: axis for name, var in block.vars.items() if (axis := _fed_batch_axis(var, shapes)) is not None}
    feeds = list(axes)
    sizes = {shapes[name][axes[name]] for name in feeds}
    if len(sizes) != 1 or min(sizes) < 2:
        return None
    rows = sizes.pop()
    batch = {name: (axis, 1) for name, axis in axes.items()}     # value -> its batch layout
    region, after, read_after = [], [], []
    for i, op in enumerate(block.ops):
        reads = [n for n in op_reads(op) if n in batch]
        if not reads:
            if region and any(n in batch for n in op.outputs):
                return None
            continue
        layout = None if after else _separable(block, op, batch, shapes, rows)
        if layout is not None:
            region.append(i)
            batch.update((name, layout) for name in op.outputs)
        else:
            after.append(i)
            read_after += [n for n in reads if n not in feeds]
    joined = list(dict.fromkeys(read_after))
    used = {n for i in region for n in op_reads(block.ops[i]) if n in feeds}
    if not region or len(joined) != 1 or not used or not _joinable(block.var(joined[0]), batch[joined[0]]):
        return None
    fed = sum(_bytes(block, n, shapes) for n in used)
    if _bytes(block, joined[0], shapes) > fed:
        return None
    attends = any(block.ops[i].type == ATTENTION for i in region)
    return Region(region, sorted(used), joined[0], rows, attends, {n: axes[n] for n in used}, batch[joined[0]])


def _fed_batch_axis(var: Var, shapes: Shapes) -> int | None:
    """A fed value's batch axis: axis 0 where it is declared -1, else its one -1 axis."""
    if not var.is_data or var.ndim < 1:
        return None
    open_axes = [axis for axis, d in enumerate(var.shape) if d < 0]
    if not open_axes or (open_axes[0] != 0 and len(open_axes) > 1):
        return None
    axis = open_axes[0]
    return axis if shapes.get(var.name, var.shape)[axis] > 0 else None


def _joinable(var: Var, layout: tuple[int, int]) -> bool:
    """The micro-batches' pieces can be put back into ``var``'s order: along its batch axis, or for
    rows grouped in front of the batch, with the axes after the rows fixed."""
    axis, groups = layout
    return groups == 1 or (axis == 0 and all(d >= 0 for d in var.shape[1:]))


def _bytes(block: Block, name: str, shapes: Shapes) -> int:
    var = block.var(name)
    return int(np.prod([max(d, 1) for d in shapes.get(name, var.shape)])) * np.dtype(var.dtype).itemsize


def _separable(block: Block, op: Op, batch: dict, shapes: Shapes, rows: int) -> tuple[int, int] | None:
    """The batch layout of ``op``'s outputs when it computes each batch element's part of them from
    that element's part of its inputs holding the batch (``batch``: name -> layout), the others
    read whole; else None."""
    opdef = get_op_def(op.type)
    if op.sub_blocks() or opdef.random or any(block.var(n).persistable for n in op.outputs):
        return None
    moves = opdef.extra.get("batch_axis")          # a layout op moving the batch axis (registry.py)
    if moves is not None and len(op.inputs) == 1:
        (axis, groups), var = batch[op.inputs[0]], block.var(op.inputs[0])
        if groups != 1:
            return None
        try:
            return moves(axis, shapes.get(var.name, var.shape), var.shape, op.attrs)
        except Exception as exc:      # a user's declaration: named, not passed through bare
            error = ProgramError(f"{op.where()}: its defop(batch_axis=) declaration failed on '{var.name}' "
                                 f"{shapes.get(var.name, var.shape)} (batch axis {axis}): "
                                 f"{type(exc).__name__}: {exc}")
            error.declaration = True     # not a size the budget may plan around: raised
            raise error from exc
    layouts = {batch[n] for n in op.inputs if n in batch}
    if len(layouts) != 1 or next(iter(layouts))[0] != 0:
        return None                   # rows along axis 0, all batch inputs alike
    layout = layouts.pop()
    return layout if _rows_separable(block, op, opdef, batch, shapes, rows * layout[1]) else None


def _rows_separable(block: Block, op: Op, opdef, batch: dict, shapes: Shapes, rows: int) -> bool:
    """True when ``op`` computes each row of its outputs from the same rows of its inputs holding
    the batch, the others read whole (as its declaration says)."""
    # declared with the op (ops/registry.py): row-wise ops, and those separable over axis 0 only
    rule = opdef.extra.get("batch_rows", opdef.extra.get("row_wise"))
    if rule is None:
        return False
    rank = len(shapes.get(op.outputs[0], block.var(op.outputs[0]).shape))
    positions = range(len(op.inputs)) if rule == ROW_WISE_ELEMENTWISE else {p % len(op.inputs) for p in rule}
    broadcasts = rule == ROW_WISE_ELEMENTWISE or opdef.extra.get("batch_broadcast", False)
    for p, name in enumerate(op.inputs):
        shape = shapes.get(name, block.var(name).shape)
        if name in batch:
            if p not in positions or shape[0] != rows or (rule == ROW_WISE_ELEMENTWISE and len(shape) != rank):
                return False
        elif p in positions and not (broadcasts and (len(shape) < rank or shape[0] == 1)):
            return False             # a whole value where rows are read, not broadcast over them
    return True


def _micro_batch(program: Program, block: Block, ops: list[Op], feed_axes: dict[str, int], chunks: int, c: int,
                 built: list[Op]) -> dict[str, str]:
    """Copies of ``ops`` over micro-batch ``c`` appended to ``built``; forward name -> copy name."""
    mapping: dict[str, str] = {}
    for op in ops:
        for name in op.inputs:
            if name in feed_axes and name not in mapping:
                pieces = [_fresh(program, block, name, f"mb{c}.{j}") for j in range(chunks)]
                built.append(Op("Split", [name], pieces, {"axis": feed_axes[name], "num": chunks, "sections": None},
                                location=op.location))
                mapping[name] = pieces[c]
        outputs = [_fresh(program, block, name, f"mb{c}") for name in op.outputs]
        mapping.update(zip(op.outputs, outputs))
        built.append(Op(op.type, [mapping.get(n, n) for n in op.inputs], outputs, dict(op.attrs),
                        location=op.location))
    return mapping


def _join(program: Program, block: Block, parts: list[str], region: Region, location) -> list[Op]:
    """Ops putting the micro-batches' pieces back into ``region.joined``, in its order: joined along
    the batch axis; rows ordered (group, batch element) are regrouped first,
    ``[G * n, ...] -> [G, n, ...]``, joined along the batch and folded back."""
    axis, groups = region.joined_layout
    joined = block.var(region.joined)
    if groups == 1:
        return [Op(JOIN, parts, [region.joined], {"axis": axis}, location=location)]
    rest = list(joined.shape[1:])
    ops, grouped = [], []
    for part in parts:
        grouped.append(_fresh(program, block, part, "grouped", (groups, -1, *rest)))
        ops.append(Op("Reshape", [part], [grouped[-1]], {"shape": [groups, -1] + rest}, location=location))
    both = _fresh(program, block, region.joined, "grouped", (groups, -1, *rest))
    ops.append(Op(JOIN, grouped, [both], {"axis": 1}, location=location))
    ops.append(Op("Reshape", [both], [region.joined], {"shape": [-1] + rest}, location=location))
    return ops


def _parameter_feeders(block: Block, region: Region, params: set[str]) -> set[int]:
    """Indices of the ops before the region's end, outside it, whose values the region reads
    (directly or through each other) and that read one of ``params`` on the way."""
    inside = set(region.ops)
    producers = {name: i for i, op in enumerate(block.ops[:region.ops[-1]]) if i not in inside
                 for name in op.outputs}
    feeding, stack = set(), [n for i in region.ops for n in op_reads(block.ops[i]) if n in producers]
    while stack:
        index = producers[stack.pop()]
        if index not in feeding:
            feeding.add(index)
            stack.extend(n for n in op_reads(block.ops[index]) if n in producers)
    from_params: set[str] = set(params)
    chosen = set()
    for index in sorted(feeding):
        op = block.ops[index]
        if any(n in from_params for n in op_reads(op)):
            chosen.add(index)
            from_params.update(op.outputs)
    return chosen


def _fresh(program: Program, block: Block, name: str, tag: str, shape=None) -> str:
    var = block.var(name)
    new = program.unique_name(f"{name}.{tag}")
    block.create_var(new, var.shape if shape is None else shape, var.dtype, stop_gradient=var.stop_gradient)
    return new


# --- gradient accumulation: each micro-batch's backward right after its forward ----------------------

LOSS_TYPES = {"Mean": True, "Sum": False}       # the loss over the joined rows -> averaged (True) or summed


def loss_over_rows(block: Block, region: Region, loss: str) -> str | None:
    """The op type of the one op after ``region`` reading its joined rows when that op reduces them
    (all axes) to ``loss`` (``Mean`` or ``Sum``): then each micro-batch's gradient needs nothing of
    the others, and micro-batches are accumulated; else None."""
    readers = [op for op in block.ops if region.joined in op_reads(op)]
    if len(readers) != 1 or readers[0].outputs != [loss] or readers[0].type not in LOSS_TYPES:
        return None
    op = readers[0]
    if op.attrs.get("axis") is not None or op.attrs.get("keepdims"):
        return None
    return op.type


def accumulate_micro_batches(program: Program, block: Block, region: Region, chunks: int, loss: str,
                             params: list[str], no_grad: set, callbacks=None) -> list[tuple]:
    """Rewrite ``block`` (its forward only; ``loss_over_rows`` holds) so each of ``chunks``
    micro-batches runs its forward and then its backward, the parameters' gradients summed as they
    come: nothing is recomputed, one micro-batch's activations live at a time. Return
    ``[(param, grad)]`` for ``params`` that get one (``no_grad``, ``callbacks``: as
    ``append_backward``'s).

    Micro-batch ``c``'s backward is that of ``Mean(rows_c) / C`` (a mean of equal pieces), or
    of ``Sum(rows_c)``, seeded as ``append_backward`` seeds (``rg.memory.report`` finds the first
    micro-batch's seed: its backward part starts there); the loss is still computed from all the
    rows, joined.

    Example::

        region = separable_region(block, resolve_shapes(block, feed_shapes))
        pairs = accumulate_micro_batches(main, block, region, 8, loss.name, ["w", "b"], set())
    """
    from ..autodiff.backward import build_backward       # autodiff imports memory's rewrites
    from ..ir.builder import block_guard, capture_ops
    from ..ops.array.creation import fill_like

    reducer = next(op for op in block.ops if region.joined in op_reads(op))
    # Ops the region reads that make values from parameters without the batch (learned positions)
    # run in every micro-batch too: its backward reaches those parameters through them.
    ops = [block.ops[i] for i in sorted(set(region.ops) | _parameter_feeders(block, region, set(params)))]
    last = region.ops[-1]
    block_ops = list(block.ops)
    before = [op for i, op in enumerate(block.ops[:last]) if i not in set(region.ops)]
    rest = block.ops[last + 1:]
    block.ops[:] = []
    for op in before:
        block.append_op(op)
    grads: dict[str, Var] = {}
    parts = []
    for c in range(chunks):
        built: list[Op] = []
        feed_axes = region.feed_axes or dict.fromkeys(region.feeds, 0)
        parts.append(_micro_batch(program, block, ops, feed_axes, chunks, c, built)[region.joined])
        piece = block.var(parts[-1])
        reduced = block.create_var(program.unique_name(f"{loss}.mb{c}"), (), piece.dtype)
        built.append(Op(reducer.type, [piece.name], [reduced.name], dict(reducer.attrs),
                        location=reducer.location))
        with block_guard(block), capture_ops() as scaling:     # a mean of equal pieces
            part_loss = reduced * (1.0 / chunks) if LOSS_TYPES[reducer.type] else reduced
        built += scaling
        with block_guard(block), capture_ops() as seeding:     # seeded as append_backward seeds
            seed = fill_like(part_loss, 1.0)
        for op in built + seeding:
            block.append_op(op)
        result = build_backward(built, block, block, {part_loss.name: seed}, params, no_grad, callbacks)
        with block_guard(block):
            for name in params:
                grad = result.grads.get(name)
                if grad is not None:
                    grads[name] = grad if name not in grads else grads[name] + grad
    for op in _join(program, block, parts, region, block_ops[last].location):
        block.append_op(op)
    for index in region.ops:            # the feeders' values stay: the ops before the region make them
        for name in block_ops[index].outputs:
            if name != region.joined:
                block.vars.pop(name, None)
    for op in rest:
        block.append_op(op)
    program.bump()
    return [(block.var(name), grads[name]) for name in params if name in grads]
