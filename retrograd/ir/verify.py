"""The verifier: rejects ill-formed programs, naming block, op and variable."""
from __future__ import annotations

from ..errors import ProgramError
from .program import Block, Program


def verify_program(program: Program) -> None:
    """Raise ProgramError at the first fault found; return None for a well-formed program."""
    for block in program.blocks:
        _verify_block(block)


def _verify_block(block: Block) -> None:
    from ..ops.registry import OPS
    for i, op in enumerate(block.ops):
        where = f"block {block.idx}, op #{i} {op.type}"
        if op.type not in OPS:
            raise ProgramError(f"{where}: op type '{op.type}' is not registered")
        for name in op.inputs:
            if block.find_var(name) is None:
                raise ProgramError(f"{where}: input '{name}' is not declared in block {block.idx} "
                                   "or its ancestors")
        for name in op.outputs:
            if block.find_var(name) is None:
                raise ProgramError(f"{where}: output '{name}' is not declared in block {block.idx} "
                                   "or its ancestors")
        for sub in op.sub_blocks():
            if sub.program is not block.program or sub.parent_idx != block.idx:
                raise ProgramError(f"{where}: sub-block {sub.idx} must be a child of block {block.idx}")
