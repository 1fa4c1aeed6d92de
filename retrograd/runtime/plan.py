"""Compiling a block into a plan: kernels resolved, liveness known, once per program version."""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.analysis import free_reads_of_ops, op_reads
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


@dataclass
class Plan:
    block: Block
    steps: list[Step]
    free_reads: list[str]        # values the block needs from outside (feeds, scope, bindings)
    keep: frozenset[str]
    persistable_writes: list[str]   # written back to the scope after a run


def compile_block(block: Block, keep: frozenset[str], backend, run) -> Plan:
    """Resolve each op to its kernel and decide when every value dies.

    A value dies after the last op that reads it (sub-block reads count), or
    right after it is written when nothing reads it, unless it is kept
    (fetched, returned) or persistable (written back to the scope). An
    output that dies as it is written is not live (``KernelCtx.live_outputs``).
    """
    ops = _needed_ops(block, keep)
    reads = [op_reads(op) for op in ops]
    last_read: dict[str, int] = {}
    for i, names in enumerate(reads):
        for name in names:
            last_read[name] = i
    steps = []
    for i, op in enumerate(ops):
        candidates = dict.fromkeys(list(reads[i]) + list(op.outputs))
        dead = tuple(n for n in candidates
                     if last_read.get(n, -1) <= i and n not in keep and not _persistable(block, n))
        live = frozenset(j for j, n in enumerate(op.outputs) if n not in dead)
        opdef = get_op_def(op.type)
        steps.append(Step(opdef.kernel, KernelCtx(backend, op, run, live), tuple(op.inputs), tuple(op.outputs),
                          dead, op, i))
    writes = list(dict.fromkeys(n for op in ops for n in op.outputs if _persistable(block, n)))
    return Plan(block, steps, free_reads_of_ops(ops), keep, writes)


def _needed_ops(block: Block, keep: frozenset[str]) -> list[Op]:
    """Ops whose results are fetched or persist (directly or through later ops): the rest are skipped."""
    needed = set(keep)
    kept = []
    for op in reversed(block.ops):
        if any(n in needed or _persistable(block, n) for n in op.outputs):
            kept.append(op)
            needed.update(op_reads(op))
    kept.reverse()
    return kept


def _persistable(block: Block, name: str) -> bool:
    var = block.find_var(name)
    return var is not None and var.persistable
