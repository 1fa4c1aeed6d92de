"""Ops of a budgeted recurrence's step that read no state, run over a chunk of time steps at once.

A budgeted ``layers.lstm`` computes its input projection inside its step
(``unhoist.py``: no ``[T, N, 4H]`` tensor), and its backward step the
projection's input gradient and bias gradient::

    forward step:   p_t = SeqLinear(x_t, w_ih, b)          (reads a step input and outer values)
    backward step:  dx_t = SeqLinear(d_t, w_ih^T)          (d_t: a row the backward keeps anyway,
                    db_t = Sum(d_t, axis=0)                 time-batched for dw_ih = x^T d)

Each is row-wise: the rows of ``L`` steps stacked are the op's rows over
``L * N`` rows. Run once per step they cost a kernel call per step, twice
over in the forward (the sweep and the re-run with tape) and once in the
backward: at small batches more than the GEMMs they are. Here they run
once per chunk of steps: the forward's projection ``P [L, N, 4H]`` for the
next ``L`` steps (``InputRows``: at most ``1/ROWS_SHARE`` of the op's
budget, at most ``ROWS_MAX`` steps, one step at the least budget), the
backward's ``dx`` and ``db`` over each segment's stacked ``d`` rows
(``OutputRows``). The step blocks are not changed (the runners skip or
pick those ops), so gradients equal the per-step ones to rounding.

Where the forward keeps every states tensor (``budget.py`` chooses it when
it fits), the step before each re-run step is known, so a segment's re-run
with tape needs no recurrence: a row-wise step block (``rows_batchable``:
the LSTM and GRU cells) runs once over the stacked rows of a chunk of
steps (``BatchedSteps``) instead of once per step.
"""
from __future__ import annotations

import math

import numpy as np

from ...ir.program import Block, Op
from ...ops.core.registry import get_op_def
from ...ops.recurrent.steps import Held
from ...ops.recurrent.steps import StepRunner as BlockRunner

ROWS_SHARE = 16
ROWS_MAX = 64


def input_row_ops(step: Block, inputs_t, outer) -> list[Op]:
    """The step's ``SeqLinear`` ops over a step input with outer weights (the input projections).

    Example::

        ops = input_row_ops(rnn.attrs["step"], rnn.attrs["inputs_t"], set(outer_names))
    """
    inputs_t, outer = set(inputs_t), set(outer)
    return [op for op in step.ops if op.type == "SeqLinear" and op.inputs[0] in inputs_t
            and all(name in outer for name in op.inputs[1:])]


def row_bytes(block: Block, ops: list[Op], batch: int) -> int:
    """Bytes of one step of the ops' outputs, -1 taken as ``batch``.

    Example::

        row_bytes(step, input_row_ops(step, inputs_t, outer), batch=16)   # 32768 for [16, 512] float32
    """
    total = 0
    for op in ops:
        for name in op.outputs:
            var = block.var(name)
            total += math.prod(batch if d < 0 else d for d in var.shape) * np.dtype(var.dtype).itemsize
    return int(total)


def rows_chunk(steps: int, budget: int, step_bytes: int) -> int:
    """Steps of one chunk of input rows: ``1/ROWS_SHARE`` of the op's budget, 1 to ``ROWS_MAX``.

    Example::

        rows_chunk(400, 16 * 10 * 32768, 32768)     # 10 steps
    """
    if step_bytes <= 0:
        return 1
    return int(max(1, min(steps, ROWS_MAX, budget // (ROWS_SHARE * step_bytes))))


class InputRows:
    """The input projections of the next ``chunk`` steps, computed at once and bound step by step."""

    def __init__(self, k, step: Block, ops: list[Op], seqs: dict, bindings: dict, chunk: int):
        self.xp, self.ops, self.seqs, self.bindings = k.xp, ops, seqs, bindings
        self.names = [op.outputs[0] for op in ops]
        picked = {id(op) for op in ops}
        inputs = sorted({op.inputs[0] for op in ops})
        self.inputs = inputs
        self.runner = BlockRunner(k.op, k.run, step, list(bindings) + inputs, self.names,
                                  select=lambda op: id(op) in picked) if ops else None
        self.chunk = max(int(chunk), 1)
        self.held = Held(k.run.meter)
        self.start = self.stop = 0
        self.values: list = []

    def bind(self, b: dict, t: int, limit: int) -> None:
        """Bind step ``t``'s rows (computing the chunk from ``t`` up to ``limit`` when needed)."""
        if self.runner is None:
            return
        if not self.start <= t < self.stop:
            self._compute(t, max(t + 1, min(limit, t + self.chunk)))
        for name, value in zip(self.names, self.values):
            b[name] = value[t - self.start]

    def _compute(self, start: int, stop: int) -> None:
        xp = self.xp
        self.held.release()
        b = dict(self.bindings)
        steps = stop - start
        for name in self.inputs:
            seq = self.seqs[name][start:stop]
            b[name] = xp.reshape(seq, (steps * seq.shape[1],) + tuple(seq.shape[2:]))
        values = self.runner(b)
        batch = self.seqs[self.inputs[0]].shape[1]
        self.values = [self.held.add(xp.reshape(v, (steps, batch) + tuple(v.shape[1:]))) for v in values]
        self.start, self.stop = start, stop

    def release(self) -> None:
        self.held.release()
        self.values, self.start, self.stop = [], 0, 0


def _sums_rows(op: Op, block: Block) -> bool:
    """A ``Sum`` over axis 0 of a [N, K] value (the bias gradient of a step)."""
    axis = op.attrs.get("axis")
    axis = list(axis) if isinstance(axis, (list, tuple)) else [axis]
    var = block.find_var(op.inputs[0])
    return (op.type == "Sum" and axis == [0] and not op.attrs.get("keepdim", op.attrs.get("keepdims", False))
            and var is not None and len(var.shape) == 2)


def output_row_ops(block: Block, collected, outer, fetch_seq, fetch_outer) -> list[Op]:
    """The backward step's ops that turn a kept ``d`` row into a sequence's gradient (``SeqLinear``)
    or an outer value's (a ``Sum`` over rows), read by no other op of the block.

    Example::

        ops = output_row_ops(grad.attrs["backward"], collected, outer, grad.attrs["fetch_seq"],
                             grad.attrs["fetch_outer"])
    """
    collected, outer = set(collected), set(outer)
    seq_grads, outer_grads = {n for n in fetch_seq if n}, {n for n in fetch_outer if n}
    read = {}
    for op in block.ops:
        for name in op.inputs:
            read[name] = read.get(name, 0) + 1
    picked = []
    for op in block.ops:
        out = op.outputs[0] if len(op.outputs) == 1 else None
        if out is None or read.get(out) or op.inputs[0] not in collected:
            continue
        if op.type == "SeqLinear" and out in seq_grads and all(n in outer for n in op.inputs[1:]):
            picked.append(op)
        elif _sums_rows(op, block) and out in outer_grads and len(op.inputs) == 1:
            picked.append(op)
    return picked


class OutputRows:
    """Runs ``output_row_ops`` over a segment's stacked ``d`` rows once the segment is reversed."""

    def __init__(self, k, block: Block, ops: list[Op], bindings: dict):
        self.xp, self.ops, self.bindings = k.xp, ops, bindings
        self.names = [op.outputs[0] for op in ops]
        self.inputs = sorted({op.inputs[0] for op in ops})
        picked = {id(op) for op in ops}
        self.runner = BlockRunner(k.op, k.run, block, list(bindings) + self.inputs, self.names,
                                  select=lambda op: id(op) in picked) if ops else None

    def run(self, stacked) -> dict:
        """name -> value over the segment: ``stacked(name)`` gives a kept row's [L, N, K] stack;
        a sequence gradient comes back [L, N, D], a summed one summed over the segment."""
        if self.runner is None:
            return {}
        xp = self.xp
        b = dict(self.bindings)
        shapes = {}
        for name in self.inputs:
            stack = stacked(name)
            shapes[name] = tuple(stack.shape[:2])
            b[name] = xp.reshape(stack, (stack.shape[0] * stack.shape[1],) + tuple(stack.shape[2:]))
        values = self.runner(b)
        out = {}
        for op, value in zip(self.ops, values):
            lead = shapes[op.inputs[0]]
            out[op.outputs[0]] = xp.reshape(value, lead + tuple(value.shape[1:])) if op.type == "SeqLinear" else value
        return out


# --- re-running a segment's steps at once from kept states -------------------------------------

ROW_OPS = {"LSTMUnit", "GRUUnit", "Tanh", "Sigmoid", "Relu", "Exp", "Log", "Square", "Neg", "Add", "Sub",
           "Mul", "Div"}


def rows_batchable(step: Block, attrs: dict, outer) -> bool:
    """True when every op of the step block computes each row (batch entry) of its outputs from
    that row of its step inputs and states alone (SeqLinear / MatMul by an outer weight, the LSTM
    and GRU units, elementwise ops with outer values of lower rank): then steps whose states are
    all kept can run as one block run over their stacked rows. No timestep, lengths or random ops.

    Example::

        rows_batchable(rnn.attrs["step"], rnn.attrs, outer_names)
    """
    if attrs.get("has_lengths") or (attrs.get("timestep") and any(
            attrs["timestep"] in op.inputs for op in step.ops)):
        return False
    rows = set(attrs["inputs_t"]) | set(attrs["states"])
    outer = set(outer)
    for op in step.ops:
        if op.sub_blocks() or get_op_def(op.type).random or not op.inputs:
            return False
        if op.type in ("SeqLinear", "MatMul"):
            ok = (op.inputs[0] in rows and all(n in outer for n in op.inputs[1:])
                  and not op.attrs.get("transpose_x") and step.var(op.inputs[0]).ndim == 2)
        elif op.type in ROW_OPS:
            rank = step.var(op.outputs[0]).ndim
            ok = all(n in rows or (n in outer and _rank(step, n) < rank) for n in op.inputs)
        else:
            ok = False
        if not ok:
            return False
        rows.update(op.outputs)
    return True


def _rank(block: Block, name: str) -> int:
    var = block.find_var(name)
    return 99 if var is None else var.ndim


class BatchedSteps:
    """Runs the step block over steps ``start..stop-1`` at once from the states they start from
    (kept by the forward), fetching the step values the backward reads, in chunks of ``chunk``
    steps (the block's values over a chunk are a transient of ``chunk`` steps)."""

    def __init__(self, k, step: Block, attrs: dict, bindings: dict, fetch: list[str], chunk: int):
        self.xp, self.attrs = k.xp, attrs
        self.bindings = dict(bindings)
        self.fetch = fetch
        bound = list(bindings) + list(attrs["inputs_t"]) + list(attrs["states"])
        self.runner = BlockRunner(k.op, k.run, step, bound, fetch)
        self.chunk = max(int(chunk), 1)

    def run(self, seqs: list, prev_states, start: int, stop: int, store) -> None:
        """``prev_states(a, b)`` -> per state the states after steps a-1..b-2 ([b - a, N, ..]);
        ``store(j, a, b, values)`` takes fetched value j over steps a..b-1 ([b - a, N, ..])."""
        xp = self.xp
        for a in range(start, stop, self.chunk):
            b = min(stop, a + self.chunk)
            steps = b - a
            bind = self.bindings
            for name, seq in zip(self.attrs["inputs_t"], seqs):
                bind[name] = _flat(xp, seq[a:b])
            for name, prev in zip(self.attrs["states"], prev_states(a, b)):
                bind[name] = _flat(xp, prev)
            values = self.runner(bind)
            for j, value in enumerate(values):
                store(j, a, b, xp.reshape(value, (steps, value.shape[0] // steps) + tuple(value.shape[1:])))


def _flat(xp, stacked):
    """[L, N, ...] as [L * N, ...]."""
    return xp.reshape(stacked, (stacked.shape[0] * stacked.shape[1],) + tuple(stacked.shape[2:]))
