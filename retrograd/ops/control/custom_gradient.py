"""``custom_gradient``: a function whose gradient the user writes (TF's ``custom_gradient``,
``torch.autograd.Function``, ``jax.custom_vjp``). Layout (as ``Do``, ``calls.py``)::

    CustomGradient(xs..., reads...; blocks=[forward], binds, outs, grad_fn, n_inputs) -> ys...

The forward is a sub-block run in a fresh scope, like ``Do``; the gradient maker calls the
user's ``grad_fn(xs, ys, dys)`` when a backward is built, and its rg ops are the gradient (so
they differentiate again, to any order). ``grad_fn`` is held in a table by name (``grad_fn``
is its key), so programs still clone and print.
"""
from __future__ import annotations

import itertools
from typing import Callable

from ...errors import ProgramError, ShapeError
from ...ir.builder import block_guard, current_block
from ...ir.program import Var
from ..core.calls import call_rule, lower_call, run_call
from ..array.creation import zeros_like
from ..core.lowering import lowers
from ..core.registry import GradCtx, append_op, defop
from ..core.subblocks import as_vars, bound_var, outer_reads, shapes_compatible

_GRAD_FNS: dict[str, Callable] = {}
_KEYS = itertools.count()


def _custom_grad(g: GradCtx) -> list:
    """The user's ``grad_fn(xs, ys, dys)``, its results checked against the inputs' types."""
    n = g.attrs["n_inputs"]
    grad_fn = _GRAD_FNS.get(g.attrs["grad_fn"])
    if grad_fn is None:
        raise ProgramError(f"{g.op.where()}: its grad_fn ('{g.attrs['grad_fn']}') is not known in this "
                           "process; a program with custom gradients is differentiated where it was built")
    xs, ys = g.x[:n], g.out
    dys = [zeros_like(y) if d is None else d for d, y in zip(g.dout, ys)]
    dxs = grad_fn(list(xs), list(ys), dys)
    dxs = [dxs] if isinstance(dxs, Var) or dxs is None else dxs
    if not isinstance(dxs, (list, tuple)) or len(dxs) != n:
        raise ProgramError(f"{g.op.where()}: grad_fn must return one gradient (a Var or None) per input, "
                           f"{n} in all, got {dxs!r}")
    for x, dx in zip(xs, dxs):
        if dx is None:
            continue
        if not isinstance(dx, Var):
            raise ProgramError(f"{g.op.where()}: grad_fn returned {dx!r} for '{x.name}'; return Vars or None")
        if dx.dtype != x.dtype or not shapes_compatible(dx.shape, x.shape):
            raise ShapeError(f"{g.op.where()}: grad_fn returned '{dx.name}' {dx.type_str()} as the gradient "
                             f"of '{x.name}' {x.type_str()}; a gradient has its input's dtype and shape")
    return list(dxs) + [None] * (len(g.x) - n)


@defop("CustomGradient", inputs=("xs*",), outputs=("ys*",), infer=lambda ins, attrs: call_rule(ins, attrs),
       grad=_custom_grad)
def _custom_gradient(k, *operands):
    """Run the forward block (blocks[0]) in a fresh scope, its bound names taking the inputs' values."""
    return run_call(k, 0, operands)


@lowers("CustomGradient")
def _custom_gradient_onnx(g):
    """The forward inlined (its gradient is ordinary ops)."""
    return lower_call(g, 0, g.ins)


def custom_gradient(forward_fn: Callable, grad_fn: Callable) -> Callable:
    """A function ``f(*xs)`` computing ``forward_fn(*xs)`` whose gradient is ``grad_fn``'s.

    ``forward_fn(*xs)`` builds the forward with rg ops and returns a Var or a
    tuple of Vars (``ys``). When a backward through ``f`` is built,
    ``grad_fn(xs, ys, dys)`` is called with lists of the inputs, the outputs
    and the outputs' gradients (zeros for an output that gets none) and
    returns the inputs' gradients: a list with a Var (of the input's dtype
    and shape; otherwise a ShapeError naming the op and the line that called
    ``f``) or None per input (a single Var for one input). It builds them with
    rg ops, so gradients of gradients work whenever those ops differentiate.
    Works in loops, branches and recurrent steps, with recompute (the forward
    replays; ``grad_fn`` is called when the backward is built, once per
    gradient build). Variables ``forward_fn`` reads from outside (not among
    ``xs``) get no gradient through ``f``: pass them as inputs.

    A ``grad_fn`` that is not linear in ``dys`` (clipping with ``tanh``, say)
    gets PyTorch's answers, except for second derivatives through
    ``rg.recurrent``: its second-order backward recomputes the step, and the
    recomputed copy's gradient and the forward's are applied to their parts
    of the output gradient separately (the same for a linear ``grad_fn``).

    Example::

        def clip_grad_forward(x):
            return rg.tanh(x)
        def clip_grad_backward(xs, ys, dys):
            return [rg.clip(dys[0] * (1.0 - ys[0] * ys[0]), -0.1, 0.1)]
        f = rg.custom_gradient(clip_grad_forward, clip_grad_backward)
        y = f(x)
    """
    if not callable(forward_fn) or not callable(grad_fn):
        raise ProgramError(f"custom_gradient needs two functions, got {forward_fn!r} and {grad_fn!r}")
    key = f"custom_gradient.{next(_KEYS)}.{getattr(grad_fn, '__name__', 'grad_fn')}"
    _GRAD_FNS[key] = grad_fn

    def f(*xs: Var):
        block = current_block()
        for i, var in enumerate(xs):
            if not isinstance(var, Var) or not block.sees(var):
                raise ProgramError(f"CustomGradient in block {block.idx}: input {i} ({var!r}) is not a Var "
                                   "this block sees")
        sub = block.program.create_block(block)
        inner = [bound_var(sub, f"{v.name}.in", v) for v in xs]
        with block_guard(sub):
            out = forward_fn(*inner)
        vars_, single = as_vars(out, f"CustomGradient in block {block.idx}: forward_fn", sub)
        reads = outer_reads(sub, [v.name for v in vars_])
        attrs = {"blocks": [sub], "binds": [[v.name for v in inner] + reads], "outs": [[v.name for v in vars_]],
                 "grad_fn": key, "n_inputs": len(xs)}
        outs = append_op("CustomGradient", list(xs) + [block.var(n) for n in reads], attrs, name="custom")
        return outs[0] if single and len(outs) == 1 else tuple(outs)
    f.__name__ = getattr(forward_fn, "__name__", "custom_gradient")
    f.__doc__ = getattr(forward_fn, "__doc__", None)
    return f
