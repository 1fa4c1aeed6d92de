"""Choosing checkpoints: a cost model of a chain-like forward and a dynamic program over it.

The model (single-level recompute, the mechanism of ``recompute.py``):

* a *cut* after forward op ``p`` is usable when the only temporaries that
  cross it are outputs of ``p`` (an articulation point of the dataflow: the
  joints of a chain, the ends of residual blocks); those outputs become the
  checkpoints;
* the backward of the part after the last cut runs first, holding every
  checkpoint plus the values that part's gradient ops read;
* the backward of segment ``(a, b]`` holds the checkpoints up to ``b`` plus
  the recomputed values its gradient ops read (and one transient);
* every op up to the last cut runs twice, so the recompute cost depends on
  the last cut only: the least recompute that fits a budget is the earliest
  last cut for which some checkpoint chain fits.

``fits`` is a dynamic program: ``best[j]`` is the least total checkpoint
size of a chain ending at cut ``j`` whose segments all fit the budget.
Smaller is always better for later segments, so the minimum is exact for
this model. ``auto`` (no budget) takes the smallest budget that fits: the
peak of Chen et al.'s sqrt(n) rule or lower.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..autodiff.backward import append_backward
from ..errors import ProgramError
from ..ir.analysis import op_reads
from ..ir.program import Var
from .lifetimes import ForwardValues, ancestors
from .shape_reads import stand_in_names
from .sizes import estimated_bytes, resolve_shapes, value_bytes

_MAX_CUTS = 400   # the dynamic program is quadratic in cuts; longer chains are thinned evenly


@dataclass
class ChainModel:
    """Sizes the policy needs, indexed by usable cut (ascending forward position)."""
    positions: list[int]          # forward op index of each cut
    checkpoints: list[list[str]]  # values kept at each cut
    ckpt_bytes: list[int]
    ckpt_read_bytes: list[int]    # the part of ckpt_bytes the backward reads (counted in read_before)
    read_before: list[int]        # bytes of backward-read values written at or before the cut
    transient_before: list[int]   # largest temporary not read by the backward, up to the cut
    work_before: list[int]        # cost of running the forward ops up to the cut
    store_all: int                # bytes of every forward value the backward reads

    def recomputed_bytes(self, i: int, j: int) -> int:
        """Bytes the backward reads from segment (cut i, cut j] other than its checkpoints."""
        before = self.read_before[i] if i >= 0 else 0
        return self.read_before[j] - before - self.ckpt_read_bytes[j]

    def tail_bytes(self, j: int) -> int:
        return self.store_all - self.read_before[j]


def build_model(info: ForwardValues, loss: str, sizes: Mapping[str, int]) -> ChainModel:
    """The cut model of the forward ``info`` for the given value sizes."""
    _, path = ancestors(info.block, info.n_forward, loss)
    ops = info.block.ops
    backward = {n for n in info.backward_reads if info.is_temporary(n)}
    positions, checkpoints, ckpt_bytes, ckpt_read, read_before, transient, work = ([] for _ in range(7))
    live: dict[str, int] = {}       # crossing temporaries -> last forward reader
    read_total = transient_max = work_total = 0
    for p in range(info.n_forward):
        op = ops[p]
        if p in path:
            work_total += sum(sizes.get(n, 0) for n in list(op_reads(op)) + list(op.outputs))
        for name in op.outputs:
            if not info.is_temporary(name):
                continue
            if name in backward:
                read_total += sizes.get(name, 0)
            else:
                transient_max = max(transient_max, sizes.get(name, 0))
            last = max(info.readers.get(name, [-1]))
            if last > p:
                live[name] = last
        for name in [n for n, last in live.items() if last <= p]:
            del live[name]
        crossing = list(live)
        if p in path and crossing and all(name in op.outputs for name in crossing) and p != info.n_forward - 1:
            positions.append(p)
            checkpoints.append(crossing)
            ckpt_bytes.append(sum(sizes.get(n, 0) for n in crossing))
            ckpt_read.append(sum(sizes.get(n, 0) for n in crossing if n in backward))
            read_before.append(read_total)
            transient.append(transient_max)
            work.append(work_total)
            transient_max = 0
    model = ChainModel(positions, checkpoints, ckpt_bytes, ckpt_read, read_before, transient, work,
                       read_total)
    return _thinned(model) if len(positions) > _MAX_CUTS else model


def _thinned(model: ChainModel) -> ChainModel:
    step = len(model.positions) / _MAX_CUTS
    keep = sorted({int(k * step) for k in range(_MAX_CUTS)})
    transient = []
    for a, b in zip([-1] + keep[:-1], keep):
        transient.append(max(model.transient_before[a + 1:b + 1]))
    pick = lambda xs: [xs[k] for k in keep]  # noqa: E731
    return ChainModel(pick(model.positions), pick(model.checkpoints), pick(model.ckpt_bytes),
                      pick(model.ckpt_read_bytes), pick(model.read_before), transient,
                      pick(model.work_before), model.store_all)


def fits(model: ChainModel, budget: int) -> list[int] | None:
    """Cuts (indices into the model) of least recompute whose peak fits ``budget``; None if none."""
    n = len(model.positions)
    best: list[float] = [float("inf")] * n
    parent: list[int] = [-1] * n
    for j in range(n):
        transient = 0
        for i in range(j - 1, -2, -1):          # segment (cut i, cut j], longer and longer
            transient = max(transient, model.transient_before[i + 1])
            prior = 0 if i < 0 else best[i]
            held = prior + model.ckpt_bytes[j] + model.recomputed_bytes(i, j) + transient
            if held <= budget and prior + model.ckpt_bytes[j] < best[j]:
                best[j] = prior + model.ckpt_bytes[j]
                parent[j] = i
    feasible = [j for j in range(n) if best[j] + model.tail_bytes(j) <= budget]
    if not feasible:
        return None
    last = min(feasible, key=lambda j: (model.work_before[j], best[j]))
    chain = []
    while last >= 0:
        chain.append(last)
        last = parent[last]
    return chain[::-1]


def smallest_budget(model: ChainModel) -> int:
    """The least budget any checkpoint chain fits in (binary search on ``fits``)."""
    lo, hi = 0, model.store_all
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(model, mid) is not None:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _names(model: ChainModel, cuts: Sequence[int]) -> list[str]:
    return [name for j in cuts for name in model.checkpoints[j]]


def _sizes(info: ForwardValues, feed_shapes, exact: bool) -> dict[str, int]:
    shapes = resolve_shapes(info.block, feed_shapes)
    sizes, unknown = {}, []
    stand_ins = stand_in_names(info.block)
    for name in info.writers:
        var = info.block.find_var(name)
        if name in stand_ins:        # one element, whatever the shape it stands in for
            sizes[name] = np.dtype(var.dtype).itemsize
            continue
        size = value_bytes(var, shapes)
        if size is None:
            unknown.append(name)
            size = estimated_bytes(var, shapes)
        sizes[name] = size
    if exact and unknown:
        raise ProgramError(f"sizes of {', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''} "
                           "depend on run-time shapes; pass feed_shapes={'x': (batch, ...)}")
    return sizes


def choose_checkpoints(info: ForwardValues, loss: str, budget: int | None = None,
                       feed_shapes=None) -> list[str]:
    """Checkpoint names for ``info``'s forward: least recompute within ``budget``, or least memory.

    Without a budget, unknown sizes count as 1 (the choice only compares sizes).
    """
    model = build_model(info, loss, _sizes(info, feed_shapes, exact=budget is not None))
    if budget is None:
        if not model.positions:
            return []
        budget = smallest_budget(model)
    elif model.store_all <= budget:
        return []
    cuts = fits(model, budget)
    if cuts is None:
        minimum = smallest_budget(model) if model.positions else model.store_all
        raise ProgramError(f"no checkpoints fit a budget of {budget} bytes for the backward of "
                           f"'{loss}'; the least that fits is {minimum} bytes (store-all takes "
                           f"{model.store_all})")
    return _names(model, cuts)


def auto_checkpoints(loss: Var, budget_bytes: int, feed_shapes: Mapping | None = None) -> list[Var]:
    """Checkpoints for ``append_backward(loss, checkpoints=...)`` that fit a memory budget.

    ``budget_bytes`` bounds the forward values held for the backward (kept plus
    recomputed), on top of inputs, parameters and gradients. Among the
    checkpoint sets that fit, the one recomputing least is returned; ``[]``
    when storing everything fits.

    Args:
        loss: The scalar loss Var (its program holds the forward only).
        budget_bytes: The bound, in bytes.
        feed_shapes: ``{name: shape}`` resolving run-time sizes (``-1``).

    Returns:
        The checkpoint Vars.

    Raises:
        ProgramError: No checkpoints fit (naming the least budget that fits).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 64])
            h = x
            for i in range(6):
                h = rg.layers.fc(h, 64, act="tanh", name=f"l{i}")
            loss = rg.mean(h)
            ckpts = rg.memory.auto_checkpoints(loss, 150_000, {"x": (128, 64)})
            rg.append_backward(loss, checkpoints=ckpts)
        assert ckpts and rg.memory.report(main, feed_shapes={"x": (128, 64)}).recomputed
        ```
    """
    if not isinstance(loss, Var):
        raise ProgramError(f"auto_checkpoints needs the loss Var, got {type(loss).__name__}")
    program = loss.block.program
    scratch = program.clone()
    scratch_loss = scratch.global_block().var(loss.name)
    block = scratch.global_block()
    last_forward = block.ops[-1]
    append_backward(scratch_loss)      # may insert shape stand-ins into the forward (shape_reads.py)
    n_forward = next(i for i, op in enumerate(block.ops) if op is last_forward) + 1
    info = ForwardValues.of(block, n_forward)
    names = choose_checkpoints(info, loss.name, int(budget_bytes), feed_shapes)
    return [loss.block.var(n) for n in names]
