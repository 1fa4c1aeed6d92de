"""Selective recompute: free the kept values that are cheap to make again, keep the costly ones.

The ``cheap_first`` policy's rung between storing everything and checkpointing
(``policies.py``). A checkpoint schedule (``binomial.py``) re-runs every unit's
forward at least once: a budget just below store-all's peak pays a whole forward
for a few megabytes. Here single values are chosen instead, as PyTorch's min-cut
partitioner and Checkmate choose them: each value the backward reads is priced
by what making it again costs (the ops between it and values still kept, at most
``MAX_CLOSURE`` of them) per byte it frees, the cheapest freed first (a GELU's
output from its kept input, a layer norm's from the residual, a layout copy),
then values behind a contraction (a projection from its kept input) where the
budget asks for more. The costs are the ops' own declarations (``defop(flops=)``
for contractions; every other op as memory-bound, its bytes read and written at
``FLOPS_PER_BYTE``): estimates for ordering, the planned peak decides what fits.

The rewrite (``apply_selective``) walks the backward once: before the first
gradient op reading a freed value it inserts copies of the ops making it (a copy
made for an earlier reader is reused), and every gradient op reads the copy. Each
op runs again at most once; the executor frees each copy after its last reader.
The copies are ``recompute.copy_ops``' (``recompute_of`` attribute; random ops
replay their draws), so the gradients are those of storing everything.

Example:
    ```python
    import numpy as np
    import retrograd as rg
    from retrograd.memory.lifetimes import ForwardValues
    from retrograd.memory.selective import apply_selective, price_values
    from retrograd.memory.sizes import resolve_shapes

    main = rg.Program()
    with rg.program_guard(main):
        x = rg.data("x", [64, 32])
        h = rg.layers.fc(x, 32, name="fc")
        loss = rg.mean(rg.tanh(rg.gelu(h)) * 2.0)
    n_forward = len(main.global_block().ops)
    with rg.program_guard(main):
        rg.append_backward(loss)
    block = main.global_block()
    info = ForwardValues.of(block, n_forward)
    order = price_values(info, resolve_shapes(block))
    assert order[0].cost < order[-1].cost     # a pointwise value before the GEMM's
    apply_selective(info, {order[0].name})
    assert any(op.attrs.get("recompute_of") == [order[0].name] for op in block.ops)
    ```
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from ..errors import ProgramError
from ..ir.analysis import op_reads
from ..ir.program import Op
from ..ops.core.registry import get_op_def
from .lifetimes import ForwardValues
from .recompute import copy_ops, recomputable, rename_reads
from .chain_peak import walk_peak
from .peak import HOLDS, Sizer, op_holds, planned_peak
from .sizes import Shapes, estimated_bytes, resolve_shapes

MAX_CLOSURE = 8         # ops re-run to make one value again, at most (a layer, not a chain of layers)
FLOPS_PER_BYTE = 16     # a memory-bound op's byte against a contraction's flop: a CPU's ratio of the two rates


@dataclass(frozen=True)
class Priced:
    """One value the selective rung may free, in the order chosen.

    Attributes:
        name: The forward value.
        nbytes: What freeing it saves.
        cost: The estimated flops of the ops it adds to the recompute (those earlier values
            did not already add).
        total: The estimated flops of all ops recomputed with it and every value before it.
    """
    name: str
    nbytes: int
    cost: float
    total: float


def op_cost(op: Op, info: ForwardValues, shapes: Shapes) -> float:
    """Estimated flops of one run of ``op``: its declaration (``defop(flops=)``), else its bytes
    read and written at ``FLOPS_PER_BYTE``."""
    block = info.block
    ins = [shapes.get(n, block.var(n).shape) for n in op.inputs if block.find_var(n) is not None]
    outs = [shapes.get(n, block.var(n).shape) for n in op.outputs]
    flops = get_op_def(op.type).extra.get("flops")
    if flops is not None:
        try:
            return float(flops([_known(s) for s in ins], [_known(s) for s in outs], op.attrs))
        except Exception as exc:      # a user's declaration: named, not passed through bare or ignored
            error = ProgramError(f"{op.where()}: its defop(flops=) declaration failed on input shapes "
                                 f"{ins}: {type(exc).__name__}: {exc}")
            error.declaration = True     # not a size the budget may plan around: raised
            raise error from exc
    moved = sum(estimated_bytes(block.var(n), shapes) for n in list(op.inputs) + list(op.outputs)
                if block.find_var(n) is not None)
    return float(moved * FLOPS_PER_BYTE)


def _known(shape) -> tuple[int, ...]:
    return tuple(max(int(d), 1) for d in shape)


class _Closures:
    """Which forward ops making a value again takes, given the values freed so far."""

    def __init__(self, info: ForwardValues, shapes: Shapes):
        self.info, self.shapes = info, shapes
        ops = info.block.ops
        self.rerunnable = [recomputable(op, info) and not op.sub_blocks() for op in ops[:info.n_forward]]
        self.costs: dict[int, float] = {}
        self.freed: set[str] = set()

    def cost(self, index: int) -> float:
        if index not in self.costs:
            self.costs[index] = op_cost(self.info.block.ops[index], self.info, self.shapes)
        return self.costs[index]

    def must_remake(self, name: str) -> bool:
        """A forward temporary the backward does not hold: freed by the rung, or not kept at all."""
        return self.info.is_temporary(name) and (name in self.freed or name not in self.info.backward_reads)

    def of(self, names, limit: int = MAX_CLOSURE) -> set[int] | None:
        """Forward op indices making ``names`` again (None: more than ``limit``, or one cannot run again)."""
        chosen: set[int] = set()
        stack = list(names)
        while stack:
            index = self.info.producer(stack.pop())
            if index is None or index in chosen:
                continue
            if index >= len(self.rerunnable) or not self.rerunnable[index] or len(chosen) >= limit:
                return None
            chosen.add(index)
            stack.extend(n for n in op_reads(self.info.block.ops[index]) if self.must_remake(n))
        return chosen


def price_values(info: ForwardValues, shapes: Shapes) -> list[Priced]:
    """The values the backward reads that could be made again, cheapest per byte freed first
    (a greedy order: each value's price counts only the ops the earlier ones did not add)."""
    closures = _Closures(info, shapes)
    block = info.block
    heap = []
    for name in info.backward_reads:
        if not info.is_temporary(name):
            continue
        nbytes = estimated_bytes(block.var(name), shapes)
        ops = closures.of([name]) if nbytes else None
        if ops is not None:
            heap.append((sum(closures.cost(i) for i in ops) / nbytes, name, nbytes))
    heapq.heapify(heap)
    chosen: list[Priced] = []
    rerun: set[int] = set()
    total = 0.0
    while heap:
        price, name, nbytes = heapq.heappop(heap)
        ops = closures.of([name])
        if ops is None:
            continue
        added = sum(closures.cost(i) for i in ops - rerun)
        if heap and added / nbytes > heap[0][0] * (1 + 1e-9):
            heapq.heappush(heap, (added / nbytes, name, nbytes))      # others' choices raised its price
            continue
        closures.freed.add(name)
        rerun |= ops
        total += added
        chosen.append(Priced(name, nbytes, added, total))
    return chosen


def forward_cost(info: ForwardValues, shapes: Shapes) -> float:
    """Estimated flops of the forward (what one checkpointed re-run of all of it costs)."""
    return sum(op_cost(op, info, shapes) for op in info.block.ops[:info.n_forward])


def apply_selective(info: ForwardValues, freed: set[str]) -> int:
    """Rewrite the backward after ``info.block.ops[:info.n_forward]`` to make ``freed`` again
    before their first gradient reader instead of keeping them; return the copies inserted."""
    block = info.block
    closures = _Closures(info, {})
    closures.freed = set(freed)
    current: dict[str, str] = {}        # forward name -> its copy's
    ops = list(block.ops[:info.n_forward])
    inserted = 0
    for op in block.ops[info.n_forward:]:
        wanted = [n for n in dict.fromkeys(op_reads(op)) if n in freed and n not in current]
        if wanted:
            made = closures.of(wanted, limit=math.inf) or ()     # (never None for names priced)
            todo = [block.ops[i] for i in sorted(made) if not all(o in current for o in block.ops[i].outputs)]
            copies, current = copy_ops(block, todo, current)
            for copy in copies:
                copy.block = block
            ops += copies
            inserted += len(copies)
        local = {n: current[n] for n in op_reads(op) if n in freed and n in current}
        if local:
            rename_reads(op, local)
        ops.append(op)
    block.ops[:] = ops
    block.program.bump()
    return inserted


# --- the rung: the fewest values freed that fit -------------------------------------------------

MAX_SHARE = 0.75        # recompute at most this share of the forward's estimated flops: beyond it a
                        # checkpoint schedule (one whole forward re-run, far less kept) is near


@dataclass
class FreedPeak:
    """The planned peak of ``apply_selective(info, freed)``'s program for any ``freed``, without
    rewriting it: the block's ops read once as records ``(reads, outputs, held bytes)``, the rewrite
    replayed on them (copies reading the current names, writing fresh ones of their original's
    size) and walked as ``planned_peak`` walks (``chain_peak.walk_peak``)."""
    info: ForwardValues
    ops: list[tuple[list, list, int]]
    sizes: dict
    protected: frozenset

    @staticmethod
    def of(block, info: ForwardValues, keep, shapes: Shapes) -> "FreedPeak | None":
        """The model; None when an op's held bytes follow a rule of its own (``peak.HOLDS``) or a
        size is unknown (trials then plan copies)."""
        if any(op.type in HOLDS for op in block.ops):
            return None
        sizer = Sizer(block, shapes)
        ops = [(op_reads(op), list(op.outputs), op_holds(sizer, op, frozenset())[0] if op.sub_blocks() else 0)
               for op in block.ops]
        names = {n for reads, outs, _ in ops for n in reads + outs}
        sizes = {n: sizer.of(n) for n in names}
        if sizer.unknown:
            return None
        persistable = {n for n in names if (var := block.find_var(n)) is not None and var.persistable}
        return FreedPeak(info, ops, sizes, frozenset(keep) | persistable)

    def peak(self, freed: set[str]) -> int:
        closures = _Closures(self.info, {})
        closures.freed = freed
        sizes, fresh = dict(self.sizes), itertools.count()
        n_forward = self.info.n_forward
        stream, current = list(self.ops[:n_forward]), {}
        for reads, outs, held in self.ops[n_forward:]:
            wanted = [n for n in dict.fromkeys(reads) if n in freed and n not in current]
            for index in sorted(closures.of(wanted, limit=math.inf) or ()) if wanted else ():
                copy_reads, copy_outs, copy_held = self.ops[index]
                if all(name in current for name in copy_outs):
                    continue
                copy_reads = [current.get(n, n) for n in copy_reads]
                for name in copy_outs:
                    current[name] = new = next(fresh)
                    sizes[new] = sizes[name]
                stream.append((copy_reads, [current[n] for n in copy_outs], copy_held))
            if not freed.isdisjoint(reads):
                reads = [current.get(n, n) if n in freed else n for n in reads]
            stream.append((reads, outs, held))
        return walk_peak(stream, sizes, self.protected)


def fewest_freed(block, n_forward: int, keep: list[str], feed_shapes, budget: int,
                 shapes: Shapes | None = None, modelled: bool = True) -> tuple[list[str] | None, int | None]:
    """The shortest prefix of ``price_values``' order whose rewrite of a copy of ``block``'s program
    plans within ``budget`` (within ``MAX_SHARE`` of the forward's cost): (names, planned peak);
    ``(None, the lowest planned peak a prefix reaches)`` when none fits (``(None, None)``: no value
    can be freed). Each trial's peak comes from ``FreedPeak`` (``modelled``, where it applies), else
    from a copy of the program rewritten and planned."""
    shapes = shapes if shapes is not None else resolve_shapes(block, feed_shapes)
    info = ForwardValues.of(block, n_forward)
    limit = MAX_SHARE * forward_cost(info, shapes)
    names = [p.name for p in price_values(info, shapes) if p.total <= limit]
    model = FreedPeak.of(block, info, keep, shapes) if modelled and names else None
    peaks: dict[int, int] = {}

    def peak(k: int) -> int:
        if k in peaks:
            return peaks[k]
        if model is not None:
            peaks[k] = model.peak(set(names[:k]))
        else:
            copy = block.program.clone()
            apply_selective(ForwardValues.of(copy.blocks[block.idx], n_forward), set(names[:k]))
            peaks[k] = planned_peak(copy.blocks[block.idx], keep, feed_shapes)
        return peaks[k]

    if not names:
        return None, None
    # The peak falls as values are freed until the copies live at once in the backward outweigh
    # them (it may rise after): the lowest is looked for first, then the shortest prefix that fits.
    lowest = _lowest(peak, len(names))
    if peak(lowest) > budget:
        return None, peak(lowest)
    low, high = 0, lowest                # peak(high) fits; the least k that fits is in (low, high]
    while high - low > 1:
        middle = (low + high) // 2
        if peak(middle) <= budget:
            high = middle
        else:
            low = middle
    return names[:high], peaks[high]


def _lowest(peak, n: int, probes: int = 8) -> int:
    """A prefix length with the lowest ``peak(k)``: the best of ``probes`` evenly spaced lengths,
    then halving steps around it while a neighbour is lower."""
    best = min(range(n, 0, -max(1, n // probes)), key=lambda k: (peak(k), k))
    step = max(1, n // probes) // 2
    while step >= 1:
        for k in (best - step, best + step):
            if 1 <= k <= n and peak(k) < peak(best):
                best = k
        step //= 2
    return best
