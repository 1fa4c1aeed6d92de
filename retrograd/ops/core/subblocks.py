"""Helpers shared by the control-flow ops (``cond.py``, ``do.py``, ``while_loop.py``) and their gradients.

Every sub-block is a child of the block holding its op and reads the values
of enclosing blocks by name (closures); each op also lists every outer value
its sub-blocks read as an input, so liveness, autodiff and the printer see
them. Values an op binds under another name (loop variables, ``do`` inputs,
values saved for a backward) are declared in the sub-block and written by no
op there ("bound" in the printed program).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

from ... import backend
from ...errors import ExecutionError, ProgramError, ShapeError
from ...ir.analysis import free_reads
from ...ir.builder import block_guard, capture_ops
from ...ir.program import Block, Op, Var


# --- Building sub-blocks ---------------------------------------------------------------------

def outer_reads(block: Block, extra: Sequence[str] = ()) -> list[str]:
    """Names ``block`` (or a block nested in it) reads from enclosing blocks, plus ``extra``
    names it returns without computing them; first-read order, no repeats."""
    names = [n for n in free_reads(block) if n not in block.vars]
    names += [n for n in extra if n not in block.vars]
    return list(dict.fromkeys(names))


@contextmanager
def build_into(block: Block) -> Iterator[None]:
    """Build ops straight into ``block``, even inside a gradient maker's capture."""
    with block_guard(block), capture_ops() as ops:
        yield
    for op in ops:
        op.block.append_op(op)


def bound_var(block: Block, hint: str, like: Var) -> Var:
    """A variable of ``block`` that its op binds (no op of the block writes it)."""
    return block.create_var(block.program.unique_name(hint), like.shape, like.dtype)


def merge_shapes(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    return tuple(x if x == y else -1 for x, y in zip(a, b))


def shapes_compatible(a: Sequence[int], b: Sequence[int]) -> bool:
    return len(a) == len(b) and all(x < 0 or y < 0 or x == y for x, y in zip(a, b))


def unique(names) -> list[str]:
    return list(dict.fromkeys(names))


def check_bound(block: Block, names: Sequence[str | None], what: str) -> None:
    """The names an op binds in ``block`` are variables the block sees (the verifier's view)."""
    for name in names:
        if name is not None and block.find_var(name) is None:
            raise ShapeError(f"{what} '{name}' is not a variable of block {block.idx}")


def as_vars(result, what: str, block: Block) -> tuple[list[Var], bool]:
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
            raise ProgramError(f"{what} returned '{var.name}' of {block.home_of(var)}, which block "
                               f"{block.idx} cannot see")
    return items, single


def names_of(vars_: Sequence[Var]) -> str:
    return ", ".join(f"{v.name}: {v.type_str()}" for v in vars_) or "nothing"


def check_predicate(pred, op_type: str, role: str, block: Block) -> None:
    if not isinstance(pred, Var):
        raise ProgramError(f"{op_type} in block {block.idx}: {role} must be a bool Var, got "
                           f"{type(pred).__name__} {pred!r}")
    if pred.dtype != "bool" or pred.shape not in ((), (1,)):
        raise ProgramError(f"{op_type} in block {block.idx}: {role} '{pred.name}' must be a scalar bool "
                           f"(shape [] or [1]), got {pred.type_str()}")
    if not block.sees(pred):
        raise ProgramError(f"{op_type} in block {block.idx}: {role} '{pred.name}' belongs to "
                           f"{block.home_of(pred)}, which block {block.idx} cannot see")


# --- Run time ---------------------------------------------------------------------------------

def truth(xp, pred) -> bool:
    return bool(xp.reshape(pred, ()))


def condition_holds(k, consts: dict, carries: Sequence, iters: int, stream) -> bool:
    """Whether a While (``k``: its kernel context) runs iteration ``iters`` on ``carries``.

    A condition that still holds after ``max_iters`` iterations is an ExecutionError."""
    attrs = k.attrs
    flag, = k.run.run_block(attrs["cond"], {**consts, **dict(zip(attrs["cond_binds"], carries))},
                            [attrs["cond_out"]], stream)
    if not truth(k.xp, flag):
        return False
    max_iters = attrs.get("max_iters")
    if max_iters is not None and iters >= max_iters:
        raise max_iters_exceeded(k.op, iters)
    return True


def max_iters_exceeded(op: Op, iters: int) -> ExecutionError:
    """The error of a While whose condition still holds after ``iters`` >= max_iters iterations
    (its kernels, and the onnxruntime engine's check of the exported Loop)."""
    return ExecutionError(f"{op.where()}: the loop ran {iters} iterations and its condition still "
                          f"holds, exceeding max_iters={op.attrs['max_iters']}")


def empty_stand_in(xp, var: Var):
    """A stand-in with no elements for a value the branch that ran did not compute."""
    return xp.zeros(tuple(0 for _ in var.shape), dtype=backend.dtype_of(xp, var.dtype))


def as_outputs(values: Sequence):
    return values[0] if len(values) == 1 else tuple(values)


def full_flags(attrs: dict, names: Sequence[str]) -> list[bool]:
    flags = attrs.get("ys_full")
    return [True] * len(names) if flags is None else list(flags)


def live_indices(k, first: int, names: Sequence[str]) -> list[int]:
    """Indices j of ``names`` whose outputs (op output ``first + j``) the running plan reads."""
    return [j for j in range(len(names)) if first + j in k.live_outputs]


def or_stand_ins(k, first: int, count: int, computed: dict) -> list:
    """Outputs ``first .. first+count-1``: the ``computed`` ones by index, for the rest (which
    nothing reads in this plan) an empty stand-in of the right rank and dtype."""
    return [computed[j] if j in computed else empty_stand_in(k.xp, k.op.block.var(k.op.outputs[first + j]))
            for j in range(count)]


# --- Copying blocks ----------------------------------------------------------------------------

def clone_ops_into(src: Block, dst: Block, ops: Sequence[Op] | None = None,
                   copies: dict[int, Block] | None = None) -> None:
    """Append copies of ``ops`` of ``src`` (default: all) to ``dst``, declaring the variables of
    ``src`` that ``dst`` lacks. The sub-blocks they run are copied too, each under the copy of its
    parent (``copies``: block index -> copy, ``src`` -> ``dst`` added), so the copies stay
    children of the blocks holding their ops."""
    copies = {} if copies is None else copies
    copies.setdefault(src.idx, dst)
    for name, var in src.vars.items():
        if name not in dst.vars:
            dst.create_var(name, var.shape, var.dtype, persistable=var.persistable, trainable=var.trainable,
                           stop_gradient=var.stop_gradient, is_parameter=var.is_parameter, is_data=var.is_data)
    for op in (src.ops if ops is None else ops):
        attrs = {key: _with_copied_blocks(value, copies) for key, value in op.attrs.items()}
        dst.append_op(Op(op.type, list(op.inputs), list(op.outputs), attrs, location=op.location))


def _with_copied_blocks(value, copies: dict[int, Block]):
    if isinstance(value, Block):
        if value.idx not in copies:
            parent = copies.get(value.parent_idx)
            if parent is None:
                raise ProgramError(f"block {value.idx} is run by a copied op but is not nested in the "
                                   "copied block")
            clone_ops_into(value, value.program.create_block(parent), None, copies)
        return copies[value.idx]
    if isinstance(value, (list, tuple)):
        return type(value)(_with_copied_blocks(v, copies) for v in value)
    if isinstance(value, dict):
        return {k: _with_copied_blocks(v, copies) for k, v in value.items()}
    return value
