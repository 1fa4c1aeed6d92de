"""Recompute at checkpoints: keep few forward values, recompute the rest in the backward.

Two halves, kept apart (STYLE 9):

* the **policy** — ``plan_recompute`` turns checkpoints into a ``RecomputePlan``:
  segments of forward ops between consecutive checkpoints, and for each
  value whether the backward gets it from memory (checkpoints, values read by
  a later segment, inputs, values after the last checkpoint) or recomputes it;
* the **mechanism** — ``apply_plan`` rewrites the program: for each segment
  whose values the backward reads, copies of the segment's forward ops that
  write fresh names are inserted just before the first gradient op that reads
  one of those values, and the gradient ops read the copies instead.

Nothing else changes: the executor's liveness frees the forward values after
their last forward read and the copies after their last gradient read.
Before/after, for ``h1 = tanh(x@w1); h2 = tanh(h1@w2); loss = mean(h2@w3)``
with checkpoint ``h1``::

    before                                after
    h1 = Tanh(m1)                         h1 = Tanh(m1)
    h2 = Tanh(m2)                         h2 = Tanh(m2)
    ...                                   ...
    d = Mul(d_h2, 1 - h2*h2)              h2.rc = Tanh(MatMul(h1, w2))   (recompute_of=[h2])
                                          d = Mul(d_h2, 1 - h2.rc*h2.rc)

Random ops replay exactly: a copy keeps the op's attributes (its seed), and
random kernels draw from (seed, run id, loop iterations), so it draws the
forward's numbers. An op with sub-blocks (cond, while_loop, recurrent) is
copied like any other: its sub-blocks are functions of what the op reads, and
a loop's copy keeps its ``rng_id``, so each iteration replays its draws.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Sequence

from ..errors import ProgramError
from ..ir.analysis import free_reads, op_reads
from ..ir.program import Block, Op, Var
from ..ops.core.registry import get_op_def
from .auto import choose_checkpoints
from .lifetimes import ForwardValues, ancestors

RECOMPUTE_ATTR = "recompute_of"   # on a copy: the forward outputs it recomputes, in output order


# --- policy ---------------------------------------------------------------------------------

@dataclass
class Segment:
    """Forward ops ``[start, stop)``; the op at ``stop - 1`` writes the segment's checkpoint."""
    start: int
    stop: int
    checkpoint: str


@dataclass
class RecomputePlan:
    """Which forward values the backward keeps and which it recomputes, segment by segment."""
    checkpoints: list[str]
    segments: list[Segment]
    recompute: dict[str, int] = field(default_factory=dict)   # recomputable value -> its segment
    cross: list[str] = field(default_factory=list)             # kept: a later segment reads them
    ignored: list[str] = field(default_factory=list)           # checkpoints that could not be used

    def segment_values(self, s: int) -> set[str]:
        return {name for name, seg in self.recompute.items() if seg == s}


def resolve_checkpoints(info: ForwardValues, loss: str, checkpoints: Sequence) -> tuple[list[str], list[str]]:
    """Usable checkpoint names sorted by position, and descriptions of the ignored ones.

    A checkpoint is usable when it is a value the forward writes exactly once,
    not persistable, and the loss depends on it.
    """
    on_path, _ = ancestors(info.block, info.n_forward, loss)
    usable: dict[str, int] = {}
    ignored: list[str] = []
    for item in checkpoints:
        name = item.name if isinstance(item, Var) else item
        if not isinstance(name, str):
            ignored.append(f"{item!r} (not a Var or a name)")
            continue
        var = info.block.find_var(name)
        if var is None or (isinstance(item, Var) and var is not item):
            ignored.append(f"'{name}' (not a variable of this program's block {info.block.idx})")
        elif not info.is_temporary(name):
            ignored.append(f"'{name}' (not a value the forward computes once)")
        elif name not in on_path:
            ignored.append(f"'{name}' (the loss '{loss}' does not depend on it)")
        elif name not in usable:
            usable[name] = info.producer(name)
    return sorted(usable, key=lambda n: (usable[n], n)), ignored


def plan_recompute(info: ForwardValues, checkpoints: Sequence[str]) -> RecomputePlan:
    """Segments between consecutive checkpoints and what each one recomputes.

    ``checkpoints`` are usable names sorted by position (``resolve_checkpoints``).
    Ops after the last checkpoint are not recomputed: their backward runs
    first, right after the forward.

    Example::

        info = ForwardValues.of(block, n_forward)
        plan = plan_recompute(info, ["tanh_3", "tanh_7"])
        plan.segments, plan.recompute, plan.cross
    """
    segments: list[Segment] = []
    start = 0
    for name in checkpoints:
        stop = info.producer(name) + 1
        if stop > start:
            segments.append(Segment(start, stop, name))
            start = stop
    plan = RecomputePlan(list(checkpoints), segments)
    kept = set(checkpoints)
    for s, seg in enumerate(segments):
        for i in range(seg.start, seg.stop):
            op = info.block.ops[i]
            if not recomputable(op, info):
                continue
            for name in op.outputs:
                if name in kept:
                    continue
                if info.read_after(name, seg.stop):
                    plan.cross.append(name)
                else:
                    plan.recompute[name] = s
    return plan


def recomputable(op: Op, info: ForwardValues) -> bool:
    """An op may run again when its op type allows it and it writes only fresh temporaries."""
    if not get_op_def(op.type).extra.get("recomputable", True):
        return False
    return all(info.is_temporary(n) for n in op.outputs)


# --- mechanism ------------------------------------------------------------------------------

def apply_plan(block: Block, info: ForwardValues, plan: RecomputePlan) -> dict[str, str]:
    """Insert each segment's recompute ops into the backward; return forward name -> copy name."""
    renamed: dict[str, str] = {}
    for s in reversed(range(len(plan.segments))):
        values = plan.segment_values(s)
        first = _first_reader(block, info.n_forward, values)
        if first is None:
            continue
        needed = {n for op in block.ops[first:] for n in op_reads(op) if n in values}
        copies, mapping = _copy_segment(block, info, plan.segments[s], values, needed)
        originals = list(block.ops[first:])
        for k, op in enumerate(copies):
            block.insert_op(first + k, op)
        for op in originals:
            rename_reads(op, mapping)
        renamed.update(mapping)
    return renamed


def _first_reader(block: Block, start: int, names: set[str]) -> int | None:
    for i in range(start, len(block.ops)):
        if any(n in names for n in op_reads(block.ops[i])):
            return i
    return None


def _copy_segment(block: Block, info: ForwardValues, seg: Segment, values: set[str],
                  needed: set[str]) -> tuple[list[Op], dict[str, str]]:
    """Copies of the segment ops that (transitively) produce ``needed``, writing fresh names."""
    chosen: list[Op] = []
    needed = set(needed)
    for i in range(seg.stop - 1, seg.start - 1, -1):
        op = block.ops[i]
        if any(n in needed for n in op.outputs):
            chosen.append(op)
            needed.update(n for n in op_reads(op) if n in values)
    chosen.reverse()
    return copy_ops(block, chosen, {})


def copy_ops(block: Block, ops: Sequence[Op], mapping: dict[str, str]) -> tuple[list[Op], dict[str, str]]:
    """Copies of ``ops`` (in order) reading ``mapping``'s names and writing fresh ones; returns the
    copies and ``mapping`` extended by forward name -> copy name. Not inserted anywhere yet."""
    copies = []
    for op in ops:
        inputs, attrs = _renamed_reads(op, block, mapping)
        attrs[RECOMPUTE_ATTR] = list(op.outputs)
        for name in op.outputs:
            mapping[name] = _fresh_var(block, name).name
        copies.append(Op(op.type, inputs, [mapping[n] for n in op.outputs], attrs, location=op.location))
    return copies, mapping


def _fresh_var(block: Block, name: str) -> Var:
    var = block.var(name)
    new = f"{name}.rc"
    if block.program.has_name(new):
        new = block.program.unique_name(new)
    return block.create_var(new, var.shape, var.dtype, stop_gradient=var.stop_gradient)


def rename_reads(op: Op, mapping: dict[str, str]) -> None:
    """Make a backward op read the recomputed values (its own sub-blocks are renamed in place)."""
    op.inputs, op.attrs = _renamed_reads(op, op.block, mapping, owner=op)
    op.block.program.bump()


def _renamed_reads(op: Op, block: Block, mapping: dict[str, str],
                   owner: Op | None = None) -> tuple[list[str], dict]:
    """``op``'s inputs and attributes reading ``mapping``'s new names instead of the old ones.

    An op with sub-blocks reads outer values in them by name and binds them
    by name, through its inputs or its attributes (``If``'s ``binds``): its
    sub-blocks are renamed too (cloned when another op also runs them, as the
    forward op does), and so are string attributes naming a renamed value.
    """
    inputs = [mapping.get(n, n) for n in op.inputs]
    local = {n: mapping[n] for n in op_reads(op) if n in mapping} if op.sub_blocks() else {}
    if not local:
        return inputs, dict(op.attrs)
    return inputs, {key: _renamed_attr(value, block, local, owner) for key, value in op.attrs.items()}


def _renamed_attr(value, block: Block, mapping: dict[str, str], owner: Op | None):
    if isinstance(value, Block):
        if not any(n in mapping for n in free_reads(value) if n not in value.vars):
            return value
        if owner is not None and not _shared(value, owner):
            _rename_block(value, mapping)
            return value
        return _clone_block(value, block, mapping)
    if isinstance(value, str):
        return mapping.get(value, value)
    if isinstance(value, list):
        return [_renamed_attr(v, block, mapping, owner) for v in value]
    if isinstance(value, tuple):
        return tuple(_renamed_attr(v, block, mapping, owner) for v in value)
    if isinstance(value, dict):
        return {k: _renamed_attr(v, block, mapping, owner) for k, v in value.items()}
    return value


def _shared(sub: Block, owner: Op) -> bool:
    """True when an op other than ``owner`` references ``sub``."""
    return any(sub in op.sub_blocks() for b in sub.program.blocks for op in b.ops if op is not owner)


def _rename_block(sub: Block, mapping: dict[str, str]) -> None:
    inner = {k: v for k, v in mapping.items() if k not in sub.vars}
    for op in sub.ops:
        op.inputs, op.attrs = _renamed_reads(op, sub, inner, owner=op)


def seen_from(sub: Block, block: Block) -> Block:
    """``sub``, or a copy of it under ``block`` when ``block`` does not descend from ``sub``'s parent
    (a loop op's gradient inside a ``cond`` branch or ``do`` sits in that block's backward block,
    and a block an op runs must be a descendant of the op's block). The copy declares what ``sub``
    reads from outside: the op binds all of it by name."""
    if any(b is block for b in sub.ancestors()):
        return sub
    clone = _clone_block(sub, block, {})
    for name in free_reads(sub):
        var = sub.find_var(name)
        if name not in clone.vars and var is not None:
            clone.create_var(name, var.shape, var.dtype)
    return clone


def _clone_block(sub: Block, parent: Block, mapping: dict[str, str]) -> Block:
    """A copy of ``sub`` (and its nested blocks) under ``parent`` reading renamed outer values."""
    clone = sub.program.create_block(parent)
    inner = {k: v for k, v in mapping.items() if k not in sub.vars}
    for name, var in sub.vars.items():
        clone.create_var(name, var.shape, var.dtype, persistable=var.persistable,
                         trainable=var.trainable, stop_gradient=var.stop_gradient,
                         is_parameter=var.is_parameter, is_data=var.is_data)
    for op in sub.ops:
        attrs = {key: _cloned_attr(value, clone, inner) for key, value in op.attrs.items()}
        if op.sub_blocks():
            attrs = {key: _renamed_attr(value, clone, inner, None) if not _holds_block(value) else value
                     for key, value in attrs.items()}
        clone.append_op(Op(op.type, [inner.get(n, n) for n in op.inputs], list(op.outputs), attrs,
                           location=op.location))
    return clone


def _cloned_attr(value, parent: Block, mapping: dict[str, str]):
    """Every sub-block in an attribute cloned under ``parent`` (a clone's blocks must be its children)."""
    if isinstance(value, Block):
        return _clone_block(value, parent, mapping)
    if isinstance(value, (list, tuple)):
        return type(value)(_cloned_attr(v, parent, mapping) for v in value)
    if isinstance(value, dict):
        return {k: _cloned_attr(v, parent, mapping) for k, v in value.items()}
    return value


def _holds_block(value) -> bool:
    if isinstance(value, Block):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_block(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_block(v) for v in value.values())
    return False


# --- entry point used by append_backward ----------------------------------------------------

def recompute_backward(block: Block, n_forward: int, loss: Var, checkpoints,
                       feed_shapes=None) -> RecomputePlan:
    """Rewrite the backward already appended after ``block.ops[:n_forward]`` to recompute.

    ``checkpoints`` is a list of Vars or names, or ``"auto"``. Unusable
    checkpoints are ignored with a warning naming them. ``append_backward``
    calls it; use that.

    Example::

        rg.append_backward(loss, checkpoints=[h3, h7])     # -> recompute_backward(block, n, loss, [h3, h7])
    """
    info = ForwardValues.of(block, n_forward)
    if isinstance(checkpoints, str) and checkpoints == "auto":
        names, ignored = choose_checkpoints(info, loss.name, feed_shapes=feed_shapes), []
    else:
        if isinstance(checkpoints, (Var, str)):
            checkpoints = [checkpoints]
        if not isinstance(checkpoints, (list, tuple)):
            raise ProgramError(f"checkpoints must be a list of Vars or names, or 'auto'; got "
                               f"{type(checkpoints).__name__}")
        names, ignored = resolve_checkpoints(info, loss.name, checkpoints)
    if ignored:
        warnings.warn("append_backward ignores checkpoints " + ", ".join(ignored), stacklevel=3)
    plan = plan_recompute(info, names)
    plan.ignored = ignored
    apply_plan(block, info, plan)
    return plan
