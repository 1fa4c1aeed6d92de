"""Control flow that differentiates: ``cond`` (If), ``while_loop`` (While), ``do`` (Do).

Every sub-block is a child of the block holding its op and reads the values
of enclosing blocks by name (closures); each op also lists every outer value
its sub-blocks read as an input, so liveness, autodiff and the printer see
them. Values an op binds under another name (loop variables, ``do`` inputs,
values saved for a backward) are declared in the sub-block and written by no
op there ("bound" in the printed program). Layouts::

    If(pred, operands...; blocks=[then, else], binds, outs)  -> outs...
    Do(operands...;       blocks=[body],       binds, outs)  -> outs...
        runs blocks[b] (If: b = 0 when pred holds, else 1) with operand j
        bound to the name binds[b][j] (None: not bound there). Output i is
        outs[b][i]: a name in the block, an int j (zeros shaped like operand
        j: a gradient the branch that ran does not produce) or None (an empty
        array: a value saved for the backward of the other branch).
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

Gradients are the same kind of op over a derived block (the backward of the
sub-block, built by ``autodiff.build_backward``): the gradient of If is an If
over the branches' backward blocks, of Do a Do, of While a reversed Scan over
the body's backward, of Scan a Scan the other way. The gradient maker decides
which forward values the backward block reads and rewrites the forward op to
output them (per iteration, for loops): nothing is kept unless a gradient is
built, and then only what the backward reads.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from .. import backend
from ..errors import ExecutionError, ProgramError, ShapeError
from ..ir.analysis import free_reads
from ..ir.builder import block_guard, capture_ops, current_block
from ..ir.dtypes import is_float
from ..ir.program import Block, Op, Var
from .creation import zeros_like
from .math import add, add_n
from . import streams
from .registry import GradCtx, append_op, defop, get_op_def


# --- Sub-block helpers ----------------------------------------------------------------------

def _outer_reads(block: Block, extra: Sequence[str] = ()) -> list[str]:
    """Names ``block`` (or a block nested in it) reads from enclosing blocks, plus ``extra``
    names it returns without computing them; first-read order, no repeats."""
    names = [n for n in free_reads(block) if n not in block.vars]
    names += [n for n in extra if n not in block.vars]
    return list(dict.fromkeys(names))


@contextmanager
def _into(block: Block) -> Iterator[None]:
    """Build ops straight into ``block``, even inside a gradient maker's capture."""
    with block_guard(block), capture_ops() as ops:
        yield
    for op in ops:
        op.block.append_op(op)


def _bound_var(block: Block, hint: str, like: Var) -> Var:
    """A variable of ``block`` that its op binds (no op of the block writes it)."""
    return block.create_var(block.program.unique_name(hint), like.shape, like.dtype)


def _merge_shapes(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    return tuple(x if x == y else -1 for x, y in zip(a, b))


def _compatible(a: Sequence[int], b: Sequence[int]) -> bool:
    return len(a) == len(b) and all(x < 0 or y < 0 or x == y for x, y in zip(a, b))


def _unique(names) -> list[str]:
    return list(dict.fromkeys(names))


# --- Run time --------------------------------------------------------------------------------

def _truth(xp, pred) -> bool:
    return bool(xp.reshape(pred, ()))


def _empty(xp, var: Var):
    """A stand-in with no elements for a value the branch that ran did not compute."""
    return xp.zeros(tuple(0 for _ in var.shape), dtype=backend.dtype_of(xp, var.dtype))


class _Kept:
    """Per-iteration values kept for a backward, held in the run's memory meter until stacked.

    Of a value whose backward reads only its shape (``full`` False) only the
    shape is kept; its stack is a zero-stride stand-in of the right shape.
    """

    def __init__(self, k, names: Sequence[str], block: Block, full: Sequence[bool]):
        self.k = k
        self.names = list(names)
        self.block = block
        self.full = list(full)
        self.values: list[list] = [[] for _ in self.names]

    def add(self, values: Sequence) -> None:
        for kept, value, full in zip(self.values, values, self.full):
            if full:
                self.k.run.meter.hold(value)
                kept.append(value)
            else:
                kept.append(_ShapeOf(tuple(value.shape), value.dtype))

    def stacks(self, reverse: bool = False) -> list:
        """One [iterations, ...] array per name, in iteration order.

        Values whose shape changes over iterations (the stacks of an inner loop
        with a varying trip count, or the empty stand-in of a branch that did
        not run) are zero-padded to the largest; their readers only look at the
        part that was written. Each value is released as it is copied, so the
        meter never counts a value and its copy at once (``empty`` pages are
        only committed as rows are written).
        """
        return [self._stack(name, values[::-1] if reverse else values)
                for name, values in zip(self.names, self.values)]

    def _stack(self, name: str, values: list):
        xp, meter = self.k.xp, self.k.run.meter
        if not values:
            var = self.block.var(name)
            return xp.zeros((0,) + tuple(max(d, 0) for d in var.shape),
                            dtype=backend.dtype_of(xp, var.dtype))
        shape = tuple(values[0].shape)
        padded = False
        for value in values[1:]:
            if tuple(value.shape) != shape:
                if len(value.shape) != len(shape):
                    raise ExecutionError(f"{self.k.op.where()}: '{name}' changes rank across iterations "
                                         f"({list(shape)} then {list(value.shape)}); the backward keeps it "
                                         "per iteration and needs one rank")
                shape = tuple(max(a, b) for a, b in zip(shape, value.shape))
                padded = True
        if isinstance(values[0], _ShapeOf):
            return xp.broadcast_to(xp.zeros((), dtype=values[0].dtype), (len(values),) + shape)
        make = xp.zeros if padded else xp.empty
        out = make((len(values),) + shape, dtype=values[0].dtype)
        for i, value in enumerate(values):
            out[(i,) + tuple(slice(0, d) for d in value.shape)] = value
            meter.release(value)
            values[i] = None
        return out


@dataclass(frozen=True)
class _ShapeOf:
    """What is kept of a value read only for its shape."""
    shape: tuple
    dtype: object


def _full_flags(attrs: dict, names: Sequence[str]) -> list[bool]:
    flags = attrs.get("ys_full")
    return [True] * len(names) if flags is None else list(flags)


def _check_bound(block: Block, names: Sequence[str | None], what: str) -> None:
    """The names an op binds in ``block`` are variables the block sees (the verifier's view)."""
    for name in names:
        if name is not None and block.find_var(name) is None:
            raise ShapeError(f"{what} '{name}' is not a variable of block {block.idx}")


def _outputs(values: Sequence):
    return values[0] if len(values) == 1 else tuple(values)


# --- If and Do: run one block with explicit bindings ---------------------------------------------

def _run_call(k, b: int, operands: Sequence):
    attrs, op = k.attrs, k.op
    bindings = {name: value for name, value in zip(attrs["binds"][b], operands) if name is not None}
    specs = attrs["outs"][b]
    fetched = iter(k.run.run_block(attrs["blocks"][b], bindings, [s for s in specs if isinstance(s, str)]))
    results = []
    for name, spec in zip(op.outputs, specs):
        if isinstance(spec, str):
            results.append(next(fetched))
        elif spec is None:
            results.append(_empty(k.xp, op.block.var(name)))
        else:
            results.append(k.xp.zeros_like(operands[spec]))
    return _outputs(results)


def _call_rule(operands: Sequence[Var], attrs: dict) -> list:
    """Each output's type from the blocks producing it: dtypes agree, shapes merge (-1 where they differ)."""
    blocks, outs = attrs["blocks"], attrs["outs"]
    if len(blocks) != len(outs) or len(blocks) != len(attrs["binds"]):
        raise ShapeError(f"{len(blocks)} blocks but {len(attrs['binds'])} binds and {len(outs)} outs lists")
    count = len(outs[0])
    for block, binds in zip(blocks, attrs["binds"]):
        if len(binds) != len(operands):
            raise ShapeError(f"block {block.idx} binds {len(binds)} names for {len(operands)} operands")
        _check_bound(block, binds, "bound name")
    specs = []
    for i in range(count):
        found = []
        for block, block_outs in zip(blocks, outs):
            if len(block_outs) != count:
                raise ShapeError(f"block {block.idx} lists {len(block_outs)} outputs, block "
                                 f"{blocks[0].idx} lists {count}")
            spec = block_outs[i]
            if isinstance(spec, str):
                var = block.find_var(spec)
                if var is None:
                    raise ShapeError(f"output {i}: block {block.idx} has no variable '{spec}'")
                found.append(var)
            elif spec is not None:
                found.append(operands[spec])
        if not found:
            raise ShapeError(f"output {i} is produced by none of the blocks")
        shape, dtype = found[0].shape, found[0].dtype
        for var in found[1:]:
            if var.dtype != dtype or len(var.shape) != len(shape):
                raise ShapeError(f"output {i}: the blocks give {found[0].name}: {found[0].type_str()} and "
                                 f"{var.name}: {var.type_str()}")
            shape = _merge_shapes(shape, var.shape)
        specs.append((shape, dtype))
    return specs


def _check_predicate(pred, op_type: str, role: str, block: Block) -> None:
    if not isinstance(pred, Var):
        raise ProgramError(f"{op_type} in block {block.idx}: {role} must be a bool Var, got "
                           f"{type(pred).__name__} {pred!r}")
    if pred.dtype != "bool" or pred.shape not in ((), (1,)):
        raise ProgramError(f"{op_type} in block {block.idx}: {role} '{pred.name}' must be a scalar bool "
                           f"(shape [] or [1]), got {pred.type_str()}")
    if not block.sees(pred):
        raise ProgramError(f"{op_type} in block {block.idx}: {role} '{pred.name}' belongs to block "
                           f"{pred.block.idx}, which block {block.idx} cannot see")


def _if_rule(ins: list[Var], attrs: dict) -> list:
    pred = ins[0]
    if pred.dtype != "bool" or pred.shape not in ((), (1,)):
        raise ShapeError(f"predicate '{pred.name}' must be a scalar bool, got {pred.type_str()}")
    if len(attrs["blocks"]) != 2:
        raise ShapeError(f"If needs two blocks (then, else), got {len(attrs['blocks'])}")
    return _call_rule(ins[1:], attrs)


def _if_grad(g: GradCtx) -> list:
    return _call_grad(g, first=1)


def _do_grad(g: GradCtx) -> list:
    return _call_grad(g, first=0)


@defop("If", inputs=("pred", "operands*"), outputs=("outs*",), infer=_if_rule, grad=_if_grad, nondiff=(0,))
def _if(k, pred, *operands):
    """Run blocks[0] when ``pred`` holds, else blocks[1]; outputs come from the block that ran."""
    return _run_call(k, 0 if _truth(k.xp, pred) else 1, operands)


@defop("Do", inputs=("operands*",), outputs=("outs*",), infer=lambda ins, attrs: _call_rule(ins, attrs),
       grad=_do_grad)
def _do(k, *operands):
    """Run blocks[0] in a fresh scope, its bound names taking the operands' values."""
    return _run_call(k, 0, operands)


def _as_vars(result, what: str, block: Block) -> tuple[list[Var], bool]:
    """A builder function's result as a list of Vars, and whether it was a single Var."""
    single = isinstance(result, Var)
    if single:
        items = [result]
    elif isinstance(result, (tuple, list)):
        items = list(result)
    else:
        raise ProgramError(f"{what} must return a Var or a tuple of Vars, got {type(result).__name__} "
                           f"{result!r}")
    for i, var in enumerate(items):
        if not isinstance(var, Var):
            raise ProgramError(f"{what} returned {type(var).__name__} {var!r} at position {i}; return "
                               "Vars (rg.constant makes one from a number)")
        if not block.sees(var):
            raise ProgramError(f"{what} returned '{var.name}' of block {var.block.idx}, which block "
                               f"{block.idx} cannot see")
    return items, single


def _names_of(vars_: Sequence[Var]) -> str:
    return ", ".join(f"{v.name}: {v.type_str()}" for v in vars_) or "nothing"


def _check_branches(block: Block, then: list[Var], other: list[Var]) -> None:
    where = f"If in block {block.idx}"
    if len(then) != len(other):
        raise ProgramError(f"{where}: true_fn returns {len(then)} values ({_names_of(then)}) but false_fn "
                           f"returns {len(other)} ({_names_of(other)})")
    for i, (a, b) in enumerate(zip(then, other)):
        if a.dtype != b.dtype or not _compatible(a.shape, b.shape):
            raise ProgramError(f"{where}: output {i} is '{a.name}' {a.type_str()} from true_fn but '{b.name}' "
                               f"{b.type_str()} from false_fn; branches must agree in dtype and shape "
                               "(-1 matches any size)")


def cond(pred: Var, true_fn: Callable[[], Var | tuple], false_fn: Callable[[], Var | tuple]):
    """``true_fn()`` if ``pred`` holds at run time, else ``false_fn()``: an ``If`` op.

    ``pred`` is a scalar bool Var (shape [] or [1]). Each function is called
    once, to build its branch; it may read any variable of the enclosing
    blocks and returns a Var or a tuple of Vars, matching in number, dtype and
    shape. Differentiable: the gradient runs the backward of the branch that
    ran (and is itself differentiable).

    Example::

        y = rg.cond(rg.sum(x) > 0.0, lambda: x * 2.0, lambda: -x)
    """
    block = current_block()
    _check_predicate(pred, "If", "pred", block)
    branches, results, single = [], [], True
    for fn, role in ((true_fn, "true_fn"), (false_fn, "false_fn")):
        sub = block.program.create_block(block)
        with block_guard(sub):
            out = fn()
        vars_, is_single = _as_vars(out, f"If in block {block.idx}: {role}", sub)
        branches.append(sub)
        results.append(vars_)
        single = single and is_single
    _check_branches(block, *results)
    reads = _unique(name for sub, vars_ in zip(branches, results)
                    for name in _outer_reads(sub, [v.name for v in vars_]))
    attrs = {"blocks": branches, "binds": [list(reads), list(reads)],
             "outs": [[v.name for v in vars_] for vars_ in results]}
    outs = append_op("If", [pred] + [block.var(n) for n in reads], attrs, name="cond")
    return outs[0] if single and len(outs) == 1 else tuple(outs)


def do(fn: Callable[..., Var | tuple], *inputs: Var):
    """``fn(*inputs)`` run as a sub-block in a fresh scope: a ``Do`` op.

    ``fn`` receives one new Var per input, bound to that input's value when
    the op runs (explicit bindings between outer and inner names, as in
    Caffe2's Do); it may also read any enclosing variable and returns a Var
    or a tuple of Vars. Differentiable, to any order.

    Example::

        y, z = rg.do(lambda a, b: (rg.tanh(a @ b), a * 2.0), x, w)
    """
    block = current_block()
    for i, var in enumerate(inputs):
        if not isinstance(var, Var) or not block.sees(var):
            raise ProgramError(f"Do in block {block.idx}: input {i} ({var!r}) is not a Var this block sees")
    sub = block.program.create_block(block)
    inner = [_bound_var(sub, f"{v.name}.in", v) for v in inputs]
    with block_guard(sub):
        out = fn(*inner)
    vars_, single = _as_vars(out, f"Do in block {block.idx}: fn", sub)
    reads = _outer_reads(sub, [v.name for v in vars_])
    attrs = {"blocks": [sub], "binds": [[v.name for v in inner] + reads], "outs": [[v.name for v in vars_]]}
    outs = append_op("Do", list(inputs) + [block.var(n) for n in reads], attrs, name="do")
    return outs[0] if single and len(outs) == 1 else tuple(outs)


# --- While and Scan: loops over carried values ---------------------------------------------------

def _carry_specs(inits: Sequence[Var], body: Block, body_outs: Sequence[str]) -> list:
    specs = []
    for j, (init, name) in enumerate(zip(inits, body_outs)):
        new = body.find_var(name)
        if new is None:
            raise ShapeError(f"loop var {j}: block {body.idx} has no variable '{name}'")
        if new.dtype != init.dtype or not _compatible(init.shape, new.shape):
            raise ShapeError(f"loop var {j} is '{init.name}' {init.type_str()} but the body makes '{name}' "
                             f"{new.type_str()}")
        specs.append((_merge_shapes(init.shape, new.shape), init.dtype))
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
    _check_bound(attrs["cond"], attrs["cond_binds"], "loop var")
    _check_bound(attrs["body"], attrs["carry_binds"], "loop var")
    specs = (_carry_specs(ins[:n], attrs["body"], attrs["body_outs"]) + [((), "int64")]
             + [_stack_spec(attrs["body"], name) for name in attrs["ys"]])
    if attrs.get("budget_outputs"):  # recompute=<bytes>: checkpoints and schedule (memory/while_budget.py)
        from ..memory.while_budget import output_specs
        specs += output_specs(ins[:n], attrs)
    return specs


def _scan_rule(ins: list[Var], attrs: dict) -> list:
    c, s = len(attrs["carry_binds"]), len(attrs["x_binds"])
    if ins[0].dtype not in ("int64", "int32") or ins[0].shape not in ((), (1,)):
        raise ShapeError(f"the trip count '{ins[0].name}' must be an integer scalar, got {ins[0].type_str()}")
    if len(ins) < 1 + c + s or len(attrs["ys_like"]) != len(attrs["ys"]):
        raise ShapeError(f"{c} carries and {s} sliced inputs need at least {1 + c + s} inputs, got {len(ins)}")
    _check_bound(attrs["body"], list(attrs["carry_binds"]) + list(attrs["x_binds"]), "bound name")
    specs = _carry_specs(ins[1:1 + c], attrs["body"], attrs["body_outs"])
    for name, like in zip(attrs["ys"], attrs["ys_like"]):
        specs.append(_stack_spec(attrs["body"], name) if like is None else (ins[like].shape, ins[like].dtype))
    return specs


def _while_grad(g: GradCtx) -> list:
    if _budgeted(g.attrs):   # recompute=<bytes>: memory/while_budget.py swaps the Scan for its own op
        from ..memory.while_budget import grad_maker
        return grad_maker(g, lambda g: _loop_grad(g, _LoopView.of_while(g)))
    return _loop_grad(g, _LoopView.of_while(g))


def _budgeted(attrs: dict) -> bool:
    return isinstance(attrs.get("recompute"), int) and not isinstance(attrs.get("recompute"), bool)


@defop("While", inputs=("init*", "consts*"), outputs=("finals*", "iters", "ys*"), infer=_while_rule,
       grad=_while_grad)
def _while(k, *arrays):
    """Run ``body`` while ``cond`` holds; the final loop vars, the trip count, the kept values."""
    attrs, run, xp, op = k.attrs, k.run, k.xp, k.op
    if _budgeted(attrs):     # recompute=<bytes>: checkpoints instead of kept values (memory/while_budget.py)
        from ..memory.while_budget import forward_kernel
        return forward_kernel(k, *arrays, truth=_truth, check_stable=_check_stable)
    n = len(attrs["carry_binds"])
    carries, consts = list(arrays[:n]), dict(zip(op.inputs[n:], arrays[n:]))
    ys, full = attrs["ys"], _full_flags(attrs, attrs["ys"])
    live = _live(k, n + 1, ys)      # kept values this plan reads (not when only the forward runs)
    kept = _Kept(k, [ys[j] for j in live], attrs["body"], [full[j] for j in live])
    fetch = list(attrs["body_outs"]) + kept.names
    max_iters = attrs.get("max_iters")
    iters = 0
    while True:
        stream = streams.stream(attrs, iters)
        flag, = run.run_block(attrs["cond"], {**consts, **dict(zip(attrs["cond_binds"], carries))},
                              [attrs["cond_out"]], stream)
        if not _truth(xp, flag):
            break
        if max_iters is not None and iters >= max_iters:
            raise ExecutionError(f"{op.where()}: the loop ran {iters} iterations and its condition still "
                                 f"holds, exceeding max_iters={max_iters}")
        values = run.run_block(attrs["body"], {**consts, **dict(zip(attrs["carry_binds"], carries))}, fetch,
                               stream)
        if ys:
            _check_stable(op, arrays[:n], values[:n])
        carries = values[:n]
        kept.add(values[n:])
        iters += 1
    stacks = _or_stand_ins(k, n + 1, len(ys), dict(zip(live, kept.stacks())))
    return tuple(carries) + (xp.asarray(iters, dtype=backend.dtype_of(xp, "int64")),) + tuple(stacks)


def _live(k, first: int, names: Sequence[str]) -> list[int]:
    """Indices j of ``names`` whose outputs (op output ``first + j``) the running plan reads."""
    return [j for j in range(len(names)) if first + j in k.live_outputs]


def _or_stand_ins(k, first: int, count: int, computed: dict) -> list:
    """Outputs ``first .. first+count-1``: the ``computed`` ones by index, for the rest (which
    nothing reads in this plan) an empty stand-in of the right rank and dtype."""
    return [computed[j] if j in computed else _empty(k.xp, k.op.block.var(k.op.outputs[first + j]))
            for j in range(count)]


def _check_stable(op: Op, inits: Sequence, carries: Sequence) -> None:
    for j, (init, new) in enumerate(zip(inits, carries)):
        if tuple(init.shape) != tuple(new.shape):
            raise ExecutionError(f"{op.where()}: loop var {j} ('{op.inputs[j]}') changes shape from "
                                 f"{list(init.shape)} to {list(new.shape)}; gradients through a loop need "
                                 "loop vars that keep their shape")


@defop("Scan", inputs=("n", "init*", "xs*", "consts*"), outputs=("finals*", "ys*"), infer=_scan_rule,
       grad=lambda g: _loop_grad(g, _LoopView.of_scan(g)), nondiff=(0,))
def _scan(k, count, *arrays):
    """Run ``body`` n times (reversed: i = n-1..0) binding xs[j][i]; the final carries and stacked ys."""
    attrs, run, xp, op = k.attrs, k.run, k.xp, k.op
    n = int(xp.reshape(count, ()))
    c, s = len(attrs["carry_binds"]), len(attrs["x_binds"])
    carries, xs = list(arrays[:c]), arrays[c:c + s]
    consts = dict(zip(op.inputs[1 + c + s:], arrays[c + s:]))
    inputs = (count,) + arrays
    likes = attrs["ys_like"]
    live = _live(k, c, attrs["ys"])
    shaped = {j: xp.zeros_like(inputs[likes[j]]) for j in live if likes[j] is not None}
    for out in shaped.values():
        run.meter.hold(out)
    stacked = [j for j in live if likes[j] is None]
    full = _full_flags(attrs, attrs["ys"])
    kept = _Kept(k, [attrs["ys"][j] for j in stacked], attrs["body"], [full[j] for j in stacked])
    fetch = list(attrs["body_outs"]) + [attrs["ys"][j] for j in live]
    for i in (range(n - 1, -1, -1) if attrs["reverse"] else range(n)):
        bindings = {**consts, **dict(zip(attrs["carry_binds"], carries)),
                    **{name: x[i, ...] for name, x in zip(attrs["x_binds"], xs)}}
        # i indexes the forward's iterations whichever way this Scan runs: its random stream
        values = run.run_block(attrs["body"], bindings, fetch, streams.stream(attrs, i))
        carries, ys = values[:c], dict(zip(live, values[c:]))
        for j, out in shaped.items():
            out[(i,) + tuple(slice(0, d) for d in ys[j].shape)] = ys[j]
        kept.add([ys[j] for j in stacked])
    for out in shaped.values():
        run.meter.release(out)
    computed = dict(zip(stacked, kept.stacks(reverse=attrs["reverse"])))
    computed.update(shaped)
    return _outputs(list(carries) + _or_stand_ins(k, c, len(likes), computed))


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
        raise ProgramError(f"{where}: body_fn returns {len(new)} values ({_names_of(new)}) for "
                           f"{len(inits)} loop vars ({_names_of(inits)})")
    for j, (init, var) in enumerate(zip(inits, new)):
        if var.dtype != init.dtype:
            raise ProgramError(f"{where}: body_fn changes loop var {j} ('{init.name}') from {init.dtype} to "
                               f"{var.dtype} ('{var.name}'); cast it back with rg.cast")
        if not _compatible(init.shape, var.shape):
            raise ProgramError(f"{where}: body_fn makes loop var {j} ('{init.name}' {init.type_str()}) into "
                               f"'{var.name}' {var.type_str()}; loop vars keep their shape (-1 matches any size)")


def while_loop(cond_fn: Callable[..., Var], body_fn: Callable[..., Var | Sequence[Var]], loop_vars,
               max_iters: int | None = None, recompute: int | None = None):
    """Repeat ``vars = body_fn(*vars)`` while ``cond_fn(*vars)`` holds: a ``While`` op.

    ``loop_vars`` is a Var or a list/tuple of Vars; the result has the same
    form and holds the final values. ``cond_fn`` returns a scalar bool Var,
    ``body_fn`` the new loop vars (same count and dtypes, shapes equal up to
    -1). Both are called once, to build their blocks, and may read any
    variable of the enclosing blocks. The trip count is decided at run time;
    ``max_iters`` bounds it (ExecutionError beyond). Reverse-differentiable,
    to any order: gradients reach the initial loop vars and every outer
    variable the body reads, summed over iterations; only what each
    iteration's backward reads is kept, and nothing when no gradient is built.
    ``recompute=<bytes>`` bounds what is kept: loop vars at checkpoints, the
    rest recomputed in the backward (``retrograd/memory/while_budget.py``).

    Example::

        x0 = rg.data("x", [4], dtype="float64")
        n = rg.data("n", [], dtype="int64")             # the trip count, fed at run time
        i, x = rg.while_loop(lambda i, x: i < n, lambda i, x: (i + 1, rg.tanh(x * w)), [rg.constant(0), x0])
    """
    block = current_block()
    inits, kind = _loop_vars(loop_vars)
    for j, var in enumerate(inits):
        if not block.sees(var):
            raise ProgramError(f"While in block {block.idx}: loop var {j} '{var.name}' belongs to block "
                               f"{var.block.idx}, which block {block.idx} cannot see")
    if max_iters is not None and (isinstance(max_iters, bool) or not isinstance(max_iters, int) or max_iters < 0):
        raise ProgramError(f"While in block {block.idx}: max_iters must be None or an int >= 0, got {max_iters!r}")
    if recompute is not None and not (_budgeted({"recompute": recompute}) and recompute >= 0):
        raise ProgramError(f"While in block {block.idx}: recompute must be None or a byte budget (an int "
                           f">= 0), got {recompute!r}")
    program = block.program
    cond_block = program.create_block(block)
    cond_vars = [_bound_var(cond_block, f"{v.name}.cur", v) for v in inits]
    with block_guard(cond_block):
        flag = cond_fn(*cond_vars)
    _check_predicate(flag, "While", "cond_fn's result", cond_block)
    body = program.create_block(block)
    body_vars = [_bound_var(body, f"{v.name}.cur", v) for v in inits]
    with block_guard(body):
        new = body_fn(*body_vars)
    new_vars, _ = _as_vars(new, f"While in block {block.idx}: body_fn", body)
    _check_body(block, inits, new_vars)
    reads = _unique(_outer_reads(cond_block, [flag.name]) + _outer_reads(body, [v.name for v in new_vars]))
    attrs = {"cond": cond_block, "cond_binds": [v.name for v in cond_vars], "cond_out": flag.name,
             "body": body, "carry_binds": [v.name for v in body_vars], "body_outs": [v.name for v in new_vars],
             "ys": [], "ys_full": [], "max_iters": max_iters}
    if recompute is not None:   # keep at most this many bytes for the backward (memory/while_budget.py)
        attrs["recompute"] = int(recompute)
    attrs.update(streams.stream_attrs(cond_block, body))   # a loop key when the loop draws random numbers
    outs = append_op("While", inits + [block.var(n) for n in reads], attrs, name="while")
    finals = outs[:len(inits)]
    return finals[0] if kind is None else kind(finals)


# --- Gradients ---------------------------------------------------------------------------------

def _run_backward(grad_block: Block, fwd: Block, parts: dict[str, list[Var]], wrt: list[str]) -> dict:
    """Build into ``grad_block`` (a child of ``fwd``) the backward of ``fwd`` from the gradients
    ``parts`` (summed per forward name) to ``wrt``; the gradient Var (or None) per name."""
    from ..autodiff.backward import build_backward
    with _into(grad_block):
        targets = {name: vs[0] if len(vs) == 1 else add_n(vs) for name, vs in parts.items()}
    if not targets or not wrt:
        return {name: None for name in wrt}
    return dict(build_backward(list(fwd.ops), fwd, grad_block, targets, list(wrt)).grads)


def _recomputable(op: Op) -> bool:
    """Cheaper to run again in the backward block than to keep: ops that read nothing (constants)."""
    return not op.inputs and not op.sub_blocks() and not get_op_def(op.type).random


def _detach(grad_block: Block, fwd: Block, parent: Block, fetch: Sequence[str],
            bound: Sequence[str]) -> tuple[list[str], set[str]]:
    """Move ``grad_block`` (built as a child of ``fwd`` to see its values) under ``parent``.

    The values of ``fwd`` it reads become variables of its own: constants are
    recomputed there, the rest are bound by the gradient op to values the
    forward op saves. Returns the names of those saved values, and the subset
    read only for their shape (the ``like`` of ``SumTo``). Variables that
    gradient makers declared for results nobody wanted (no op writes them) go.
    """
    written = {name for op in grad_block.ops for name in op.outputs}
    for name in [n for n in grad_block.vars if n not in written and n not in bound]:
        del grad_block.vars[name]
    wanted = [n for n in _unique(free_reads(grad_block) + list(fetch))
              if n not in grad_block.vars and n in fwd.vars]
    producer = {name: op for op in fwd.ops for name in op.outputs}
    saved, remade = [], []
    for name in wanted:
        op = producer.get(name)
        if op is not None and _recomputable(op):
            if not any(op is r for r in remade):
                remade.append(op)
        else:
            saved.append(name)
    for i, op in enumerate(remade):
        for name in op.outputs:
            var = fwd.vars[name]
            grad_block.create_var(name, var.shape, var.dtype)
        grad_block.insert_op(i, Op(op.type, [], list(op.outputs), dict(op.attrs)))
    for name in saved:
        var = fwd.vars[name]
        grad_block.create_var(name, var.shape, var.dtype)
    grad_block.parent_idx = parent.idx
    grad_block.program.bump()
    return saved, _read_only_for_shape(grad_block, fetch) & set(saved)


def _read_only_for_shape(block: Block, fetch: Sequence[str]) -> set[str]:
    """Names the ops of ``block`` read only through inputs their op marks ``shape_only``."""
    full, shape = set(fetch), set()
    for op in block.ops:
        only = get_op_def(op.type).extra.get("shape_only", ())
        for i, name in enumerate(op.inputs):
            (shape if i in only else full).add(name)
        for sub in op.sub_blocks():
            full.update(free_reads(sub))
    return shape - full


@dataclass
class _Derived:
    """One block's backward: the block, its gradient per operand, what it binds."""
    block: Block
    grads: dict[int, Var | None]
    fetch: list[str]
    dout_binds: list[tuple[str, Var]]    # (bound name, outer output gradient)
    saved: list[str]                     # forward values it reads, saved by the forward op


def _call_grad(g: GradCtx, first: int) -> list:
    """Gradient of If (``first`` = 1: the predicate) or Do: the same op over backward blocks."""
    op, attrs = g.op, g.attrs
    operands = g.x[first:]
    wanted = [w and is_float(v.dtype) for v, w in zip(operands, g.wanted[first:])]
    result: list = [None] * len(g.x)
    if not any(wanted) or all(d is None for d in g.dout):
        return result
    derived = [_derive_call(g, b, block, wanted) for b, block in enumerate(attrs["blocks"])]
    with_grad = [j for j in range(len(operands)) if any(d.grads.get(j) is not None for d in derived)]
    if not with_grad:
        return result
    nb = len(derived)
    # Outer values the backward blocks read by name, and operands whose zeros a block stands in.
    lexical = _unique([n for d in derived for n in _outer_reads(d.block, d.fetch)]
                      + [operands[j].name for j in with_grad if any(d.grads.get(j) is None for d in derived)])
    inputs = [g.block.var(n) for n in lexical]
    binds = [list(lexical) for _ in derived]
    for b, d in enumerate(derived):
        stored = _save_call_values(op, b, d.saved)
        for inner, outer in d.dout_binds + [(name, stored[name]) for name in d.saved]:
            inputs.append(outer)
            for c in range(nb):
                binds[c].append(inner if c == b else None)
    outs = [[d.grads[j].name if d.grads.get(j) is not None else lexical.index(operands[j].name)
             for j in with_grad] for d in derived]
    new = {"blocks": [d.block for d in derived], "binds": binds, "outs": outs}
    grads = append_op(op.type, g.x[:first] + inputs, new, name=f"{op.type.lower()}_grad")
    for var, j in zip(grads, with_grad):
        result[first + j] = var
    return result


def _derive_call(g: GradCtx, b: int, block: Block, wanted: list[bool]) -> _Derived:
    grad_block = block.program.create_block(block)
    parts: dict[str, list[Var]] = {}
    dout_binds = []
    for spec, dout in zip(g.attrs["outs"][b], g.dout):
        if isinstance(spec, str) and dout is not None:
            bound = _bound_var(grad_block, f"{spec}.grad_in", dout)
            parts.setdefault(spec, []).append(bound)
            dout_binds.append((bound.name, dout))
    binds = g.attrs["binds"][b]
    operand_of = {binds[j]: j for j in range(len(wanted)) if wanted[j] and binds[j] is not None}
    grads = _run_backward(grad_block, block, parts, list(operand_of))
    per_operand = {j: grads.get(name) for name, j in operand_of.items()}
    fetch = [v.name for v in per_operand.values() if v is not None]
    saved, _ = _detach(grad_block, block, g.block, fetch, [name for name, _ in dout_binds])
    return _Derived(grad_block, per_operand, fetch, dout_binds, saved)


def _save_call_values(op: Op, b: int, names: Sequence[str]) -> dict[str, Var]:
    """Make If/Do ``op`` also output block ``b``'s values ``names``; their outer Vars."""
    outs = [list(o) for o in op.attrs["outs"]]
    found = {}
    for name in names:
        if name in outs[b]:
            found[name] = op.block.var(op.outputs[outs[b].index(name)])
            continue
        inner = op.attrs["blocks"][b].var(name)
        var = op.block.create_var(op.block.program.unique_name(f"{name}.saved"), inner.shape, inner.dtype)
        op.outputs.append(var.name)
        for c, block_outs in enumerate(outs):
            block_outs.append(name if c == b else None)
        found[name] = var
    op.attrs["outs"] = outs
    op.block.program.bump()
    return found


@dataclass
class _LoopView:
    """Where a While's or a Scan's parts sit, so one gradient maker serves both."""
    op: Op
    body: Block
    carry_binds: list[str]
    body_outs: list[str]
    x_binds: list[str]
    ys: list[str]
    carry_pos: list[int]
    xs_pos: list[int]
    const_pos: list[int]
    finals: list[Var]
    ys_start: int
    count: Var
    reverse: bool

    @staticmethod
    def of_while(g: GradCtx) -> "_LoopView":
        a, n = g.attrs, len(g.attrs["carry_binds"])
        return _LoopView(g.op, a["body"], list(a["carry_binds"]), list(a["body_outs"]), [], list(a["ys"]),
                         list(range(n)), [], list(range(n, len(g.x))), g.out[:n], n + 1, g.out[n], False)

    @staticmethod
    def of_scan(g: GradCtx) -> "_LoopView":
        a = g.attrs
        c, s = len(a["carry_binds"]), len(a["x_binds"])
        return _LoopView(g.op, a["body"], list(a["carry_binds"]), list(a["body_outs"]), list(a["x_binds"]),
                         list(a["ys"]), list(range(1, 1 + c)), list(range(1 + c, 1 + c + s)),
                         list(range(1 + c + s, len(g.x))), g.out[:c], c, g.x[0], bool(a["reverse"]))


def _reaching(ops: Sequence[Op], targets: set[str]) -> set[str]:
    """Names whose values flow into ``targets`` through differentiable inputs."""
    relevant = set(targets)
    for op in reversed(ops):
        opdef = get_op_def(op.type)
        if opdef.grad is None or not any(n in relevant for n in op.outputs):
            continue
        relevant.update(n for i, n in enumerate(op.inputs) if i not in opdef.nondiff_inputs)
        for sub in op.sub_blocks():
            relevant.update(free_reads(sub))
    return relevant


def _active_carries(L: _LoopView, x: list[Var], active: set[int], ys_in: list[int]) -> tuple[list[int], set]:
    """The loop vars that carry a gradient: those given one, and (to a fixed point) those that
    reach one through the body. Also every body name reaching a gradient."""
    while True:
        reach = _reaching(L.body.ops, {L.body_outs[j] for j in active} | {L.ys[i] for i in ys_in})
        more = {j for j, name in enumerate(L.carry_binds) if name in reach and is_float(x[L.carry_pos[j]].dtype)}
        if more <= active:
            return sorted(active), reach
        active = active | more


def _loop_grad(g: GradCtx, L: _LoopView) -> list:
    """Gradient of While or Scan: a Scan in the other direction over the body's backward block.

    Its carries are the loop vars' gradients and one accumulator per outer
    value the body reads; per iteration it binds the gradients of the kept
    values (double backward) and the forward values the backward reads.
    """
    x, body = g.x, L.body
    c = len(L.carry_binds)
    result: list = [None] * len(x)
    dfinal = g.dout[:c]
    dys = g.dout[L.ys_start:L.ys_start + len(L.ys)]
    ys_in = [i for i, d in enumerate(dys) if d is not None]

    def diff(pos: int) -> bool:
        return g.wanted[pos] and is_float(x[pos].dtype)

    carries, reach = _active_carries(L, x, {j for j in range(c) if dfinal[j] is not None}, ys_in)
    consts = [i for i, pos in enumerate(L.const_pos) if diff(pos) and x[pos].name in reach]
    xs_diff = [i for i, pos in enumerate(L.xs_pos) if diff(pos) and L.x_binds[i] in reach]
    if not any(diff(L.carry_pos[j]) for j in carries) and not consts and not xs_diff:
        return result

    # The backward of one iteration.
    G = body.program.create_block(body)
    dcarry = {j: _bound_var(G, f"{L.carry_binds[j]}.grad_in", body.var(L.carry_binds[j])) for j in carries}
    dy = {i: _bound_var(G, f"{L.ys[i]}.grad_in", body.var(L.ys[i])) for i in ys_in}
    parts: dict[str, list[Var]] = {}
    for j in carries:
        parts.setdefault(L.body_outs[j], []).append(dcarry[j])
    for i in ys_in:
        parts.setdefault(L.ys[i], []).append(dy[i])
    const_names = [x[L.const_pos[i]].name for i in consts]
    grads = _run_backward(G, body, parts, [L.carry_binds[j] for j in carries]
                          + [L.x_binds[i] for i in xs_diff] + const_names)
    with _into(G):
        new_dcarry = [zeros_like(dcarry[j]) if grads[L.carry_binds[j]] is None else grads[L.carry_binds[j]]
                      for j in carries]
        summed = [(i, grads[name]) for i, name in zip(consts, const_names) if grads[name] is not None]
        accs = [_bound_var(G, f"{x[L.const_pos[i]].name}.grad_acc", x[L.const_pos[i]]) for i, _ in summed]
        new_accs = [add(acc, grad) for acc, (_, grad) in zip(accs, summed)]
    dxs = [(i, grads[L.x_binds[i]]) for i in xs_diff if grads[L.x_binds[i]] is not None]
    fetch = [v.name for v in new_dcarry + new_accs] + [v.name for _, v in dxs]
    saved, shape_only = _detach(G, body, g.block, fetch, [v.name for v in [*dcarry.values(), *dy.values(), *accs]])

    # Per iteration: the kept values' gradients, then the forward values the backward reads.
    stacks = _save_loop_values(L, [n for n in saved if n not in L.x_binds], shape_only)
    for name in saved:
        if name in L.x_binds and name not in shape_only:
            _need_in_full(x[L.xs_pos[L.x_binds.index(name)]])
    xs_vars = [dys[i] for i in ys_in] + [x[L.xs_pos[L.x_binds.index(n)]] if n in L.x_binds else stacks[n]
                                         for n in saved]
    x_binds = [dy[i].name for i in ys_in] + saved
    inits = [dfinal[j] if dfinal[j] is not None else zeros_like(L.finals[j]) for j in carries]
    inits += [zeros_like(x[L.const_pos[i]]) for i, _ in summed]
    inputs = [L.count] + inits + xs_vars + [g.block.var(n) for n in _outer_reads(G, fetch)]
    ys_like = []
    for i, _ in dxs:  # the gradient of a sliced input has that input's shape
        ref = x[L.xs_pos[i]]
        if not any(v.name == ref.name for v in inputs[1 + len(inits):]):
            inputs.append(ref)
        ys_like.append(next(p for p, v in enumerate(inputs) if p > len(inits) and v.name == ref.name))
    attrs = {"body": G, "carry_binds": [dcarry[j].name for j in carries] + [a.name for a in accs],
             "body_outs": fetch[:len(carries) + len(accs)], "x_binds": x_binds,
             "ys": [v.name for _, v in dxs], "ys_like": ys_like, "ys_full": [True] * len(dxs),
             "reverse": not L.reverse}
    streams.copy_stream(L.op.attrs, attrs)   # iteration i replays the forward's iteration i
    outs = append_op("Scan", inputs, attrs, name="scan_grad")
    for var, j in zip(outs, carries):
        if diff(L.carry_pos[j]):
            result[L.carry_pos[j]] = var
    for var, (i, _) in zip(outs[len(carries):], summed):
        result[L.const_pos[i]] = var
    for var, (i, _) in zip(outs[len(carries) + len(summed):], dxs):
        result[L.xs_pos[i]] = var
    return result


def _save_loop_values(L: _LoopView, names: Sequence[str], shape_only: set[str]) -> dict[str, Var]:
    """Make the loop op also output, stacked over iterations, the body values ``names``
    (as zero-stride stand-ins for those in ``shape_only``)."""
    op, attrs = L.op, L.op.attrs
    ys = list(attrs["ys"])
    likes = list(attrs["ys_like"]) if "ys_like" in attrs else None
    full = _full_flags(attrs, ys)
    found = {}
    for name in names:
        if name in ys:
            found[name] = op.block.var(op.outputs[L.ys_start + ys.index(name)])
            full[ys.index(name)] |= name not in shape_only
            continue
        full.append(name not in shape_only)
        inner = L.body.var(name)
        var = op.block.create_var(op.block.program.unique_name(f"{name}.saved"), (-1,) + inner.shape,
                                  inner.dtype)
        op.outputs.append(var.name)
        ys.append(name)
        if likes is not None:
            likes.append(None)
        found[name] = var
    attrs["ys"] = ys
    attrs["ys_full"] = full
    if likes is not None:
        attrs["ys_like"] = likes
    op.block.program.bump()
    return found


def _need_in_full(stack: Var) -> None:
    """A backward reads ``stack`` (a loop's kept values) in full: keep the values, not a stand-in."""
    for op in stack.block.ops:
        if stack.name in op.outputs and "ys_full" in op.attrs:
            index = op.outputs.index(stack.name) - (len(op.outputs) - len(op.attrs["ys"]))
            if index >= 0 and not op.attrs["ys_full"][index]:
                op.attrs["ys_full"] = [f or i == index for i, f in enumerate(op.attrs["ys_full"])]
                stack.block.program.bump()
