"""Per-iteration values a loop (While, Scan) keeps for its backward, stacked into [iterations, ...]."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .. import backend
from ..errors import ExecutionError
from ..ir.program import Block


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
