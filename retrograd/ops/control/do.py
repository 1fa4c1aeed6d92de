"""``do``: the ``Do`` op, a sub-block run in a fresh scope (layout in ``calls.py``); its gradient is a Do."""
from __future__ import annotations

from typing import Callable

from ...errors import ProgramError
from ...ir.builder import block_guard, current_block
from ...ir.program import Var
from ..core.calls import call_grad, call_rule, lower_call, run_call
from ..core.registry import GradCtx, append_op, defop
from ..core.lowering import lowers
from ..core.subblocks import as_vars, bound_var, outer_reads


def _do_grad(g: GradCtx) -> list:
    return call_grad(g, first=0)


@defop("Do", inputs=("operands*",), outputs=("outs*",), infer=lambda ins, attrs: call_rule(ins, attrs),
       grad=_do_grad)
def _do(k, *operands):
    """Run blocks[0] in a fresh scope, its bound names taking the operands' values."""
    return run_call(k, 0, operands)


@lowers("Do")
def _do_onnx(g):
    """Inlined: the block's ops go straight into the enclosing graph, operands bound by name."""
    return lower_call(g, 0, g.ins)


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
    inner = [bound_var(sub, f"{v.name}.in", v) for v in inputs]
    with block_guard(sub):
        out = fn(*inner)
    vars_, single = as_vars(out, f"Do in block {block.idx}: fn", sub)
    reads = outer_reads(sub, [v.name for v in vars_])
    attrs = {"blocks": [sub], "binds": [[v.name for v in inner] + reads], "outs": [[v.name for v in vars_]]}
    outs = append_op("Do", list(inputs) + [block.var(n) for n in reads], attrs, name="do")
    return outs[0] if single and len(outs) == 1 else tuple(outs)
