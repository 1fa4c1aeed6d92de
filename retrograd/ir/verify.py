"""The verifier: rejects ill-formed programs, naming block, op and variable.

Every fault is reported as ``block B, op #I Type: <what is wrong>`` followed by
the op as the printer shows it, so the message reads next to ``print(program)``.
Checks, in order, for each block:

1. the block's place in the program (index, parent) and its variables;
2. per op: the type is registered, every input and output is declared in the
   block or an ancestor, every sub-block is a child of this block;
3. per op, in program order: each value read has a value by then (see
   ``_has_value``);
4. per op: the op's shape rule, re-run on the declared inputs, agrees with the
   declared outputs (``-1`` matches any size).

The IR knows no op types: checks 2 and 4 ask the ``OpSchema`` that the op
registry (``retrograd/ops/core/registry.py``) hands to ``register_op_schema`` when
it is imported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import ProgramError, ShapeError
from .analysis import op_reads
from .dtypes import canonical
from .program import MAX_BLOCK_DEPTH, Block, Op, Program, Var


@dataclass(frozen=True)
class OpSchema:
    """What the verifier needs to know about op types, supplied by the op registry."""
    is_registered: Callable[[str], bool]
    # The shape rule of ``op`` on its declared input Vars: [(shape, dtype), ...]; raises ShapeError.
    infer: Callable[[Op, list[Var], Block], list]


_SCHEMA: dict[str, OpSchema] = {}


def register_op_schema(schema: OpSchema) -> None:
    """Called once by ``retrograd/ops/core/registry.py`` (the IR must not import the ops)."""
    _SCHEMA["ops"] = schema


def _op_schema() -> OpSchema:
    if "ops" not in _SCHEMA:
        raise ProgramError("no op schema is registered to verify against; import retrograd (or retrograd.ops)")
    return _SCHEMA["ops"]


def verify_program(program: Program) -> None:
    """Raise ProgramError at the first fault found; return None for a well-formed program.

    Example::

        verify_program(main)       # silent when main is well-formed
    """
    for position, block in enumerate(program.blocks):
        _check_block_place(program, block, position)
    for block in program.blocks:
        _check_vars(block)
        for i, op in enumerate(block.ops):
            _check_op_refs(block, i, op)
    # Reads and shapes assume every name resolves, so they run after the checks above.
    for block in program.blocks:
        _check_reads(block)
        for i, op in enumerate(block.ops):
            _check_shapes(block, i, op)


def _fault(block: Block, i: int, op: Op, message: str, cls: type[ProgramError] = ProgramError):
    from .printer import format_op
    place = f"{op.location}: " if op.location else ""    # the user's line that built the op
    return cls(f"{place}block {block.idx}, op #{i} {op.type}: {message}\n    {format_op(op, block)}")


# --- 1. Structure ------------------------------------------------------------------------

def _check_block_place(program: Program, block: Block, position: int) -> None:
    if block.program is not program or block.idx != position:
        raise ProgramError(f"block at position {position} calls itself block {block.idx}"
                           + ("" if block.program is program else " of another program"))
    if position == 0 and block.parent_idx != -1:
        raise ProgramError(f"block 0 is the global block but has parent {block.parent_idx}")
    # Parents are created before their children; this also rules out cycles.
    if position > 0 and not 0 <= block.parent_idx < position:
        raise ProgramError(f"block {position} has parent {block.parent_idx}, "
                           f"which is not an earlier block (0..{position - 1})")
    # The walks over nested blocks (here, in passes, in the executor) recurse once per level.
    if block.depth() > MAX_BLOCK_DEPTH:
        raise ProgramError(f"block {position} is nested {block.depth()} blocks deep; at most "
                           f"{MAX_BLOCK_DEPTH} are allowed")


def _check_vars(block: Block) -> None:
    for name, var in block.vars.items():
        if var.name != name or var.block is not block:
            raise ProgramError(f"block {block.idx}: variable entry '{name}' holds Var '{var.name}' "
                               f"of block {var.block.idx}")
        if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= -1
                   for d in var.shape):
            raise ProgramError(f"block {block.idx}: variable '{name}' has shape {list(var.shape)!r:.80}; "
                               "dimensions are sizes or -1 (unknown until run time)")


# --- 2. References ------------------------------------------------------------------------

def _check_op_refs(block: Block, i: int, op: Op) -> None:
    if not _op_schema().is_registered(op.type):
        raise _fault(block, i, op, f"op type '{op.type}' is not registered (is the module that "
                                   "defines it imported?)")
    for role, names in (("input", op.inputs), ("output", op.outputs)):
        for name in names:
            if block.find_var(name) is None:
                raise _fault(block, i, op, f"{role} '{name}' is not declared in block {block.idx} "
                                           "or its ancestors")
    for sub in op.sub_blocks():
        if sub.program is not block.program or sub.idx >= len(block.program.blocks) \
                or block.program.blocks[sub.idx] is not sub:
            raise _fault(block, i, op, f"sub-block {sub.idx} is not a block of this program")
        if sub.parent_idx != block.idx and not _descends_from(sub, block):
            raise _fault(block, i, op, f"sub-block {sub.idx} has parent {sub.parent_idx}, "
                                       f"but its op is in block {block.idx}; a sub-block must be "
                                       "a child (or a deeper descendant) of the block holding its op")


def _descends_from(sub: Block, block: Block) -> bool:
    """True when ``block`` is a proper ancestor of ``sub`` (a recurrent gradient op runs a
    backward block nested in the forward step block, which sees the step's values)."""
    return any(b is block for b in sub.ancestors() if b is not sub)


# --- 3. Reads before writes ----------------------------------------------------------------

def _check_reads(block: Block) -> None:
    written: set[str] = set()
    # Names declared in a sub-block that no op of it writes are bound by the
    # control-flow op that runs the block (loop variables, step inputs).
    bound = set(block.vars) - _block_writes(block) if block.parent_idx >= 0 else set()
    for i, op in enumerate(block.ops):
        for name in op_reads(op):
            if name in written or name in bound or _has_value(block, name):
                continue
            where = "an input" if name in op.inputs else "read by a sub-block"
            raise _fault(block, i, op, f"'{name}' ({where}) is read before any op writes it; it is "
                                       "neither data, persistable, nor declared in an enclosing block")
        written.update(_op_writes(op))


def _has_value(block: Block, name: str) -> bool:
    """True when ``name`` needs no earlier op of ``block``: fed, kept in the scope, or outer."""
    var = block.find_var(name)
    if var is None:  # a sub-block's undeclared read; reported when that block is checked
        return True
    return var.is_data or var.persistable or var.block is not block


def _op_writes(op: Op) -> set[str]:
    """What an op writes: its outputs and whatever its sub-blocks write outside themselves."""
    names = set(op.outputs)
    for sub in op.sub_blocks():
        names.update(n for n in _block_writes(sub) if n not in sub.vars)
    return names


def _block_writes(block: Block) -> set[str]:
    names: set[str] = set()
    for op in block.ops:
        names.update(_op_writes(op))
    return names


# --- 4. Shapes and dtypes -------------------------------------------------------------------

def _check_shapes(block: Block, i: int, op: Op) -> None:
    in_vars = [block.var(n) for n in op.inputs]
    try:
        specs = _op_schema().infer(op, in_vars, block)
    except ShapeError as exc:
        raise _fault(block, i, op, f"shape rule: {exc}", ShapeError) from None
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, ArithmeticError) as exc:
        # A hand-made or loaded op may lack attributes or inputs its rule expects, or hold
        # attributes of the wrong type (a float axis, a list where a block belongs).
        raise _fault(block, i, op, f"shape rule failed ({type(exc).__name__}: {exc}); check the op's "
                                   "inputs and attributes") from None
    bad = _malformed_spec(specs)
    if bad is not None:
        raise _fault(block, i, op, f"shape rule gives {bad}; check the op's attributes", ShapeError)
    if len(specs) != len(op.outputs):
        raise _fault(block, i, op, f"{op.type} produces {len(specs)} outputs, the op lists "
                                   f"{len(op.outputs)}")
    for name, (shape, dtype) in zip(op.outputs, specs):
        var, dtype = block.var(name), canonical(dtype)
        if var.dtype != dtype:
            raise _fault(block, i, op, f"output '{name}' is declared {var.dtype}, the shape rule "
                                       f"gives {dtype}", ShapeError)
        if not _shapes_compatible(var.shape, tuple(shape)):
            raise _fault(block, i, op, f"output '{name}' is declared {var.type_str()}, the shape "
                                       f"rule gives {dtype}{_shape_text(shape)}", ShapeError)


def _malformed_spec(specs) -> str | None:
    """What is wrong with a shape rule's result (shapes of ints >= -1, dtype names), or None.

    Rules compute shapes from attributes, and a loaded op's attributes may hold
    anything JSON can (``"shape": [1.5]``), so the result is checked before use.
    """
    if not isinstance(specs, (list, tuple)):
        return f"a {type(specs).__name__}, not a list of (shape, dtype)"
    for spec in specs:
        if not isinstance(spec, (list, tuple)) or len(spec) != 2:
            return f"{spec!r:.80}, not a (shape, dtype) pair"
        shape, dtype = spec
        if not isinstance(shape, (list, tuple)) or not all(
                isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= -1 for d in shape):
            return f"the shape {shape!r:.80}; dimensions are ints >= -1"
        try:
            canonical(dtype)
        except ProgramError:
            return f"the dtype {dtype!r:.40}"
    return None


def _shapes_compatible(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x < 0 or y < 0 or x == y for x, y in zip(a, b))


def _shape_text(shape) -> str:
    return "[" + ", ".join("?" if d < 0 else str(d) for d in shape) + "]"
