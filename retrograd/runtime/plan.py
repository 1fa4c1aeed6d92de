"""Compiling a block into a plan: kernels resolved, liveness known, once per program version."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.analysis import lifetimes
from ..ir.program import Block, Op
from ..ops.core.registry import get_op_def


class KernelCtx:
    """What a kernel sees besides its arrays: the namespace, backend, attributes, op and run.

    ``xp`` is the backend's array namespace; ``backend`` (a
    ``retrograd.backends.Backend``) has what the namespace lacks: keyed random
    draws, scatter-add, dtype lookup.

    ``live_outputs`` holds the positions of the op's outputs that this plan
    reads later, fetches or keeps (all of them unless the plan says less): a
    kernel may return a cheap stand-in of the right rank and dtype for the
    others (a loop need not stack per-iteration values nobody reads), and the
    executor drops it at once.
    """

    __slots__ = ("xp", "backend", "attrs", "op", "run", "live_outputs", "cached")

    def __init__(self, backend, op: Op, run, live_outputs: frozenset[int] | None = None):
        self.xp = backend.xp
        self.backend = backend
        self.attrs = op.attrs
        self.op = op
        self.run = run
        self.live_outputs = frozenset(range(len(op.outputs))) if live_outputs is None else live_outputs
        self.cached = None      # a kernel's own value kept between runs of the plan (Constant's array)


@dataclass
class Step:
    kernel: object
    k: KernelCtx
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    dead: tuple[str, ...]        # names to drop once this step has run
    op: Op
    index: int

    def __post_init__(self):
        self.single = len(self.outputs) == 1     # the kernel returns the one output itself


@dataclass
class Plan:
    block: Block
    steps: list[Step]
    free_reads: list[str]        # values the block needs from outside (feeds, scope, bindings)
    keep: frozenset[str]
    persistable_writes: list[str]   # written back to the scope after a run
    # No op runs a sub-block (control flow): the steps are the whole run, and the memory meter's
    # count of a run is a function of where it starts (``stats.MeterRecord``, ``Executor.run``).
    straight_line: bool = False
    # start (the names and ``Backend.layouts`` of the values a run starts from) -> MeterRecord, or
    # None for a plan whose kernels hold values on the meter themselves (it is metered op by op)
    meter_records: dict = field(default_factory=dict)


def compile_block(block: Block, keep: frozenset[str], backend, run) -> Plan:
    """Resolve each op to its kernel; values die as ``ir.analysis.lifetimes`` says.

    An output that dies as it is written is not live (``KernelCtx.live_outputs``).
    """
    timed = lifetimes(block, keep)
    steps = [Step(backend.kernel_for(get_op_def(t.op.type).kernel, t.op, block),
                  KernelCtx(backend, t.op, run, t.live_outputs),
                  tuple(t.op.inputs), tuple(t.op.outputs), t.dead, t.op, t.index) for t in timed.ops]
    return Plan(block, steps, timed.free_reads, keep, timed.persistable_writes,
                not any(_has_block(s.op) for s in steps))


def _has_block(op: Op) -> bool:
    """Whether ``op`` runs a sub-block (an attribute holds a Block or a list of them)."""
    return any(isinstance(v, Block) or (isinstance(v, (list, tuple)) and any(isinstance(b, Block) for b in v))
               for v in op.attrs.values())
