"""``cond``: the ``If`` op (layout in ``calls.py``); its gradient is an If over the branches' backward blocks."""
from __future__ import annotations

from typing import Callable

from ..errors import ProgramError, ShapeError
from ..ir.builder import block_guard, current_block
from ..ir.program import Block, Var
from .calls import call_grad, call_rule, lower_call, run_call
from .registry import GradCtx, append_op, defop
from .lowering import lowers
from .subblocks import as_vars, check_predicate, names_of, outer_reads, shapes_compatible, truth, unique


def _if_rule(ins: list[Var], attrs: dict) -> list:
    pred = ins[0]
    if pred.dtype != "bool" or pred.shape not in ((), (1,)):
        raise ShapeError(f"predicate '{pred.name}' must be a scalar bool, got {pred.type_str()}")
    if len(attrs["blocks"]) != 2:
        raise ShapeError(f"If needs two blocks (then, else), got {len(attrs['blocks'])}")
    return call_rule(ins[1:], attrs)


def _if_grad(g: GradCtx) -> list:
    return call_grad(g, first=1)


@defop("If", inputs=("pred", "operands*"), outputs=("outs*",), infer=_if_rule, grad=_if_grad, nondiff=(0,))
def _if(k, pred, *operands):
    """Run blocks[0] when ``pred`` holds, else blocks[1]; outputs come from the block that ran."""
    return run_call(k, 0 if truth(k.xp, pred) else 1, operands)


@lowers("If")
def _if_onnx(g):
    """ONNX If: each branch a graph reading the operands (and outer values) by name."""
    branches = []
    for b in (0, 1):
        body = g.child()
        values = lower_call(body, b, g.ins[1:])
        branches.append(body.finish(f"{g.op.outputs[0] if g.op.outputs else 'if'}.branch{b}",
                                    list(zip(values, g.out_vars))))
    return g.nodes("If", [g.ins[0]], len(g.out_vars), then_branch=branches[0], else_branch=branches[1])


def _check_branches(block: Block, then: list[Var], other: list[Var]) -> None:
    where = f"If in block {block.idx}"
    if len(then) != len(other):
        raise ProgramError(f"{where}: true_fn returns {len(then)} values ({names_of(then)}) but false_fn "
                           f"returns {len(other)} ({names_of(other)})")
    for i, (a, b) in enumerate(zip(then, other)):
        if a.dtype != b.dtype or not shapes_compatible(a.shape, b.shape):
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
    check_predicate(pred, "If", "pred", block)
    branches, results, single = [], [], True
    for fn, role in ((true_fn, "true_fn"), (false_fn, "false_fn")):
        sub = block.program.create_block(block)
        with block_guard(sub):
            out = fn()
        vars_, is_single = as_vars(out, f"If in block {block.idx}: {role}", sub)
        branches.append(sub)
        results.append(vars_)
        single = single and is_single
    _check_branches(block, *results)
    reads = unique(name for sub, vars_ in zip(branches, results)
                    for name in outer_reads(sub, [v.name for v in vars_]))
    attrs = {"blocks": branches, "binds": [list(reads), list(reads)],
             "outs": [[v.name for v in vars_] for vars_ in results]}
    outs = append_op("If", [pred] + [block.var(n) for n in reads], attrs, name="cond")
    return outs[0] if single and len(outs) == 1 else tuple(outs)
