"""One memory budget for a whole training step: ``append_backward(loss, memory_budget=, feed_shapes=)``.

The budget bounds the planned peak of a run (``peak.py``: feeds, parameters,
activations kept and recomputed, gradients; the run fetching the loss and the
gradients). The policy, in order:

1. store everything when that fits (tried on a copy of the program; a program none of the
   steps below rewrites before its backward is built, ``_builds_once``, is built once, in place,
   and planned there);
2. else an output layer feeding ``softmax_cross_entropy`` becomes one
   ``LinearCrossEntropy`` op (``passes/fuse_linear_loss.py``: its logits are
   made a chunk at a time, in the forward and again in the backward); a
   transformer stack (a batch-separable forward with attention and a mean
   loss) then runs in the fewest micro-batches that fit, each one's backward
   right after its forward (``micro_batches.py``); else a
   recurrence whose states tensors the program partly reads anyway keeps
   them all when that fits with segments of ``KEPT_SEGMENT`` steps or more
   (its backward then re-runs each segment from them, at once where its
   step is row-wise: ``step_rows.py``); else, when
   no schedule of the program fits, the row-wise ops over a recurrence's
   states tensor (that output layer, the loss) move into its step
   (``time_steps.py``: recomputed with its segments of time steps); every
   loop op (``RecurrentNetwork``, ``While``) without a recompute setting of
   its own gets a byte budget, the backward is built, and one
   activation budget ``A`` is searched for: each loop op keeps at most ``A``
   bytes (binomial checkpointing over its steps, ``rnn_budget.py`` /
   ``while_budget.py``), and the feed-forward chain is reversed by a binomial
   schedule over its units whose checkpoints and tape fit ``A``
   (``binomial.py``). The largest ``A`` whose planned peak fits wins: the
   least recomputation;
3. when none fits, ``ProgramError`` names the least budget that fits (the
   planned peak at the smallest ``A``, or of the most micro-batches when that is
   less), and that budget then works.

Each trial's planned peak comes from the chain model (``chain_peak.py``: the
schedule's rewrite replayed on records of the ops) when no loop takes the
budget, else from a copy of the program configured for it; the program is
rewritten once, for the budget chosen, and its planned peak checked against
the model's (a disagreement falls back to copies).

The mechanisms (copies of forward ops, budgeted loop kernels) are the other
modules' business; this one only decides.
"""
from __future__ import annotations

import gc
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from ..autodiff.rewrites import register_backward_rewrite
from ..ops.nn.linear_cross_entropy import CHUNK_BYTES
from ..passes.expand_fused import expand_fused_ops
from ..passes.fuse_linear_loss import fuse_linear_cross_entropy
from ..errors import ProgramError
from ..ir.program import Block, Program, Var
from ..ops.recurrent.steps import is_budget
from .auto import build_model
from .shape_first import store_all_freeing_shape_reads
from .selective import apply_selective, fewest_freed
from . import policies
from .binomial import Units, apply_binomial
from .chain_peak import ChainPeak
from .lifetimes import ForwardValues
from .micro_batches import ATTENTION, accumulate_micro_batches, loss_over_rows, micro_batch_counts, separable_region
from .peak import Sizer, planned_peak
from .recompute import recompute_backward
from .loops.rnn_budget import states_read_elsewhere
from .loops.schedules import budget_plan
from .sizes import estimated_bytes, resolve_shapes
from .loops.time_steps import sink_time_step_ops
from .loops.trip_counts import largest_loop_vars

LOOP_TYPES = ("RecurrentNetwork", "While")
LOOP_GRAD_TYPES = ("RecurrentNetworkBudgetGrad", "WhileBudgetGrad")
_PLACEHOLDER = 1 << 60      # a loop's budget until the search sets it
_TRIALS = 24
KEPT_SEGMENT = 32       # the fewest steps per segment for which keeping every state pays
SELECTIVE_MAX_OPS = 2000    # larger forwards go to the checkpoint schedules: the selective rung copies
                            # the program per trial, theirs is modelled (chain_peak.py)


@register_backward_rewrite("recompute")
def rewrite_backward(block: Block, n_forward: int, loss: Var, checkpoints, feed_shapes=None):
    """``append_backward(..., checkpoints=)``: recompute at the checkpoints given (``recompute.py``)."""
    return recompute_backward(block, n_forward, loss, checkpoints, feed_shapes)


@dataclass
class BudgetPlan:
    """What ``append_backward(..., memory_budget=)`` chose; ``rg.memory.report(main).plan`` shows it.

    Attributes:
        budget: The budget asked for, in bytes.
        planned_peak: The peak of the step as built.
        store_all_peak: The peak when storing everything (None: a loop's trip
            count decides it).
        activation_budget: The bound given to loops and checkpoint choice (None:
            everything stored).
        units: Feed-forward units under a binomial schedule (0: none).
        micro_batches: How many micro-batches the batch was split into.
        recomputed: How many kept values are made again instead, from the
            values beside them (selective recompute; 0: none).
        reserved_peak: The peak with the caller's reserve (the optimizer's updates).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 32])
            h = x
            for i in range(4):
                h = rg.layers.fc(h, 32, act="tanh", name=f"l{i}")
            loss = rg.mean(h)
            rg.append_backward(loss, memory_budget=240_000, feed_shapes={"x": (256, 32)})
        plan = rg.memory.report(main, feed_shapes={"x": (256, 32)}).plan
        assert plan.budget == 240_000 and plan.planned_peak <= plan.budget < plan.store_all_peak
        ```
    """
    budget: int
    planned_peak: int
    store_all_peak: int | None          # None: a loop's trip count decides it
    activation_budget: int | None       # None: everything stored
    units: int = 0                      # feed-forward units under a binomial schedule (0: none)
    micro_batches: int = 1              # the batch split into micro-batches (micro_batches.py)
    recomputed: int = 0                 # values made again before their gradient readers (selective.py)
    reserved_peak: int | None = None    # what the schedules reserve (the fit): planned_peak <= it <= budget


@register_backward_rewrite("memory_budget")
def fit_memory_budget(loss: Var, memory_budget: int, feed_shapes: Mapping | None,
                      build: Callable[[], tuple[list, int]], reserve: int = 0) -> list:
    """Build the backward of ``loss`` (``build()`` -> (params_grads, n_forward)) within ``memory_budget``,
    of which ``reserve`` bytes are for what the caller appends afterwards (optimizer updates)."""
    total = _check_budget(memory_budget)
    reserve = max(int(reserve), 0)
    budget = total - reserve
    program = loss.block.program
    # The budget schedules recurrences over time steps: whole-layer vendor ops become the general
    # RecurrentNetwork they stand for.
    expand_fused_ops(program)
    if _builds_once(program, build):
        with _collector_paused():
            return _fit_built(loss, feed_shapes, build, budget, total, reserve)
    store_all, scratch = _store_all_peak(loss, feed_shapes, build)
    if store_all is not None and store_all <= budget:
        pairs, _ = build()
        _record(program, BudgetPlan(total, store_all + reserve, store_all + reserve, None))
        return pairs
    # Values the backward reads only for their shape, freed first (policies.py: nothing recomputed).
    pairs = _stored_freeing_shape_reads(loss, feed_shapes, build, budget, total, reserve, store_all)
    if pairs is not None:
        return pairs
    # An output layer feeding softmax_cross_entropy holds one chunk of its logits at a time: one
    # more GEMM, but the room it frees lets the loops keep more (on the LSTM LM at 25% of
    # store-all's peak, fusing only when nothing fits without it took 2x the time).
    fuse_linear_cross_entropy(program, loss.block, chunk_bytes=min(CHUNK_BYTES, max(budget // 16, 1)))
    # A transformer stack runs in micro-batches, each one's backward right after its forward
    # (micro_batches.py): nothing is recomputed, where recomputing whole sub-layers over the batch
    # re-ran the attention and still held one sub-layer's activations over the whole batch.
    pairs = _stored_freeing_shape_reads(loss, feed_shapes, build, budget, total, reserve, store_all)
    if pairs is not None:
        return pairs
    accumulated = _accumulate_micro_batches(loss, feed_shapes, build, budget)
    if accumulated is not None and accumulated[0] is not None:
        pairs, chunks, peak = accumulated
        _record(program, BudgetPlan(total, peak + reserve, None if store_all is None else store_all + reserve,
                                    None, 0, micro_batches=chunks))
        return pairs
    # Single values cheap to make again, freed (selective.py) - after micro-batches, which cost a
    # transformer stack less time than any recompute (and whose planned peak is what a run measures).
    pairs, freed_least = _stored_recomputing_cheap(loss, feed_shapes, build, budget, total, reserve, store_all)
    if pairs is not None:
        return pairs
    # A recurrence keeping every states tensor re-runs each segment of its backward from them, at
    # once where its step is row-wise (rnn_budget.py): no checkpoint advances, no step-by-step
    # re-run. Taken when it fits. Else ops over every time step of a recurrence's states run
    # inside its steps (time_steps.py) when the budget needs it: step by step they cost more time
    # than one GEMM over all steps.
    searched: list[_Scratch] = []       # the search _fits made and the program version it searched
    if _keeps_states(loss.block) and _fits(loss, feed_shapes, build, budget, keep_states=True):
        _keep_states(loss.block)
    elif not _fits(loss, feed_shapes, build, budget, scratch=scratch, searched=searched):
        sink_time_step_ops(program, loss.block, resolve_shapes(loss.block, feed_shapes))
    same = bool(searched) and searched[0].version == program.version and not getattr(build, "callbacks", None)
    _budget_loops(loss.block)
    pairs, n_forward = build()
    keep = [loss.name] + [g.name for _, g in pairs]
    if same and _same_ops(searched[0].program.global_block(), loss.block):
        search = searched[0].search     # _fits searched this very program (a copy, built the same way)
    else:
        search = _Search(program, loss, n_forward, keep, feed_shapes)
    return _choose(loss, program, search, keep, feed_shapes, pairs, budget, total, reserve, store_all, accumulated,
                   freed_least)


def _choose(loss: Var, program: Program, search: "_Search", keep: list[str], feed_shapes, pairs: list, budget: int,
            total: int, reserve: int, store_all: int | None, accumulated, freed_least: int | None = None) -> list:
    """The largest activation budget that fits (``search``), built into ``program`` (its backward
    built: ``pairs``) and recorded; else ``ProgramError`` naming the least budget that fits."""
    best = search.best(budget)
    if best is None and _tail_off(loss.block):
        # The kept tails (policies.py, keep_tail) are live between the forward and the backward: at
        # the least budgets the recurrences keep none, so the policy never raises the least budget.
        search = _Search(program, loss, search.n_forward, keep, feed_shapes)
        best = search.best(budget)
    if best is not None:
        undo = _Undo(program) if search.modelled else None
        units, live = _apply(search, program, keep, feed_shapes, best[0])
        # For the programs the chain model takes (no loop) what is live at once is what a schedule
        # reserves: its peak is the rewritten program's. Should they differ, the model has a
        # defect: the program is put back and searched the old way (a copy per trial).
        if undo is not None and live != best[1]:
            undo.restore()
            search.forget_model()
            best = search.best(budget)
            if best is not None:
                units, live = _apply(search, program, keep, feed_shapes, best[0])
    if best is None:
        least = min(peak for peak in (search.least(), accumulated and accumulated[2], freed_least) if peak)
        least = least if store_all is None else min(least, store_all)     # storing everything fits too
        least += reserve
        stored = ("a trip count decides what storing everything takes" if store_all is None
                  else f"storing everything peaks at {store_all + reserve} bytes")
        error = ProgramError(f"a memory_budget of {total} bytes is below what the training step of "
                             f"'{loss.name}' can run in for feed_shapes={dict(feed_shapes or {})}: the least "
                             f"budget that fits is {least} bytes ({stored})")
        error.least_budget = least        # for callers that offer the least budget instead
        raise error
    activation, peak = best
    _record(program, BudgetPlan(total, live + reserve, None if store_all is None else store_all + reserve,
                                activation, units, reserved_peak=peak + reserve))
    return pairs


# Op types for which a policy step before the backward build rewrites the program (loops, the
# output layer fused with its loss, micro-batches of an attention stack, shape-first reads).
_REWRITTEN_BEFORE_BUILD = frozenset(LOOP_TYPES) | {"SoftmaxCrossEntropy", ATTENTION}


def _builds_once(program: Program, build) -> bool:
    """True when no policy step before the build applies to ``program`` (none of
    ``_REWRITTEN_BEFORE_BUILD``'s ops, no callbacks): its backward is then built once, in place,
    and planned there (no store-all copy built first: the same decisions in half the time)."""
    return not getattr(build, "callbacks", None) and not any(
        op.type in _REWRITTEN_BEFORE_BUILD for block in program.blocks for op in block.ops)


@contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while a program is built and planned in place: the
    plan allocates some 300,000 short-lived containers, and the collections they trigger walk
    every object of the program being planned (10-15% of planning 10,000 ops). What the plan drops
    is freed by reference counting (no program copies on this path); cycles wait for the next
    collection once it is back on."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _fit_built(loss: Var, feed_shapes, build, budget: int, total: int, reserve: int) -> list:
    """``fit_memory_budget`` for a program ``_builds_once`` takes: the backward built in place,
    stored whole when that fits, else searched and rewritten there."""
    program = loss.block.program
    undo = _Undo(program)
    pairs, n_forward = build()
    block = loss.block
    keep = [loss.name] + [g.name for _, g in pairs]
    try:
        shapes = resolve_shapes(block, feed_shapes)
        search = _Search(program, loss, n_forward, keep, feed_shapes, shapes)
        # The chain model's peak of the program as built is its planned peak (chain_peak.py); the
        # program's own walk confirms a fit (a model too optimistic never stores everything).
        model = search._chain_model()
        store_all = model.peak(None) if model is not None else None
        if store_all is None or store_all <= budget:
            store_all = planned_peak(block, keep, feed_shapes, shapes=shapes)
    except ProgramError:
        undo.restore()          # as the copy's build did: the program left unbuilt
        raise
    if store_all <= budget:
        _record(program, BudgetPlan(total, store_all + reserve, store_all + reserve, None))
        return pairs
    done, freed_least = _recompute_cheap_in_place(block, n_forward, keep, feed_shapes, shapes, budget, total,
                                                  reserve, store_all)
    if done:
        return pairs
    search.by_schedule[("all",)] = store_all     # the schedule "all" leaves the program as built
    return _choose(loss, program, search, keep, feed_shapes, pairs, budget, total, reserve, store_all, None,
                   freed_least)


def _apply(search: "_Search", program: Program, keep: list[str], feed_shapes, activation: int) -> tuple[int, int]:
    """Configure ``program`` for ``activation``: (units under a binomial schedule, planned peak).
    The fit counts what the loops' schedules reserve; the plan reports what is live at once."""
    units = search.apply(program, activation)
    _plan_tails(program.global_block(), feed_shapes)     # (with the recompute copies)
    # The chain model's rewrite adds copies the size of their originals: only they need shapes.
    shapes = resolve_shapes(program.global_block(), feed_shapes, known=search.shapes) if search.modelled else None
    return units, planned_peak(program.global_block(), keep, feed_shapes, shapes=shapes, live=True)


class _Undo:
    """What the rewrite of a schedule changes (ops, what they read, variables, blocks, the counts
    behind ``unique_name``), to put back."""

    def __init__(self, program: Program):
        self.program, self.n_blocks = program, len(program.blocks)
        self.name_counts = dict(program.name_counts)
        self.blocks = [(b, list(b.ops), dict(b.vars)) for b in program.blocks]
        self.ops = [(op, op.inputs, op.attrs) for b in program.blocks for op in b.ops]

    def restore(self) -> None:
        del self.program.blocks[self.n_blocks:]
        for block, ops, names in self.blocks:
            block.ops[:] = ops
            block.vars.clear()
            block.vars.update(names)
        for op, inputs, attrs in self.ops:
            op.inputs, op.attrs = inputs, attrs
        self.program.name_counts.clear()
        self.program.name_counts.update(self.name_counts)
        self.program.bump()


def _stored_freeing_shape_reads(loss: Var, feed_shapes, build, budget: int, total: int, reserve: int,
                                store_all: int | None) -> list | None:
    """Store everything but what the backward reads only for its shape, when that fits: built and
    recorded, its pairs; else None (``shape_first.py``, the ``cheap_first`` policy)."""
    stored = store_all_freeing_shape_reads(loss, feed_shapes, build, budget)
    if stored is None:
        return None
    pairs, peak = stored
    _record(loss.block.program, BudgetPlan(total, peak + reserve, None if store_all is None else store_all + reserve,
                                           None))
    return pairs


def _stored_recomputing_cheap(loss: Var, feed_shapes, build, budget: int, total: int, reserve: int,
                              store_all: int | None) -> tuple[list | None, int | None]:
    """Store everything but the fewest values cheap to make again that fit (``selective.py``, the
    ``cheap_first`` policy; searched on a copy): built and recorded, ``(its pairs, None)``; else
    ``(None, the least planned peak it reaches or None)``."""
    if not policies.recomputes_selectively() or len(loss.block.ops) > SELECTIVE_MAX_OPS:   # the forward, unbuilt
        return None, None
    scratch = loss.block.program.clone()
    block = scratch.global_block()
    pairs, n_forward = build(block.var(loss.name), real=False)
    try:
        names, peak = _freed_in(block, n_forward, [loss.name] + [g.name for _, g in pairs], feed_shapes, budget,
                                resolve_shapes(block, feed_shapes))
    except ProgramError as exc:     # a size feed_shapes leaves open: the schedules below say which
        if getattr(exc, "declaration", False):
            raise
        return None, None
    if names is None:
        return None, peak
    pairs, n_forward = build()
    apply_selective(ForwardValues.of(loss.block, n_forward), set(names))
    _record(loss.block.program, BudgetPlan(total, peak + reserve, None if store_all is None else store_all + reserve,
                                           None, recomputed=len(names)))
    return pairs, None


def _recompute_cheap_in_place(block: Block, n_forward: int, keep: list[str], feed_shapes, shapes, budget: int,
                              total: int, reserve: int, store_all: int) -> tuple[bool, int | None]:
    """``_stored_recomputing_cheap`` for a program built in place (``_fit_built``): (done, the least
    planned peak it reaches when not done)."""
    if not policies.recomputes_selectively() or n_forward > SELECTIVE_MAX_OPS:
        return False, None
    names, peak = _freed_in(block, n_forward, keep, feed_shapes, budget, shapes)
    if names is None:
        return False, peak
    _record(block.program, BudgetPlan(total, peak + reserve, store_all + reserve, None, recomputed=len(names)))
    return True, None


def _freed_in(block: Block, n_forward: int, keep: list[str], feed_shapes, budget: int,
              shapes) -> tuple[list[str] | None, int | None]:
    """The fewest values to free that fit (``selective.fewest_freed``), freed in ``block``: (names,
    planned peak); else ``(None, the least planned peak reached)`` with ``block`` unchanged. The
    model's peak is checked against the rewritten block's own: should they differ, the block is
    put back and searched with a copy per trial."""
    names, peak = fewest_freed(block, n_forward, keep, feed_shapes, budget, shapes)
    if names is None:
        return None, peak
    undo = _Undo(block.program)
    apply_selective(ForwardValues.of(block, n_forward), set(names))
    known = resolve_shapes(block, feed_shapes, known=shapes)
    if planned_peak(block, keep, feed_shapes, shapes=known) == peak:
        return names, peak
    undo.restore()
    names, peak = fewest_freed(block, n_forward, keep, feed_shapes, budget, shapes, modelled=False)
    if names is not None:
        apply_selective(ForwardValues.of(block, n_forward), set(names))
    return names, peak


def _plan_tails(block: Block, feed_shapes) -> None:
    """A recurrence keeping its tail keeps it up to the length planned for (``rnn_budget.tail_kept``)."""
    ops = [op for op in block.ops if op.type == "RecurrentNetwork" and op.attrs.get("budget_tail")]
    if not ops:
        return
    shapes = resolve_shapes(block, feed_shapes)
    for op in ops:
        op.attrs["budget_tail_steps"] = int((shapes.get(op.inputs[0]) or (0,))[0])
    block.program.bump()


def _tail_off(block: Block) -> bool:
    """Budgeted recurrences keep no tail (``budget_tail_off``); True if one kept one."""
    ops = [op for op in block.ops if op.type == "RecurrentNetwork" and op.attrs.get("budget_tail")]
    for op in ops:
        op.attrs["budget_tail_off"] = True
    block.program.bump()
    return bool(ops)


def _budget_loops(block: Block) -> None:
    """Every loop op without a recompute setting of its own gets a byte budget (set by the search)."""
    for op in block.ops:
        if op.type in LOOP_TYPES and op.attrs.get("recompute") is None:
            op.attrs["recompute"] = _PLACEHOLDER
    block.program.bump()


def _keeps_states(block: Block) -> bool:
    """True when a recurrent op would keep its states tensors (``_keep_states``)."""
    return any(op.type == "RecurrentNetwork" and op.attrs.get("recompute") is None
               and any(states_read_elsewhere(op)) for op in block.ops)


def _keep_states(block: Block) -> None:
    """Recurrent ops the budget sets keep every states tensor for their backward, where the
    program reads one of them anyway (then the memory the op holds outside its budget already
    grows with a longer run-time length; an op whose states tensors nothing reads stays within
    its budget at any length, as checkpoints keep it)."""
    for op in block.ops:
        if op.type == "RecurrentNetwork" and op.attrs.get("recompute") is None and any(states_read_elsewhere(op)):
            op.attrs["budget_keep_states"] = True
    block.program.bump()


@dataclass
class _Scratch:
    """A copy of the program with its backward built (``build(real=False)``), made at ``version``."""
    program: Program
    version: int
    pairs: list
    n_forward: int
    search: "_Search | None" = None
    shapes: dict | None = None          # resolved for feed_shapes
    store_all: int | None = None        # its planned peak as built (storing everything)


def _fits(loss: Var, feed_shapes, build, budget: int, keep_states: bool = False, scratch: _Scratch | None = None,
          searched: list | None = None) -> bool:
    """True when some schedule of the program as it is fits ``budget`` (searched on a copy), with
    ``keep_states`` when its recurrent ops keep every states tensor. ``scratch``: the store-all
    copy, searched instead of a new one when nothing changed since (no loop to budget either);
    ``searched`` gets the search made."""
    program = loss.block.program
    if keep_states or scratch is None or scratch.version != program.version or _has_loops(program.global_block()):
        version = program.version
        copy = program.clone()
        block = copy.global_block()
        if keep_states:
            _keep_states(block)
        _budget_loops(block)
        pairs, n_forward = build(block.var(loss.name), real=False)
        scratch = _Scratch(copy, version, pairs, n_forward)
    block = scratch.program.global_block()
    keep = [loss.name] + [g.name for _, g in scratch.pairs]
    search = scratch.search = _Search(scratch.program, block.var(loss.name), scratch.n_forward, keep, feed_shapes,
                                      scratch.shapes)
    if scratch.store_all is not None and not search.loops:     # the schedule "all" leaves the copy as built
        search.by_schedule[("all",)] = scratch.store_all
    if searched is not None:
        searched.append(scratch)
    best = search.best(budget)
    if best is None or not keep_states:
        return best is not None
    # Kept states pay only with segments of KEPT_SEGMENT steps or more (each segment's backward
    # has its own batched products) and no feed-forward recompute of the recurrence itself.
    activation = best[0]
    sizer = Sizer(block, search.shapes)
    tapes = [_one_step_tape(sizer, op) for op in block.ops[:n_forward] if op.type == "RecurrentNetwork"
             and is_budget(op.attrs.get("recompute"))]
    return (search.units.count < 2 or activation >= search.model.store_all) and all(
        activation >= KEPT_SEGMENT * tape for tape in tapes)


def _micro_batchable(loss: Var, shapes, build):
    """The batch-separable region of a transformer stack whose loss is a mean or sum over its rows
    (``micro_batches.py``), or None."""
    region = separable_region(loss.block, shapes)
    if region is None or not region.attends or getattr(build, "param_names", None) is None:
        return None
    return region if loss_over_rows(loss.block, region, loss.name) is not None else None


def _accumulate_micro_batches(loss: Var, feed_shapes, build, budget: int) -> tuple[list, int, int] | None:
    """Micro-batches of a transformer stack (a batch-separable forward with attention and a mean
    loss, ``micro_batches.py``): the fewest whose accumulated gradients fit ``budget`` (tried on
    copies), built into the program: ``(pairs, micro-batches, planned peak)``; when none fits,
    ``(None, 0, the least planned peak)`` (more micro-batches are tried while the peak falls);
    None when the program is not one. Other batch-separable chains (an MLP) keep the binomial
    schedule over their layers, which reaches low budgets with bit-identical gradients."""
    shapes = resolve_shapes(loss.block, feed_shapes)
    region = _micro_batchable(loss, shapes, build)
    if region is None:
        return None
    params = build.param_names
    least = None
    for chunks in micro_batch_counts(region.rows):
        scratch = loss.block.program.clone()
        block = scratch.global_block()
        pairs = accumulate_micro_batches(scratch, block, separable_region(block, shapes), chunks, loss.name,
                                         params, build.no_grad)
        peak = planned_peak(block, [loss.name] + [g.name for _, g in pairs], feed_shapes)
        if peak <= budget:
            pairs = accumulate_micro_batches(loss.block.program, loss.block, region, chunks, loss.name,
                                             params, build.no_grad, build.callbacks)
            return pairs, chunks, peak
        if least is not None and peak >= least:      # what every micro-batch holds dominates
            break
        least = peak
    return None if least is None else (None, 0, least)


def _check_budget(memory_budget) -> int:
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget < 0:
        raise ProgramError(f"memory_budget must be a number of bytes (an int >= 0), got {memory_budget!r}")
    return memory_budget


def _store_all_peak(loss: Var, feed_shapes, build) -> tuple[int | None, _Scratch]:
    """The planned peak of storing everything, built on a copy (None when a loop's trip count
    decides it: what it keeps per iteration has no size before the run), and that copy."""
    version = loss.block.program.version
    copy = loss.block.program.clone()
    block = copy.global_block()
    pairs, n_forward = build(block.var(loss.name), real=False)
    scratch = _Scratch(copy, version, pairs, n_forward)
    keep = [loss.name] + [g.name for _, g in pairs]
    try:
        scratch.shapes = resolve_shapes(block, feed_shapes)
        scratch.store_all = planned_peak(block, keep, feed_shapes, shapes=scratch.shapes)
        return scratch.store_all, scratch
    except ProgramError:
        if any(op.type == "While" for op in block.ops):
            return None, scratch
        raise


def _same_ops(a: Block, b: Block) -> bool:
    """True when the two blocks run the same ops on the same names (a copy built like the original)."""
    return len(a.ops) == len(b.ops) and all(
        x.type == y.type and x.inputs == y.inputs and x.outputs == y.outputs for x, y in zip(a.ops, b.ops))


def _has_loops(block: Block) -> bool:
    return any(op.type in LOOP_TYPES for op in block.ops)


def _record(program: Program, plan: BudgetPlan) -> None:
    """Kept on the program for ``rg.memory.report`` (not serialized: a plan is for this build)."""
    program.memory_plan = plan


def _one_step_tape(sizer: Sizer, op) -> int:
    attrs = op.attrs
    if op.type == "RecurrentNetwork":
        n_seq, n_state = len(attrs["inputs_t"]), len(attrs["states"])
        states = op.inputs[n_seq:n_seq + n_state]
        rows = max((sizer.shapes.get(states[0]) or (1,))[0], 1)
        tape = sum(sizer.var_bytes(attrs["step"].var(n), rows) for n in attrs.get("budget_tape", ()))
        tape += sum(math.prod(rows if d < 0 else d for d in shape) * np.dtype(dtype).itemsize
                    for shape, dtype in attrs.get("budget_batched", ()))
    else:
        n = len(attrs["carry_binds"])
        states = op.inputs[:n]
        rows = max([(sizer.shapes.get(s) or (1,))[0] for s in states if len(sizer.shapes.get(s, ())) >= 2] + [1])
        full = attrs.get("ys_full") or [True] * len(attrs["ys"])
        tape = sum(sizer.var_bytes(attrs["body"].var(y), rows) for y, f in zip(attrs["ys"], full) if f)
        return tape + largest_loop_vars(sizer, op)      # a TensorArray loop var at its largest
    return tape + sum(sizer.of(s) for s in states)


class _Search:
    """Planned peaks of the program for activation budgets ``A`` (from the chain model, else each tried on a copy)."""

    def __init__(self, program: Program, loss: Var, n_forward: int, keep: list[str], feed_shapes, shapes=None):
        self.program, self.loss, self.n_forward, self.keep = program, loss, n_forward, keep
        self.feed_shapes = feed_shapes
        block = program.global_block()
        self.shapes = shapes if shapes is not None else resolve_shapes(block, feed_shapes)
        info = ForwardValues.of(block, n_forward)
        sizes = {n: estimated_bytes(block.var(n), self.shapes) for n in info.writers}
        self.model = build_model(info, loss.name, sizes)
        self.units = Units.of(self.model, n_forward)
        self.state_bytes = max(self.model.ckpt_bytes, default=0)
        reads = [b - a for a, b in zip([0] + self.model.read_before, self.model.read_before + [self.model.store_all])]
        self.tape_bytes = max(reads, default=0) + self.state_bytes
        self.loop_least = self._loop_least(block)
        # A loop keeps at most A; the feed-forward schedule at least its own tape (a loop's least
        # budget is far below a feed-forward unit's when h_all [T, N, H] is one unit).
        self.least_a = max(self.loop_least, 1) if self.loop_least else max(self.tape_bytes, 1)
        self.most_a = max(self.model.store_all, self.loop_least) * 2 + 1
        self.peaks: dict[int, int | None] = {}
        self.why: ProgramError | None = None      # why the last refused activation budget failed
        # Without budgeted loops the program an activation budget configures is a function of its
        # feed-forward schedule alone: budgets with the same schedule share one planned peak
        # (half the trials of a deep MLP's search repeat a schedule).
        self.loops = any(op.attrs.get("recompute") == _PLACEHOLDER or op.attrs.get("budget") == _PLACEHOLDER
                         for op in block.ops if op.type in LOOP_TYPES + LOOP_GRAD_TYPES)
        self.by_schedule: dict[tuple, int | None] = {}
        # Without them the peak of a schedule comes from the chain model: the rewrite replayed on
        # records of the ops, no copy of the program (chain_peak.py; 10,000 ops in seconds, not minutes).
        self.info = info
        self.model_peaks: ChainPeak | None | bool = not self.loops      # True: not built yet
        self.modelled = False        # some peak came from the chain model

    def _chain_model(self) -> ChainPeak | None:
        """The chain model of the program (built on first use; None with loops or ops it cannot take)."""
        if self.model_peaks is True:
            block = self.program.global_block()
            self.model_peaks = ChainPeak.of(block, self.info, self.units, self.keep, self.shapes)
            self.model_version = self.program.version
        return self.model_peaks or None

    def forget_model(self) -> None:
        """Plan every schedule on a copy of the program from now on (``peak``)."""
        self.model_peaks, self.modelled = None, False
        self.peaks, self.by_schedule = {}, {}

    def _loop_least(self, block: Block) -> int:
        """The least budget a loop op can run with: one taped step (what its backward reads of one
        step, its states, and for a recurrent op the step's rows of the time-batched buffers)."""
        sizer = Sizer(block, self.shapes)
        least = 0
        for op in block.ops[:self.n_forward]:
            if op.type in LOOP_TYPES and is_budget(op.attrs.get("recompute")):
                least = max(least, _one_step_tape(sizer, op))
        return least

    def peak(self, activation: int) -> int | None:
        """The planned peak with activation budget ``activation`` (None when no schedule fits it)."""
        if activation not in self.peaks:
            schedule = self._schedule(activation)
            if schedule is not None and schedule in self.by_schedule:
                self.peaks[activation] = self.by_schedule[schedule]
                return self.peaks[activation]
            if schedule is not None and self._chain_model() is not None:
                self.peaks[activation] = self.by_schedule[schedule] = self._model_peak(activation)
                self.modelled = True
                return self.peaks[activation]
            scratch = self.program.clone()
            try:
                self._configure(scratch, activation)
                self.peaks[activation] = planned_peak(scratch.global_block(), self.keep, self.feed_shapes)
            except ProgramError as exc:
                self.peaks[activation] = None
                self.why = exc          # what the least budget's refusal names
            if schedule is not None:
                self.by_schedule[schedule] = self.peaks[activation]
        return self.peaks[activation]

    def _model_peak(self, activation: int) -> int | None:
        """The chain model's planned peak of what ``_configure`` makes of the program."""
        if self.units.count < 2 or activation >= self.model.store_all:
            return self.model_peaks.peak(None)
        try:
            plan = budget_plan(self.units.count, max(activation, self.tape_bytes), self.state_bytes, self.tape_bytes)
        except ProgramError as exc:
            self.why = exc
            return None
        return self.model_peaks.peak(plan)

    def _schedule(self, activation: int) -> tuple | None:
        """What ``_configure(program, activation)`` makes of the program when no loop takes the
        budget: ``("all",)`` (nothing recomputed) or the binomial plan's ``(segment, slots)``
        (``make_plan``'s arguments: the plan is a function of them); None when loops take it."""
        if self.loops:
            return None
        if self.units.count < 2 or activation >= self.model.store_all:
            return ("all",)
        try:
            plan = budget_plan(self.units.count, max(activation, self.tape_bytes), self.state_bytes, self.tape_bytes)
        except ProgramError:
            return ("none",)
        return (plan.steps, plan.segment, plan.slots)

    def _configure(self, program: Program, activation: int) -> int:
        """Give ``program`` (this program or a copy) the loop budgets and FF schedule of ``activation``."""
        block = program.global_block()
        modelled = (isinstance(self.model_peaks, ChainPeak) and program is self.program
                    and program.version == self.model_version)
        for op in block.ops:
            if op.type in LOOP_TYPES and op.attrs.get("recompute") == _PLACEHOLDER:
                op.attrs["recompute"] = activation
            elif op.type in LOOP_GRAD_TYPES and op.attrs.get("budget") == _PLACEHOLDER:
                op.attrs["budget"] = activation
        program.bump()
        if self.units.count < 2 or activation >= self.model.store_all:
            return 0
        plan = budget_plan(self.units.count, max(activation, self.tape_bytes), self.state_bytes, self.tape_bytes)
        if modelled:        # the program the chain model read, unchanged since: its reads serve the rewrite
            apply_binomial(block, self.info, self.units, plan, self.model_peaks.chain)
        else:
            apply_binomial(block, ForwardValues.of(block, self.n_forward), self.units, plan)
        return self.units.count

    def best(self, budget: int) -> tuple[int, int] | None:
        """The largest activation budget whose planned peak fits ``budget``, with that peak."""
        fits = lambda a: self.peak(a) is not None and self.peak(a) <= budget  # noqa: E731
        self.most_a = max(self.most_a, budget)       # a loop's own keep never needs more than all
        if fits(self.most_a):
            return self.most_a, self.peak(self.most_a)
        lo, hi = self.least_a, self.most_a            # fits(lo) (asked last), not fits(hi)
        for _ in range(_TRIALS):
            if hi - lo <= max(1, lo // 64):
                break
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        # The least activation budget is the costliest schedule to plan (every unit recomputed from
        # the start: quadratic in the units); asked only when no larger one fits.
        if lo == self.least_a and not fits(lo):
            return None
        return lo, self.peak(lo)

    def least(self) -> int:
        """The least budget that fits: the planned peak at the smallest activation budget."""
        peak = self.peak(self.least_a)
        if peak is None:
            raise ProgramError(f"no recompute schedule of the backward of '{self.loss.name}' fits any budget"
                               + (f": {self.why}" if self.why is not None else ""))
        return peak

    def apply(self, program: Program, activation: int) -> int:
        return self._configure(program, activation)
