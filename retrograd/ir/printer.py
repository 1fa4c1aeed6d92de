"""The readable text form of a program: one op per line, sub-blocks nested."""
from __future__ import annotations

from .program import Block, Op, Program


def format_program(program: Program) -> str:
    return "\n".join(_format_block(program.global_block(), indent=0))


def _format_block(block: Block, indent: int) -> list[str]:
    pad = "  " * indent
    lines = [f"{pad}block {block.idx}" + (f" (parent {block.parent_idx})" if block.parent_idx >= 0 else "") + ":"]
    for var in block.vars.values():
        if var.is_parameter or var.is_data or var.persistable:
            kind = "param" if var.is_parameter else "data" if var.is_data else "state"
            lines.append(f"{pad}  {kind} {var.name}: {var.type_str()}")
    for op in block.ops:
        lines.append(pad + "  " + format_op(op, block))
        for sub in op.sub_blocks():
            lines.extend(_format_block(sub, indent + 2))
    return lines


def format_op(op: Op, block: Block) -> str:
    outs = ", ".join(_typed(n, block) for n in op.outputs)
    attrs = ", ".join(f"{k}={_attr(v)}" for k, v in op.attrs.items())
    args = ", ".join(op.inputs)
    inner = args + ("; " + attrs if attrs and args else attrs)
    return (f"{outs} = " if outs else "") + f"{op.type}({inner})"


def _typed(name: str, block: Block) -> str:
    var = block.find_var(name)
    return f"{name}: {var.type_str()}" if var is not None else name


def _attr(value) -> str:
    from .program import Block as _Block
    if isinstance(value, _Block):
        return f"block {value.idx}"
    if isinstance(value, list) and len(value) > 8:
        return f"[{len(value)} items]"
    return repr(value)
