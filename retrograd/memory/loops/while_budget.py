"""``while_loop(..., recompute=<bytes>)``: a While that keeps at most that many bytes for its backward.

The trip count is known only when the loop ends, so the forward checkpoints
online: it keeps the loop vars of every k-th iteration (k = 1, 2, 4, ...),
and when half the budget is full it doubles k and drops every other
checkpoint. The backward (``WhileBudgetGrad``, which takes the place of the
reversed ``Scan`` the While's gradient maker builds) then reverses the loop
one checkpointed stretch at a time, last first; within a stretch it follows
a binomial plan (``schedules.budget_plan``) fitted to what the budget has
left: re-run iterations from the checkpoint, keep what the body's backward
reads (the values the Scan would have read from the forward's stacks), and
run the Scan's body over them in reverse. Its gradients are the Scan's: the
same block run on the same values in the same order.

The kept-values outputs of the While become zero-stride stand-ins; they and
the checkpoints cost nothing beyond the budget. A run whose plan does not
read the checkpoints (no backward in it: ``KernelCtx.live_outputs``) takes
none, so it holds what the forward alone holds, whatever the trip count. Double backward through a
budgeted loop is not supported (ProgramError).
"""
from __future__ import annotations

import numpy as np

from ...backends import dtype_name
from ...errors import ExecutionError, ProgramError
from ...ir.builder import capture_ops, emit
from ...ir.program import Op, Var
from ...ops.core import streams
from ...ops.control.loop_stacks import RaggedStacks
from ...ops.core.lowering import lowers
from ...ops.core.registry import GradCtx, defop
from ..recompute import seen_from
from ...ops.recurrent.steps import BUDGET_VARIANTS, BudgetVariant, is_budget
from .schedules import StepRunner, budget_plan, run_backward, sweep

SCHEDULE_LEN = 5          # [iterations, stride k, checkpoints, bytes per loop-var set, bytes per taped iteration]


def output_specs(inits: list[Var], attrs: dict) -> list:
    """Shapes of the extra outputs of a budgeted While once a gradient is built."""
    if not attrs.get("budget_outputs"):
        return []
    return [((-1,) + tuple(v.shape), v.dtype) for v in inits] + [((SCHEDULE_LEN,), "int64")]


def _nbytes(arrays) -> int:
    return int(sum(int(np.prod(a.shape)) * np.dtype(dtype_name(a.dtype)).itemsize for a in arrays))


# --- forward -----------------------------------------------------------------------------------------

def forward_kernel(k, *arrays, condition_holds, check_stable):
    """Run the loop keeping loop vars at online checkpoints; kept-value stacks are stand-ins."""
    attrs, run, xp, op = k.attrs, k.run, k.xp, k.op
    n = len(attrs["carry_binds"])
    carries, consts = list(arrays[:n]), dict(zip(op.inputs[n:], arrays[n:]))
    ys = list(attrs["ys"])
    full = list(attrs.get("ys_full") or [True] * len(ys))
    # Checkpoints only when this plan runs the backward: it reads the checkpoints and the schedule
    # (the last n + 1 outputs). A run fetching only the loss keeps nothing per iteration.
    graded = bool(attrs.get("budget_outputs")) and any(
        len(op.outputs) - 1 - j in k.live_outputs for j in range(n + 1))
    budget = int(attrs["recompute"])
    fetch = list(attrs["body_outs"]) + (ys if graded else [])
    meter = run.meter
    stride, kept = 1, []            # kept: (iteration, loop vars), iteration > 0
    carry_bytes = tape_bytes = capacity = 0
    shapes: list = [None] * len(ys)
    iters = 0
    while True:
        stream = streams.stream(attrs, iters)    # random ops draw per iteration (ops/streams.py)
        if not condition_holds(k, consts, carries, iters, stream):
            break
        if graded and iters and iters % stride == 0:
            for value in carries:
                meter.hold(value)
            kept.append((iters, list(carries)))
            if len(kept) > capacity:
                stride *= 2
                for it, values in [e for e in kept if e[0] % stride]:
                    for value in values:
                        meter.release(value)
                kept = [e for e in kept if e[0] % stride == 0]
        values = run.run_block(attrs["body"], {**consts, **dict(zip(attrs["carry_binds"], carries))},
                               fetch if iters == 0 else fetch[:n], stream)
        if graded:
            check_stable(op, arrays[:n], values[:n])
        if graded and iters == 0:
            carry_bytes = _nbytes(carries)
            tape_bytes = _nbytes([v for v, f in zip(values[n:], full) if f]) + carry_bytes
            shapes = [tuple(v.shape) for v in values[n:]]
            if budget < tape_bytes:
                raise ExecutionError(f"{op.where()}: a recompute budget of {budget} bytes cannot hold one "
                                     f"iteration; the minimum budget is {tape_bytes} bytes")
            # Checkpoints may take half the budget, but never so much that the backward cannot hold
            # one taped iteration beside them (else budgets between would fail: not monotonic).
            room = min(budget // 2, budget - tape_bytes)
            capacity = room // carry_bytes if carry_bytes else 1 << 30
        carries = values[:n]
        iters += 1
    outputs = list(carries) + [xp.asarray(iters, dtype=xp.int64)]
    for name, shape in zip(ys, shapes):
        var = attrs["body"].var(name)
        shape = shape if shape is not None else tuple(max(d, 0) for d in var.shape)
        outputs.append(xp.broadcast_to(xp.zeros((), dtype=getattr(xp, var.dtype)), (iters,) + tuple(shape)))
    if attrs.get("budget_outputs"):
        for j, init in enumerate(arrays[:n]):
            stack = xp.empty((len(kept),) + tuple(init.shape), dtype=init.dtype)
            for i, (_, values) in enumerate(kept):
                stack[i, ...] = values[j]
            outputs.append(stack)
        for _, values in kept:
            for value in values:
                meter.release(value)
        outputs.append(xp.asarray([iters, stride, len(kept), carry_bytes, tape_bytes], dtype=xp.int64))
    return tuple(outputs)


# --- the gradient maker ------------------------------------------------------------------------------

def grad_maker(g: GradCtx, loop_grad) -> list:
    """The While's own gradient (a reversed Scan), with the Scan replaced by a WhileBudgetGrad."""
    op, attrs = g.op, g.attrs
    n = len(attrs["carry_binds"])
    if any(d is not None for d in g.dout[n + 1:n + 1 + len(attrs["ys"])]):
        raise ProgramError(f"{op.where()}: double backward through a while_loop with a recompute budget "
                           "is not supported; build it with recompute=None")
    with capture_ops() as ops:
        result = loop_grad(g)
    scans = [o for o in ops if o.type == "Scan" and o.attrs.get("body") is not None
             and o.attrs["body"].parent_idx == g.block.idx and o.inputs[:1] == [op.outputs[n]]]
    if len(scans) != 1:
        raise ProgramError(f"{op.where()}: expected the While's gradient to be one reversed Scan, got "
                           f"{len(scans)}")
    scan = scans[0]
    _add_budget_outputs(op)
    for o in ops:
        emit(_budget_op(o, op, g.block) if o is scan else o, g.block)
    return result


def _add_budget_outputs(op: Op) -> None:
    """Give the While its checkpoint and schedule outputs, last (after any kept values added since)."""
    attrs, block = op.attrs, op.block
    if not attrs.get("budget_outputs"):
        attrs["budget_outputs"] = True
        names = []
        for name in op.inputs[:len(attrs["carry_binds"])]:
            var = block.var(name)
            names.append(block.create_var(block.program.unique_name(f"{name}.ckpt"), (-1,) + var.shape,
                                          var.dtype).name)
        names.append(block.create_var(block.program.unique_name(f"{op.outputs[0]}.schedule"),
                                      (SCHEDULE_LEN,), "int64").name)
        attrs["budget_names"] = names
    names = attrs["budget_names"]
    op.outputs = [o for o in op.outputs if o not in names] + list(names)
    block.program.bump()


def _budget_op(scan: Op, loop: Op, block) -> Op:
    """The WhileBudgetGrad doing ``scan``'s work without the stacks ``loop`` would have kept."""
    a = scan.attrs
    c, s = len(a["carry_binds"]), len(a["x_binds"])
    if a.get("ys"):
        raise ProgramError(f"{loop.where()}: a recompute budget cannot serve a gradient with per-iteration "
                           "outputs")
    n = len(loop.attrs["carry_binds"])
    ys = list(loop.attrs["ys"])
    full = list(loop.attrs.get("ys_full") or [True] * len(ys))
    for name, x in zip(a["x_binds"], scan.inputs[1 + c:1 + c + s]):
        if name not in ys or x != loop.outputs[n + 1 + ys.index(name)]:
            raise ProgramError(f"{loop.where()}: its gradient reads '{name}' other than from the loop's "
                               "kept values; a recompute budget cannot serve it")
    inputs = ([scan.inputs[0]] + scan.inputs[1:1 + c] + scan.inputs[1 + c + s:] + list(loop.inputs)
              + list(loop.attrs["budget_names"]))
    attrs = {"body": a["body"], "carry_binds": list(a["carry_binds"]), "body_outs": list(a["body_outs"]),
             "x_binds": list(a["x_binds"]), "shape_only": [x for x in a["x_binds"] if not full[ys.index(x)]],
             "n_consts": len(scan.inputs) - 1 - c - s, "n_loop_vars": n,
             "fwd_body": seen_from(loop.attrs["body"], block), "fwd_carry_binds": list(loop.attrs["carry_binds"]),
             "fwd_body_outs": list(loop.attrs["body_outs"]), "budget": int(loop.attrs["recompute"])}
    streams.copy_stream(loop.attrs, attrs)   # re-run iterations draw the forward's random numbers
    return Op("WhileBudgetGrad", inputs, list(scan.outputs), attrs)


# --- WhileBudgetGrad ---------------------------------------------------------------------------------

def _budget_grad_rule(ins: list[Var], attrs: dict):
    c = len(attrs["carry_binds"])
    return [(v.shape, v.dtype) for v in ins[1:1 + c]]


@defop("WhileBudgetGrad", inputs=("iterations", "init*", "consts*", "loop_inputs*", "checkpoints*",
                                  "schedule"),
       outputs=("finals*",), infer=_budget_grad_rule, nondiff=(0,))
def _while_budget_grad(k, count, *arrays):
    """Reverse a budgeted loop stretch by stretch from its checkpoints, running the Scan body per iteration."""
    attrs, op = k.attrs, k.op
    c, m, n = len(attrs["carry_binds"]), int(attrs["n_consts"]), int(attrs["n_loop_vars"])
    carries = list(arrays[:c])
    consts = dict(zip(op.inputs[1 + c:1 + c + m], arrays[c:c + m]))
    loop_in = arrays[c + m:len(arrays) - n - 1]
    ckpts, schedule = arrays[len(arrays) - n - 1:-1], arrays[-1]
    # The schedule steers this kernel's host-side loop: one explicit transfer of its few ints.
    iters, stride, held, carry_bytes, tape_bytes = (int(v) for v in k.backend.to_numpy(schedule).reshape(-1))
    loop_names = op.inputs[1 + c + m:1 + c + m + len(loop_in)]
    runner = _Iterations(k, dict(zip(loop_names[n:], loop_in[n:])), consts, carries)
    starts = [0] + [stride * (i + 1) for i in range(held)]
    for j in range(len(starts) - 1, -1, -1):
        start, stop = starts[j], starts[j + 1] if j + 1 < len(starts) else iters
        if stop <= start:
            continue
        state = list(loop_in[:n]) if j == 0 else [ck[j - 1] for ck in ckpts]
        room = attrs["budget"] - held * carry_bytes     # the checkpoint stack is held throughout
        try:
            plan = budget_plan(stop - start, room, carry_bytes, tape_bytes)
        except ProgramError as exc:
            raise ExecutionError(f"{op.where()}: {exc}") from None
        runner.first = start     # the plan counts iterations from the stretch's start
        run_backward(plan, sweep(plan, state, runner), runner)
    return runner.carries[0] if c == 1 else tuple(runner.carries)



@lowers("WhileBudgetGrad")
def _while_budget_grad_onnx(g):
    """ONNX has no memory budget to keep: store-all. A Loop re-runs the forward iterations from
    the initial loop vars stacking what the Scan body reads, a reversed Loop runs the Scan body
    over them (checkpoints and schedule are not read). The Scan's gradients, store-all memory."""
    a = g.attrs
    c, m, n = len(a["carry_binds"]), int(a["n_consts"]), int(a["n_loop_vars"])
    count = g.node("Reshape", [g.cast(g.ins[0], "int64"), g.const([], "int64")])
    names, values = g.op.inputs, g.ins
    loop_names, loop_in = names[1 + c + m:len(names) - n - 1], values[1 + c + m:len(values) - n - 1]
    fwd = g.child()
    fwd.stream(fwd.input("iter", "int64", []))
    cond = fwd.input("cond", "bool", [])
    state = [fwd.input(name, v.dtype, None) for name, v in zip(a["fwd_carry_binds"], g.in_vars[1 + c + m:])]
    binds = {**dict(zip(loop_names[n:], loop_in[n:])), **dict(zip(a["fwd_carry_binds"], state))}
    new = fwd.lower(a["fwd_body"], binds, list(a["fwd_body_outs"]) + list(a["x_binds"]))
    carried = g.in_vars[1 + c + m:1 + c + m + n]
    kept = RaggedStacks(g, a["fwd_body"], a["x_binds"])      # as While's lowering stacks them
    outputs = ([(cond, "bool", [])] + list(zip(new[:n], carried)) + kept.carry(fwd, new[n:])
               + kept.scanned([(v, a["fwd_body"].var(x)) for v, x in zip(new[n:], a["x_binds"])]))
    outs = g.nodes("Loop", [count, "", *loop_in[:n], *kept.starts], len(outputs) - 1,
                   body=fwd.finish(f"{g.op.outputs[0]}.forward", outputs))
    stacks = kept.stacks(g, outs[n:n + kept.width], outs[n + kept.width:])
    back = g.child()
    i = back.input("iter", "int64", [])
    cond = back.input("cond", "bool", [])
    i = back.node("Sub", [back.node("Sub", [count, back.const(1, "int64")]), i])
    back.stream(i)
    carries = [back.input(name, v.dtype, None) for name, v in zip(a["carry_binds"], g.out_vars)]
    binds = {**dict(zip(names[1 + c:1 + c + m], values[1 + c:1 + c + m])), **dict(zip(a["carry_binds"], carries)),
             **{x: back.node("Gather", [stack, i], axis=0) for x, stack in zip(a["x_binds"], stacks)}}
    new = back.lower(a["body"], binds, list(a["body_outs"]))
    graph = back.finish(f"{g.op.outputs[0]}.backward", [(cond, "bool", [])] + list(zip(new, g.out_vars)))
    return g.nodes("Loop", [count, "", *values[1:1 + c]], c, body=graph)

class _Iterations(StepRunner):
    """Runs loop iterations (the forward body) and the Scan body's backward over them."""

    def __init__(self, k, loop_consts: dict, consts: dict, carries: list):
        self.k, self.run, self.xp, self.attrs = k, k.run, k.xp, k.attrs
        self.loop_consts, self.consts, self.carries = loop_consts, consts, carries
        self.taped = [x for x in self.attrs["x_binds"] if x not in set(self.attrs["shape_only"])]
        self.first = 0           # the loop iteration the current stretch starts at

    def _body(self, state, fetch, i: int):
        """Iteration ``i`` of the stretch from ``state``, in the random stream the forward ran it in."""
        bindings = {**self.loop_consts, **dict(zip(self.attrs["fwd_carry_binds"], state))}
        return self.run.run_block(self.attrs["fwd_body"], bindings, fetch,
                                  streams.stream(self.attrs, self.first + i))

    def advance(self, state, start: int, stop: int):
        n = len(state)
        for i in range(start, stop):
            new = self._body(state, self.attrs["fwd_body_outs"], i)[:n]
            for value in new:
                self.run.meter.hold(value)
            if i > start:
                self.release(state)
            state = new
        return state

    def keep(self, state):
        for value in state:
            self.run.meter.hold(value)
        return state

    def drop(self, state) -> None:
        self.release(state)

    def release(self, state) -> None:
        for value in state:
            self.run.meter.release(value)

    def reverse(self, state, start: int, stop: int) -> None:
        xp, attrs, meter = self.xp, self.attrs, self.run.meter
        n = len(state)
        x_binds = attrs["x_binds"]
        tape = []
        for i in range(start, stop):
            values = self._body(state, list(attrs["fwd_body_outs"]) + x_binds, i)
            kept = {}
            for name, value in zip(x_binds, values[n:]):
                if name in attrs["shape_only"]:
                    value = xp.broadcast_to(xp.zeros((), dtype=value.dtype), tuple(value.shape))
                else:
                    meter.hold(value)
                kept[name] = value
            tape.append(kept)
            state = values[:n]
        for i, kept in reversed(list(enumerate(tape, start))):
            bindings = {**self.consts, **dict(zip(attrs["carry_binds"], self.carries)), **kept}
            self.carries = list(self.run.run_block(attrs["body"], bindings, attrs["body_outs"],
                                                   streams.stream(attrs, self.first + i)))
            for name in self.taped:
                meter.release(kept[name])


def is_budgeted(attrs: dict) -> bool:
    return is_budget(attrs.get("recompute"))


BUDGET_VARIANTS["While"] = BudgetVariant(output_specs, forward_kernel, grad_maker)
