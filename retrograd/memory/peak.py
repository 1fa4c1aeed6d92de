"""The planned peak of a run: the executor's liveness replayed on sizes instead of arrays.

``planned_peak`` follows the liveness the executor's plans follow (both read
``ir.analysis.lifetimes``: the same ops skipped, the same values dying after the same
op) and walks it adding and removing bytes, as ``MemoryMeter`` would. What a
looping op holds while it runs (states tensors, checkpoints, one step's
values, time-batched buffers, its budget) comes from a per-op model
(``HOLDS``); a budgeted recurrent op holds what the schedule its kernels
will run keeps (``rnn_budget.checkpoint_plan``, asked with the sizes the
kernel measures), not its whole budget; everything else holds only its
inputs and outputs. Sizes are
upper bounds where the executor may share a buffer (a view counts as new),
so the planned peak bounds the measured one from above for the shapes given.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np

from ..errors import ProgramError
from ..ir.analysis import lifetimes, op_reads
from ..ir.program import Block, Var
from ..ops.recurrent.network_grad import TimeBatches
from ..ops.recurrent.steps import is_budget
from .loops.rnn_budget import (SCHEDULE_LEN, batched_bytes, batched_rows, checkpoint_plan, long_tail, tail_kept,
                                tail_shared)
from .shape_reads import stand_in_names
from .loops.step_rows import (input_row_ops, output_row_ops, row_bytes, rows_batchable, rows_chunk)
from .sizes import Shapes, resolve_shapes
from .loops.trip_counts import unbounded_loops




_ITEMSIZES: dict[str, int] = {}


def _itemsize(dtype: str) -> int:
    """``np.dtype(dtype).itemsize``, asked once per dtype (planning asks per value)."""
    size = _ITEMSIZES.get(dtype)
    if size is None:
        size = _ITEMSIZES[dtype] = np.dtype(dtype).itemsize
    return size


class Sizer:
    """Bytes of values at resolved shapes; -1 dims inside loop bodies take the batch ``rows``.
    ``live``: a budgeted loop's segment counts what is live at once rather than what its
    schedule reserves (``planned_peak(..., live=True)``)."""

    def __init__(self, block: Block, shapes: Shapes, live: bool = False):
        self.block, self.shapes, self.live_only = block, shapes, live
        self.stand_ins = stand_in_names(block)
        self.unknown: list[str] = []
        self.live: dict[str, int] = {}       # bytes of the values live at the op being planned
        self.dying: tuple = ()               # the values dying after the op being planned

    def of(self, name: str, block: Block | None = None) -> int:
        var = (block or self.block).find_var(name)
        if var is None:
            return 0
        if name in self.stand_ins:
            return _itemsize(var.dtype)
        shape = self.shapes.get(name, var.shape) if block is None else var.shape
        if 0 in shape:          # empty whatever its other sizes (a TensorArray not written yet)
            return 0
        if shape and min(shape) < 0:
            self.unknown.append(name)
            shape = tuple(max(d, 1) for d in shape)
        return int(math.prod(shape)) * _itemsize(var.dtype)

    def var_bytes(self, var: Var, rows: int, steps: int = 1) -> int:
        """A loop body's value with -1 taken as the batch ``rows`` (where its loop did not resolve
        it: ``loops/trip_counts.py``), times ``steps``."""
        shape = self.shapes.get(var.name, var.shape) if var.block is not self.block else var.shape
        return steps * int(math.prod(rows if d < 0 else d for d in shape)) * np.dtype(var.dtype).itemsize

    def block_bytes(self, block: Block, rows: int) -> int:
        """The most bytes one run of a body holds: its values live from their op to their last
        reader in the body (never-read ones, the results, to the end), nested bodies' peaks on
        top. What the body reads from outside is bound, not allocated."""
        last: dict[str, int] = {}
        for i, op in enumerate(block.ops):
            for name in op_reads(op):
                last[name] = i
        end = len(block.ops)
        live = peak = 0
        dying: dict[int, int] = {}
        for i, op in enumerate(block.ops):
            out = 0
            for name in op.outputs:
                var = block.vars.get(name)
                if var is not None:
                    size = self.var_bytes(var, rows)
                    out += size
                    dies = last.get(name, end)
                    dying[max(dies, i)] = dying.get(max(dies, i), 0) + size
            inner = sum(self.block_bytes(sub, rows) for sub in op.sub_blocks())
            peak = max(peak, live + out + inner)
            live += out - dying.pop(i, 0)
        return peak


# --- what looping ops hold ---------------------------------------------------------------------------

def _rows(sizer: Sizer, op, first_state: int) -> int:
    """The batch size N of a recurrent op (from its first initial state's resolved shape)."""
    shape = sizer.shapes.get(op.inputs[first_state], (1,))
    return max(shape[0], 1) if shape else 1


def _steps(sizer: Sizer, op) -> int:
    """T of a recurrent op, from its first sequence's resolved shape."""
    steps = sizer.shapes.get(op.inputs[0], (-1,))[0]
    if steps < 0:
        sizer.unknown.append(op.inputs[0])
    return max(steps, 1)


def _rnn_holds(sizer: Sizer, op, live) -> tuple[int, list[int]]:
    attrs = op.attrs
    n_seq, n_state = len(attrs["inputs_t"]), len(attrs["states"])
    steps = _steps(sizer, op)
    rows = _rows(sizer, op, n_seq)
    states = [sizer.of(n) for n in op.inputs[n_seq:n_seq + n_state]]
    transient = sizer.block_bytes(attrs["step"], rows)
    outs = [0] * len(op.outputs)
    budget = int(attrs["recompute"]) if is_budget(attrs.get("recompute")) else None
    graded = budget is not None and bool(attrs.get("budget_outputs")) and any(
        len(op.outputs) - 1 - j in live for j in range(n_state + 1))
    from_alls = graded and all(attrs["budget_all"])
    for i, size in enumerate(states):
        outs[2 * i] = (steps + 1) * size if 2 * i in live or from_alls else 0
        outs[2 * i + 1] = size
    held = transient + 2 * sum(states)
    if budget is not None:
        held += _input_rows_bytes(op, op.inputs[n_seq + n_state + int(bool(attrs["has_lengths"])):], steps, rows,
                                  budget)
    if budget is None:
        for j, (name, full) in enumerate(zip(attrs.get("saved", ()), attrs.get("saved_full", ()))):
            if 2 * n_state + j in live and full:
                outs[2 * n_state + j] = sizer.var_bytes(attrs["step"].var(name), rows, steps)
    elif graded:      # the checkpoints of the schedule the kernel will choose, and its tail
        tape = _tape_bytes(sizer, attrs["step"], attrs["budget_tape"], attrs["budget_batched"], states, rows,
                           from_alls)
        long = tail_kept(attrs, steps) and long_tail(op)     # policies.py, "tape_first"
        plan = checkpoint_plan(steps, budget, sum(states), tape, from_alls, batched=batched_bytes(
            attrs["budget_batched"], rows) if long else None,
            unaliased=batched_bytes(attrs.get("budget_batched_unaliased", ()), rows))
        first = len(op.outputs) - n_state - 1
        if not from_alls:
            for i, size in enumerate(states):
                outs[first + i] = len(plan.sweep_stores) * size
            outs[-1] = 8 * SCHEDULE_LEN
        for j, size in enumerate(_tail_bytes(sizer, op, plan, steps, rows)):
            outs[2 * n_state + j] = size
    return held, outs


def _tail_bytes(sizer: Sizer, op, plan, steps: int, rows: int) -> list[int]:
    """Bytes of each tail output of a budgeted recurrent op (``rnn_budget.tail_vars``): one
    segment's rows of each tape value, one more row of each state."""
    attrs = op.attrs
    n_state = len(attrs["states"])
    inits = op.inputs[len(attrs["inputs_t"]):len(attrs["inputs_t"]) + n_state]
    segment = plan.tail or max(1, min(plan.segment, steps))
    tape = [sizer.var_bytes(attrs["step"].var(n), rows, segment) for n in attrs.get("budget_tape", ())]
    n_tail = len(op.outputs) - 3 * n_state - 1
    if not tail_kept(attrs, steps):             # outputs kept empty (budget.py: the least budgets)
        return [0] * max(n_tail, 0)
    states = [(segment + 1) * sizer.of(n) for n in inits] if n_tail > len(tape) else []
    return (tape + states)[:n_tail] if n_tail > 0 else []


def _tape_bytes(sizer: Sizer, step: Block, tape: list, batched_rows: list, states: list[int], rows: int,
                from_alls: bool = False) -> int:
    """One taped step of a budgeted recurrent op, as its forward kernel measures it: the step
    values its backward reads, the rows of the time-batched products, and (unless the states
    tensors are kept) the new states."""
    size = sum(sizer.var_bytes(step.var(n), rows) for n in tape) + batched_bytes(batched_rows, rows)
    return size + (0 if from_alls else sum(states))


def _rnn_grad_holds(sizer: Sizer, op, live) -> tuple[int, list[int]]:
    attrs = op.attrs
    n_seq, n_state = len(attrs["inputs_t"]), len(attrs["states"])
    rows = _rows(sizer, op, n_seq)
    steps = _steps(sizer, op)
    backward: Block = attrs["backward"]
    held = sizer.block_bytes(backward, rows)
    if "step" in attrs:               # RecurrentNetworkBudgetGrad: re-runs segments of its schedule
        states = [sizer.of(n) for n in op.inputs[n_seq:n_seq + n_state]]
        from_alls = bool(attrs.get("alls_given"))
        rows_batched = batched_rows(attrs["batched"], backward, attrs["tape"])
        tape = _tape_bytes(sizer, attrs["step"], attrs["tape"], rows_batched, states, rows, from_alls)
        n_tail = int(attrs.get("n_tail", 0))
        first = len(op.inputs) - n_tail - sum(map(bool, attrs["dall_given"])) - sum(map(bool, attrs["dlast_given"]))
        live_tail = sum(sizer.live.get(n, 0) for n in op.inputs[first:first + n_tail]) if n_tail else 0
        long = bool(attrs.get("long_tail")) and live_tail > 0 and not tail_shared(op)   # a long tail kept
        into = attrs.get("into_tape") or {}
        unaliased = [e for e in attrs["batched"] if e[3] not in into]
        plan = checkpoint_plan(steps, int(attrs["budget"]), sum(states), tape, from_alls,
                               batched=batched_bytes(rows_batched, rows) if long else None,
                               unaliased=batched_bytes(batched_rows(unaliased, backward, attrs["tape"]), rows))
        # The sweep's checkpoints are rows of inputs, live already (dropping one frees nothing): the
        # states the backward holds besides them are those it makes (``Plan.own_states``).
        own = 0 if from_alls else plan.own_states() * sum(states)
        if sizer.live_only:     # the schedule reserves a shared batched row per use; it is one buffer
            tape = _tape_bytes(sizer, attrs["step"], attrs["tape"],
                               batched_rows(attrs["batched"], backward, attrs["tape"], once=True), states, rows,
                               from_alls)
        # A step re-runs (advance, tape) and backward steps (reverse) take turns: one body at a time.
        # From the kept states tensors, the plan's checkpoints are views of them: only the tape.
        kept = min(plan.segment, steps) * tape + own
        # The forward's tail (policies.py, "keep_tail") is an input, live already: its buffers are
        # the segments' tape.
        if n_tail and not tail_shared(op):      # (an empty tail, budget_tail_off, subtracts nothing)
            kept = max(0, kept - live_tail)
        segment = min(max(plan.segment, plan.tail_segment), steps)
        if plan.tail:       # a long tail: its buffers hold every segment's tape; only unaliased rows added
            kept = segment * batched_bytes(batched_rows(unaliased, backward, attrs["tape"], once=sizer.live_only), rows)
            kept += own
            # the step being re-run: its state and tape values before they are copied into the tail's rows
            kept += _tape_bytes(sizer, attrs["step"], attrs["tape"], [], states, rows, from_alls) if plan.tail < steps else 0
        held = max(held, sizer.block_bytes(attrs["step"], rows)) + kept
        outer = op.inputs[n_seq + n_state + int(bool(attrs["has_lengths"])):][:int(attrs["n_outer"])]
        held += _input_rows_bytes(op, outer, steps, rows, int(attrs["budget"]))
        step = attrs["step"]
        if from_alls and not attrs["shape_only"] and rows_batchable(step, attrs, outer):   # steps at once
            per_step = row_bytes(step, step.ops, rows)
            held += rows_chunk(steps, int(attrs["budget"]), per_step) * per_step
        held += segment * _output_rows_bytes(op, outer, rows)
    else:                             # store-all: the time-batched buffers span all steps
        held += _time_batches(sizer, op, rows, steps)
    outs = [sizer.of(name) for name in op.outputs]    # (an input may be a shape stand-in: policies.py)
    # While the steps run, the sequences' gradients and the outer ones summed step by step exist;
    # the time-batched products are made after, when the loop's buffers are gone.
    looping = sum(size for position, size in zip(attrs["grad_of"], outs) if _grown_in_loop(op, position))
    return max(0, held + looping - sum(outs)), outs


def _input_rows_bytes(op, outer: list[str], steps: int, rows: int, budget: int) -> int:
    """A budgeted recurrent op's chunk of input projections (``step_rows.InputRows``)."""
    step = op.attrs["step"]
    per_step = row_bytes(step, input_row_ops(step, op.attrs["inputs_t"], outer), rows)
    return rows_chunk(steps, budget, per_step) * per_step


def _output_rows_bytes(op, outer: list[str], rows: int) -> int:
    """One step of the gradients a budgeted backward makes per segment (``step_rows.OutputRows``)."""
    attrs, backward = op.attrs, op.attrs["backward"]
    collected = TimeBatches(np, None, 0, attrs["batched"], attrs["fetch_seq"], attrs["tape"]).names
    ops = output_row_ops(backward, collected, outer, attrs["fetch_seq"], attrs["fetch_outer"])
    return row_bytes(backward, [o for o in ops if o.type == "SeqLinear"], rows)


def _grown_in_loop(op, position: int) -> bool:
    """True for a gradient a recurrent gradient op fills while its steps run: a sequence's, or an
    outer value's summed step by step (not one batched over time)."""
    attrs = op.attrs
    n_seq, n_state = len(attrs["inputs_t"]), len(attrs["states"])
    first_outer = n_seq + n_state + int(bool(attrs.get("has_lengths")))
    if position < n_seq:
        return True
    j = position - first_outer
    return 0 <= j < len(attrs["fetch_outer"]) and bool(attrs["fetch_outer"][j])


def _time_batches(sizer: Sizer, op, rows: int, steps: int) -> int:
    """The ``[T, ...]`` buffers ``TimeBatches`` fills: one per batched gradient ``d`` (none where
    ``d`` is a sequence's gradient, which its output buffer already holds) and one per step value
    used as the product's other factor that the forward did not save."""
    attrs, backward = op.attrs, op.attrs["backward"]
    outputs = {name for i, name in enumerate(attrs["fetch_seq"]) if name and i in attrs["grad_of"]}
    names = []
    for _, kind, ref, d in attrs["batched"]:
        names.append(d)
        if kind == "value" and ref not in attrs["saved"]:
            names.append(ref)
    found = [backward.find_var(n) for n in dict.fromkeys(names) if n not in outputs]
    return sum(sizer.var_bytes(var, rows, steps) for var in found if var is not None)


def _budget_left(sizer: Sizer, op, n_ckpt: int) -> int:
    """A budgeted while loop's gradient holds its budget, of which the forward's checkpoints (its
    inputs just before the trip count, live already) are a part."""
    ckpts = op.inputs[-(n_ckpt + 1):-1]
    return max(0, int(op.attrs.get("budget", 0)) - sum(sizer.live.get(n, 0) for n in ckpts))


def _batch(sizer: Sizer, op) -> int:
    """The batch a loop body's -1 sizes stand for: the largest leading size of an input of rank 2+."""
    sizes = [sizer.shapes.get(n, ())[0] for n in op.inputs if len(sizer.shapes.get(n, ())) >= 2]
    return max([s for s in sizes if s > 0] + [1])


def _while_holds(sizer: Sizer, op, live) -> tuple[int, list[int]]:
    attrs = op.attrs
    rows = _batch(sizer, op)
    held = sizer.block_bytes(attrs["body"], rows) + sizer.block_bytes(attrs["cond"], rows)
    if not is_budget(attrs.get("recompute")):
        return held, [sizer.of(n) for n in op.outputs]
    n = len(attrs["carry_binds"])
    outs = [sizer.of(name) for name in op.outputs[:n]] + [8]     # loop vars, the trip count
    outs += [0] * (len(op.outputs) - len(outs))                  # kept values: zero-stride stand-ins
    if attrs.get("budget_outputs"):                              # the checkpoints: half the budget at most
        outs[len(op.outputs) - n - 1] = int(attrs["recompute"]) // 2
    return held, outs


def _while_grad_holds(sizer: Sizer, op, live) -> tuple[int, list[int]]:
    attrs = op.attrs
    rows = _batch(sizer, op)
    held = sizer.block_bytes(attrs["body"], rows) + sizer.block_bytes(attrs["fwd_body"], rows)
    return held + _budget_left(sizer, op, int(attrs["n_loop_vars"])), [sizer.of(n) for n in op.outputs]


def _sub_block_holds(sizer: Sizer, op, live) -> tuple[int, list[int]]:
    rows = _batch(sizer, op)
    return sum(sizer.block_bytes(b, rows) for b in op.sub_blocks()), [sizer.of(n) for n in op.outputs]


def _split_holds(sizer: Sizer, op, live) -> tuple[int, list[int]]:
    """``Split``'s pieces are views of its input, whose buffer lives while one of them does: when
    the input dies at this op, its first live piece holds the input's bytes (the micro-batches of
    a fed batch, ``micro_batches.py``: each one's piece lives to its backward)."""
    outs = [sizer.of(n) for n in op.outputs]
    kept = [i for i in range(len(outs)) if i in live]
    if kept and op.inputs[0] in sizer.dying:
        outs[kept[0]] += max(0, sizer.live.get(op.inputs[0], 0) - sum(outs[i] for i in kept))
    return 0, outs


HOLDS: dict[str, Callable] = {
    "Split": _split_holds,
    "RecurrentNetwork": _rnn_holds, "RecurrentNetworkGrad": _rnn_grad_holds,
    "RecurrentNetworkBudgetGrad": _rnn_grad_holds, "While": _while_holds, "WhileBudgetGrad": _while_grad_holds,
}


def op_holds(sizer: Sizer, op, live) -> tuple[int, list[int]]:
    """What ``op`` holds while it runs besides its inputs, and its outputs' bytes (``live``: the
    positions of outputs read later): the per-op model ``planned_peak`` walks with."""
    return _holds(sizer, op, live)


def _holds(sizer: Sizer, op, live) -> tuple[int, list[int]]:
    rule = HOLDS.get(op.type)
    if rule is not None:
        return rule(sizer, op, live)
    if op.sub_blocks():
        return _sub_block_holds(sizer, op, live)
    return 0, [sizer.of(n) for n in op.outputs]


# --- the walk ------------------------------------------------------------------------------------------

def planned_peak(block: Block, keep, feed_shapes: Mapping | None = None, shapes: Shapes | None = None,
                 exact: bool = True, live: bool = False) -> int:
    """The peak bytes a run of ``block`` fetching ``keep`` would reach, for the shapes given.

    By default a budgeted recurrence's segment counts what its schedule
    reserves (a time-batched row once per gradient it serves: what a budget
    must hold); with ``live`` what is live at once (each buffer once: what a
    run measures, the number ``rg.memory.report`` shows).

    Args:
        block: The block to plan (usually the global block).
        keep: The names the run fetches.
        feed_shapes: ``{name: shape}`` for run-time sizes.
        shapes: Resolved shapes to reuse (internal).
        exact: Raise when a size is unknown.
        live: Count what is live at once instead of what a schedule reserves.

    Returns:
        The planned peak, in bytes.

    Raises:
        ProgramError: With ``exact``, values whose sizes depend on run-time
            shapes ``feed_shapes`` did not give (naming them).

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
            rg.append_backward(loss)
        peak = rg.memory.planned_peak(main.global_block(), [loss.name], {"x": (128, 64)})
        exe = rg.Executor()
        exe.run(startup)
        exe.run(main, feed={"x": np.ones((128, 64), "float32")}, fetch_list=[loss])
        print(peak, exe.last_stats.peak_bytes)                 # planned and measured
        assert peak > 128 * 64 * 4
        ```
    """
    shapes = shapes if shapes is not None else resolve_shapes(block, feed_shapes)
    sizer = Sizer(block, shapes, live)
    timed = lifetimes(block, frozenset(keep))      # what the executor's plan follows
    held_now: dict[str, int] = {name: sizer.of(name) for name in timed.free_reads}
    sizer.live = held_now
    total = peak = sum(held_now.values())
    for step in timed.ops:
        op = step.op
        if op.attrs or op.type in HOLDS:
            sizer.dying = step.dead
            held, outs = _holds(sizer, op, step.live_outputs)
        else:           # no attribute, no sub-block, no rule of its own (most ops): its outputs alone
            held, outs = 0, [sizer.of(n) for n in op.outputs]
        peak = max(peak, total + held + sum(outs))
        for name, size in zip(step.op.outputs, outs):
            total += size - held_now.get(name, 0)
            held_now[name] = size
        for name in step.dead:
            total -= held_now.pop(name, 0)
    if exact and sizer.unknown:
        names = list(dict.fromkeys(sizer.unknown))
        listed = f"{', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
        unfed = _unresolved_feeds(block, shapes)
        if unfed:
            raise ProgramError(f"the sizes of {listed} depend on run-time shapes; pass feed_shapes="
                               f"{{'{unfed[0]}': (batch, ...)}} for every fed value (missing: {', '.join(unfed)})")
        raise ProgramError(f"the sizes of {listed} depend on run-time values that feed_shapes cannot give (a "
                           "while_loop's trip count, a TensorArray's length): they cannot be planned; "
                           f"{unbounded_loops(block, names)}give such a loop its own recompute=<bytes>, or leave "
                           "memory_budget out")
    return peak


def _unresolved_feeds(block: Block, shapes) -> list[str]:
    """The fed values (read, never written, not persistable) whose shapes still hold -1."""
    written = {name for op in block.ops for name in op.outputs}
    read = {name for op in block.ops for name in op.inputs}
    return sorted(name for name in read - written
                  if (var := block.find_var(name)) is not None and not var.persistable
                  and any(d < 0 for d in shapes.get(name, var.shape)))
