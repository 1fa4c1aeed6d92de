"""Reverse-mode autodiff as a program transformation.

``build_backward`` is the one mechanism: it decides which ops need a gradient
(forward from the variables we differentiate with respect to, backward from
the targets), then walks those ops in reverse asking each op's gradient maker
for gradient ops, summing concurrent contributions to one variable with
``AddN``. ``append_backward`` and ``gradients`` are thin front ends; control
-flow ops call ``build_backward`` on their sub-blocks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ..errors import ProgramError
from ..ir.dtypes import is_float
from ..ir.program import Block, Op, Var
from ..ops.creation import fill_like
from ..ops.math import add_n
from ..ops.registry import get_op_def, make_grad_ops
from ..ir.builder import block_guard


@dataclass
class BackwardResult:
    """What a backward build produced: gradient Vars and the ops appended."""
    grads: dict[str, Var | None]
    ops: list[Op] = field(default_factory=list)
    grad_of: dict[str, str] = field(default_factory=dict)   # gradient name -> forward name


def _can_carry_grad(var: Var, wrt: set[str], no_grad: set[str]) -> bool:
    if var.name in no_grad or not is_float(var.dtype):
        return False
    return var.name in wrt or not var.stop_gradient


def needs_grad_names(ops: Sequence[Op], block: Block, wrt: Iterable[str], no_grad: set[str]) -> set[str]:
    """Names that depend differentiably on ``wrt`` (forward propagation of 'needs a gradient')."""
    wrt = set(wrt)
    needs = {n for n in wrt if _can_carry_grad(block.var(n), wrt, no_grad)}
    for op in ops:
        opdef = get_op_def(op.type)
        if any(name in needs and opdef.input_differentiable(i) for i, name in enumerate(op.inputs)):
            for name in op.outputs:
                if _can_carry_grad(block.var(name), wrt, no_grad):
                    needs.add(name)
    return needs


def path_ops(ops: Sequence[Op], targets: Iterable[str], needs: set[str]) -> list[Op]:
    """Ops (in forward order) that carry a gradient from ``needs`` to the targets."""
    relevant = set(targets)
    on_path = []
    for op in reversed(ops):
        opdef = get_op_def(op.type)
        if not any(name in relevant and name in needs for name in op.outputs):
            continue
        diff_inputs = [n for i, n in enumerate(op.inputs) if n in needs and opdef.input_differentiable(i)]
        if not diff_inputs:
            continue
        on_path.append(op)
        relevant.update(diff_inputs)
    on_path.reverse()
    return on_path


class _GradAccumulator:
    """Contributions to each variable's gradient, summed when first needed."""

    def __init__(self, grad_block: Block, created: set[str], emit: Callable[[Op, str], None]):
        self.block = grad_block
        self.pending: dict[str, list[Var]] = {}
        self.final: dict[str, Var | None] = {}
        self.created = created        # names this backward created (safe to rename)
        self.emit = emit

    def add(self, name: str, grad: Var) -> None:
        self.pending.setdefault(name, []).append(grad)

    def total(self, name: str) -> Var | None:
        """The summed gradient of the current version of ``name``; later writes start afresh."""
        parts = self.pending.pop(name, [])
        if not parts:
            self.final.setdefault(name, None)
            return None
        if len(parts) == 1:
            grad = parts[0]
        else:
            with block_guard(self.block):
                from ..ir.builder import capture_ops
                with capture_ops() as ops:
                    grad = add_n(parts)
            self.created.add(grad.name)
            for op in ops:
                self.emit(op, name)
        grad = self._display_name(grad, name)
        self.final[name] = grad
        return grad

    def _display_name(self, grad: Var, forward_name: str) -> Var:
        """Give a fresh gradient Var a readable name ('w.grad'); never parsed back."""
        if grad.name not in self.created or any(grad is v for vs in self.pending.values() for v in vs):
            return grad
        if any(grad is v for v in self.final.values()):
            return grad
        new = f"{forward_name}.grad"
        if self.block.program.has_name(new):
            new = self.block.program.unique_name(new)
        _rename(self.block, grad, new)
        self.created.discard(grad.name)
        return grad


def _rename(block: Block, var: Var, new: str) -> None:
    old = var.name
    del var.block.vars[old]
    var.name = new
    var.block.vars[new] = var
    for b in block.program.blocks:
        for op in b.ops:
            op.inputs = [new if n == old else n for n in op.inputs]
            op.outputs = [new if n == old else n for n in op.outputs]
    block.program.bump()


def build_backward(fwd_ops: Sequence[Op], fwd_block: Block, grad_block: Block,
                   target_grads: dict[str, Var], wrt: Sequence[str], no_grad: set[str] | None = None,
                   callbacks: Sequence[Callable] | None = None) -> BackwardResult:
    """Append to ``grad_block`` the ops computing d(targets)/d(wrt).

    ``target_grads`` maps each target name to the Var holding its incoming
    gradient (visible from ``grad_block``). ``grad_block`` is ``fwd_block``
    itself, or a block that sees it (a child), for sub-block backward.
    Returns the gradient Var of every name in ``wrt`` (None when unreachable).
    """
    no_grad = set(no_grad or ())
    needs = needs_grad_names(fwd_ops, fwd_block, wrt, no_grad)
    ops = path_ops(fwd_ops, target_grads, needs)
    result = BackwardResult(grads={})
    before = set(grad_block.vars)
    created: set[str] = set()

    def emit(op: Op, forward_name: str | None) -> None:
        grad_block.append_op(op)
        result.ops.append(op)
        created.update(n for n in op.outputs if n not in before)
        for cb in callbacks or ():
            cb(grad_block, _callback_context(result, op))

    acc = _GradAccumulator(grad_block, created, emit)
    for name, grad in target_grads.items():
        acc.add(name, grad)
    for op in reversed(ops):
        out_grads = [acc.total(n) if n in needs else None for n in op.outputs]
        if all(g is None for g in out_grads):
            continue
        wanted = [n in needs and get_op_def(op.type).input_differentiable(i)
                  for i, n in enumerate(op.inputs)]
        grad_ops, in_grad_names = make_grad_ops(op, [None if g is None else g.name for g in out_grads],
                                                grad_block, wanted)
        for grad_op in grad_ops:
            emit(grad_op, None)
        for name, grad_name in zip(op.inputs, in_grad_names):
            if grad_name is not None and name in needs:
                acc.add(name, grad_block.var(grad_name))
    for name in wrt:
        grad = acc.total(name) if name in acc.pending else acc.final.get(name)
        result.grads[name] = grad
        if grad is not None:
            result.grad_of[grad.name] = name
    return result


def _callback_context(result: BackwardResult, op: Op) -> dict:
    context: dict = {name: op.block.find_var(fwd) for name, fwd in result.grad_of.items()}
    context["__current_op__"] = op
    context["__current_op_desc__"] = op
    return context


# --- front ends -------------------------------------------------------------------------------

def _as_list(items) -> list:
    if items is None:
        return []
    if isinstance(items, (list, tuple)):
        return list(items)
    return [items]


def _names(items, block: Block, what: str) -> list[str]:
    names = []
    for item in _as_list(items):
        name = item.name if isinstance(item, Var) else item
        if not isinstance(name, str) or block.find_var(name) is None:
            raise ProgramError(f"{what} {item!r} is not a variable of block {block.idx}")
        names.append(name)
    return names


def _seed(target: Var, grad) -> Var:
    if grad is None:
        with block_guard(target.block):
            return fill_like(target, 1.0)
    if not isinstance(grad, Var):
        raise ProgramError(f"target gradient for '{target.name}' must be a Var, got {type(grad).__name__}")
    return grad


def gradients(targets, inputs, target_gradients=None, no_grad_set=None) -> list[Var | None]:
    """Gradients of ``targets`` with respect to ``inputs`` (None where unreachable).

    Each target is seeded by its entry in ``target_gradients`` (ones when
    absent), so non-scalar targets give vector-Jacobian products. Works on
    any variables, data included, and can be called repeatedly (double
    backward: differentiate a gradient again).

    Example::

        x = rg.data("x", [3], dtype="float64")
        y = rg.sum(x * x * x)
        dx, = rg.gradients(y, x)                 # 3 x^2
        ddx, = rg.gradients(rg.sum(dx), x)       # 6 x
    """
    targets = _as_list(targets)
    if not targets or not all(isinstance(t, Var) for t in targets):
        raise ProgramError("gradients() needs target Vars")
    block = targets[0].block
    wrt = _names(inputs, block, "input")
    seeds = _as_list(target_gradients) or [None] * len(targets)
    if len(seeds) != len(targets):
        raise ProgramError(f"{len(targets)} targets but {len(seeds)} target gradients")
    no_grad = set(_names(no_grad_set, block, "no_grad_set entry"))
    fwd_ops = list(block.ops)
    target_grads = _combine_seeds(targets, seeds, block)
    result = build_backward(fwd_ops, block, block, target_grads, wrt, no_grad)
    return [result.grads[n] for n in wrt]


def _combine_seeds(targets: list[Var], seeds: list, block: Block) -> dict[str, Var]:
    combined: dict[str, Var] = {}
    for target, seed in zip(targets, seeds):
        if block.find_var(target.name) is not target:
            raise ProgramError(f"target '{target.name}' is not in block {block.idx} of this program")
        grad = _seed(target, seed)
        if target.name in combined:
            with block_guard(block):
                grad = add_n([combined[target.name], grad])
        combined[target.name] = grad
    return combined


def append_backward(loss: Var, parameter_list=None, no_grad_set=None, callbacks=None,
                    checkpoints=None) -> list[tuple[Var, Var]]:
    """Append the backward pass of scalar ``loss`` to its program; return ``[(param, grad)]``.

    Only ops on a path from the parameters to ``loss`` get gradient ops;
    ``stop_gradient`` variables, integer/bool values and ``no_grad_set`` block
    the flow. Each callback is called as ``cb(block, context)`` after every
    gradient op appended (``context`` maps gradient names to forward Vars and
    holds the op under ``"__current_op__"``). Parameters that the loss does
    not depend on are left out of the result.

    Example::

        loss = rg.mean(rg.square(rg.layers.fc(x, 1, name="fc") - y))
        for param, grad in rg.append_backward(loss):
            print(param.name, grad.name)
    """
    if not isinstance(loss, Var):
        raise ProgramError(f"append_backward needs the loss Var, got {type(loss).__name__}")
    block = loss.block
    if block.find_var(loss.name) is not loss:
        raise ProgramError(f"loss '{loss.name}' is not a variable of its program")
    if any(d != 1 for d in loss.shape):
        raise ProgramError(f"loss '{loss.name}' has shape {list(loss.shape)}; append_backward needs a "
                           "scalar (reduce it with rg.mean / rg.sum, or use rg.gradients with "
                           "target_gradients)")
    params = _parameters(block, parameter_list)
    no_grad = set(_names(no_grad_set, block, "no_grad_set entry"))
    fwd_ops = list(block.ops)
    checkpoint_names = _names(checkpoints, block, "checkpoint") if checkpoints else []
    seed = _seed(loss, None)
    if checkpoint_names:
        raise ProgramError("append_backward(checkpoints=...) is not implemented yet")
    result = build_backward(fwd_ops, block, block, {loss.name: seed}, [p.name for p in params],
                            no_grad, callbacks)
    return [(p, result.grads[p.name]) for p in params if result.grads.get(p.name) is not None]


def _parameters(block: Block, parameter_list) -> list[Var]:
    if parameter_list is None:
        return [v for v in block.program.all_parameters() if v.trainable]
    params = []
    for item in _as_list(parameter_list):
        name = item.name if isinstance(item, Var) else item
        var = block.find_var(name) if isinstance(name, str) else None
        if var is None or not var.is_parameter:
            raise ProgramError(f"parameter_list entry {item!r} is not a parameter of the program "
                               "(create it with rg.create_parameter or a layer)")
        params.append(var)
    return params
