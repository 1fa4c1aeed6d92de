"""Reverse-mode autodiff as a program transformation.

``build_backward`` is the one mechanism: it decides which ops need a gradient
(forward from the variables we differentiate with respect to, backward from
the targets), then walks those ops in reverse asking each op's gradient maker
for gradient ops, summing concurrent contributions to one variable with
``AddN``. ``append_backward`` and ``gradients`` are thin front ends; control
-flow ops call ``build_backward`` on their sub-blocks.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from ..errors import ProgramError, ShapeError
from ..ir.location import here
from ..ir.dtypes import is_float
from ..ir.program import Block, Op, Var
from ..ops.array.creation import constant, fill_like, zeros_like
from ..ops.math.elementwise import add_n
from ..ops.core.registry import get_op_def, make_grad_ops, register_backward_builder
from ..ir.analysis import op_reads
from ..ir.builder import block_guard, capture_ops
from .rewrites import backward_rewrite


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
    return _propagate_needs(ops, block, wrt, no_grad)[0]


def _propagate_needs(ops: Sequence[Op], block: Block, wrt: Iterable[str],
                     no_grad: set[str]) -> tuple[set[str], dict[str, tuple[Op, str, str]]]:
    """``(needs, stuck)``: the names that need a gradient, and the names that would need
    one but for an op without a gradient maker on the way, mapped to ``(that op, its
    output, its input that needs a gradient)``. A target among the stuck is an error,
    not a silent zero."""
    wrt = set(wrt)
    needs = {n for n in wrt if _can_carry_grad(block.var(n), wrt, no_grad)}
    stuck: dict[str, tuple[Op, str, str]] = {}
    for op in ops:
        opdef = get_op_def(op.type)
        live = [n for i, n in enumerate(op.inputs) if i not in opdef.nondiff_inputs and (n in needs or n in stuck)]
        if not live:
            continue
        origin = next((stuck[n] for n in live if n in stuck), None)
        for name in op.outputs:
            if name in needs or not _can_carry_grad(block.var(name), wrt, no_grad):
                continue
            if opdef.grad is None:
                stuck.setdefault(name, (op, name, live[0]))
                continue
            if origin is not None:
                stuck.setdefault(name, origin)
            if any(n in needs for n in live):
                needs.add(name)
    return needs, stuck


def _check_not_stuck(targets: Iterable[str], stuck: dict[str, tuple[Op, str, str]]) -> None:
    for target in targets:
        if target in stuck:
            op, out, source = stuck[target]
            raise ProgramError(f"{op.where()} has no gradient maker, but its output '{out}' depends on "
                               f"'{source}' and leads to '{target}'; cut the path with rg.stop_gradient "
                               f"or no_grad_set, or give {op.type} a gradient maker")


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


def _contribution_counts(ops: Sequence[Op], targets: Iterable[str], needs: set[str]) -> Counter:
    """How many gradient contributions each name can receive (an upper bound)."""
    counts = Counter(list(targets))  # a dict argument would be read as counts
    for op in ops:
        opdef = get_op_def(op.type)
        counts.update(n for i, n in enumerate(op.inputs) if n in needs and opdef.input_differentiable(i))
    return counts


class _Backward:
    """One backward build in progress: contributions per forward name, summed with
    ``AddN`` when first needed, and gradient ops placed (and reported to callbacks)
    only once their names are final."""

    def __init__(self, block: Block, result: BackwardResult, counts: Counter, callbacks):
        self.block = block
        self.result = result
        self.counts = counts                  # expected contributions per forward name
        self.callbacks = list(callbacks or ())
        self.pending: dict[str, list[Var]] = {}
        self.final: dict[str, Var | None] = {}
        self.context: dict = {}               # gradient name -> forward Var, for callbacks

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
            with block_guard(self.block), capture_ops() as ops:
                grad = add_n(parts)
            _rename_new(grad, self._display_name(name), ops)
            self.place(ops, {grad.name: name})
        self.final[name] = grad
        return grad

    def add_op_grads(self, op: Op, grad_ops: list[Op], in_grad_names: list[str | None], needs: set[str]) -> None:
        """Name the gradient maker's results after the forward inputs, place its ops, collect them."""
        made_here = {n for grad_op in grad_ops for n in grad_op.outputs}
        names: list[str | None] = []
        gradient_of: dict[str, str] = {}
        for name, grad_name in zip(op.inputs, in_grad_names):
            if grad_name is None or name not in needs:
                names.append(None)
                continue
            if (grad_name in made_here and in_grad_names.count(grad_name) == 1
                    and not _named_in_attrs(grad_name, grad_ops)):
                new = self._display_name(name) if self.counts[name] == 1 else self._part_name(name)
                grad_name = _rename_new(self.block.var(grad_name), new, grad_ops)
            names.append(grad_name)
            gradient_of.setdefault(grad_name, name)
        self.place(grad_ops, gradient_of)
        for name, grad_name in zip(op.inputs, names):
            if grad_name is not None:
                self.add(name, self.block.var(grad_name))

    def place(self, ops: list[Op], gradient_of: dict[str, str]) -> None:
        """Append ``ops``; call each callback after each one with the gradient -> forward map."""
        for grad_name, fwd in gradient_of.items():
            self.result.grad_of.setdefault(grad_name, fwd)
            self.context.setdefault(grad_name, self.block.find_var(fwd))
        for op in ops:
            self.block.append_op(op)
            self.result.ops.append(op)
            if self.callbacks:
                self.context["__current_op__"] = self.context["__current_op_desc__"] = op
                for cb in self.callbacks:
                    cb(self.block, self.context)

    def _display_name(self, forward_name: str) -> str:
        """'w.grad', or 'w.grad_1' when taken (a second backward); never parsed back.
        In a sub-block 'w.grad.b3', leaving the plain name to the enclosing backward."""
        name = f"{forward_name}.grad{self._block_suffix()}"
        return self.block.program.unique_name(name) if self.block.program.has_name(name) else name

    def _part_name(self, forward_name: str) -> str:
        return self.block.program.unique_name(f"{forward_name}.grad{self._block_suffix()}.part")

    def _block_suffix(self) -> str:
        return "" if self.block.parent_idx < 0 else f".b{self.block.idx}"


def _named_in_attrs(name: str, ops: list[Op]) -> bool:
    """Whether an attribute mentions ``name`` (then renaming it is not safe)."""
    if not any(op.attrs for op in ops):
        return False            # the common case: no attribute to look through
    def mentions(value) -> bool:
        if isinstance(value, str):
            return value == name
        if isinstance(value, (list, tuple)):
            return any(mentions(v) for v in value)
        if isinstance(value, dict):
            return any(mentions(k) or mentions(v) for k, v in value.items())
        return False
    return any(mentions(v) or (isinstance(v, Block) and _named_in_attrs(name, v.ops))
               or (isinstance(v, (list, tuple)) and any(isinstance(b, Block) and _named_in_attrs(name, b.ops)
                                                         for b in v))
               for op in ops for v in op.attrs.values())


def _rename_new(var: Var, new: str, ops: list[Op]) -> str:
    """Rename a Var that only the (not yet placed) ``ops`` mention; returns the new name."""
    old = var.name
    del var.block.vars[old]
    var.name = new
    var.block.vars[new] = var

    def fix(op_list):
        for op in op_list:
            op.inputs = [new if n == old else n for n in op.inputs]
            op.outputs = [new if n == old else n for n in op.outputs]
            for sub in op.sub_blocks():
                fix(sub.ops)
    fix(ops)
    var.block.program.bump()
    return new


def _later_writes(fwd_ops: Sequence[Op]) -> dict[int, dict[str, Op]]:
    """For each op (by id), the names it reads or writes that a later op writes
    (in place: an optimizer update, a non-SSA assign), with the last such op."""
    last_writer = {name: i for i, op in enumerate(fwd_ops) for name in op.outputs}
    result: dict[int, dict[str, Op]] = {}
    for i, op in enumerate(fwd_ops):
        for name in (*op.inputs, *op.outputs):
            if last_writer.get(name, -1) > i:
                result.setdefault(id(op), {})[name] = fwd_ops[last_writer[name]]
    return result


def _check_reads_current(op: Op, grad_ops: list[Op], overwritten: dict[str, Op]) -> None:
    """Gradient ops run after the whole forward: a value they read must not be overwritten
    after ``op`` used it, or they would see the new value."""
    if not overwritten:
        return
    for grad_op in grad_ops:
        for name in op_reads(grad_op):
            if name in overwritten:
                raise ProgramError(f"{op.where()}: its gradient needs the value of '{name}' it used, but "
                                   f"{overwritten[name].where()} overwrites '{name}' afterwards, and gradient "
                                   "ops run after it; write the new value to a fresh variable, or build "
                                   "this backward before that op (every append_backward/gradients call "
                                   "before optimizer updates)")


def build_backward(fwd_ops: Sequence[Op], fwd_block: Block, grad_block: Block,
                   target_grads: dict[str, Var], wrt: Sequence[str], no_grad: set[str] | None = None,
                   callbacks: Sequence[Callable] | None = None) -> BackwardResult:
    """Append to ``grad_block`` the ops computing d(targets)/d(wrt).

    ``target_grads`` maps each target name to the Var holding its incoming
    gradient (visible from ``grad_block``). ``grad_block`` is ``fwd_block``
    itself, or a block that sees it (a child), for sub-block backward.
    Returns the gradient Var of every name in ``wrt`` (None when unreachable).
    Raises ProgramError when an op without a gradient maker lies on the path.

    Example::

        result = build_backward(block.ops, block, block, {"loss": seed}, ["w"])
        result.grads["w"]          # the Var holding d loss / d w
    """
    no_grad = set(no_grad or ())
    needs, stuck = _propagate_needs(fwd_ops, fwd_block, wrt, no_grad)
    _check_not_stuck(target_grads, stuck)
    ops = path_ops(fwd_ops, target_grads, needs)
    result = BackwardResult(grads={})
    state = _Backward(grad_block, result, _contribution_counts(ops, target_grads, needs), callbacks)
    for name, grad in target_grads.items():
        state.add(name, grad)
    overwrites = _later_writes(fwd_ops)
    for op in reversed(ops):
        out_grads = [state.total(n) if n in needs else None for n in op.outputs]
        if all(g is None for g in out_grads):
            continue
        opdef = get_op_def(op.type)
        wanted = [n in needs and opdef.input_differentiable(i) for i, n in enumerate(op.inputs)]
        grad_ops, in_grad_names = make_grad_ops(op, [None if g is None else g.name for g in out_grads],
                                                grad_block, wanted, state.callbacks)
        _check_reads_current(op, grad_ops, overwrites.get(id(op), {}))
        state.add_op_grads(op, grad_ops, in_grad_names, needs)
    for name in wrt:
        grad = state.total(name) if name in state.pending else state.final.get(name)
        result.grads[name] = grad
        if grad is not None:
            result.grad_of.setdefault(grad.name, name)
    return result


register_backward_builder(build_backward)     # control-flow gradient makers build sub-block backwards


# --- front ends -------------------------------------------------------------------------------

def _as_list(items) -> list:
    if items is None:
        return []
    if isinstance(items, (list, tuple)):
        return list(items)
    if isinstance(items, (set, frozenset)):
        return sorted(items, key=lambda item: item.name if isinstance(item, Var) else str(item))
    return [items]


def _names(items, block: Block, what: str) -> list[str]:
    """Names of Vars or names in ``items``; each must be a variable that ``block`` sees
    (a Var must be that very variable, not a namesake from another program)."""
    names = []
    for item in _as_list(items):
        name = item.name if isinstance(item, Var) else item
        found = block.find_var(name) if isinstance(name, str) else None
        if found is None or (isinstance(item, Var) and found is not item and found.block is not item.block):
            raise ProgramError(f"{what} {item!r} is not a variable of block {block.idx} of this program")
        names.append(name)
    return names


def _seed(target: Var, grad) -> Var:
    if grad is None:
        block = target.block
        with block_guard(block), capture_ops() as ops:
            seed = fill_like(target, 1.0)
        name = f"{target.name}.grad"
        _rename_new(seed, block.program.unique_name(name) if block.program.has_name(name) else name, ops)
        for op in ops:
            block.append_op(op)
        return seed
    if isinstance(grad, (int, float)) and not isinstance(grad, bool):
        with block_guard(target.block):               # a number: the target's shape filled with it
            return fill_like(target, float(grad))
    if isinstance(grad, (np.ndarray, np.generic)):
        with block_guard(target.block):               # a fixed seed value: a constant in the program
            grad = constant(np.asarray(grad), dtype=target.dtype)
    elif not isinstance(grad, Var):
        raise ProgramError(f"target gradient for '{target.name}' must be a Var or an array, "
                           f"got {type(grad).__name__}")
    _check_seed_shape(target, grad)
    return grad


def _check_seed_shape(target: Var, grad: Var) -> None:
    """A target gradient has its target's shape (sizes -1 match any): broadcasting one would scale
    or reshape the gradient silently (PyTorch: "Mismatch in shape")."""
    if len(grad.shape) != len(target.shape) or any(
            a >= 0 and b >= 0 and a != b for a, b in zip(grad.shape, target.shape)):
        location = here()
        raise ShapeError(f"{location + ': ' if location else ''}gradients(): the target gradient "
                         f"'{grad.name}' {grad.type_str()} does not have the shape of its target "
                         f"'{target.name}' {target.type_str()}")


def gradients(targets, inputs, target_gradients=None, no_grad_set=None, stop_gradients=None,
              unconnected: str = "none") -> list[Var | None]:
    """Gradients of ``targets`` with respect to ``inputs`` (None where unreachable).

    Each target is seeded by its entry in ``target_gradients`` (ones when
    absent), so non-scalar targets give vector-Jacobian products. Works on any
    variables, data included, and can be called repeatedly (double backward:
    differentiate a gradient again). The gradient ops are appended to the
    targets' block.

    As ``tf.gradients``: ``stop_gradients`` (Vars) are held constant, so no
    gradient flows through them to what they were computed from (an input
    among them still gets its own, direct gradient); ``unconnected="zero"``
    gives zeros shaped like an input that the targets do not depend on,
    instead of None. ``no_grad_set`` names variables that get no gradient at
    all.

    Args:
        targets: A Var or a list of Vars to differentiate.
        inputs: A Var or a list of Vars (or names) to differentiate with respect to.
        target_gradients: Seeds, one per target (None entries mean ones); each
            must have its target's shape.
        no_grad_set: Vars or names that get no gradient.
        stop_gradients: Vars held constant.
        unconnected: ``"none"`` (default) or ``"zero"``, for inputs the targets
            do not depend on.

    Returns:
        A list with one gradient Var (or None) per input.

    Raises:
        ShapeError: A target gradient does not have its target's shape.
        ProgramError: No target Vars, a bad ``unconnected``, or as many seeds as
            targets not given.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [3], dtype="float64")
            y = rg.sum(x * x * x)
            (dx,) = rg.gradients(y, x)                 # 3 x^2
            (ddx,) = rg.gradients(rg.sum(dx), x)       # 6 x
            b = x * 2.0
            da, db = rg.gradients(rg.sum(x + b), [x, b], stop_gradients=[b])   # 1 and 1, not 3
            (dz,) = rg.gradients(rg.sum(x), [rg.data("z", [2])], unconnected="zero")   # zeros([2])
        xv = np.array([1.0, 2.0, 3.0])
        outs = rg.Executor().run(main, feed={"x": xv, "z": np.ones(2, "float32")}, fetch_list=[dx, ddx, da, dz])
        assert np.allclose(outs[0], 3 * xv**2) and np.allclose(outs[1], 6 * xv)
        assert np.allclose(outs[2], 1.0) and list(outs[3]) == [0.0, 0.0]
        ```
    """
    targets = _as_list(targets)
    if not targets or not all(isinstance(t, Var) for t in targets):
        raise ProgramError("gradients() needs target Vars")
    if unconnected not in ("none", "zero"):
        raise ProgramError(f"gradients(): unconnected must be \"none\" or \"zero\", got {unconnected!r}")
    block = targets[0].block
    wrt = _names(inputs, block, "input")
    seeds = _as_list(target_gradients) or [None] * len(targets)
    if len(seeds) != len(targets):
        raise ProgramError(f"{len(targets)} targets but {len(seeds)} target gradients")
    no_grad = set(_names(no_grad_set, block, "no_grad_set entry"))
    stops = set(_names(stop_gradients, block, "stop_gradients entry"))
    fwd_ops = list(block.ops)
    target_grads = _combine_seeds(targets, seeds, block)
    grads = _build_through_enclosing(block, fwd_ops, target_grads, wrt, no_grad, stops)
    _bind_shape_stand_ins(block, len(fwd_ops))
    if unconnected == "zero":
        with block_guard(block):
            grads = {n: zeros_like(block.var(n)) if g is None else g for n, g in grads.items()}
    return [grads[n] for n in wrt]


def _build_through_enclosing(block: Block, ops: list[Op], target_grads: dict[str, Var], wrt: list[str],
                             no_grad: set[str], stops: set[str] = frozenset()) -> dict[str, Var | None]:
    """``build_backward`` over ``ops`` of ``block`` and, for inputs reached through ops of the
    enclosing blocks (a gradient taken inside a cond branch or a loop body of a value computed
    outside it), over those blocks' earlier ops too, innermost first. The gradients of the outer
    values a level reads become the targets of the level above; every gradient op goes into
    ``block``, which sees all their values."""
    levels = [(level, _not_writing(level_ops, stops)) for level, level_ops in _enclosing_levels(block, ops)]
    carry: set[str] = set()           # outer names that depend on an input (root first)
    for level, level_ops in reversed(levels[1:]):
        carry |= needs_grad_names(level_ops, level, [n for n in wrt if n in level.vars] + sorted(carry), no_grad)
    grads: dict[str, Var | None] = {}
    for level, level_ops in levels:
        outer = [n for op in level_ops for n in op_reads(op) if n not in level.vars and n in carry]
        passing = [n for n in target_grads if n not in level.vars]
        want = list(dict.fromkeys([n for n in wrt if level.find_var(n) is not None] + outer + passing))
        result = build_backward(level_ops, level, block, target_grads, want, no_grad)
        grads.update({n: result.grads[n] for n in want if n in level.vars})    # final at its own level
        target_grads = {n: g for n, g in result.grads.items() if g is not None and n not in level.vars}
        if not target_grads:
            break
    return {n: grads.get(n) for n in wrt}


def _not_writing(ops: list[Op], stops: set[str]) -> list[Op]:
    """``ops`` without those writing a ``stop_gradients`` variable: seen from the backward, a
    stopped variable is a leaf (a constant with respect to everything before it)."""
    return [op for op in ops if not any(n in stops for n in op.outputs)] if stops else ops


def _enclosing_levels(block: Block, ops: list[Op]) -> list[tuple[Block, list[Op]]]:
    """``(block, ops)``, then each enclosing block with its ops that run before the op holding
    the level below (all of them while that op is still being built)."""
    levels = [(block, ops)]
    for outer in list(block.ancestors())[1:]:
        inner = levels[-1][0]
        holder = next((i for i, op in enumerate(outer.ops)
                       if any(b is sub for sub in op.sub_blocks() for b in inner.ancestors())), len(outer.ops))
        levels.append((outer, list(outer.ops[:holder])))
    return levels


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
                    checkpoints=None, memory_budget=None, feed_shapes=None,
                    memory_reserve: int = 0) -> list[tuple[Var, Var]]:
    """Append the backward pass of scalar ``loss`` to its program; return ``[(param, grad)]``.

    Only ops on a path from the parameters to ``loss`` get gradient ops;
    ``stop_gradient`` variables, integer/bool values and ``no_grad_set`` block
    the flow. Parameters that the loss does not depend on are left out of the
    result. The backward is ordinary ops: ``print(main)`` shows it.

    ``checkpoints`` keep only those forward values and recompute the rest in
    the backward. ``memory_budget`` bounds the peak of a run of the whole
    training step instead: the memory package chooses checkpoints and the
    budgets of loops and recurrent ops to fit it for the shapes in
    ``feed_shapes`` (``retrograd/memory/budget.py``).

    Args:
        loss: A scalar Var (shape ``[]`` or all ones).
        parameter_list: The parameters (Vars or names) to differentiate with
            respect to; all trainable parameters by default; ``[]`` asks for none.
        no_grad_set: Vars or names that get no gradient.
        callbacks: Callables ``cb(block, context)`` called after every gradient
            op appended (``context`` maps gradient names to forward Vars and
            holds the op under ``"__current_op__"``).
        checkpoints: Vars, names or ``"auto"``: recompute between them.
        memory_budget: A bound in bytes on the training step's peak.
        feed_shapes: ``{name: shape}`` for the budget, needed where declared
            shapes hold -1.
        memory_reserve: What the caller adds after the backward within the same
            budget (an optimizer's state and updates: ``minimize`` passes it).

    Returns:
        ``[(param, grad)]`` pairs of Vars.

    Raises:
        ProgramError: ``loss`` is not scalar, no trainable parameter reaches it
            (unless ``parameter_list=[]``), both ``checkpoints`` and
            ``memory_budget`` are given, or no plan fits the budget (the message
            names the least budget that fits).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 3])
            y = rg.data("y", [-1, 1])
            loss = rg.mean(rg.square(rg.layers.fc(x, 1, name="fc") - y))
            params_grads = rg.append_backward(loss)
        assert [(p.name, g.name) for p, g in params_grads][0][0] == "fc.w"
        exe = rg.Executor()
        exe.run(startup)
        feed = {"x": np.ones((4, 3), "float32"), "y": np.zeros((4, 1), "float32")}
        loss_v, dw = exe.run(main, feed=feed, fetch_list=[loss, params_grads[0][1]])
        assert dw.shape == (3, 1)
        ```
    """
    if not isinstance(loss, Var):
        raise ProgramError(f"append_backward needs the loss Var, got {type(loss).__name__}")
    block = loss.block
    if block.find_var(loss.name) is not loss:
        raise ProgramError(f"loss '{loss.name}' is not a variable of its program")
    if any(d != 1 for d in loss.shape):
        raise ProgramError(f"loss '{loss.name}' is {loss.type_str()}; append_backward needs a "
                           "scalar (reduce it with rg.mean / rg.sum, or use rg.gradients with "
                           "target_gradients)")
    params = _parameters(block, parameter_list)
    if not params and not _explicitly_empty(parameter_list):
        raise _no_parameters(loss, params)
    no_grad = set(_names(no_grad_set, block, "no_grad_set entry"))
    if callable(callbacks):
        callbacks = [callbacks]
    bad = [cb for cb in (callbacks or ()) if not callable(cb)]
    if bad:
        raise ProgramError(f"append_backward: callbacks must be callables cb(block, context), got {bad!r}")
    if memory_budget is not None:      # memory/budget.py plans the whole step, then builds it
        if checkpoints is not None:
            raise ProgramError("append_backward: give checkpoints or memory_budget, not both")
        param_names, no_grad_names = [p.name for p in params], sorted(no_grad)

        def build(target: Var = loss, real: bool = True):
            found = target.block.program.global_block()
            return _build_append(target, [found.var(n) for n in param_names], set(no_grad_names),
                                 callbacks if real else None)
        # What the build uses, for a budget that builds the gradients of parts itself (micro_batches.py).
        build.param_names, build.no_grad, build.callbacks = param_names, set(no_grad_names), callbacks
        pairs = backward_rewrite("memory_budget")(loss, memory_budget, feed_shapes, build, memory_reserve)
    else:
        pairs, n_forward = _build_append(loss, params, no_grad, callbacks)
        if checkpoints is not None:    # memory/recompute.py: recompute segments instead of storing them
            backward_rewrite("recompute")(block, n_forward, loss, checkpoints, feed_shapes=feed_shapes)
    wanted = [p for p in params if p.name not in no_grad]    # no_grad_set may leave none on purpose
    if not pairs and wanted:
        raise _no_parameters(loss, wanted)
    return pairs


def _explicitly_empty(parameter_list) -> bool:
    return isinstance(parameter_list, (list, tuple)) and len(parameter_list) == 0


def _no_parameters(loss: Var, params: list[Var]) -> ProgramError:
    """A loss no trainable parameter reaches: almost always a mistake (a model built from data
    and constants only, or parameters made with trainable=False), so it is named."""
    producer = next((op for op in reversed(loss.block.ops) if loss.name in op.outputs), None)
    place = f"{producer.location}: " if producer is not None and producer.location else ""
    which = (f"none of the {len(params)} parameter(s) asked for reaches it" if params
             else "the program has no trainable parameter")
    return ProgramError(f"{place}append_backward: loss '{loss.name}' depends on no trainable "
                        f"parameter ({which}), so there is no gradient to compute; create "
                        "parameters with rg.create_parameter or a layer, or pass parameter_list=[] "
                        "to accept an empty result")


def _build_append(loss: Var, params: list[Var], no_grad: set[str], callbacks) -> tuple[list, int]:
    """The backward of ``loss`` appended to its block: ``([(param, grad)], ops in the forward part)``."""
    block = loss.block
    backward_rewrite("before_backward")(block)    # memory/unhoist.py: budgeted loops' inputs per step
    fwd_ops = list(block.ops)
    seed = _seed(loss, None)
    result = build_backward(fwd_ops, block, block, {loss.name: seed}, [p.name for p in params],
                            no_grad, callbacks)
    n_forward = len(fwd_ops) + _bind_shape_stand_ins(block, len(fwd_ops))
    pairs = [(p, result.grads[p.name]) for p in params if result.grads.get(p.name) is not None]
    return pairs, n_forward


def _bind_shape_stand_ins(block: Block, n_forward: int) -> int:
    """Gradient ops reading a forward value only for its shape read a one-element stand-in, so
    the value dies at its last real use (memory/shape_reads.py). Returns the ops inserted into
    the forward part (before ``block.ops[n_forward]``)."""
    return backward_rewrite("shape_stand_ins")(block, n_forward)


def _parameters(block: Block, parameter_list) -> list[Var]:
    if parameter_list is None:
        return [v for v in block.program.all_parameters() if v.trainable]
    params = []
    for item in _as_list(parameter_list):
        name = item.name if isinstance(item, Var) else item
        var = block.find_var(name) if isinstance(name, str) else None
        if var is None or not var.is_parameter or (isinstance(item, Var) and var is not item):
            raise ProgramError(f"parameter_list entry {item!r} is not a parameter of the program "
                               "(create it with rg.create_parameter or a layer)")
        params.append(var)
    return params
