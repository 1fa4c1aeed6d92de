"""Read-only questions about blocks that several passes ask."""
from __future__ import annotations

from dataclasses import dataclass

from .program import Block, Op


def free_reads(block: Block) -> list[str]:
    """Names a block reads before (or without) writing them, in first-read order.

    Sub-blocks count: what a nested block reads from outside itself and this
    block does not define is a free read of this block too.
    """
    return free_reads_of_ops(block.ops)


def free_reads_of_ops(ops) -> list[str]:
    """Names a sequence of ops reads before (or without) one of them writing them, in first-read
    order (a compiled plan's or a recurrent step's inputs from outside)."""
    written: set[str] = set()
    reads: dict[str, None] = {}
    for op in ops:
        for name in op_reads(op):
            if name not in written:
                reads.setdefault(name)
        written.update(op.outputs)
    return list(reads)


def read_counts(program) -> dict[str, int]:
    """How many ops of the whole program read each name (sub-blocks' reads included; an op reading
    a name twice counts once)."""
    count: dict[str, int] = {}
    for block in program.blocks:
        for op in block.ops:
            for name in dict.fromkeys(op_reads(op)):
                count[name] = count.get(name, 0) + 1
    return count


def op_reads(op: Op) -> list[str]:
    """Everything an op reads: its inputs, then its sub-blocks' free reads.

    A sub-block may be a deeper descendant of the op's block (a gradient op runs
    a backward block nested in the forward step block): names declared anywhere
    between the sub-block and the op's block are inner to the op, not reads.
    """
    names = list(op.inputs)
    if not op.attrs:            # most ops (no attribute, no sub-block): asked for every op of every plan
        return names
    for sub in op.sub_blocks():
        inner = _declared_below(sub, op.block)
        names.extend(n for n in free_reads(sub) if n not in inner)
    return names


def _declared_below(sub: Block, outer: Block | None):
    """Names declared in ``sub`` and its ancestors strictly below ``outer``."""
    if outer is None or sub.parent_idx == outer.idx:
        return sub.vars
    names: set[str] = set()
    for block in sub.ancestors():
        if block is outer:
            break
        names.update(block.vars)
    return names


def producers(block: Block) -> dict[str, int]:
    """For each name written in the block, the index of the last op writing it."""
    return {name: i for i, op in enumerate(block.ops) for name in op.outputs}


@dataclass(frozen=True)
class OpLifetime:
    op: Op
    index: int                     # position among the ops that run
    dead: tuple[str, ...]          # values to drop once the op has run
    live_outputs: frozenset[int]   # positions of outputs something reads later, fetches or keeps


@dataclass(frozen=True)
class Lifetimes:
    """When each value of a run of a block dies: what the executor's plan and the memory
    planner both follow (the same ops skipped, the same values freed after the same op)."""
    ops: list[OpLifetime]
    free_reads: list[str]          # values the block needs from outside (feeds, scope, bindings)
    persistable_writes: list[str]  # written back to the scope after a run


_LIVE, _NOT_LIVE = frozenset((0,)), frozenset()       # live_outputs of an op with one output


def lifetimes(block: Block, keep: frozenset[str]) -> Lifetimes:
    """Ops a run fetching ``keep`` needs, and when each value dies: after the last op that
    reads it (sub-block reads count), or as it is written when nothing reads it, unless it is
    kept or persistable."""
    persistable = _persistable_names(block)
    ops, reads = _needed(block, keep, persistable)       # each op's reads asked once (10,000-op plans)
    last_read: dict[str, int] = {}
    for i, names in enumerate(reads):
        for name in names:
            last_read[name] = i
    kept = persistable | frozenset(keep)
    timed = []
    for i, op in enumerate(ops):
        candidates = dict.fromkeys(reads[i] + op.outputs)
        dead = tuple(n for n in candidates if last_read.get(n, -1) <= i and n not in kept)
        if len(op.outputs) == 1:                # most ops: one of two sets, shared
            live = _NOT_LIVE if op.outputs[0] in dead else _LIVE
        else:
            live = frozenset(j for j, n in enumerate(op.outputs) if n not in dead)
        timed.append(OpLifetime(op, i, dead, live))
    writes = list(dict.fromkeys(n for op in ops for n in op.outputs if n in persistable))
    return Lifetimes(timed, _free_reads(ops, reads), writes)


def needed_ops(block: Block, keep: frozenset[str]) -> list[Op]:
    """Ops whose results are fetched or persist (directly or through later ops): the rest are skipped."""
    return _needed(block, keep, _persistable_names(block))[0]


def _needed(block: Block, keep, persistable: frozenset[str]) -> tuple[list[Op], list[list[str]]]:
    """``needed_ops`` and each one's ``op_reads`` (``persistable``: ``_persistable_names``)."""
    needed = set(keep) | persistable
    kept, reads = [], []
    for op in reversed(block.ops):
        if not needed.isdisjoint(op.outputs):
            names = op_reads(op)
            kept.append(op)
            reads.append(names)
            needed.update(names)
    kept.reverse()
    reads.reverse()
    return kept, reads


def _free_reads(ops, reads) -> list[str]:
    """``free_reads_of_ops(ops)`` given each op's reads."""
    written: set[str] = set()
    found: dict[str, None] = {}
    for op, names in zip(ops, reads):
        for name in names:
            if name not in written:
                found.setdefault(name)
        written.update(op.outputs)
    return list(found)


def _persistable_names(block: Block) -> frozenset[str]:
    """The names of ``block``'s ops that ``_persistable(block, name)`` is true of, for set lookups
    in per-op loops: the global block's persistable variables; in a nested block, those of the
    names its ops mention (its ancestors' variables may be many)."""
    if block.parent_idx < 0:
        return frozenset(name for name, var in block.vars.items() if var.persistable)
    names = {name for op in block.ops for name in (*op_reads(op), *op.outputs)}
    return frozenset(name for name in names if _persistable(block, name))


def _persistable(block: Block, name: str) -> bool:
    var = block.find_var(name)
    return var is not None and var.persistable
