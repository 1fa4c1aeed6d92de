"""``while_loop``: the ``While`` op, and ``Scan`` (a counted loop; the gradient of both). Layouts::

    While(init..., consts...; cond, cond_binds, cond_out, body, carry_binds,
          body_outs, ys, ys_full, max_iters)              -> finals..., iters, ys...
    Scan(n, init..., xs..., consts...; body, carry_binds, body_outs, x_binds,
         ys, ys_like, ys_full, reverse)                   -> finals..., ys...
        a loop over carried values; Scan runs n iterations (i = 0..n-1, or
        n-1..0 when reversed) binding xs[j][i] to x_binds[j]; both stack the
        body's values ``ys`` of every iteration into [iterations, ...] outputs
        (ys_like[j] = an input index: shaped like that input instead;
        ys_full[j] False: the backward reads only its shape, so the output is
        a zero-stride stand-in that costs no memory; an output the running
        plan does not read, as in a forward-only run, is an empty stand-in).
        With ``rng_id`` (the body draws random numbers) iteration i runs in
        the random stream (rng_id, i); a Scan that is a loop's gradient has
        the forward's rng_id, so its i replays forward iteration i
        (``streams.py``).

The gradient of While is a reversed Scan over the body's backward, of Scan a
Scan the other way (``loop_grad.py``).
"""
from __future__ import annotations

from typing import Callable, Sequence

from ...backends import dtype_of
from ...errors import ExecutionError, ProgramError, ShapeError
from ...ir.builder import block_guard, current_block
from ...ir.program import Block, Op, Var
from ..core import streams
from .loop_grad import LoopView, loop_grad
from .loop_stacks import Kept, RaggedStacks
from ..recurrent.steps import budget_variant, is_budget
from ..core.registry import GradCtx, append_op, defop
from ..core.lowering import lowers
from .tensor_array import TensorArray
from .empty_arrays import fill_empty, fill_empty_onnx
from ..core.subblocks import (as_outputs, as_vars, bound_var, check_bound, check_predicate,
                              full_flags, live_indices, merge_shapes, names_of, or_stand_ins,
                              outer_reads, shapes_compatible, condition_holds, max_iters_exceeded,
                              unique)


def _carry_specs(inits: Sequence[Var], body: Block, body_outs: Sequence[str]) -> list:
    specs = []
    for j, (init, name) in enumerate(zip(inits, body_outs)):
        new = body.find_var(name)
        if new is None:
            raise ShapeError(f"loop var {j}: block {body.idx} has no variable '{name}'")
        if new.dtype != init.dtype or not shapes_compatible(init.shape, new.shape):
            raise ShapeError(f"loop var {j} is '{init.name}' {init.type_str()} but the body makes '{name}' "
                             f"{new.type_str()}")
        specs.append((merge_shapes(init.shape, new.shape), init.dtype))
    return specs


def _stack_spec(body: Block, name: str):
    var = body.find_var(name)
    if var is None:
        raise ShapeError(f"block {body.idx} has no variable '{name}' to keep per iteration")
    return ((-1,) + var.shape, var.dtype)


def _while_rule(ins: list[Var], attrs: dict) -> list:
    n = len(attrs["carry_binds"])
    flag = attrs["cond"].find_var(attrs["cond_out"])
    if flag is None or flag.dtype != "bool" or flag.shape not in ((), (1,)):
        raise ShapeError(f"the condition '{attrs['cond_out']}' must be a scalar bool"
                         + ("" if flag is None else f", got {flag.type_str()}"))
    if len(attrs["cond_binds"]) != n or len(attrs["body_outs"]) != n or len(ins) < n:
        raise ShapeError(f"{n} loop vars but {len(attrs['cond_binds'])} condition bindings, "
                         f"{len(attrs['body_outs'])} body results and {len(ins)} inputs")
    check_bound(attrs["cond"], attrs["cond_binds"], "loop var")
    check_bound(attrs["body"], attrs["carry_binds"], "loop var")
    specs = (_carry_specs(ins[:n], attrs["body"], attrs["body_outs"]) + [((), "int64")]
             + [_stack_spec(attrs["body"], name) for name in attrs["ys"]])
    if attrs.get("budget_outputs"):  # recompute=<bytes>: checkpoints and schedule (memory/while_budget.py)
        specs += budget_variant("While").output_specs(ins[:n], attrs)
    return specs


def _scan_rule(ins: list[Var], attrs: dict) -> list:
    c, s = len(attrs["carry_binds"]), len(attrs["x_binds"])
    if ins[0].dtype not in ("int64", "int32") or ins[0].shape not in ((), (1,)):
        raise ShapeError(f"the trip count '{ins[0].name}' must be an integer scalar, got {ins[0].type_str()}")
    if len(ins) < 1 + c + s or len(attrs["ys_like"]) != len(attrs["ys"]):
        raise ShapeError(f"{c} carries and {s} sliced inputs need at least {1 + c + s} inputs, got {len(ins)}")
    check_bound(attrs["body"], list(attrs["carry_binds"]) + list(attrs["x_binds"]), "bound name")
    x_shapes = attrs.get("x_shapes")
    if x_shapes is not None and (len(x_shapes) != s or any(
            p is not None and not (isinstance(p, int) and 1 + c + s <= p < len(ins)) for p in x_shapes)):
        raise ShapeError(f"x_shapes must give, per sliced input, None or the position of its shapes "
                         f"(an input after the sliced ones), got {x_shapes!r}")
    specs = _carry_specs(ins[1:1 + c], attrs["body"], attrs["body_outs"])
    for name, like in zip(attrs["ys"], attrs["ys_like"]):
        specs.append(_stack_spec(attrs["body"], name) if like is None else (ins[like].shape, ins[like].dtype))
    return specs


def _while_grad(g: GradCtx) -> list:
    if _budgeted(g.attrs):   # recompute=<bytes>: memory/while_budget.py swaps the Scan for its own op
        return budget_variant("While").grad(g, lambda g: loop_grad(g, LoopView.of_while(g)))
    return loop_grad(g, LoopView.of_while(g))


def _budgeted(attrs: dict) -> bool:
    return is_budget(attrs.get("recompute"))


@defop("While", inputs=("init*", "consts*"), outputs=("finals*", "iters", "ys*"), infer=_while_rule,
       grad=_while_grad)
def _while(k, *arrays):
    """Run ``body`` while ``cond`` holds; the final loop vars, the trip count, the kept values."""
    attrs, run, xp, op = k.attrs, k.run, k.xp, k.op
    if _budgeted(attrs):     # recompute=<bytes>: checkpoints instead of kept values (memory/while_budget.py)
        outs = budget_variant("While").forward(k, *arrays, condition_holds=condition_holds,
                                               check_stable=_check_stable)
        return tuple(fill_empty(k, arrays, list(outs)))
    n = len(attrs["carry_binds"])
    carries, consts = list(arrays[:n]), dict(zip(op.inputs[n:], arrays[n:]))
    ys, full = attrs["ys"], full_flags(attrs, attrs["ys"])
    live = live_indices(k, n + 1, ys)      # kept values this plan reads (not when only the forward runs)
    kept = Kept(k, [ys[j] for j in live], attrs["body"], [full[j] for j in live])
    fetch = list(attrs["body_outs"]) + kept.names
    iters = 0
    while True:
        stream = streams.stream(attrs, iters)
        if not condition_holds(k, consts, carries, iters, stream):
            break
        values = run.run_block(attrs["body"], {**consts, **dict(zip(attrs["carry_binds"], carries))}, fetch,
                               stream)
        if ys and not attrs.get("ragged"):
            _check_stable(op, arrays[:n], values[:n])
        carries = values[:n]
        kept.add(values[n:])
        iters += 1
    stacks = or_stand_ins(k, n + 1, len(ys), dict(zip(live, kept.stacks())))
    carries = fill_empty(k, arrays, list(carries))    # an unwritten TensorArray's run-time element sizes
    return tuple(carries) + (xp.asarray(iters, dtype=dtype_of(xp, "int64")),) + tuple(stacks)


@lowers("While")
def _while_onnx(g):
    """A Loop with no trip limit: the condition on the initial loop vars decides the first
    iteration, the body ends by evaluating it on the new ones; a carried counter gives ``iters``.
    ``max_iters`` is a run-time check (``_max_iters_onnx``). With ``recompute=<bytes>`` the kept
    values are computed (store-all)."""
    a = g.attrs
    n = len(a["carry_binds"])
    carry_vars = g.out_vars[:n]
    first, = g.lower(a["cond"], dict(zip(a["cond_binds"], g.ins[:n])), [a["cond_out"]])
    if streams.contains_random(a["cond"]):
        g.fail("a loop condition that draws random numbers has no ONNX form")
    body = g.child()
    iteration = body.input("iter", "int64", [])
    body.stream(iteration)
    body.input("cond", "bool", [])
    carries = [body.input(name, var.dtype, None) for name, var in zip(a["carry_binds"], carry_vars)]
    count = body.input("iters", "int64", [])
    # A loop whose loop vars change shape (shape_invariants) keeps values that may change with them.
    stacks = RaggedStacks(g, a["body"], a["ys"], a["carry_binds"] if a.get("ragged") else ())
    values = body.lower(a["body"], dict(zip(a["carry_binds"], carries)), list(a["body_outs"]) + list(a["ys"]))
    new, kept = values[:n], values[n:]
    ragged_outputs = stacks.carry(body, kept)
    flag, = body.lower(a["cond"], dict(zip(a["cond_binds"], new)), [a["cond_out"]])
    first, flag = _scalar_onnx(g, first), _scalar_onnx(body, flag)
    if a.get("max_iters") == 0:     # only then can the first condition exceed it
        first = _max_iters_onnx(g, first, g.const(0, "int64"))
    if a.get("max_iters") is not None:
        flag = _max_iters_onnx(body, flag, body.node("Add", [iteration, body.const(1, "int64")]))
    outputs = ([(flag, "bool", [])] + list(zip(new, carry_vars))
               + [(body.node("Add", [count, body.const(1, "int64")]), "int64", [])] + ragged_outputs
               + stacks.scanned([(value, a["body"].var(name)) for value, name in zip(kept, a["ys"])]))
    graph = body.finish(f"{g.op.outputs[0]}.body", outputs)
    outs = g.nodes("Loop", ["", first, *_carry_inits(g, range(n)), g.const(0, "int64"), *stacks.starts],
                   len(outputs) - 1,
                   body=graph)
    end = n + 1 + stacks.width
    outs = fill_empty_onnx(g, outs[:n]) + outs[n:n + 1] + stacks.stacks(g, outs[n + 1:end], outs[end:])
    if a.get("budget_outputs"):   # recompute=<bytes>: its ONNX backward re-runs every iteration
        extra = g.out_vars[len(outs):]  # (store-all) and reads no checkpoints: empty ones
        outs += [g.fill(g.const([0] * var.ndim, "int64"), 0, var.dtype) for var in extra[:-1]]
        outs.append(g.const([0] * extra[-1].shape[0], "int64"))
    return outs




def _carry_inits(g, positions) -> list[str]:
    """The op's inputs at ``positions`` as a Loop's initial carries; a scalar passes through a
    Reshape to [] first (onnxruntime, with I/O binding, hands a scalar graph input bound straight
    to a Loop carry back with shape [1])."""
    return [g.node("Reshape", [g.ins[p], g.const([], "int64")]) if g.in_vars[p].ndim == 0 else g.ins[p]
            for p in positions]








def _scalar_onnx(g, value: str) -> str:
    return g.node("Reshape", [value, g.const([], "int64")])


def _max_iters_onnx(g, holds: str, done: str) -> str:
    """The loop condition ``holds`` after ``done`` iterations (int64 scalars), guarded by the
    kernel's check: holding after max_iters iterations fails the run (``max_iters_exceeded``)."""
    max_iters = g.attrs["max_iters"]
    over = g.node("And", [holds, g.node("GreaterOrEqual", [done, g.const(max_iters, "int64")])])
    ok = g.check(over, f"the loop's condition still holds after max_iters={max_iters} iterations",
                 lambda: _raise(max_iters_exceeded(g.op, max_iters)))
    return g.node("And", [holds, ok])


def _raise(error: Exception):
    raise error


def _check_stable(op: Op, inits: Sequence, carries: Sequence) -> None:
    for j, (init, new) in enumerate(zip(inits, carries)):
        if tuple(init.shape) != tuple(new.shape):
            raise ExecutionError(f"{op.where()}: loop var {j} ('{op.inputs[j]}') changes shape from "
                                 f"{list(init.shape)} to {list(new.shape)}; declare the sizes that may change "
                                 "with while_loop(..., shape_invariants=...) (-1 for each)")


@defop("Scan", inputs=("n", "init*", "xs*", "consts*"), outputs=("finals*", "ys*"), infer=_scan_rule,
       grad=lambda g: loop_grad(g, LoopView.of_scan(g)), nondiff=(0,))
def _scan(k, count, *arrays):
    """Run ``body`` n times (reversed: i = n-1..0) binding xs[j][i]; the final carries and stacked ys."""
    attrs, run, xp, op = k.attrs, k.run, k.xp, k.op
    n = int(xp.reshape(count, ()))
    c, s = len(attrs["carry_binds"]), len(attrs["x_binds"])
    carries, xs = list(arrays[:c]), arrays[c:c + s]
    consts = dict(zip(op.inputs[1 + c + s:], arrays[c + s:]))
    inputs = (count,) + arrays
    likes = attrs["ys_like"]
    live = live_indices(k, c, attrs["ys"])
    shaped = {j: xp.zeros_like(inputs[likes[j]]) for j in live if likes[j] is not None}
    for out in shaped.values():
        run.meter.hold(out)
    stacked = [j for j in live if likes[j] is None]
    full = full_flags(attrs, attrs["ys"])
    kept = Kept(k, [attrs["ys"][j] for j in stacked], attrs["body"], [full[j] for j in stacked])
    fetch = list(attrs["body_outs"]) + [attrs["ys"][j] for j in live]
    x_shapes = [None if p is None else inputs[p] for p in attrs.get("x_shapes") or [None] * s]
    for i in (range(n - 1, -1, -1) if attrs["reverse"] else range(n)):
        bindings = {**consts, **dict(zip(attrs["carry_binds"], carries)),
                    **{name: _row(x, i, sizes) for name, x, sizes in zip(attrs["x_binds"], xs, x_shapes)}}
        # i indexes the forward's iterations whichever way this Scan runs: its random stream
        values = run.run_block(attrs["body"], bindings, fetch, streams.stream(attrs, i))
        carries, ys = values[:c], dict(zip(live, values[c:]))
        for j, out in shaped.items():
            out[(i,) + tuple(slice(0, d) for d in ys[j].shape)] = ys[j]
        kept.add([ys[j] for j in stacked])
    for out in shaped.values():
        run.meter.release(out)
    computed = dict(zip(stacked, kept.stacks(reverse=attrs["reverse"])))
    if n == 0 and attrs.get("zero_step_shapes"):
        def bindings_of(rows):
            return {**consts, **dict(zip(attrs["carry_binds"], carries)), **dict(zip(attrs["x_binds"], rows))}
        computed.update(_zero_step_stacks(k, stacked, bindings_of=bindings_of, xs=xs))
        carries = _zero_step_arrays(k, carries, bindings_of=bindings_of, xs=xs)
    computed.update(shaped)
    return as_outputs(list(carries) + or_stand_ins(k, c, len(likes), computed))


def _zero_step_stacks(k, stacked: list[int], bindings_of: Callable, xs) -> dict:
    """For a Scan of zero iterations, the empty stacks of the ys whose sizes only a step knows
    (declared -1, e.g. the batch of a row): one step runs on zero rows of the xs' row shapes, and
    each y's stack is ``[0, *its shape]``. Only the Scans ``rg.scan`` builds are marked
    ``zero_step_shapes``: a gradient's Scan body reads the forward's stacks, which have no rows to
    run it on. Where that step fails, an ExecutionError names the scan and the y rather than an
    empty stack of a wrong shape."""
    attrs, xp = k.attrs, k.xp
    body = attrs["body"]
    unknown = [j for j in stacked if any(d < 0 for d in body.var(attrs["ys"][j]).shape)]
    if not unknown:
        return {}
    rows = [xp.zeros(tuple(x.shape[1:]), dtype=x.dtype) for x in xs]
    names = [attrs["ys"][j] for j in unknown]
    try:
        values = k.run.run_block(body, bindings_of(rows), names, streams.stream(attrs, 0))
    except ExecutionError as exc:
        raise ExecutionError(f"{k.op.where()}: zero iterations, and the run-time shape of "
                             f"{', '.join(repr(n) for n in names)} (declared with -1) comes only from a "
                             f"step, which failed on zero rows: {type(exc).__name__}: {exc}") from exc
    return {j: xp.zeros((0,) + tuple(v.shape), dtype=v.dtype) for j, v in zip(unknown, values)}


def _zero_step_arrays(k, carries: list, bindings_of: Callable, xs) -> list:
    """For a Scan of zero iterations, its carried TensorArrays that are still empty and were
    declared with -1 element sizes (``array_carries``): ``[0, *element shape]`` of one step run on
    zero rows, the element a step would write (without it the -1 sizes would stack as 0). Where
    that step fails, an ExecutionError names the scan and the TensorArray."""
    attrs, xp = k.attrs, k.xp
    empty = [j for j in attrs.get("array_carries") or [] if carries[j].shape[0] == 0]
    if not empty:
        return carries
    rows = [xp.zeros(tuple(x.shape[1:]), dtype=x.dtype) for x in xs]
    names = [attrs["body_outs"][j] for j in empty]
    try:
        values = k.run.run_block(attrs["body"], bindings_of(rows), names, streams.stream(attrs, 0))
    except ExecutionError as exc:
        arrays = ", ".join(repr(k.op.inputs[1 + j]) for j in empty)
        raise ExecutionError(f"{k.op.where()}: zero iterations, and the element shape of the empty "
                             f"TensorArray {arrays} (declared with -1) comes only from a step's write, "
                             f"which failed on zero rows: {type(exc).__name__}: {exc}") from exc
    out = list(carries)
    for j, v in zip(empty, values):
        out[j] = xp.zeros((0,) + tuple(v.shape[1:]), dtype=carries[j].dtype)
    return out


def _row(stack, i: int, sizes):
    """Row ``i`` of a stack; cut to ``sizes[i]`` when the rows were zero-padded (ragged loops)."""
    if sizes is None:
        return stack[i, ...]
    return stack[(i,) + tuple(slice(0, int(d)) for d in sizes[i])]


@lowers("Scan")
def _scan_onnx(g):
    """A Loop of n iterations binding xs[j][i] (i = n-1-iteration when reversed); stacks come
    out in loop order, so a reversed Scan flips them back to index order."""
    a = g.attrs
    c, s = len(a["carry_binds"]), len(a["x_binds"])
    count = _scalar_onnx(g, g.cast(g.ins[0], "int64"))
    body = g.child()
    i = body.input("iter", "int64", [])
    cond = body.input("cond", "bool", [])
    carries = [body.input(name, var.dtype, None) for name, var in zip(a["carry_binds"], g.out_vars[:c])]
    index = body.node("Sub", [body.node("Sub", [count, body.const(1, "int64")]), i]) if a["reverse"] else i
    body.stream(index)
    slices = [body.node("Gather", [x, index], axis=0) for x in g.ins[1 + c:1 + c + s]]
    for j, position in enumerate(a.get("x_shapes") or []):
        if position is not None and g.in_vars[1 + c + j].ndim > 1:  # a ragged loop's padded stack: cut
            # row i to its own shape (a scalar has none to cut)
            sizes = body.node("Gather", [g.ins[position], index], axis=0)
            slices[j] = body.node("Slice", [slices[j], body.node("Mul", [sizes, body.const(0, "int64")]), sizes])
    binds = {**dict(zip(a["carry_binds"], carries)), **dict(zip(a["x_binds"], slices))}
    values = body.lower(a["body"], binds, list(a["body_outs"]) + list(a["ys"]))
    rows = [bind for bind, position in zip(a["x_binds"], a.get("x_shapes") or []) if position is not None]
    kept = RaggedStacks(g, a["body"], a["ys"], rows + (list(a["carry_binds"]) if a.get("ragged") else []))
    outputs = ([(cond, "bool", [])] + list(zip(values[:c], g.out_vars[:c])) + kept.carry(body, values[c:])
               + kept.scanned([(value, a["body"].var(name)) for value, name in zip(values[c:], a["ys"])]))
    outs = g.nodes("Loop", [count, "", *_carry_inits(g, range(1, 1 + c)), *kept.starts], len(outputs) - 1,
                   body=body.finish(f"{g.op.outputs[0] if g.op.outputs else 'scan'}.body", outputs))
    stacks = kept.stacks(g, outs[c:c + kept.width], outs[c + kept.width:])
    if a["reverse"]:
        stacks = [g.node("Slice", [v, g.const([-1], "int64"), g.const([-(1 << 62)], "int64"),
                                   g.const([0], "int64"), g.const([-1], "int64")]) for v in stacks]
    for j, like in enumerate(a["ys_like"]):
        if like is not None:     # shaped like that input: the stack zero-padded to its run-time shape
            rank = g.in_vars[like].ndim
            tail = g.node("Sub", [g.shape(g.ins[like]), g.shape(stacks[j])])
            stacks[j] = g.node("Pad", [stacks[j], g.node("Concat", [g.const([0] * rank, "int64"), tail], axis=0)])
    return _zero_step_arrays_onnx(g, count, outs[:c]) + _zero_step_stacks_onnx(g, count, stacks)


def _zero_step_arrays_onnx(g, count: str, finals: list[str]) -> list[str]:
    """The kernel's ``_zero_step_arrays``: behind an If on zero iterations, each carried
    TensorArray of ``array_carries`` is its initial value reshaped to ``[its rows, *the element
    shape of one step run on zero rows]`` (the same value when it has rows: a write keeps them)."""
    a = g.attrs
    arrays = a.get("array_carries") or []
    if not arrays or not a.get("zero_step_shapes"):
        return finals
    c = len(a["carry_binds"])
    step, rows = _zero_row_step(g)
    inits = _carry_inits(g, range(1, 1 + c))
    values = step.lower(a["body"], {**dict(zip(a["carry_binds"], inits)), **dict(zip(a["x_binds"], rows))},
                        [a["body_outs"][j] for j in arrays])
    shaped, types = [], []
    for j, value in zip(arrays, values):
        shape = step.node("Concat", [step.node("Shape", [inits[j]], end=1), step.node("Shape", [value], start=1)],
                          axis=0)
        shaped.append(step.node("Reshape", [inits[j], shape], allowzero=1))
        types.append((g.out_vars[j].dtype, [None] * g.out_vars[j].ndim))
    chosen = _on_zero_steps(g, count, step, f"{g.op.outputs[arrays[0]]}.zero_steps", shaped,
                            [finals[j] for j in arrays], types)
    out = list(finals)
    for j, value in zip(arrays, chosen):
        out[j] = value
    return out


def _zero_step_stacks_onnx(g, count: str, stacks: list[str]) -> list[str]:
    """The kernel's ``_zero_step_stacks``: behind an If on zero iterations, the stacks of the ys
    whose sizes only a step knows are ``[0, *shape]`` of one step run on zero rows (a Loop of no
    iterations would give 0 for those sizes)."""
    a = g.attrs
    c = len(a["carry_binds"])
    unknown = [j for j, like in enumerate(a["ys_like"])
               if like is None and any(d < 0 for d in a["body"].var(a["ys"][j]).shape)]
    if not unknown or not a.get("zero_step_shapes"):
        return stacks
    step, rows = _zero_row_step(g)
    binds = {**dict(zip(a["carry_binds"], _carry_inits(g, range(1, 1 + c)))), **dict(zip(a["x_binds"], rows))}
    values = step.lower(a["body"], binds, [a["ys"][j] for j in unknown])
    empties, types = [], []
    for j, value in zip(unknown, values):
        empties.append(step.node("Slice", [step.node("Unsqueeze", [value, step.const([0], "int64")]),
                                           step.const([0], "int64"), step.const([0], "int64"),
                                           step.const([0], "int64")]))
        types.append((g.out_vars[c + j].dtype, [None] * g.out_vars[c + j].ndim))
    chosen = _on_zero_steps(g, count, step, f"{g.op.outputs[c + unknown[0]]}.zero_steps", empties,
                            [stacks[j] for j in unknown], types)
    out = list(stacks)
    for j, value in zip(unknown, chosen):
        out[j] = value
    return out


def _zero_row_step(g) -> tuple:
    """A sub-graph for one step of the loop's body run on zero rows of each ``xs``: (it, the rows)."""
    c, s = len(g.attrs["carry_binds"]), len(g.attrs["x_binds"])
    step = g.child()
    step.stream(step.const(0, "int64"))
    rows = [step.fill(step.node("Shape", [x], start=1), 0, var.dtype)
            for x, var in zip(g.ins[1 + c:1 + c + s], g.in_vars[1 + c:1 + c + s])]
    return step, rows


def _on_zero_steps(g, count: str, step, name: str, computed: list[str], finals: list[str], types: list) -> list:
    """An If on ``count == 0``: ``computed`` (values of ``step``) then, ``finals`` (the loop's) else."""
    kept = g.child()
    passed = [kept.node("Identity", [v]) for v in finals]
    return g.nodes("If", [g.node("Equal", [count, g.const(0, "int64")])], len(computed),
                   then_branch=step.finish(name, [(v, *t) for v, t in zip(computed, types)]),
                   else_branch=kept.finish(f"{name}.else", [(v, *t) for v, t in zip(passed, types)]))


def _invariant_vars(block: Block, inits: list[Var], shape_invariants) -> list[Var]:
    """Stand-ins typed as the loop vars inside the loop: ``inits``, or their shape invariants."""
    if shape_invariants is None:
        return inits
    if not isinstance(shape_invariants, (list, tuple)) or len(shape_invariants) != len(inits):
        raise ProgramError(f"While in block {block.idx}: shape_invariants must be a list with one shape per "
                           f"loop var ({len(inits)}), got {shape_invariants!r}")
    declared = []
    for j, (init, shape) in enumerate(zip(inits, shape_invariants)):
        if shape is None:
            shape = init.shape
        if not isinstance(shape, (list, tuple)) or len(shape) != init.ndim or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape) \
                or not shapes_compatible(init.shape, shape):
            raise ProgramError(f"While in block {block.idx}: shape invariant {shape!r} of loop var {j} "
                               f"('{init.name}' {init.type_str()}) must be a list of {init.ndim} sizes "
                               "(-1 where it may change) that the initial value has")
        declared.append(Var(block, init.name, tuple(shape), init.dtype))
    return declared


def _loop_vars(loop_vars) -> tuple[list[Var], type | None]:
    if isinstance(loop_vars, Var):
        return [loop_vars], None
    if isinstance(loop_vars, (list, tuple)) and loop_vars and all(isinstance(v, Var) for v in loop_vars):
        return list(loop_vars), type(loop_vars)
    raise ProgramError(f"while_loop: loop_vars must be a Var or a non-empty list/tuple of Vars, got "
                       f"{loop_vars!r}")


def _check_body(block: Block, inits: list[Var], new: list[Var]) -> None:
    where = f"While in block {block.idx}"
    if len(new) != len(inits):
        raise ProgramError(f"{where}: body_fn returns {len(new)} values ({names_of(new)}) for "
                           f"{len(inits)} loop vars ({names_of(inits)})")
    for j, (init, var) in enumerate(zip(inits, new)):
        if var.dtype != init.dtype:
            raise ProgramError(f"{where}: body_fn changes loop var {j} ('{init.name}') from {init.dtype} to "
                               f"{var.dtype} ('{var.name}'); cast it back with rg.cast")
        if not shapes_compatible(init.shape, var.shape):
            raise ProgramError(f"{where}: body_fn makes loop var {j} ('{init.name}' {init.type_str()}) into "
                               f"'{var.name}' {var.type_str()}; loop vars keep their shape (-1 matches any size)")


def while_loop(cond_fn: Callable[..., Var], body_fn: Callable[..., Var | Sequence[Var]], loop_vars,
               max_iters: int | None = None, recompute: int | None = None, shape_invariants=None):
    """Repeat ``vars = body_fn(*vars)`` while ``cond_fn(*vars)`` holds: a ``While`` op.

    ``cond_fn`` returns a scalar bool Var, ``body_fn`` the new loop vars (same
    count and dtypes, shapes equal up to -1). Both are called once, to build
    their blocks, and may read any variable of the enclosing blocks. The trip
    count is decided at run time. Reverse-differentiable, to any order:
    gradients reach the initial loop vars and every outer variable the body
    reads, summed over iterations; only what each iteration's backward reads is
    kept, and nothing when no gradient is built.

    Args:
        cond_fn: ``cond_fn(*vars) -> scalar bool Var``.
        body_fn: ``body_fn(*vars) -> new vars`` (a Var, or a list/tuple of Vars).
        loop_vars: A Var or a list/tuple of Vars (``TensorArray`` included): the initial values.
        max_iters: None or an int bounding the trip count (ExecutionError beyond).
        recompute: None, or a byte budget for what is kept for the backward:
            loop vars at checkpoints, the rest recomputed in the backward
            (``retrograd/memory/while_budget.py``).
        shape_invariants: One shape per loop var, -1 where the size may change
            from one iteration to the next (as TensorFlow's); lets loop vars
            change shape, e.g. grow by ``rg.concat`` (decoding outputs of
            unknown length); gradients flow through them too.

    Returns:
        The final loop vars, in the form of ``loop_vars`` (a Var or a list/tuple).

    Raises:
        ProgramError: A loop var the block cannot see, a bad ``max_iters`` or
            ``recompute``, or a body whose results do not match the loop vars.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x0 = rg.data("x", [2], dtype="float64", stop_gradient=False)
            n = rg.data("n", [], dtype="int64")        # the trip count, fed at run time
            i, x = rg.while_loop(lambda i, x: i < n, lambda i, x: (i + 1, x * 2.0), [rg.constant(0), x0])
            (dx0,) = rg.gradients(rg.sum(x), x0)       # 2 ** n
        feed = {"x": np.array([1.0, 3.0]), "n": np.array(3)}
        iv, xv, dv = rg.Executor().run(main, feed=feed, fetch_list=[i, x, dx0])
        assert iv == 3 and xv.tolist() == [8.0, 24.0] and dv.tolist() == [8.0, 8.0]
        ```
    """
    block = current_block()
    inits, kind = _loop_vars(loop_vars)
    for j, var in enumerate(inits):
        if not block.sees(var):
            raise ProgramError(f"While in block {block.idx}: loop var {j} '{var.name}' belongs to "
                               f"{block.home_of(var)}, which block {block.idx} cannot see")
    if max_iters is not None and (isinstance(max_iters, bool) or not isinstance(max_iters, int) or max_iters < 0):
        raise ProgramError(f"While in block {block.idx}: max_iters must be None or an int >= 0, got {max_iters!r}")
    if recompute is not None and not (_budgeted({"recompute": recompute}) and recompute >= 0):
        raise ProgramError(f"While in block {block.idx}: recompute must be None or a byte budget (an int "
                           f">= 0), got {recompute!r}")
    program = block.program
    shape_invariants = _array_invariants(inits, shape_invariants)
    declared = _invariant_vars(block, inits, shape_invariants)
    cond_block = program.create_block(block)
    cond_vars = _as_arrays(inits, [bound_var(cond_block, f"{v.name}.cur", v) for v in declared])
    with block_guard(cond_block):
        flag = cond_fn(*cond_vars)
    check_predicate(flag, "While", "cond_fn's result", cond_block)
    body = program.create_block(block)
    body_vars = _as_arrays(inits, [bound_var(body, f"{v.name}.cur", v) for v in declared])
    with block_guard(body):
        new = body_fn(*body_vars)
    new_vars, _ = as_vars(new, f"While in block {block.idx}: body_fn", body)
    _check_body(block, declared, new_vars)
    reads = unique(outer_reads(cond_block, [flag.name]) + outer_reads(body, [v.name for v in new_vars]))
    attrs = {"cond": cond_block, "cond_binds": [v.name for v in cond_vars], "cond_out": flag.name,
             "body": body, "carry_binds": [v.name for v in body_vars], "body_outs": [v.name for v in new_vars],
             "ys": [], "ys_full": [], "max_iters": max_iters}
    if recompute is not None:   # keep at most this many bytes for the backward (memory/while_budget.py)
        attrs["recompute"] = int(recompute)
    if shape_invariants is not None:     # loop vars may change shape: the backward keeps each one's shape
        attrs["ragged"] = True
    arrays = [j for j, v in enumerate(inits) if isinstance(v, TensorArray) and any(d < 0 for d in v.shape[1:])]
    if arrays:      # sizes an unwritten array takes from the inputs' shapes (empty_arrays.py)
        attrs["array_carries"] = arrays
    attrs.update(streams.stream_attrs(cond_block, body))   # a loop key when the loop draws random numbers
    outs = append_op("While", inits + [block.var(n) for n in reads], attrs, name="while")
    finals = _as_arrays(inits, outs[:len(inits)])
    return finals[0] if kind is None else kind(finals)


def _array_invariants(inits: list[Var], shape_invariants):
    """The shape invariants with ``[-1, *element_shape]`` for each TensorArray loop var (its size
    changes as it is written) where none is given; unchanged without TensorArrays."""
    if not any(isinstance(v, TensorArray) for v in inits):
        return shape_invariants
    given = [None] * len(inits) if shape_invariants is None else list(shape_invariants)
    if len(given) != len(inits):
        return shape_invariants        # _invariant_vars says what is wrong
    return [[-1] + list(v.shape[1:]) if isinstance(v, TensorArray) and shape is None else shape
            for v, shape in zip(inits, given)]


def _as_arrays(inits: list[Var], vars_: list[Var]) -> list[Var]:
    """``vars_`` with those at the positions of TensorArray loop vars seen as TensorArrays."""
    return [TensorArray.of(v, init.element_shape) if isinstance(init, TensorArray) else v
            for init, v in zip(inits, vars_)]
