"""Multi-level (binomial) recompute for feed-forward chains: a schedule over layers, written into IR.

Single-level recompute (``recompute.py``) keeps the checkpoints of every
segment at once, so a chain of ``n`` layers cannot go below about
``2 sqrt(n)`` activations. Here the chain is cut into *units* at its joints
(``auto.build_model``: cuts where the only crossing temporaries are one op's
outputs) and reversed by a binomial schedule over units (``schedules``, the
same plans the loops follow over time steps). The plan's actions become ops:

* ``Advance(a, b)``: copies of the forward ops of units ``a..b-1`` that lead
  to the state at cut ``b``, reading the current state's names;
* ``Store(t)``: that copy's names are remembered as checkpoint ``t``;
  ``Restore(t)`` makes them current again; ``Drop`` needs nothing (the
  executor frees a value after its last reader);
* ``Reverse(a, b)``: copies of what the gradient ops of units ``a..b-1`` read,
  inserted (after the pending advances) just before the first gradient op
  reading one of those values or the state at ``a``.

Finally every gradient op reads the latest copy of each forward value it
reads (any copy holds the same numbers: random ops replay their draws).
The states the forward sweep stores are the forward's own values, kept
alive because copies read them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..ir.analysis import op_reads
from ..ir.program import Block, Op
from .auto import ChainModel
from .lifetimes import ForwardValues
from .recompute import RECOMPUTE_ATTR, copy_ops, recomputable, rename_reads
from .loops.schedules import Advance, Plan, Restore, Reverse, Store


@dataclass
class Units:
    """The forward cut into units: unit ``u`` is ops ``[starts[u], starts[u+1])``; ``states[t]`` the
    values crossing into unit ``t`` (``states[0]`` is empty: inputs only)."""
    starts: list[int]
    states: list[list[str]]

    @property
    def count(self) -> int:
        return len(self.starts) - 1

    @staticmethod
    def of(model: ChainModel, n_forward: int) -> "Units":
        starts = [0] + [p + 1 for p in model.positions] + [n_forward]
        return Units(starts, [[]] + [list(c) for c in model.checkpoints] + [[]])


@dataclass
class ChainOps:
    """What the rewrite reads of the block, read once: every op's reads and outputs, which forward
    ops may run again, and each unit's temporaries. ``apply_binomial`` and the planner's peak
    model (``chain_peak.py``) both follow a plan through ``plan_groups`` over it."""
    info: ForwardValues
    units: Units
    reads: list[list[str]]
    outputs: list[list[str]]
    recomputable: list[bool]              # per forward op
    temporaries: list[set[str]]           # per unit
    # (kind, start, stop) -> what an action over those units copies: a function of the block alone,
    # asked again by every schedule the search tries (each reverses every unit).
    memo: dict = field(default_factory=dict)

    @staticmethod
    def of(block: Block, info: ForwardValues, units: Units) -> "ChainOps":
        recomputable_ = [recomputable(op, info) for op in block.ops[:info.n_forward]]
        chain = ChainOps(info, units, [op_reads(op) for op in block.ops], [list(op.outputs) for op in block.ops],
                         recomputable_, [])
        chain.temporaries = [_unit_values(info, units, u) for u in range(units.count)]
        return chain


def apply_binomial(block: Block, info: ForwardValues, units: Units, plan: Plan, chain: ChainOps | None = None) -> int:
    """Rewrite the backward after ``block.ops[:info.n_forward]`` to follow ``plan``; return copies made.
    ``chain``: ``ChainOps.of(block, info, units)`` when the caller has it (the block unchanged since)."""
    chain = chain if chain is not None else ChainOps.of(block, info, units)

    def copy(indices: list[int], current: dict[str, str]) -> tuple[list[Op], dict[str, str]]:
        return copy_ops(block, [block.ops[i] for i in indices], dict(current))

    return _insert(block, info.n_forward, plan_groups(chain, plan, copy))


def plan_groups(chain: ChainOps, plan: Plan, copy: Callable) -> list[tuple[int, list, dict[str, str]]]:
    """The copies ``plan`` inserts: ``(before op, copies, registrations)`` per reverse, in order.
    ``copy(op indices, current names) -> (copies, forward name -> copy name)`` makes the copies
    (ops, or the peak model's stand-ins for them)."""
    info, units = chain.info, chain.units
    stored: dict[int, dict[str, str]] = {0: {}}
    for t in plan.sweep_stores:
        stored[t] = {n: n for n in units.states[t]}
    current: dict[str, str] = {}
    pending: list = []
    groups: list[tuple[int, list, dict[str, str]]] = []    # (insert before op, copies, registrations)
    at = info.n_forward
    for action in plan.actions():
        if isinstance(action, Restore):
            current = dict(stored[action.step])
        elif isinstance(action, Advance):
            copies, mapping = copy(_advanced(chain, action.start, action.stop), current)
            pending += copies
            current = {n: mapping.get(n, n) for n in units.states[action.stop]}
        elif isinstance(action, Store):
            stored[action.step] = dict(current)
        elif isinstance(action, Reverse):
            chosen, wanted = _reversed(chain, action.start, action.stop)
            copies, mapping = copy(chosen, current)
            register = {n: current.get(n, n) for n in units.states[action.start]}
            register.update({n: mapping[n] for n in wanted if n in mapping})
            at = _first_reader(chain, at, set(register) | wanted)
            groups.append((at, pending + copies, register))
            pending = []
    return groups


def _advanced(chain: ChainOps, start: int, stop: int) -> list[int]:
    """The ops ``Advance(start, stop)`` copies: those leading to the state at cut ``stop``."""
    key = ("advance", start, stop)
    if key not in chain.memo:
        chain.memo[key] = _chosen(chain, start, stop, set(chain.units.states[stop]))
    return chain.memo[key]


def _reversed(chain: ChainOps, start: int, stop: int) -> tuple[list[int], set[str]]:
    """What ``Reverse(start, stop)`` copies (op indices) and the values the backward reads of it."""
    key = ("reverse", start, stop)
    if key not in chain.memo:
        values = set().union(*chain.temporaries[start:stop])
        values -= set(chain.units.states[stop])
        wanted = {n for n in values if n in chain.info.backward_reads}
        chain.memo[key] = _chosen(chain, start, stop, wanted), wanted
    return chain.memo[key]


def _unit_values(info: ForwardValues, units: Units, u: int) -> set[str]:
    return {n for i in range(units.starts[u], units.starts[u + 1])
            for n in info.block.ops[i].outputs if info.is_temporary(n)}


def _chosen(chain: ChainOps, start: int, stop: int, wanted: set[str]) -> list[int]:
    """Indices of the ops of units ``start..stop-1`` producing ``wanted`` (in order)."""
    first, last = chain.units.starts[start], chain.units.starts[stop]
    inside = set().union(*chain.temporaries[start:stop])
    chosen, need = [], set(wanted)
    for i in range(last - 1, first - 1, -1):
        if chain.recomputable[i] and not need.isdisjoint(chain.outputs[i]):
            chosen.append(i)
            need.update(n for n in chain.reads[i] if n in inside)
    return chosen[::-1]


def _first_reader(chain: ChainOps, start: int, names: set[str]) -> int:
    reads = chain.reads
    for i in range(start, len(reads)):
        if not names.isdisjoint(reads[i]):
            return i
    return start


def _insert(block: Block, n_forward: int, groups) -> int:
    """Insert each group's copies before its op (later groups first, so positions hold), then make
    every gradient op read the latest copy registered before it."""
    # One pass over the ops (inserting one op at a time was quadratic: 10,000-op programs).
    before: dict[int, list] = {}
    for at, copies, _ in groups:
        before.setdefault(at, []).extend(copies)
    ops: list = []
    for i, op in enumerate(block.ops + [None]):
        for copy in before.get(i, ()):
            copy.block = block
            ops.append(copy)
        if op is not None:
            ops.append(op)
    block.ops[:] = ops
    shifted, offset = [], 0
    for at, copies, register in groups:
        shifted.append((at + offset, register))
        offset += len(copies)
    latest: dict[str, str] = {}
    marks = iter(shifted)
    mark = next(marks, None)
    for i in range(n_forward, len(block.ops)):
        while mark is not None and mark[0] <= i:
            latest.update(mark[1])
            mark = next(marks, None)
        op = block.ops[i]
        if RECOMPUTE_ATTR in op.attrs:
            continue
        local = {n: latest[n] for n in op_reads(op) if n in latest and latest[n] != n}
        if local:
            rename_reads(op, local)
    block.program.bump()
    return offset
