"""The planned peak of a binomial schedule over a feed-forward chain, without rewriting the program.

``budget._Search`` tries activation budgets one after another (a bisection,
~20 trials); each trial used to copy the program, rewrite the copy's backward
(``binomial.apply_binomial``) and plan it (``peak.planned_peak``): minutes for
10,000 ops. Here the program is read once (every op's reads, outputs, sizes
and held bytes, named by strings) and a schedule's rewrite is replayed on
those records: ``binomial.plan_groups`` picks the copies exactly as the
rewrite does (one function serves both), a copy is a record reading the
current names and writing fresh integer names of its original's size, and the
gradient ops read the latest copy registered before them. The planned peak is
then the walk ``planned_peak`` makes (``ir.analysis.lifetimes``: the same ops
skipped, the same values freed after the same op), on the records::

    program (read once)            a schedule's records             the walk
    op 12: h3 = Tanh(m3)           ...                              needed ops, last reads,
    ...                            copy: 7 = Tanh(5)   (of h3)      free reads, then bytes
    op 40: d = Mul(g, h3)          op 40: d = Mul(g, 7)             added and dropped

The model covers programs whose ops' held bytes do not depend on the
schedule: no budgeted loop, no op with a per-op rule in ``peak.HOLDS``
(``ChainPeak.of`` answers None for the others; the search then plans copies).
The search checks the rewritten program's real planned peak once at the end.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..ir.program import Block
from .binomial import ChainOps, Units, plan_groups
from .lifetimes import ForwardValues
from .loops.schedules import Plan
from .peak import HOLDS, Sizer, op_holds
from .recompute import RECOMPUTE_ATTR
from .sizes import Shapes


@dataclass
class ChainPeak:
    """A block's ops as records for ``peak(plan)``: ``(reads, outputs, held bytes)`` per op."""
    chain: ChainOps
    n_forward: int
    ops: list[tuple[list, list, int]]
    copies: list[bool]                   # per op: a recompute copy already (its reads stay)
    sizes: dict                          # name -> bytes
    keep: frozenset
    persistable: frozenset
    renamed: list[int]                   # gradient ops reading a value a schedule may register a copy of

    @staticmethod
    def of(block: Block, info: ForwardValues, units: Units, keep, shapes: Shapes) -> "ChainPeak | None":
        """The model of ``block`` (forward ``block.ops[:info.n_forward]``); None when an op's held
        bytes depend on the schedule or a size is unknown (plan copies then)."""
        if any(op.type in HOLDS for op in block.ops):
            return None
        chain = ChainOps.of(block, info, units)
        sizer = Sizer(block, shapes)
        names = {n for reads in chain.reads for n in reads} | {n for outs in chain.outputs for n in outs}
        sizes = {n: sizer.of(n) for n in names}
        held = [op_holds(sizer, op, frozenset())[0] if op.attrs and op.sub_blocks() else 0 for op in block.ops]
        if sizer.unknown:
            return None
        ops = list(zip(chain.reads, chain.outputs, held))
        persistable = frozenset(n for n in names if (var := block.find_var(n)) is not None and var.persistable)
        copies = [RECOMPUTE_ATTR in op.attrs for op in block.ops]
        registered = {n for state in units.states for n in state}
        registered.update(n for values in chain.temporaries for n in values if n in info.backward_reads)
        renamed = [i for i in range(info.n_forward, len(ops)) if not copies[i] and not registered.isdisjoint(ops[i][0])]
        return ChainPeak(chain, info.n_forward, ops, copies, sizes, frozenset(keep), persistable, renamed)

    def peak(self, plan: Plan | None) -> int:
        """The planned peak of the program ``apply_binomial(..., plan)`` would make (``plan`` None:
        as it is)."""
        sizes = dict(self.sizes)
        fresh = itertools.count()
        ops = self.ops

        def copy(indices: list[int], current: dict) -> tuple[list, dict]:
            mapping, made = dict(current), []
            for i in indices:
                reads, outs, held = ops[i]
                reads = [mapping.get(n, n) for n in reads]
                for name in outs:
                    mapping[name] = new = next(fresh)
                    sizes[new] = sizes[name]
                made.append((reads, [mapping[n] for n in outs], held))
            return made, mapping

        stream = ops if plan is None else self._stream(plan_groups(self.chain, plan, copy))
        return self._walk(stream, sizes)

    def _stream(self, groups) -> list[tuple[list, list, int]]:
        """The rewritten op sequence (``binomial._insert``: copies before their op, then every
        gradient op reading the latest copy registered before it). Runs of ops that read no value
        a copy may stand for are taken as they are."""
        ops = self.ops
        before: dict[int, list] = {}
        marks: dict[int, list] = {}
        for at, copies, register in groups:
            before.setdefault(at, []).extend(copies)
            marks.setdefault(at, []).append(register)
        renamed = set(self.renamed)
        stream = ops[:self.n_forward]
        latest: dict = {}
        position = self.n_forward
        for i in sorted(renamed.union(before)):
            stream += ops[position:i]
            position = i
            if i in before:
                stream += before[i]
                for register in marks[i]:
                    latest.update(register)
            if i in renamed:
                reads, outs, held = ops[i]
                stream.append(([latest.get(n, n) for n in reads], outs, held))
                position = i + 1
        stream += ops[position:]
        return stream

    def _walk(self, ops: list, sizes: dict) -> int:
        return walk_peak(ops, sizes, self.keep | self.persistable)


def walk_peak(ops: list, sizes: dict, protected: frozenset) -> int:
    """``planned_peak``'s walk over ``lifetimes(keep)`` of records ``(reads, outputs, held bytes)``
    (``protected``: the kept and persistable names, needed and never freed). One backward pass finds
    the needed ops (``ir.analysis.needed_ops``), each value's last read (counted from the end) and
    the free reads (a value whose first use is a read); one forward pass adds and drops bytes."""
    last: dict = {}                              # name -> its last reader, counted from the end
    first_read: dict = {}                        # name -> its first use is a read
    kept = []
    read_later = last.keys()                     # (a live view)
    for op in reversed(ops):
        reads, outs = op[0], op[1]
        if read_later.isdisjoint(outs) and protected.isdisjoint(outs):
            continue
        k = len(kept)
        kept.append(op)
        for name in outs:
            first_read[name] = False
        for name in reads:
            if name not in last:
                last[name] = k
            first_read[name] = True
    held_now = {name: sizes[name] for name, read in first_read.items() if read}
    total = peak = sum(held_now.values())
    end = len(kept)
    for j in range(end - 1, -1, -1):             # forward order: j ops after this one
        reads, outs, held = kept[j]
        made = total + held                      # what is held while the op runs
        for name in outs:
            size = sizes[name]
            made += size
            total += size - held_now.get(name, 0)
            if last.get(name, end) >= j and name not in protected:     # read by nothing later
                held_now.pop(name, None)
                total -= size
            else:
                held_now[name] = size
        if made > peak:
            peak = made
        for name in reads:                       # dead after the op (a second pop finds nothing)
            if last[name] >= j and name not in protected:
                total -= held_now.pop(name, 0)
    return peak
