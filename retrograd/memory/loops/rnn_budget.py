"""Recurrent networks under a memory budget: ``recurrent(..., recompute=<bytes>)``.

With an int ``recompute``, a RecurrentNetwork keeps at most that many bytes
of step values for its backward, following a binomial checkpoint schedule
(``schedules.budget_plan``) chosen at run time from the sequence length and
the measured size of one step:

* the **forward** runs every step once without keeping per-step values; on
  its way it copies the states at the schedule's checkpoint steps into one
  ``[C, N, ...]`` tensor per state (``<state>.ckpt``) and writes the plan's
  parameters to ``<op>.schedule``. The ``(T+1) x N x ...`` states tensor is
  built only when the running plan reads or fetches ``<state>_all``
  (``KernelCtx.live_outputs``); otherwise ``_all`` is an empty stand-in the
  executor drops at once. A run that does not need the gradient (the plan
  reads neither checkpoints nor schedule, e.g. one fetching only the loss)
  keeps no checkpoints either: it holds what the forward alone holds;
* the **backward** (``RecurrentNetworkBudgetGrad``) carries out the plan:
  it advances from checkpoints, re-runs each segment of steps keeping what
  the backward step block reads (the same block as the store-all backward,
  so gradients are identical), then runs the block over the segment in
  reverse. Gradients batched over time (``dW = A^T D``) are batched per
  segment.

Budget accounting: state checkpoints plus one segment's tape (its states
and the step values the backward reads). One step's tape is the least a
budget can be; below that the op raises ProgramError at build time when
the sizes are known then, else ExecutionError at run time.

The op's own files (``ops/recurrent.py``, ``ops/recurrent_grad.py``) hand
over to this module when ``recompute`` is an int; everything else about the
op (layout, step block, backward step block) is theirs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...backends import dtype_name
from ...errors import ExecutionError, ProgramError, ShapeError
from ...ir.analysis import op_reads
from ...ir.program import Block, Op, Var
from ...ops.recurrent.network_grad import (TimeBatches, build_backward_step, gradient_request)
from ...ops.recurrent.steps import (BUDGET_VARIANTS, BudgetVariant, Held, RnnLayout, add_optional,
                                    check_state_shape, fresh_name, per_state, step_mask,
                                    time_steps, timestep_value)
from ...ops.recurrent.steps import StepRunner as BlockRunner
from ...ops.core import streams
from ...ops.core.lowering import lowers
from ...ops.recurrent.network_onnx import backward_loop_onnx, forward_loop_onnx
from ...ops.core.registry import GradCtx, append_op, defop
from ..recompute import seen_from
from .schedules import (Advance, Plan, Restore, Reverse, StepRunner, budget_plan, long_tail_plan, make_long_plan,
                        make_plan, minimum_budget, run_backward)
from .. import policies
from .step_rows import (BatchedSteps, InputRows, OutputRows, input_row_ops, output_row_ops,
                        row_bytes, rows_batchable, rows_chunk)

SCHEDULE_LEN = 6          # [T, segment, slots, from_alls, tail steps (long_tail_plan; 0: none), tail_segment]


def output_specs(inits: list[Var], attrs: dict) -> list:
    """Shapes of the outputs a budgeted RecurrentNetwork gets once a gradient is built: the last
    segment's tape (``budget_tail``, ``policies.py``), the checkpoints and the schedule."""
    if not attrs.get("budget_outputs"):
        return []
    return ([((-1,) + tuple(v.shape), v.dtype) for v in tail_vars(attrs, inits)]
            + [((-1,) + tuple(v.shape), v.dtype) for v in inits] + [((SCHEDULE_LEN,), "int64")])


def tail_vars(attrs: dict, inits: list) -> list:
    """What the forward keeps of its last segment for the backward (``budget_tail``): a row per
    step of each tape value, and unless every states tensor is kept, the states (one more row:
    the state the segment starts from). Vars of the step block (tape) and ``inits`` (states)."""
    if not attrs.get("budget_tail"):
        return []
    step = attrs["step"]
    return [step.var(n) for n in attrs["budget_tape"]] + (list(inits) if attrs.get("budget_tail_states") else [])


def tail_shared(grad_op: Op) -> bool:
    """True when another op of the block reads a tail input of ``grad_op`` (a second gradient of the
    same forward): then the tail's buffers are not reused for the other segments' tape."""
    n_tail = int(grad_op.attrs.get("n_tail", 0))
    if not n_tail:
        return False
    lay = _Layout.of(grad_op.attrs)
    first = lay.fwd.n_inputs + lay.n_alls + lay.fwd.n_state + 1
    names = set(grad_op.inputs[first:first + n_tail])
    return any(names & set(op_reads(other)) for other in grad_op.block.ops if other is not grad_op)


def tail_kept(attrs: dict, steps: int) -> bool:
    """Does the forward keep its tail at ``steps`` time steps? Not when the whole-program budget
    turned it off (``budget_tail_off``: the least budgets), nor at a run-time length above the one
    it planned for (``budget_tail_steps``): the tail is live where the values that grow with the
    length are, and the plan counted it at the planned length only."""
    return bool(attrs.get("budget_tail")) and not attrs.get("budget_tail_off") and (
        steps <= int(attrs.get("budget_tail_steps", steps)))


def long_tail(op: Op) -> bool:
    """Does the forward keep a long tail (``policies.py``, "tape_first")? Not when an op other than
    one gradient reads its tail (a second gradient of the same forward): the backward then writes
    no time-batched rows into the tail's rows, nor re-runs steps into its buffers."""
    if not op.attrs.get("budget_long_tail"):
        return False
    n_state = len(op.attrs["states"])
    names = set(op.outputs[2 * n_state:len(op.outputs) - n_state - 1])
    readers = [other for other in op.block.ops if other is not op and names & set(op_reads(other))]
    return len(readers) <= 1


def into_tape(bstep, step: Block) -> dict:
    """The time-batched ``d`` rows a reversed segment can write into a tape value's rows, each once
    its step's backward has read that row: the same row shape and dtype, the tape value no batched
    product's operand. ``{d name: tape name}``."""
    operands = {ref for _, kind, ref, _ in bstep.batched if kind == "value"}
    into: dict = {}
    for _, _, _, d in bstep.batched:
        dvar = bstep.block.find_var(d)
        if d in into or dvar is None:
            continue
        for name in bstep.saved:
            tvar = step.var(name)
            if (name not in operands and name not in into.values() and tuple(tvar.shape) == tuple(dvar.shape)
                    and tvar.dtype == dvar.dtype):
                into[d] = name
                break
    return into


def tail_range(plan: Plan) -> tuple[int, int]:
    """The steps whose tape the forward keeps: the schedule's last segment, or a long plan's tail."""
    if plan.tail:
        return plan.steps - plan.tail, plan.steps
    first = next((a for a in plan.actions() if isinstance(a, Reverse)), None)
    return (first.start, first.stop) if first is not None else (plan.steps, plan.steps)


# --- running steps ------------------------------------------------------------------------------

class _Steps:
    """Runs the forward step block of one op: bindings per step, state updates, meter holds."""

    def __init__(self, k, lay: RnnLayout, seqs, lengths, outers, step: Block, attrs: dict, budget: int):
        self.k, self.xp, self.run, self.op = k, k.xp, k.run, k.op
        self.seqs, self.lengths = seqs, lengths
        self.step = step
        self.inputs_t, self.states = attrs["inputs_t"], attrs["states"]
        self.state_outs, self.timestep = attrs["state_outs"], attrs.get("timestep")
        self.bindings = dict(zip(k.op.inputs[lay.outer_start:lay.n_inputs], outers))
        self.runners: dict[tuple, BlockRunner] = {}
        # The input projections run over chunks of steps (step_rows.py); ``limit`` ends a chunk
        # where the steps being run end.
        ops = input_row_ops(step, self.inputs_t, self.bindings)
        batch = int(seqs[0].shape[1]) if seqs and len(seqs[0].shape) > 1 else 1
        chunk = rows_chunk(time_steps(k.op, seqs) if seqs else 1, budget, row_bytes(step, ops, batch))
        self.rows = InputRows(k, step, ops, dict(zip(self.inputs_t, seqs)), self.bindings, chunk)
        self.limit = len(seqs[0]) if seqs else 0

    def runner(self, block: Block, bound, fetch) -> BlockRunner:
        """A compiled runner of ``block`` binding ``bound`` and fetching ``fetch`` (made once); the
        forward step skips the ops ``self.rows`` runs over chunks of steps."""
        key = (block.idx, tuple(fetch))
        runner = self.runners.get(key)
        if runner is None:
            skip = {id(op) for op in self.rows.ops} if block is self.step else set()
            runner = self.runners[key] = BlockRunner(self.op, self.run, block, list(bound) + self.rows.names,
                                                     fetch, select=lambda op: id(op) not in skip)
        return runner

    def bind(self, t: int, state: list) -> dict:
        b = self.bindings
        for name, seq in zip(self.inputs_t, self.seqs):
            b[name] = seq[t]
        for name, value in zip(self.states, state):
            b[name] = value
        if self.timestep:
            b[self.timestep] = timestep_value(self.xp, self.step, self.timestep, t)
        self.rows.bind(b, t, self.limit)
        return b

    def run_step(self, t: int, state: list, extra: list[str] = ()) -> tuple[list, list]:
        """Step ``t`` from ``state``: (next state, values of ``extra``)."""
        bound = list(self.bindings) + list(self.inputs_t) + list(self.states) + ([self.timestep] if self.timestep else [])
        values = self.runner(self.step, bound, list(self.state_outs) + list(extra))(
            self.bind(t, state), streams.stream(self.k.attrs, t))   # forward step t's random stream
        n = len(state)
        new = []
        for i, (value, prev) in enumerate(zip(values[:n], state)):
            if tuple(value.shape) != tuple(prev.shape):
                check_state_shape(self.op, self.state_outs[i], value, prev)
            if self.lengths is not None:
                value = self.xp.where(step_mask(self.xp, self.lengths, t, prev.ndim), value, prev)
            new.append(value)
        return new, values[n:]

    def hold(self, state: list) -> list:
        for value in state:
            self.run.meter.hold(value)
        return state

    def release(self, state: list) -> None:
        for value in state:
            self.run.meter.release(value)


def _nbytes(arrays) -> int:
    return int(sum(int(np.prod(a.shape)) * np.dtype(dtype_name(a.dtype)).itemsize for a in arrays))


def checkpoint_plan(steps: int, budget: int, state_bytes: int, tape_bytes: int, from_alls: bool,
                    align_end: bool = False, batched: int | None = None, unaliased: int = 0) -> Plan:
    """The schedule a budgeted RecurrentNetwork runs (its kernels and the planner, ``peak.py``, ask
    here alike): with every state kept (``from_alls``), segments of as many steps as the budget holds;
    else ``schedules.budget_plan``. Raises ProgramError when one step does not fit. With ``batched``
    (the bytes of ``tape_bytes`` that are time-batched rows, of which ``unaliased`` are not written
    into the tape's rows, ``into_tape``; the forward keeps its tail under the "tape_first" policy,
    ``policies.py``): ``schedules.long_tail_plan`` where one segment's tail fits.

    Example::

        plan = checkpoint_plan(1000, 200_000, state_bytes=1000, tape_bytes=4000, from_alls=False)
        len(plan.sweep_stores)          # the checkpoints the forward keeps
    """
    if batched is not None:     # the long tail where it re-runs fewer steps than the one-segment tail
        plan = long_tail_plan(steps, budget, state_bytes, tape_bytes - batched, unaliased, from_alls)
        if plan is not None:
            try:
                other = checkpoint_plan(steps, budget, state_bytes, tape_bytes, from_alls, align_end)
            except ProgramError:
                return plan
            if _reruns(plan) <= _reruns(other):
                return plan
            return other
    if from_alls:
        if budget < tape_bytes:
            budget_plan(steps, budget, state_bytes, tape_bytes)   # raises with the minimum
        segment = max(1, min(steps, budget // tape_bytes)) if tape_bytes else max(steps, 1)
        return make_plan(steps, segment, -(-steps // segment), align_end)
    plan = budget_plan(steps, budget, state_bytes, tape_bytes)
    return make_plan(plan.steps, plan.segment, plan.slots, True) if align_end else plan


def _reruns(plan: Plan) -> int:
    """Steps the backward runs again: those outside the kept tail (the last segment, or a long
    plan's tail), and the advances."""
    first, stop = tail_range(plan)
    return plan.steps - (stop - first) + plan.advances


def _plan(op: Op, steps: int, budget: int, state_bytes: int, tape_bytes: int, from_alls: bool,
          batched: int | None = None, unaliased: int = 0) -> Plan:
    try:
        return checkpoint_plan(steps, budget, state_bytes, tape_bytes, from_alls,     # align: as n_tail > 0
                               bool(tail_vars(op.attrs, op.attrs["states"])), batched, unaliased)
    except ProgramError as exc:
        error = ExecutionError(f"{op.where()}: {exc}")
        error.least_budget = getattr(exc, "least_budget", None)
        raise error from None


def forward_kernel(k, *arrays):
    """RecurrentNetwork with a byte budget: one pass, states kept only at checkpoints."""
    attrs, xp, op, run = k.attrs, k.xp, k.op, k.run
    lay = RnnLayout.of(attrs, len(arrays))
    seqs, inits, lengths, outers = lay.split(arrays)
    steps = time_steps(op, seqs)
    runner = _Steps(k, lay, seqs, lengths, outers, attrs["step"], attrs, int(attrs["recompute"]))
    k_state = lay.n_state
    # Checkpoints only when this plan runs the backward (it reads them and the schedule); the
    # backward reads the states tensors instead when every _all is read elsewhere anyway.
    n_out = len(op.outputs)       # ..., <state>.ckpt per state, <op>.schedule: the last k + 1
    graded = bool(attrs.get("budget_outputs")) and any(
        n_out - 1 - j in k.live_outputs for j in range(k_state + 1))
    from_alls = graded and all(attrs["budget_all"])
    materialize = [from_alls or 2 * i in k.live_outputs for i in range(k_state)]
    held = Held(run.meter)
    bufs = []
    for init, full in zip(inits, materialize):
        buf = held.add(xp.empty((steps + 1,) + tuple(init.shape), dtype=init.dtype)) if full else None
        if buf is not None:
            buf[0, ...] = init
        bufs.append(buf)
    state = list(inits)
    plan, ckpts, where = None, [], {}
    tape_names = list(attrs.get("budget_tape", ()))
    tail = _Tail(k, held, attrs) if graded and tail_kept(attrs, steps) else None
    for t in range(steps):
        if t in where:
            for buf, value in zip(ckpts, state):
                buf[where[t], ...] = value
        measure = graded and plan is None
        taping = measure or (tail is not None and tail.covers(t))
        new, extra = runner.run_step(t, state, tape_names if taping else ())
        runner.hold(new)
        if measure:
            state_bytes = _nbytes(inits)
            tape_bytes = _nbytes(extra) + (0 if from_alls else state_bytes)   # kept states are not taped
            batched = _batched_bytes(attrs.get("budget_batched", ()), inits)
            tape_bytes += batched
            if k.cached is None:
                k.cached = long_tail(op)
            plan = _plan(op, steps, int(attrs["recompute"]), state_bytes, tape_bytes, from_alls,
                         batched if tail is not None and k.cached else None,
                         _batched_bytes(attrs.get("budget_batched_unaliased", ()), inits))
            if not from_alls:
                where = {s: j for j, s in enumerate(plan.sweep_stores)}
                ckpts = [held.add(xp.empty((len(where),) + tuple(v.shape), dtype=v.dtype)) for v in inits]
            if tail is not None:
                tail.start(plan, steps)
        if tail is not None and tail.covers(t):
            tail.store(t, state, new, extra)
        for buf, value in zip(bufs, new):
            if buf is not None:
                buf[t + 1, ...] = value
        if t > 0:
            runner.release(state)
        state = new
    if plan is None:
        plan = make_plan(steps, 1, 0)
    outputs = []
    for init, buf, last in zip(inits, bufs, state):
        if buf is not None:
            outputs += [buf[1:], buf[steps]]
        else:   # not live: nothing reads or fetches it in this plan, and the executor drops it at once
            outputs += [_empty(xp, init), last if steps > 0 else xp.asarray(init, copy=True)]
    if steps > 0:
        runner.release(state)
    runner.rows.release()
    if attrs.get("budget_outputs"):
        if not ckpts:    # no checkpoints taken (none planned, or not live in this plan)
            ckpts = [_empty(xp, v) for v in inits]
        outputs += tail.outputs(inits) if tail is not None else _empty_tail(k, attrs, inits)
        outputs += ckpts
        outputs.append(xp.asarray([steps, plan.segment, plan.slots, int(from_alls), plan.tail, plan.tail_segment],
                                  dtype=xp.int64))
    held.release()
    return tuple(outputs)


class _Tail:
    """The last segment's tape as the forward sweep makes it (``policies.py``, "keep_tail"): rows
    ``t - a`` of each tape value and, unless the states tensors are kept, rows ``t - a + 1`` of each
    state (row 0: the state step ``a`` starts from), ``a`` the segment's first step. The buffers
    have the backward's segment length, so it reuses them for the other segments' tape."""

    def __init__(self, k, held: Held, attrs: dict):
        self.k, self.xp, self.held = k, k.xp, held
        self.with_states = bool(attrs.get("budget_tail_states"))
        self.n_tape = len(attrs.get("budget_tape", ()))
        self.first = self.stop = -1
        self.rows = 0
        self.long = False
        self.tape: list = [None] * self.n_tape
        self.states: list = []
        self.attrs = attrs

    def start(self, plan: Plan, steps: int) -> None:
        self.first, self.stop = tail_range(plan)
        self.rows = max(1, self.stop - self.first)
        self.long = bool(plan.tail)

    def covers(self, t: int) -> bool:
        return self.first <= t < self.stop

    def store(self, t: int, state: list, new: list, values: list) -> None:
        xp, row = self.xp, t - self.first
        for j, value in enumerate(values[:self.n_tape]):
            if self.tape[j] is None:
                self.tape[j] = self.held.add(xp.empty((self.rows,) + tuple(value.shape), dtype=value.dtype))
            elif tuple(self.tape[j].shape[1:]) != tuple(value.shape):   # a step value's shape changed:
                if self.long:       # the backward has no checkpoint inside a long tail to re-run it from
                    raise ExecutionError(f"{self.k.op.where()}: step value '{self.attrs['budget_tape'][j]}' "
                                         f"changes shape over time ({list(self.tape[j].shape[1:])} then "
                                         f"{list(value.shape)}); the \"tape_first\" memory policy keeps a "
                                         "tail of one shape: build the backward under another policy "
                                         "(rg.memory.policies.policy(\"cheap_first\"))")
                self.drop()                                           # the backward re-runs the segment
                return
            self.tape[j][row, ...] = value
        if not self.with_states:
            return
        if not self.states:
            self.states = [self.held.add(xp.empty((self.rows + 1,) + tuple(v.shape), dtype=v.dtype)) for v in new]
            for buf, value in zip(self.states, state):
                buf[0, ...] = value
        for buf, value in zip(self.states, new):
            buf[row + 1, ...] = value

    def drop(self) -> None:
        for buf in [b for b in self.tape if b is not None] + self.states:
            self.held.drop(buf)
        self.first = self.stop = -1
        self.tape, self.states = [None] * self.n_tape, []

    def outputs(self, inits) -> list:
        if any(b is None for b in self.tape) or (self.with_states and not self.states):
            return _empty_tail(self.k, self.attrs, inits)
        return self.tape + self.states


def _empty_tail(k, attrs: dict, inits) -> list:
    """Empty stand-ins of the tail outputs (no backward in this plan, or no tail kept)."""
    if not attrs.get("budget_tail"):
        return []
    xp, step = k.xp, attrs["step"]
    tape = [xp.empty((0,) + tuple(max(d, 0) for d in step.var(n).shape), dtype=k.backend.dtype_of(step.var(n).dtype))
            for n in attrs["budget_tape"]]
    return tape + ([_empty(xp, v) for v in inits] if attrs.get("budget_tail_states") else [])


def _empty(xp, like):
    """A [0, ...] stand-in of ``like``'s row shape and dtype for an output that is not live."""
    return xp.empty((0,) + tuple(like.shape), dtype=like.dtype)


# --- the gradient maker -----------------------------------------------------------------------------

def batched_rows(batched: list, block: Block, saved, once: bool = False) -> list:
    """[shape, dtype] per step of each value the backward keeps per step of a segment for the
    gradients batched over time (``TimeBatches``): they count in the budget like the tape, once
    per use (an LSTM's d(gates) serves w_ih and w_hh: counting it once let a budget be exceeded
    at a longer run-time length, see 54cfaed). With ``once``, once per buffer: what is live (the
    planner's report, ``peak.py``), not what the schedule reserves."""
    names = []
    for _, kind, ref, d in batched:
        names += [d] + ([ref] if kind == "value" and ref not in saved else [])
    if once:
        names = list(dict.fromkeys(names))
    rows = []
    for name in names:
        var = block.find_var(name)
        if var is not None:
            rows.append([list(var.shape), var.dtype])
    return rows


def _batched_bytes(rows, inits) -> int:
    """Bytes of one step of the batched values, -1 (the batch) taken from the first state."""
    return batched_bytes(rows, int(inits[0].shape[0]) if inits and len(inits[0].shape) else 1)


def batched_bytes(rows, batch: int) -> int:
    """Bytes of one step of the batched values (``budget_batched`` rows), -1 taken as ``batch``."""
    return int(sum(math.prod(batch if d < 0 else d for d in shape) * np.dtype(dtype).itemsize
                   for shape, dtype in rows))


def states_read_elsewhere(op: Op) -> list[bool]:
    """Per state of a RecurrentNetwork: is its states tensor read by another op (or persistable)?

    Example::

        states_read_elsewhere(rnn)      # [True, False]: h_all feeds the output layer, c_all nothing
    """
    return [_read_elsewhere(op, op.outputs[2 * i]) for i in range(len(op.attrs["states"]))]


def _read_elsewhere(op: Op, name: str) -> bool:
    """True when an op other than ``op`` (in any block) reads ``name`` or names it in an attribute
    (a control-flow op returning it from a sub-block), or the value persists."""
    var = op.block.find_var(name)
    if var is not None and var.persistable:
        return True
    return any(name in op_reads(other) or _names_in(other.attrs.values(), name)
               for block in op.block.program.blocks for other in block.ops if other is not op)


def _names_in(values, name: str) -> bool:
    for value in values:
        if value == name if isinstance(value, str) else (
                isinstance(value, (list, tuple)) and _names_in(value, name)):
            return True
    return False


def _static_bytes(vars_: list[Var]) -> int | None:
    if any(d < 0 for v in vars_ for d in v.shape):
        return None
    return sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in vars_)


def grad_maker(g: GradCtx) -> list[Var | None]:
    """The gradient of a budgeted RecurrentNetwork: one RecurrentNetworkBudgetGrad op."""
    op, attrs = g.op, g.attrs
    request = gradient_request(g)
    if request is None:
        return [None] * len(op.inputs)
    lay, douts, wanted = request
    k = lay.n_state
    # The store-all backward step block: it reads the tape the budgeted backward re-creates.
    proxy = Op(op.type, op.inputs, op.outputs, {**attrs, "recompute": None})
    proxy.block = op.block
    bstep = build_backward_step(proxy, wanted, parent=g.block, callbacks=g.callbacks)
    _check_static_budget(op, bstep)
    block = op.block
    if not attrs.get("budget_outputs"):
        # Every states tensor kept when the whole-program budget chose to (budget.py: a segment's
        # steps then re-run at once), else those the program reads anyway.
        keep = bool(attrs.get("budget_keep_states"))
        attrs["budget_all"] = [keep or _read_elsewhere(op, op.outputs[2 * i]) for i in range(k)]
        attrs["budget_tape"] = list(bstep.saved)
        attrs["budget_batched"] = batched_rows(bstep.batched, bstep.block, bstep.saved)
        attrs["budget_outputs"] = True
        # The recompute policy in force (policies.py): keep the last segment's tape from the forward.
        attrs["budget_tail"] = policies.keeps_tail() and not bstep.saved_shape
        attrs["budget_tail_states"] = attrs["budget_tail"] and not all(attrs["budget_all"])
        # ... and as many of the last steps' tape as the budget holds ("tape_first"), the backward
        # writing time-batched rows into the tape's rows where it can (into_tape)
        attrs["budget_long_tail"] = attrs["budget_tail"] and policies.keeps_long_tail()
        into = into_tape(bstep, attrs["step"]) if attrs["budget_long_tail"] else {}
        attrs["budget_into_tape"] = into
        attrs["budget_batched_unaliased"] = batched_rows([e for e in bstep.batched if e[3] not in into],
                                                         bstep.block, bstep.saved)
        prefix = op.outputs[0]
        inits = [block.var(n) for n in op.inputs[lay.n_seq:lay.n_seq + k]]
        for var in tail_vars(attrs, inits):
            op.outputs.append(block.create_var(fresh_name(block.program, f"{prefix}.tail"), (-1,) + tuple(var.shape),
                                               var.dtype).name)
        for name in attrs["states"]:
            var = attrs["step"].var(name)
            out = block.create_var(fresh_name(block.program, f"{name}.ckpt"), (-1,) + var.shape, var.dtype)
            op.outputs.append(out.name)
        op.outputs.append(block.create_var(fresh_name(block.program, f"{prefix}.schedule"),
                                           (SCHEDULE_LEN,), "int64").name)
        block.program.bump()
    # The backward reads the full states tensors only when the program reads them all anyway
    # (the forward then keeps them and takes no checkpoints); else checkpoints and the schedule.
    alls_given = all(attrs["budget_all"])
    alls = [block.var(n) for n in op.outputs[0:2 * k:2]] if alls_given else []
    extra = [block.var(n) for n in op.outputs[-(k + 1):]]
    n_tail = len(op.outputs) - 3 * k - 1
    tails = [block.var(n) for n in op.outputs[2 * k:2 * k + n_tail]]
    d_all, d_last = douts[0::2], douts[1::2]
    inputs = list(g.x[:lay.n_inputs]) + alls + extra + tails
    inputs += [d for d in d_all if d is not None] + [d for d in d_last if d is not None]
    grad_of = [i for i, w in enumerate(wanted) if w]
    grad_attrs = {
        "backward": bstep.block, "step": seen_from(attrs["step"], g.block),
        "inputs_t": list(attrs["inputs_t"]), "states": list(attrs["states"]),
        "state_outs": list(attrs["state_outs"]), "timestep": attrs.get("timestep"),
        "has_lengths": lay.has_lengths, "n_outer": lay.n_outer, "alls_given": alls_given,
        "tape": list(bstep.saved), "shape_only": list(bstep.saved_shape),
        "dall_given": [d is not None for d in d_all], "dlast_given": [d is not None for d in d_last],
        "dnext": bstep.dnext, "fetch_seq": bstep.fetch_seq, "fetch_state": bstep.fetch_state,
        "fetch_outer": bstep.fetch_outer, "batched": bstep.batched, "grad_of": grad_of,
        "budget": int(attrs["recompute"]), "n_tail": n_tail, "long_tail": bool(attrs.get("budget_long_tail")),
        "into_tape": dict(attrs.get("budget_into_tape") or {}),
    }
    streams.copy_stream(attrs, grad_attrs)   # re-run steps draw the forward's random numbers
    outs = append_op("RecurrentNetworkBudgetGrad", inputs, grad_attrs, name="rnn_grad")
    grads: list[Var | None] = [None] * len(op.inputs)
    for position, out in zip(grad_of, outs):
        grads[position] = out
    return grads


def _check_static_budget(op: Op, bstep) -> None:
    """ProgramError now when the sizes are known and the budget cannot hold one step."""
    step: Block = op.attrs["step"]
    states = [step.var(n) for n in op.attrs["states"]]
    state_bytes = _static_bytes(states)
    tape_bytes = _static_bytes(states + [step.var(n) for n in bstep.saved])
    if state_bytes is None or tape_bytes is None:
        return
    least = minimum_budget(state_bytes, tape_bytes)
    if op.attrs["recompute"] < least:
        raise ProgramError(f"{op.where()}: recompute budget of {op.attrs['recompute']} bytes cannot hold "
                           f"one step; the minimum budget is {least} bytes (one step's states and the "
                           "values its backward reads)")


# --- RecurrentNetworkBudgetGrad ---------------------------------------------------------------------

@dataclass(frozen=True)
class _Layout:
    fwd: RnnLayout
    n_alls: int          # the states tensors (all states, or none: ``alls_given``)
    n_dall: int
    n_dlast: int
    n_tail: int = 0      # the forward's last-segment tape (``tail_vars``)

    @staticmethod
    def of(attrs: dict) -> "_Layout":
        fwd = RnnLayout(len(attrs["inputs_t"]), len(attrs["states"]), bool(attrs["has_lengths"]),
                        int(attrs["n_outer"]))
        n_alls = fwd.n_state if attrs.get("alls_given", True) else 0
        return _Layout(fwd, n_alls, sum(map(bool, attrs["dall_given"])), sum(map(bool, attrs["dlast_given"])),
                       int(attrs.get("n_tail", 0)))

    def split(self, items):
        """(forward inputs, state alls or [], checkpoints, schedule, d_all given, d_last given);
        ``split_tail`` the tail."""
        n, a, k = self.fwd.n_inputs, self.n_alls, self.fwd.n_state
        rest = list(items[n:])
        d = a + k + 1 + self.n_tail
        return (list(items[:n]), rest[:a], rest[a:a + k], rest[a + k],
                rest[d:d + self.n_dall], rest[d + self.n_dall:])

    def split_tail(self, items) -> list:
        start = self.fwd.n_inputs + self.n_alls + self.fwd.n_state + 1
        return list(items[start:start + self.n_tail])


def _grad_rule(ins: list[Var], attrs: dict):
    lay = _Layout.of(attrs)
    expected = lay.fwd.n_inputs + lay.n_alls + lay.fwd.n_state + 1 + lay.n_tail + lay.n_dall + lay.n_dlast
    if len(ins) != expected:
        raise ShapeError(f"expects {expected} inputs from its attributes, got {len(ins)}")
    return [(ins[i].shape, ins[i].dtype) for i in attrs["grad_of"]]


@defop("RecurrentNetworkBudgetGrad", inputs=("forward_inputs*", "state_alls*", "checkpoints*", "schedule",
                                             "tail*", "d_all*", "d_last*"),
       outputs=("grads*",), infer=_grad_rule)
def _budget_grad_kernel(k, *arrays):
    """Carry out the forward's checkpoint plan: advance, re-run segments with tape, run their backward."""
    attrs, op = k.attrs, k.op
    lay = _Layout.of(attrs)
    fwd, alls, ckpts, schedule, d_all, d_last = lay.split(arrays)
    seqs, inits, lengths, outers = lay.fwd.split(fwd)
    steps = time_steps(op, seqs)
    # The schedule steers this kernel's host-side loop: one explicit transfer of its few ints.
    total, segment, slots, from_alls, tail, tail_segment = (int(v) for v in k.backend.to_numpy(schedule).reshape(-1))
    if total != steps:
        raise ExecutionError(f"{op.where()}: the forward planned {total} steps, the sequences have {steps}")
    if from_alls and (len(alls) != lay.fwd.n_state or any(int(a.shape[0]) != steps for a in alls)):
        raise ExecutionError(f"{op.where()}: the forward kept its states tensors for this backward, but it "
                             f"received {[list(a.shape) for a in alls]} for {steps} steps (a stand-in "
                             "of an output the forward's plan did not keep)")
    plan = (make_long_plan(steps, max(segment, 1), slots, tail, tail_segment) if tail
            else make_plan(steps, max(segment, 1), slots, align_end=lay.n_tail > 0))
    checkpoints = {0: list(inits)}
    for j, t in enumerate(plan.sweep_stores):
        checkpoints[t] = [a[t - 1] for a in alls] if from_alls else [c[j] for c in ckpts]
    back = _Backward(k, lay, seqs, inits, lengths, outers, per_state(attrs["dall_given"], d_all),
                     per_state(attrs["dlast_given"], d_last), plan.segment, alls if from_alls else None)
    if k.cached is None:
        k.cached = tail_shared(op)
    actions = back.take_tail(lay.split_tail(arrays), plan, reuse=not k.cached)
    run_backward(plan, checkpoints, back, actions)
    return back.results()



@lowers("RecurrentNetworkBudgetGrad")
def _budget_grad_onnx(g):
    """ONNX has no memory budget to keep: store-all. The steps run again from the start keeping
    every state and the tape (``recurrent_onnx.forward_loop_onnx``), then the store-all backward
    loop; the checkpoints and schedule are not read. Same gradients, the store-all memory."""
    a, lay = g.attrs, _Layout.of(g.attrs)
    _, _, _, _, d_all, d_last = lay.split(g.ins)
    saved_names = list(a["tape"]) + list(a["shape_only"])
    alls, _, saved = forward_loop_onnx(g, a, lay.fwd, saved_names)
    return backward_loop_onnx(g, a, lay.fwd, alls, saved, saved_names, per_state(a["dall_given"], d_all),
                              per_state(a["dlast_given"], d_last))

class _Backward(StepRunner):
    """The backward of one budgeted op: re-runs segments with tape and runs the backward step block."""

    def __init__(self, k, lay: _Layout, seqs, inits, lengths, outers, d_all, d_last, segment: int, alls):
        attrs, xp = k.attrs, k.xp
        self.k, self.xp, self.attrs, self.lay = k, xp, attrs, lay
        self.block: Block = attrs["backward"]
        self.steps = _Steps(k, lay.fwd, seqs, lengths, outers, attrs["step"], attrs, int(attrs["budget"]))
        self.seqs, self.inits, self.lengths = seqs, inits, lengths
        self.d_all, self.d_last = d_all, d_last
        self.held = Held(k.run.meter)
        self.segment = max(1, min(segment, len(seqs[0]) if seqs else 1))
        self.grad_of = set(attrs["grad_of"])
        n_state = lay.fwd.n_state
        self.dseq = [self.held.add(xp.empty(seq.shape, dtype=seq.dtype) if name else
                                   xp.zeros(seq.shape, dtype=seq.dtype)) if i in self.grad_of else None
                     for i, (seq, name) in enumerate(zip(seqs, attrs["fetch_seq"]))]
        self.fetch_seq = [name if self.dseq[i] is not None else None for i, name in enumerate(attrs["fetch_seq"])]
        self.tape = list(attrs["tape"])
        self.shape_only = list(attrs["shape_only"])
        collected = TimeBatches(xp, Held(k.run.meter), 0, attrs["batched"], self.fetch_seq, self.tape).names
        # Input and bias gradients of the projections: once per segment over the kept d rows.
        self.rows = OutputRows(k, self.block, output_row_ops(self.block, collected, self.steps.bindings,
                                                             self.fetch_seq, attrs["fetch_outer"]),
                               self.steps.bindings)
        by_rows = set(self.rows.names)
        self.fetch_seq = [None if n in by_rows else n for n in self.fetch_seq]
        self.seq_rows = {n: i for i, n in enumerate(attrs["fetch_seq"]) if n in by_rows and self.dseq[i] is not None}
        self.outer_rows = {n: j for j, n in enumerate(attrs["fetch_outer"]) if n in by_rows}
        self.fetch_outer = [None if n in by_rows else n for n in attrs["fetch_outer"]]
        self.fetch = [n for n in self.fetch_seq + attrs["fetch_state"] + self.fetch_outer if n] + collected
        self.index = {name: i for i, name in enumerate(self.fetch)}
        self.acc: list = [None] * lay.fwd.n_outer
        self.dcur: list = list(d_last)   # gradient arriving at state t+1 from later steps; None = zero
        self.zeros = [None] * n_state
        self.bindings = dict(self.steps.bindings)
        self.alls = alls                 # the forward's full states when it kept them, else None
        self.seg_states: list = [None] * n_state
        self.seg_tape: list = [None] * len(self.tape)
        self.stand_ins: dict = {}
        self.tail: tuple[int, int] | None = None     # the steps whose tape the forward kept
        self.tail_bufs: tuple[list, list] = ([], [])  # its buffers: tape rows, state rows (row 0: its start)
        self.reuse = False                           # the other segments' tape goes into them
        self.own = False                             # the other segments' buffers are set up
        self.into: dict = {}                         # d rows written into tape rows (into_tape)
        self.at_once = self._batched_steps(k, seqs, int(attrs["budget"]))

    def take_tail(self, tails: list, plan: Plan, reuse: bool) -> list:
        """Use the forward's tape of its last steps (``_Tail``: the last segment, or a long plan's
        tail) as the tape of the segments in it and, with ``reuse`` (no other op reads it), as the
        buffers of the others; the plan's actions, without those that only led to its start."""
        actions = plan.actions()
        n_tape = len(self.tape)
        if not tails or any(int(b.shape[0]) == 0 for b in tails) or (
                self.alls is None and len(tails) != n_tape + len(self.inits)):
            if plan.tail:
                raise ExecutionError(f"{self.k.op.where()}: the forward planned to keep the tape of its last "
                                     f"{plan.tail} steps but kept none")
            return actions
        self.tail = tail_range(plan)
        self.tail_bufs = (list(tails[:n_tape]), list(tails[n_tape:]) if self.alls is None else [])
        self.reuse = reuse
        self.into = dict(self.attrs.get("into_tape") or {}) if plan.tail else {}
        r = next(i for i, a in enumerate(actions) if isinstance(a, Reverse))
        if all(isinstance(a, (Restore, Advance)) for a in actions[:r]):
            actions = actions[r:]          # nothing to advance to: the tail holds the segment
        return actions

    # -- StepRunner --------------------------------------------------------------------------
    def advance(self, state, start: int, stop: int):
        self.steps.limit = stop
        for t in range(start, stop):
            new, _ = self.steps.run_step(t, state)
            self.steps.hold(new)
            if t > start:
                self.steps.release(state)
            state = new
        return state

    def keep(self, state):
        return self.steps.hold(list(state))

    def drop(self, state) -> None:
        self.steps.release(state)

    def release(self, state) -> None:
        self.steps.release(state)

    def reverse(self, state, start: int, stop: int) -> None:
        if self.tail is not None and self.tail[0] <= start and stop <= self.tail[1]:
            state = self._from_tail(start)     # kept by the forward sweep (policies.py, "keep_tail")
        else:
            self._own_buffers()
            self._tape(state, start, stop)
        n = stop - start
        collect = TimeBatches(self.xp, Held(self.k.run.meter), n, self.attrs["batched"], self.fetch_seq, self.tape)
        for d, name in self.into.items():      # each d row goes where its step's tape row was read
            collect.buffers[d] = self.seg_tape[self.tape.index(name)][:n]
        dseq = [None if d is None else d[start:stop] for d in self.dseq]
        for t in range(stop - 1, start - 1, -1):
            values = self._backward_step(t, start, state)
            if t == stop - 1 and self.into:
                self._check_into(collect, values)
            collect.store(t - start, values, self.index, dseq)
        alls = [a[start:stop] for a in self.alls] if self.alls is not None else [s[:n] for s in self.seg_states]
        saved = [s[:n] for s in self.seg_tape]
        seqs = [s[start:stop] for s in self.seqs]
        for name, value in self.rows.run(lambda n: collect.stacked(n, dseq)).items():
            if name in self.seq_rows:
                self.dseq[self.seq_rows[name]][start:stop, ...] = value
            elif name in self.outer_rows:
                self._accumulate(self.outer_rows[name], value)
        for j, product in collect.products(seqs, list(state), alls, saved, dseq):
            self.acc[j] = product if self.acc[j] is None else self.acc[j] + product
        collect.held.release()

    # -- one segment ---------------------------------------------------------------------------
    def _check_into(self, collect, values) -> None:
        for d in self.into:
            value, rows = values[self.index[d]], collect.buffers[d]
            if tuple(value.shape) != tuple(rows.shape[1:]) or value.dtype != rows.dtype:
                raise ExecutionError(f"{self.k.op.where()}: the time-batched value '{d}' {list(value.shape)} "
                                     f"{value.dtype} was to be written into the rows of the tape value "
                                     f"'{self.into[d]}' {list(rows.shape[1:])} {rows.dtype}; build the "
                                     "backward under another memory policy (rg.memory.policies)")

    def _from_tail(self, start: int) -> list:
        """Point the segment's tape (and states) at the tail's rows from step ``start``; the state
        the segment starts from."""
        tape, states = self.tail_bufs
        row = start - self.tail[0]
        self.seg_tape = [b[row:] for b in tape]
        if self.alls is None:
            self.seg_states = [b[row + 1:] for b in states]
            return [b[row] for b in states]
        return list(self.inits) if start == 0 else [a[start - 1] for a in self.alls]

    def _own_buffers(self) -> None:
        """Before the first segment the tail does not hold: its tape goes into the tail's buffers
        (``reuse``) or into buffers of its own."""
        if self.own:
            return
        self.own = True
        tape, states = self.tail_bufs
        reuse = self.reuse and self.tail is not None
        self.seg_tape = list(tape) if reuse else [None] * len(self.tape)
        self.seg_states = [b[1:] for b in states] if reuse and states else [None] * len(self.seg_states)

    def _batched_steps(self, k, seqs, budget: int) -> BatchedSteps | None:
        """With every state kept by the forward and a row-wise step (``step_rows.rows_batchable``),
        a segment's steps re-run as one block run over their rows (in chunks): no recurrence."""
        step, attrs = self.attrs["step"], self.attrs
        if self.alls is None or self.shape_only or not seqs or not rows_batchable(step, attrs, self.steps.bindings):
            return None
        chunk = rows_chunk(len(seqs[0]), budget, row_bytes(step, step.ops, int(seqs[0].shape[1])))
        return BatchedSteps(k, step, attrs, self.steps.bindings, self.tape, chunk)

    def _tape_at_once(self, start: int, stop: int) -> None:
        xp = self.xp

        def prev_states(a: int, b: int) -> list:
            if a > 0:
                return [s[a - 1:b - 1] for s in self.alls]
            return [xp.concatenate([xp.reshape(init, (1,) + tuple(init.shape)), s[:b - 1]], axis=0)
                    for init, s in zip(self.inits, self.alls)]

        def store(j: int, a: int, b: int, rows) -> None:
            if self.seg_tape[j] is None:
                self.seg_tape[j] = self.held.add(xp.empty((self.segment,) + tuple(rows.shape[1:]), dtype=rows.dtype))
            self.seg_tape[j][a - start:b - start, ...] = rows

        self.at_once.run(self.seqs, prev_states, start, stop, store)

    def _tape(self, state, start: int, stop: int) -> None:
        """Re-run steps start..stop-1 keeping their states and the values the backward block reads."""
        if self.at_once is not None:
            return self._tape_at_once(start, stop)
        xp, steps = self.xp, self.steps
        current = state
        steps.limit = stop
        for t in range(start, stop):
            new, values = steps.run_step(t, current, self.tape + self.shape_only)
            for i, value in enumerate(new if self.alls is None else ()):
                if self.seg_states[i] is None:
                    self.seg_states[i] = self.held.add(xp.empty((self.segment,) + tuple(value.shape), dtype=value.dtype))
                self.seg_states[i][t - start, ...] = value
            for j, value in enumerate(values[:len(self.tape)]):
                self._store_tape(j, t - start, value)
            for name, value in zip(self.shape_only, values[len(self.tape):]):
                if name not in self.stand_ins or tuple(self.stand_ins[name].shape) != tuple(value.shape):
                    self.stand_ins[name] = xp.broadcast_to(xp.zeros((), dtype=value.dtype), tuple(value.shape))
            current = [self._new_state(i, t, start) for i in range(len(new))]

    def _store_tape(self, j: int, row: int, value) -> None:
        """Row ``row`` of tape buffer j. A step value whose shape changes over time (an inner loop's
        per-step trip count) is kept zero-padded to the largest shape seen, as the store-all forward
        keeps it: its readers look only at the part that was written."""
        xp, buf = self.xp, self.seg_tape[j]
        shape = tuple(value.shape)
        if buf is None:
            buf = self.seg_tape[j] = self.held.add(xp.zeros((self.segment,) + shape, dtype=value.dtype))
        elif len(buf.shape) - 1 != len(shape):
            raise ExecutionError(f"{self.k.op.where()}: step value '{self.tape[j]}' changes rank over time "
                                 f"({list(buf.shape[1:])} then {list(shape)}); the backward keeps it per "
                                 "step and needs one rank")
        elif any(a > b for a, b in zip(shape, buf.shape[1:])):
            wide = xp.zeros((self.segment,) + tuple(max(a, b) for a, b in zip(shape, buf.shape[1:])),
                            dtype=buf.dtype)
            wide[(slice(None),) + tuple(slice(0, d) for d in buf.shape[1:])] = buf
            if any(a is buf for a in self.held.arrays):     # (not the forward's tail: an input)
                self.held.drop(buf)
            buf = self.seg_tape[j] = self.held.add(wide)
        if shape == tuple(buf.shape[1:]):
            buf[row, ...] = value
        else:
            buf[row, ...] = 0
            buf[(row,) + tuple(slice(0, d) for d in shape)] = value

    def _new_state(self, i: int, t: int, start: int):
        """State i after step t (t in the segment being reversed)."""
        return self.alls[i][t] if self.alls is not None else self.seg_states[i][t - start]

    def _backward_step(self, t: int, start: int, state) -> list:
        """The backward step block at step t (same bindings as the store-all RecurrentNetworkGrad)."""
        xp, attrs, b = self.xp, self.attrs, self.bindings
        n_state = self.lay.fwd.n_state
        carry = [None] * n_state
        for i in range(n_state):
            dn = add_optional(self.dcur[i], None if self.d_all[i] is None else self.d_all[i][t])
            if dn is None:
                if self.zeros[i] is None:
                    self.zeros[i] = xp.zeros(self.inits[i].shape, dtype=self.inits[i].dtype)
                dn = self.zeros[i]
            elif self.lengths is not None:
                mask = step_mask(xp, self.lengths, t, dn.ndim)
                carry[i] = xp.where(mask, xp.zeros_like(dn), dn)
                dn = xp.where(mask, dn, xp.zeros_like(dn))
            b[attrs["dnext"][i]] = dn
        for name, seq in zip(attrs["inputs_t"], self.seqs):
            b[name] = seq[t]
        local = t - start
        for i, (name, out) in enumerate(zip(attrs["states"], attrs["state_outs"])):
            b[name] = state[i] if local == 0 else self._new_state(i, t - 1, start)
            b[out] = self._new_state(i, t, start)
        for name, values in zip(self.tape, self.seg_tape):
            b[name] = values[local]
        for name in self.shape_only:
            b[name] = self.stand_ins[name]
        timestep = attrs.get("timestep")
        if timestep:
            b[timestep] = timestep_value(xp, self.block, timestep, t)
        values = self.steps.runner(self.block, list(b), self.fetch)(b, streams.stream(attrs, t))
        for i, name in enumerate(self.fetch_seq):
            if name:
                self.dseq[i][t, ...] = values[self.index[name]]
        for i, name in enumerate(attrs["fetch_state"]):
            self.dcur[i] = add_optional(values[self.index[name]] if name else None, carry[i])
        for j, name in enumerate(self.fetch_outer):
            if name:
                self._accumulate(j, values[self.index[name]])
        return values

    def _accumulate(self, j: int, value) -> None:
        """Add ``value`` to outer value j's gradient (held from its first part on)."""
        if self.acc[j] is None:
            self.acc[j] = self.held.add(self.xp.asarray(value, copy=True))
        else:
            self.acc[j] += value

    def results(self):
        xp, lay = self.xp, self.lay.fwd
        self.steps.rows.release()
        self.held.release()
        out = []
        for position in self.attrs["grad_of"]:
            if position < lay.n_seq:
                out.append(self.dseq[position])
            elif position < lay.n_seq + lay.n_state:
                i = position - lay.n_seq
                d = self.dcur[i]
                out.append(d if d is not None else xp.zeros(self.inits[i].shape, dtype=self.inits[i].dtype))
            else:
                j = position - lay.outer_start
                outer = self.steps.bindings[self.k.op.inputs[lay.outer_start + j]]
                out.append(self.acc[j] if self.acc[j] is not None else xp.zeros(outer.shape, dtype=outer.dtype))
        return out[0] if len(out) == 1 else tuple(out)


BUDGET_VARIANTS["RecurrentNetwork"] = BudgetVariant(output_specs, forward_kernel, grad_maker)
