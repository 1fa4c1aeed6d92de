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

from dataclasses import dataclass

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


def apply_binomial(block: Block, info: ForwardValues, units: Units, plan: Plan) -> int:
    """Rewrite the backward after ``block.ops[:info.n_forward]`` to follow ``plan``; return copies made."""
    temporaries = {u: _unit_values(info, units, u) for u in range(units.count)}
    stored: dict[int, dict[str, str]] = {0: {}}
    for t in plan.sweep_stores:
        stored[t] = {n: n for n in units.states[t]}
    current: dict[str, str] = {}
    pending: list[Op] = []
    groups: list[tuple[int, list[Op], dict[str, str]]] = []    # (insert before op, copies, registrations)
    at = info.n_forward
    for action in plan.actions():
        if isinstance(action, Restore):
            current = dict(stored[action.step])
        elif isinstance(action, Advance):
            wanted = set(units.states[action.stop])
            copies, mapping = _copies(block, info, units, temporaries, action.start, action.stop, wanted, current)
            pending += copies
            current = {n: mapping.get(n, n) for n in units.states[action.stop]}
        elif isinstance(action, Store):
            stored[action.step] = dict(current)
        elif isinstance(action, Reverse):
            values = set().union(*(temporaries[u] for u in range(action.start, action.stop)))
            values -= set(units.states[action.stop])
            wanted = {n for n in values if n in info.backward_reads}
            copies, mapping = _copies(block, info, units, temporaries, action.start, action.stop, wanted, current)
            register = {n: current.get(n, n) for n in units.states[action.start]}
            register.update({n: mapping[n] for n in wanted if n in mapping})
            at = _first_reader(block, at, set(register) | wanted)
            groups.append((at, pending + copies, register))
            pending = []
    return _insert(block, info.n_forward, groups)


def _unit_values(info: ForwardValues, units: Units, u: int) -> set[str]:
    return {n for i in range(units.starts[u], units.starts[u + 1])
            for n in info.block.ops[i].outputs if info.is_temporary(n)}


def _copies(block: Block, info: ForwardValues, units: Units, temporaries, start: int, stop: int,
            wanted: set[str], current: dict[str, str]) -> tuple[list[Op], dict[str, str]]:
    """Copies of the ops of units ``start..stop-1`` producing ``wanted``, reading ``current``."""
    ops = block.ops[units.starts[start]:units.starts[stop]]
    inside = set().union(*(temporaries[u] for u in range(start, stop))) if stop > start else set()
    chosen, need = [], set(wanted)
    for op in reversed(ops):
        if any(n in need for n in op.outputs) and recomputable(op, info):
            chosen.append(op)
            need.update(n for n in op_reads(op) if n in inside)
    return copy_ops(block, chosen[::-1], dict(current))


def _first_reader(block: Block, start: int, names: set[str]) -> int:
    for i in range(start, len(block.ops)):
        if any(n in names for n in op_reads(block.ops[i])):
            return i
    return start


def _insert(block: Block, n_forward: int, groups) -> int:
    """Insert each group's copies before its op (later groups first, so positions hold), then make
    every gradient op read the latest copy registered before it."""
    for at, copies, _ in reversed(groups):
        for k, op in enumerate(copies):
            block.insert_op(at + k, op)
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
