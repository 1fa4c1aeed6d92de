"""Per-iteration values a loop (While, Scan) keeps for its backward, stacked into [iterations, ...]."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ... import backend
from ...errors import ExecutionError
from ...ir.program import Block


class Kept:
    """Per-iteration values kept for a backward, held in the run's memory meter until stacked.

    Of a value whose backward reads only its shape (``full`` False) only the
    shape is kept; its stack is a zero-stride stand-in of the right shape.
    """

    def __init__(self, k, names: Sequence[str], block: Block, full: Sequence[bool]):
        self.k = k
        self.names = list(names)
        self.block = block
        self.full = list(full)
        self.values: list[list] = [[] for _ in self.names]

    def add(self, values: Sequence) -> None:
        for kept, value, full in zip(self.values, values, self.full):
            if full:
                self.k.run.meter.hold(value)
                kept.append(value)
            else:
                kept.append(_ShapeOf(tuple(value.shape), value.dtype))

    def stacks(self, reverse: bool = False) -> list:
        """One [iterations, ...] array per name, in iteration order.

        Values whose shape changes over iterations (the stacks of an inner loop
        with a varying trip count, or the empty stand-in of a branch that did
        not run) are zero-padded to the largest; their readers only look at the
        part that was written. Each value is released as it is copied, so the
        meter never counts a value and its copy at once (``empty`` pages are
        only committed as rows are written).
        """
        return [self._stack(name, values[::-1] if reverse else values)
                for name, values in zip(self.names, self.values)]

    def _stack(self, name: str, values: list):
        xp, meter = self.k.xp, self.k.run.meter
        if not values:
            var = self.block.var(name)
            return xp.zeros((0,) + tuple(max(d, 0) for d in var.shape),
                            dtype=backend.dtype_of(xp, var.dtype))
        shape = tuple(values[0].shape)
        padded = False
        for value in values[1:]:
            if tuple(value.shape) != shape:
                if len(value.shape) != len(shape):
                    raise ExecutionError(f"{self.k.op.where()}: '{name}' changes rank across iterations "
                                         f"({list(shape)} then {list(value.shape)}); the backward keeps it "
                                         "per iteration and needs one rank")
                shape = tuple(max(a, b) for a, b in zip(shape, value.shape))
                padded = True
        if isinstance(values[0], _ShapeOf):
            return xp.broadcast_to(xp.zeros((), dtype=values[0].dtype), (len(values),) + shape)
        make = xp.zeros if padded else xp.empty
        out = make((len(values),) + shape, dtype=values[0].dtype)
        for i, value in enumerate(values):
            out[(i,) + tuple(slice(0, d) for d in value.shape)] = value
            meter.release(value)
            values[i] = None
        return out


@dataclass(frozen=True)
class _ShapeOf:
    """What is kept of a value read only for its shape."""
    shape: tuple
    dtype: object


# --- ONNX: stacks of values whose shape may change from one iteration to the next ---------------
# An ONNX Loop's scan outputs must keep one shape over the iterations. A value a loop keeps for
# its backward may not: the empty stand-in an If outputs for a value only the other branch
# computes (the taken branch changing between iterations), the stacks of an inner loop whose trip
# count changes. The kernels zero-pad such stacks to the largest shape (``Kept._stack``); the
# lowerings carry them as ONNX sequences instead, with the running largest shape, and pad them
# the same way after the loop (``RaggedStacks``).

def ragged_values(block: Block, ragged=()) -> set[str]:
    """Names of ``block`` (and the bound names in ``ragged``) whose shape may differ between two
    runs of the block with inputs of the same shapes (decided from the ops, conservatively)."""
    from ...ir.analysis import op_reads
    ragged = set(ragged)
    for op in block.ops:
        if any(name in ragged for name in op_reads(op)):
            ragged.update(op.outputs)
        else:
            ragged.update(_ragged_outputs(op))
    return ragged


def _ragged_outputs(op) -> list[str]:
    """Outputs of ``op`` (its inputs not ragged) whose shape depends on the values computed."""
    attrs = op.attrs
    if op.type == "While":
        n = len(attrs["carry_binds"])
        finals = op.outputs[:n] if attrs.get("ragged") else []
        return finals + op.outputs[n + 1:n + 1 + len(attrs["ys"])]       # trip counts vary
    if op.type == "Scan":
        c = len(attrs["carry_binds"])
        return [name for name, like in zip(op.outputs[c:], attrs["ys_like"]) if like is None]
    if op.type in ("If", "Do") and len(attrs["blocks"]) > 1:
        return [name for i, name in enumerate(op.outputs) if _branches_differ(attrs, i)]
    return []


def _branches_differ(attrs: dict, i: int) -> bool:
    """Whether output ``i`` of an If may have another shape depending on the branch taken: an
    empty stand-in in one branch, other static shapes, or a ragged value in a branch."""
    specs = [outs[i] for outs in attrs["outs"]]
    if any(spec is None for spec in specs):
        return True
    named = [(block, spec) for block, spec in zip(attrs["blocks"], specs) if isinstance(spec, str)]
    if len({block.var(spec).shape for block, spec in named}) > 1:
        return True
    return any(spec in ragged_values(block) for block, spec in named)


def ragged_positions(block: Block, names: Sequence[str], seeds=()) -> list[int]:
    """Positions of ``names`` (values of ``block`` a loop keeps per iteration) whose shape may
    change between iterations (``ragged_values``, with the bound names ``seeds`` changing shape
    themselves: a growing loop's carries, a ragged stack's rows; a 0-d value never does)."""
    ragged = ragged_values(block, seeds)
    return [j for j, name in enumerate(names) if name in ragged and block.var(name).ndim > 0]


class RaggedStacks:
    """The ONNX Loop stacks ``[iterations, ...]`` of the body values ``names`` of ``block``: those
    whose shape may change between iterations (``positions``) are carried as sequences beside
    their running largest shape (``starts``: the Loop's initial values of those carries, after
    the loop's own; ``carry``: the body's outputs for them, after its own carries), then
    zero-padded to that shape and stacked, as the kernels pad them; the others are the Loop's
    scan outputs (``scanned``). The largest shape starts at the Var's known sizes, so zero
    iterations give the kernels' empty stack. Example (a Loop with ``c`` carries)::

        stacks = RaggedStacks(g, body_block, kept_names)
        outputs = [cond, *carries] + stacks.carry(body, kept) + stacks.scanned(kept_outputs)
        outs = g.nodes("Loop", [count, "", *inits, *stacks.starts], ...)
        kept_stacks = stacks.stacks(g, outs[c:c + stacks.width], outs[c + stacks.width:])
    """

    def __init__(self, g, block: Block, names: Sequence[str], seeds=()):
        self.count = len(names)
        self.positions = ragged_positions(block, names, seeds)
        self.vars = [block.var(names[j]) for j in self.positions]
        self.width = 2 * len(self.vars)          # carries per ragged value: the sequence, the shape
        self.starts = ([g.node("SequenceEmpty", [], dtype=g.onnx_dtype(var.dtype)) for var in self.vars]
                       + [g.const([max(d, 0) for d in var.shape], "int64") for var in self.vars])

    def carry(self, body, values: Sequence[str]) -> list[tuple]:
        """The body's inputs for the carries (made here: call it right after the body's own
        carries' inputs are made) and its outputs for them, given the body's ``values`` of every
        name: the sequences with the ragged values appended, then the largest shapes."""
        seqs = [body.input("kept.seq", f"sequence:{var.dtype}", None) for var in self.vars]
        largest = [body.input("kept.shape", "int64", [var.ndim]) for var in self.vars]
        ragged = [values[j] for j in self.positions]
        outputs = [(body.node("SequenceInsert", [seq, value]), f"sequence:{var.dtype}", None)
                   for seq, value, var in zip(seqs, ragged, self.vars)]
        return outputs + [(body.node("Max", [shape, body.shape(value)]), "int64", [var.ndim])
                          for shape, value, var in zip(largest, ragged, self.vars)]

    def scanned(self, items: Sequence) -> list:
        """``items`` (one per name) of the names stacked as scan outputs."""
        return [item for j, item in enumerate(items) if j not in self.positions]

    def stacks(self, g, carried: Sequence[str], scanned: Sequence[str]) -> list[str]:
        """The stack of every name, in order: the padded ones from the Loop's final ``carried``
        values, the others from its scan outputs ``scanned``."""
        k = len(self.vars)
        padded = iter([_padded_stack(g, seq, shape, var)
                       for seq, shape, var in zip(carried[:k], carried[k:], self.vars)])
        rows = iter(scanned)
        return [next(padded) if j in self.positions else next(rows) for j in range(self.count)]


def _padded_stack(g, seq: str, shape: str, var) -> str:
    """The tensors of ``seq`` zero-padded at the end of each axis to ``shape`` and stacked."""
    count = g.node("SequenceLength", [seq])
    body = g.child()
    i = body.input("i", "int64", [])
    cond = body.input("cond", "bool", [])
    item = body.node("SequenceAt", [seq, i])
    pads = body.node("Concat", [body.const([0] * var.ndim, "int64"), body.node("Sub", [shape, body.shape(item)])],
                     axis=0)
    padded = body.node("Pad", [item, pads])
    rows, = g.nodes("Loop", [count, ""], 1, body=body.finish(f"{var.name}.padded",
                                                             [(cond, "bool", []),
                                                              (padded, var.dtype, [None] * var.ndim)]))
    full = g.node("Concat", [g.node("Reshape", [count, g.const([1], "int64")]), shape], axis=0)
    return g.node("Reshape", [rows, full], allowzero=1)
