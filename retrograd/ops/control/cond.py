"""``cond``: the ``If`` op (layout in ``calls.py``); its gradient is an If over the branches' backward blocks."""
from __future__ import annotations

from typing import Callable

from ...errors import ProgramError, ShapeError
from ...ir.builder import block_guard, current_block
from ...ir.program import Block, Var
from ..core.calls import call_grad, call_rule, lower_call, run_call
from ..math.elementwise import equal
from ..core.registry import GradCtx, append_op, defop
from ..core.lowering import lowers
from .tensor_array import TensorArray
from ..core.subblocks import (as_vars, check_predicate, names_of, outer_reads, shapes_compatible,
                              truth, unique)


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
                                    [(v, var.dtype, [None] * var.ndim) for v, var in zip(values, g.out_vars)]))
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
    outs = [TensorArray.of(v, a.element_shape) if isinstance(a, TensorArray) else v   # arrays stay arrays
            for v, a in zip(outs, results[0])]
    return outs[0] if single and len(outs) == 1 else tuple(outs)


def switch_case(branch_index: Var, branch_fns, default: Callable | None = None):
    """Run the branch whose key equals ``branch_index`` at run time (PaddlePaddle's ``switch_case``).

    ``branch_index`` is an integer scalar Var (shape [] or [1]); ``branch_fns``
    is a list of functions (keys 0, 1, ...), a list of ``(key, fn)`` pairs or a
    dict ``{key: fn}`` with int keys. When no key matches, ``default`` runs, or,
    when ``default`` is None, the branch with the largest key. Every function is
    called once, to build its block, and returns Vars matching the others in
    number, dtype and shape. Built as nested ``If`` ops, so it differentiates
    (to any order) like ``cond``.

    Example::

        y = rg.switch_case(i, {0: lambda: x * 2.0, 3: lambda: rg.sin(x)}, default=lambda: -x)
    """
    block = current_block()
    if not isinstance(branch_index, Var) or branch_index.dtype not in ("int32", "int64") \
            or branch_index.shape not in ((), (1,)):
        raise ProgramError(f"switch_case in block {block.idx}: branch_index must be an int32/int64 scalar "
                           f"Var (shape [] or [1]), got {branch_index!r}")
    pairs = _branch_pairs(branch_fns, block)
    if default is None:
        *pairs, (_, default) = sorted(pairs, key=lambda pair: pair[0])
    elif not callable(default):
        raise ProgramError(f"switch_case in block {block.idx}: default must be a function or None, "
                           f"got {default!r}")
    return _chain(branch_index, pairs, default)


def _branch_pairs(branch_fns, block: Block) -> list[tuple[int, Callable]]:
    """``branch_fns`` as (key, fn) pairs with distinct int keys."""
    if isinstance(branch_fns, dict):
        pairs = list(branch_fns.items())
    elif isinstance(branch_fns, (list, tuple)) and all(callable(fn) for fn in branch_fns):
        pairs = list(enumerate(branch_fns))
    elif isinstance(branch_fns, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2
                                                       for p in branch_fns):
        pairs = [tuple(p) for p in branch_fns]
    else:
        raise ProgramError(f"switch_case in block {block.idx}: branch_fns must be a list of functions, a "
                           f"list of (int, function) pairs or a dict {{int: function}}, got {branch_fns!r}")
    keys = [key for key, _ in pairs]
    if not pairs or any(isinstance(k, bool) or not isinstance(k, int) for k in keys) \
            or len(set(keys)) != len(keys) or not all(callable(fn) for _, fn in pairs):
        raise ProgramError(f"switch_case in block {block.idx}: branch_fns needs at least one branch, "
                           f"distinct int keys and functions, got keys {keys!r}")
    return pairs


def _chain(index: Var, pairs: list[tuple[int, Callable]], default: Callable):
    """cond(index == k0, fn0, cond(index == k1, fn1, ... default)): each function built once."""
    if not pairs:
        return default()
    (key, fn), rest = pairs[0], pairs[1:]
    return cond(equal(index, key), fn, lambda: _chain(index, rest, default))
