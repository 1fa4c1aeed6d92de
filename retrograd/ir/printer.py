"""The readable text form of a program: one op per line, sub-blocks nested.

Example output::

    block 0:
      data x: float32[?, 8]
      param fc1.w: float32[8, 16]
      matmul_0: float32[?, 16] = MatMul(x, fc1.w)
      loop_0: float32[?, 16] = While(matmul_0; body=block 1)
        block 1 (parent 0):
          bound h: float32[?, 16]
          tanh_0: float32[?, 16] = Tanh(h)

A block's header lists the values it does not compute itself: ``param``
(parameters), ``state`` (other persistable values), ``data`` (fed), and in a
sub-block ``bound`` (declared there but written by no op: the control-flow op
binds them). ``?`` is a size known only at run time. The printer never
consults the op registry, so it also prints programs the verifier rejects.
"""
from __future__ import annotations

from typing import Any

from .program import Block, Op, Program, provides

_INDENT = "  "
_MAX_LIST_VALUES = 8  # longer lists (constant tables, ...) print as their size
_MAX_NESTED_DEPTH = 2 * 32  # indentation of the deepest block printed inline (32 levels)


@provides
def format_program(program: Program, locations: bool = False) -> str:
    """The whole program as text; ``print(program)`` shows the same.

    With ``locations``, each op's line ends with ``  # file:line``, where
    user code built it (when known).

    Example::

        print(format_program(main, locations=True))
    """
    printed: set[int] = set()
    lines = _format_block(program.global_block(), 0, printed, locations)
    # Blocks no op references (a pass's work in progress) would otherwise be invisible.
    for block in program.blocks:
        if block.idx not in printed:
            lines.extend(_format_block(block, 0, printed, locations))
    return "\n".join(lines)


def format_block(block: Block, locations: bool = False) -> str:
    """One block and its nested sub-blocks as text."""
    return "\n".join(_format_block(block, 0, set(), locations))


def _format_block(block: Block, depth: int, printed: set[int], locations: bool = False) -> list[str]:
    printed.add(block.idx)
    pad = _INDENT * depth
    parent = f" (parent {block.parent_idx})" if block.parent_idx >= 0 else ""
    lines = [f"{pad}block {block.idx}{parent}:"]
    written = {name for op in block.ops for name in op.outputs}
    for var in block.vars.values():
        kind = _header_kind(var, block, written)
        if kind:
            lines.append(f"{pad}{_INDENT}{kind} {var.name}: {var.type_str()}")
    for op in block.ops:
        where = f"  # {op.location}" if locations and op.location else ""
        lines.append(pad + _INDENT + format_op(op, block) + where)
        for sub in op.sub_blocks():
            if sub.idx in printed:
                continue  # a second reference to a block (e.g. by a gradient op) prints it once
            if depth >= _MAX_NESTED_DEPTH:
                # Bounded recursion: deeper blocks are printed after the rest, at the left margin.
                lines.append(f"{pad}{_INDENT * 3}(block {sub.idx} is printed below)")
                continue
            lines.extend(_format_block(sub, depth + 2, printed, locations))
    return lines


def _header_kind(var, block: Block, written: set[str]) -> str:
    if var.is_parameter:
        return "param"
    if var.is_data:
        return "data"
    if var.persistable:
        return "state"
    if block.parent_idx >= 0 and var.name not in written:
        return "bound"
    return ""


def format_op(op: Op, block: Block) -> str:
    """One op as ``out: float32[?, 16] = MatMul(x, fc1.w; transpose_y=True)``."""
    outs = ", ".join(_typed(name, block) for name in op.outputs)
    args = ", ".join(op.inputs)
    attrs = ", ".join(f"{key}={_attr(value)}" for key, value in op.attrs.items())
    inner = f"{args}; {attrs}" if args and attrs else args or attrs
    return (f"{outs} = " if outs else "") + f"{op.type}({inner})"


def _typed(name: str, block: Block) -> str:
    var = block.find_var(name)
    return f"{name}: {var.type_str()}" if var is not None else f"{name}: <undeclared>"


def _attr(value: Any) -> str:
    if isinstance(value, Block):
        return f"block {value.idx}"
    if isinstance(value, (list, tuple)):
        count = _leaf_count(value)
        if count > _MAX_LIST_VALUES:
            return f"[{count} values]"
        items = ", ".join(_attr(v) for v in value)
        if isinstance(value, tuple):
            return f"({items},)" if len(value) == 1 else f"({items})"
        return f"[{items}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_attr(k)}: {_attr(v)}" for k, v in value.items()) + "}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # an array attribute
        return f"<{value.dtype} array {list(value.shape)}>"
    return repr(value)


def _leaf_count(value: Any) -> int:
    if isinstance(value, (list, tuple)):
        return sum(_leaf_count(v) for v in value)
    return 1
