"""How many bytes a value takes: shapes resolved from feed shapes by re-running shape rules.

Declared shapes hold ``-1`` where a size is known only at run time (batch,
time). Given the shapes of the fed values, ``resolve_shapes`` walks the block
once and asks every op's own shape rule what it produces, so the sizes the
memory passes reason about are the ones the executor will meet.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from ..errors import ProgramError
from ..ir.program import Block, Var
from ..ops.core.registry import get_op_def
from .loops.trip_counts import budget_grad_shapes, scan_shapes, while_shapes

Shapes = dict[str, tuple[int, ...]]


def resolve_shapes(block: Block, feed_shapes: Mapping[str, Sequence[int]] | None = None,
                   known: Shapes | None = None) -> Shapes:
    """The best-known shape of every variable ``block`` sees, ``-1`` where still unknown.

    ``known``: shapes resolved before a rewrite that added ops whose values have the sizes of
    values already there (recompute copies): only ops writing a name not in it are inferred.

    Example::

        shapes = resolve_shapes(main.global_block(), {"x": (64, 784)})
        shapes["fc1.out"]                       # (64, 256) instead of (-1, 256)
    """
    shapes: Shapes = {}
    for ancestor in reversed(list(block.ancestors())):
        shapes.update({name: var.shape for name, var in ancestor.vars.items()})
    for name, shape in (feed_shapes or {}).items():
        name = name.name if isinstance(name, Var) else name
        var = block.find_var(name)
        if var is None:
            raise ProgramError(f"feed_shapes names '{name}', which is not a variable of block {block.idx}")
        shape = tuple(int(d) for d in shape)
        if len(shape) != len(var.shape) or any(d >= 0 and d != s for d, s in zip(var.shape, shape)):
            raise ProgramError(f"feed_shapes gives '{name}' the shape {list(shape)}, but it is declared "
                               f"{var.type_str()}")
        shapes[name] = shape
    values: dict[str, int] = {}       # int scalars whose value the planner knows (a Dim's size)
    if known is not None:
        shapes.update(known)
    rules: dict[tuple, list | None] = {}     # what rules without attributes said for input shapes
    sized: dict[str, bool] = {}     # op type -> has a size_values rule
    for op in block.ops:
        if op.type not in sized:
            sized[op.type] = get_op_def(op.type).extra.get("size_values") is not None
        if sized[op.type]:
            _size_values(op, shapes, values)
        if known is not None and all(map(known.__contains__, op.outputs)):
            continue
        if all(name in shapes and min(shapes[name], default=0) >= 0 for name in op.outputs):
            inferred = None         # nothing to learn: every output's size is known already
        else:
            inferred = _infer(op, block, shapes, rules)
        if inferred is not None:
            for name, shape in zip(op.outputs, inferred):
                declared = shapes.get(name, ())
                if len(shape) == len(declared):
                    shapes[name] = tuple(d if d >= 0 else s for d, s in zip(declared, shape))
        if op.type == "While":    # what its trip count decides, where the program fixes it
            while_shapes(op, shapes, values, resolve_shapes)
        elif op.type == "Scan":
            scan_shapes(op, shapes, values, resolve_shapes)
        elif op.type == "WhileBudgetGrad":
            budget_grad_shapes(op, shapes, resolve_shapes)
        if op.attrs and op.sub_blocks():
            _carried_shapes(op, block, shapes)
    return shapes


def _carried_shapes(op, block: Block, shapes: Shapes) -> None:
    """A control-flow op's rule answers with its body's declared shapes (-1 for the batch): an
    output still unknown takes the resolved shape of an input declared exactly like it (a loop
    var carried through, a branch returning its input's kind of value)."""
    resolved = {}
    for name in op.inputs:
        var = block.find_var(name)
        if var is not None and all(d >= 0 for d in shapes.get(name, var.shape)):
            resolved.setdefault(tuple(var.shape), shapes.get(name, var.shape))
    for name in op.outputs:
        declared = shapes.get(name, ())
        if any(d < 0 for d in declared) and tuple(declared) in resolved:
            shapes[name] = resolved[tuple(declared)]


def _size_values(op, shapes: Shapes, values: dict[str, int]) -> None:
    """Apply the op's ``size_values`` rule (registry.py): known int values of its outputs, and
    shapes that follow from its inputs' values."""
    rule = get_op_def(op.type).extra.get("size_values")
    if rule is None:
        return
    out_shapes, out_values = rule([shapes.get(n, ()) for n in op.inputs], [values.get(n) for n in op.inputs],
                                  op.attrs)
    for name, value in zip(op.outputs, out_values or ()):
        if value is not None:
            values[name] = int(value)
    for name, shape in zip(op.outputs, out_shapes or ()):
        shapes[name] = tuple(shape)


def _infer(op, block: Block, shapes: Shapes, rules: dict | None = None) -> list[tuple[int, ...]] | None:
    """The op's shape rule on concrete input shapes; None when the rule cannot say more.
    ``rules``: answers of rules of ops without attributes, by (type, input shapes and dtypes): a
    deep chain asks the same few thousands of times."""
    ins = [block.find_var(n) for n in op.inputs]
    if any(v is None for v in ins) or all(shapes.get(v.name) == v.shape for v in ins):
        return None  # nothing more known than what is declared
    key = None
    if rules is not None and not op.attrs:
        key = (op.type, *((shapes.get(v.name, v.shape), v.dtype) for v in ins))
        if key in rules:
            return rules[key]
    probes = [Var(v.block, v.name, shapes.get(v.name, v.shape), v.dtype) for v in ins]
    try:
        specs = get_op_def(op.type).infer(probes, op.attrs)
    except (ProgramError, KeyError, IndexError, TypeError, ValueError):
        # A rule that cannot handle the probe leaves the declared shapes in place.
        specs = None
    found = None if specs is None else [tuple(int(d) for d in shape) for shape, _ in specs]
    if key is not None:
        rules[key] = found
    return found


def value_bytes(var: Var, shapes: Shapes | None = None) -> int | None:
    """Bytes of ``var`` at its resolved shape; None while a size is unknown."""
    shape = (shapes or {}).get(var.name, var.shape)
    if any(d < 0 for d in shape):
        return None
    return int(math.prod(shape)) * np.dtype(var.dtype).itemsize


def estimated_bytes(var: Var, shapes: Shapes | None = None) -> int:
    """Bytes of ``var`` with every unknown size taken as 1: comparable, not absolute."""
    shape = (shapes or {}).get(var.name, var.shape)
    return int(math.prod(max(d, 1) for d in shape)) * np.dtype(var.dtype).itemsize
