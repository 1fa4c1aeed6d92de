"""Running a step block over time: the layout of a RecurrentNetwork's inputs, a compiled step
runner, the buffers a looping kernel holds, and the budget variants of looping ops.

Shared by the forward (``recurrent.py``), the store-all backward (``recurrent_grad.py``) and the
budgeted forward and backward (``retrograd/memory/rnn_budget.py``), none of which imports another's
private names. Looping ops with ``recompute=<bytes>`` run the variant the memory package registers
in ``BUDGET_VARIANTS`` (the ops package never imports the memory package).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from ...errors import ExecutionError, ProgramError
from ...ir.analysis import free_reads_of_ops
from ...ir.program import Block, Program


# --- The op's input layout ------------------------------------------------------------------

@dataclass(frozen=True)
class RnnLayout:
    """Where each group of a RecurrentNetwork op's inputs sits (counts come from its attrs)."""
    n_seq: int
    n_state: int
    has_lengths: bool
    n_outer: int

    @staticmethod
    def of(attrs: dict, n_inputs: int) -> "RnnLayout":
        n_seq, n_state = len(attrs["inputs_t"]), len(attrs["states"])
        has_lengths = bool(attrs["has_lengths"])
        return RnnLayout(n_seq, n_state, has_lengths, n_inputs - n_seq - n_state - int(has_lengths))

    @property
    def outer_start(self) -> int:
        return self.n_seq + self.n_state + int(self.has_lengths)

    @property
    def n_inputs(self) -> int:
        return self.outer_start + self.n_outer

    def split(self, items: Sequence) -> tuple[list, list, object, list]:
        """(sequences, initial states, seq_lengths or None, outer values) of the forward inputs."""
        s, k = self.n_seq, self.n_state
        lengths = items[s + k] if self.has_lengths else None
        return list(items[:s]), list(items[s:s + k]), lengths, list(items[self.outer_start:self.n_inputs])


def fresh_name(program: Program, base: str) -> str:
    """``base`` if the program does not use it yet, else ``base_N``."""
    return base if not program.has_name(base) else program.unique_name(base)


# --- Running steps --------------------------------------------------------------------------------

def time_steps(op, seqs: list) -> int:
    """T, the common length of the sequences (ExecutionError naming the op if they differ)."""
    lengths = {int(seq.shape[0]) for seq in seqs}
    if len(lengths) != 1:
        raise ExecutionError(f"{op.where()}: input sequences have different lengths {sorted(lengths)} "
                             "along axis 0 (time)")
    return lengths.pop()


def check_batches(xp, op, seqs: list, inits: list, lengths) -> None:
    """Run-time checks a shape rule cannot make while sizes are -1: each initial state and
    ``seq_lengths`` has the sequences' batch N (axis 1), and every length lies in [0, T].

    Without them a wrong batch fails deep in the step block (an inner Add that
    does not broadcast) and a length outside [0, T] is silently clamped.
    """
    if not seqs or seqs[0].ndim < 2:
        return
    steps, batch = int(seqs[0].shape[0]), int(seqs[0].shape[1])
    names = op.inputs[len(seqs):len(seqs) + len(inits)]
    for name, init in zip(names, inits):
        if init.ndim >= 1 and int(init.shape[0]) != batch:
            raise ExecutionError(f"{op.where()}: initial state '{name}' has batch {int(init.shape[0])} "
                                 f"(shape {list(init.shape)}), the input sequence '{op.inputs[0]}' has "
                                 f"batch {batch} (shape {list(seqs[0].shape)}, [T, N, ...])")
    if lengths is None:
        return
    if tuple(lengths.shape) != (batch,):
        raise ExecutionError(f"{op.where()}: seq_lengths has shape {list(lengths.shape)}, expected "
                             f"[{batch}] (one length per example of '{op.inputs[0]}')")
    low, high = (int(xp.min(lengths)), int(xp.max(lengths))) if batch else (0, 0)
    if not 0 <= low <= high <= steps:
        raise ExecutionError(f"{op.where()}: seq_lengths holds {low}..{high}; "
                             f"each length must lie in [0, {steps}] (the sequences have {steps} steps)")


def timestep_value(xp, step: Block, name: str, t: int):
    """The value bound to the step's timestep variable at step ``t``."""
    var = step.var(name)
    return xp.full(tuple(max(d, 1) for d in var.shape), t, dtype=getattr(xp, var.dtype))


def step_mask(xp, lengths, t: int, ndim: int):
    """Rows still running at step ``t`` (``t < length``), shaped to broadcast over a state of rank ``ndim``."""
    return xp.reshape(lengths > t, (-1,) + (1,) * (ndim - 1))


def check_state_shape(op, name: str, value, slot) -> None:
    if tuple(value.shape) != tuple(slot.shape):
        raise ExecutionError(f"{op.where()}: step value '{name}' has shape {list(value.shape)}, but its "
                             f"state slots have shape {list(slot.shape)}; a step must keep each state's shape")


class StepRunner:
    """Runs one block many times (once per time step) with a plan compiled once.

    The bound names (step inputs, state slots, outer values) are kept in the
    plan, so the executor never frees or counts them: they are views of
    buffers the caller or the executor already holds, and holding each view
    per step would only cost time. Fetched values the block computes are
    released from the memory meter once the caller has them.
    """

    def __init__(self, op, run, block: Block, bound: Sequence[str], fetch: Sequence[str],
                 select: Callable | None = None):
        """``select(op) -> bool``, when given, keeps only the block's ops it accepts (the others'
        results are bound instead, or not needed)."""
        self.run = run
        self.fetch = list(fetch)
        bound = set(bound)
        self.plan = run.executor.plan_for(block, frozenset(self.fetch) | frozenset(bound))
        if select is not None:
            steps = [s for s in self.plan.steps if select(s.op)]
            self.plan = replace(self.plan, steps=steps, free_reads=free_reads_of_ops([s.op for s in steps]))
        missing = [n for n in self.plan.free_reads if n not in bound]
        if missing:
            raise ExecutionError(f"{op.where()}: block {block.idx} reads {', '.join(missing)}, which the op "
                                 "does not bind")
        self.overwritten = sorted({n for s in self.plan.steps for n in s.outputs if n in bound})
        self.release = list(dict.fromkeys([n for n in self.fetch if n not in bound] + self.overwritten))

    def __call__(self, bindings: dict, stream: tuple[int, int] | None = None) -> list:
        """Run the block once; ``stream`` = (the op's rng_id, time step) for its random ops (streams.py)."""
        env = dict(bindings)
        meter = self.run.meter
        for name in self.overwritten:      # the executor releases a value it overwrites
            meter.hold(env[name])
        if stream is None:
            self.run.executor.execute(self.plan, env)
        else:
            with self.run.random_stream(stream):
                self.run.executor.execute(self.plan, env)
        values = [env[n] for n in self.fetch]
        for name in self.release:
            meter.release(env[name])
        return values


class Held:
    """Buffers a kernel owns while it loops, counted by the run's memory meter."""

    def __init__(self, meter):
        self.meter = meter
        self.arrays: list = []

    def add(self, array):
        self.meter.hold(array)
        self.arrays.append(array)
        return array

    def drop(self, array) -> None:
        """Stop holding ``array`` before the loop ends (it was replaced)."""
        self.meter.release(array)
        self.arrays = [a for a in self.arrays if a is not array]

    def release(self) -> None:
        for array in self.arrays:
            self.meter.release(array)
        self.arrays = []


def add_optional(a, b):
    """``a + b`` where None stands for zero."""
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def per_state(given: list[bool], values: list) -> list:
    """``values`` spread over the states flagged in ``given`` (None for the others)."""
    it = iter(values)
    return [next(it) if flag else None for flag in given]


# --- Budget variants ----------------------------------------------------------------------------

def is_budget(recompute) -> bool:
    """True when ``recompute`` asks for a byte budget (an int, not a bool)."""
    return isinstance(recompute, int) and not isinstance(recompute, bool)


@dataclass(frozen=True)
class BudgetVariant:
    """How a looping op built with ``recompute=<bytes>`` runs: the extra outputs its gradient adds
    (checkpoints, schedule), its forward kernel and its gradient maker."""
    output_specs: Callable
    forward: Callable
    grad: Callable


BUDGET_VARIANTS: dict[str, BudgetVariant] = {}


def budget_variant(op_type: str) -> BudgetVariant:
    """The registered budget variant of ``op_type`` (ProgramError when none is)."""
    variant = BUDGET_VARIANTS.get(op_type)
    if variant is None:
        raise ProgramError(f"{op_type} with recompute=<bytes> has no budget variant registered "
                           "(import retrograd.memory)")
    return variant


# --- ONNX lowering pieces (the forward's and the backward's Loop bodies) ------------------------

def checked_inputs_onnx(g, lay: RnnLayout) -> str | None:
    """The kernel's run-time checks of the op's inputs (``check_batches``, then ``time_steps``) as
    a check of the model (``g.check``): a bool scalar, true when they pass, for the Loop's first
    condition (None when there is nothing to check). When it fails, the engine runs the kernel's
    own checks on the shapes and lengths, which raise its message."""
    seqs, inits, lengths, _ = lay.split(g.ins)
    init_vars = lay.split(g.in_vars)[1]
    shapes = [g.shape(v) for v in seqs + inits]
    steps, batch = _size_onnx(g, shapes[0], 0), _size_onnx(g, shapes[0], 1)
    bad = [_differs_onnx(g, _size_onnx(g, shape, 0), steps) for shape in shapes[1:lay.n_seq]]
    bad += [_differs_onnx(g, _size_onnx(g, shape, 0), batch)
            for shape, var in zip(shapes[lay.n_seq:], init_vars) if var.ndim >= 1]
    payload = list(shapes)
    if lengths is not None:
        lengths = g.cast(lengths, "int64")
        payload.append(lengths)
        bad += [_differs_onnx(g, g.shape(lengths), batch),   # no lengths: min, max are int64 max, min
                g.node("Less", [g.node("ReduceMin", [lengths]), g.const([0], "int64")]),
                g.node("Greater", [g.node("ReduceMax", [lengths]), steps])]
    if not bad:
        return None
    failed = bad[0]
    for more in bad[1:]:
        failed = g.node("Or", [failed, more])
    failed = g.node("Reshape", [failed, g.const([], "int64")])
    n_seq, n_state, op, with_lengths = lay.n_seq, lay.n_state, g.op, lengths is not None

    def verify(*values):      # the NumPy values of ``payload``: shapes, then the lengths
        import numpy as np
        stand_ins = [np.broadcast_to(np.zeros((), dtype=np.int8), tuple(int(d) for d in shape))
                     for shape in values[:n_seq + n_state]]
        check_batches(np, op, stand_ins[:n_seq], stand_ins[n_seq:], values[-1] if with_lengths else None)
        time_steps(op, stand_ins[:n_seq])

    return g.check(failed, "the input sequences' lengths, the initial states' batch or seq_lengths do "
                   "not fit the input sequences", verify, payload)


def _size_onnx(g, shape: str, axis: int) -> str:
    """``shape[axis:axis + 1]`` of an int64 shape value."""
    return g.node("Slice", [shape, g.const([axis], "int64"), g.const([axis + 1], "int64")])


def _differs_onnx(g, a: str, b: str) -> str:
    return g.node("Not", [g.node("Equal", [a, b])])


def step_mask_onnx(g, lengths: str, t: str, ndim: int) -> str:
    """ONNX ``lengths > t`` shaped [N, 1, ...] to broadcast over a state of rank ``ndim``."""
    running = g.node("Greater", [g.cast(lengths, "int64"), t])
    return g.node("Reshape", [running, g.const([-1] + [1] * (ndim - 1), "int64")])


def timestep_onnx(g, var, t: str) -> str:
    """ONNX value bound to the step's timestep variable (``timestep_value``) at step ``t``."""
    shape = g.const([max(d, 1) for d in var.shape], "int64")
    return g.node("Expand", [g.cast(t, var.dtype), shape])


def with_first_onnx(g, first: str, rest: str) -> str:
    """``concat([first[None], rest])``: slot 0 and the later slots of a states tensor."""
    return g.node("Concat", [g.node("Unsqueeze", [first, g.const([0], "int64")]), rest], axis=0)


def flip_onnx(g, stack: str) -> str:
    """``stack[::-1]``: a Loop running t = T-1..0 stacks its per-step values in that order."""
    return g.node("Slice", [stack, g.const([-1], "int64"), g.const([-(1 << 62)], "int64"),
                            g.const([0], "int64"), g.const([-1], "int64")])
