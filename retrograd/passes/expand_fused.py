"""``expand_fused_ops``: fused sequence ops back into the general ops they stand for.

An op registered with ``extra["expand"]`` (``LSTMSequence``: a whole LSTM layer)
can be rewritten into ordinary ops that compute the same outputs under the same
names (``expand(op, block)`` builds them and returns which names it built stand
for which of the op's outputs) (``seq_linear`` and a ``RecurrentNetwork`` of ``LSTMUnit`` steps). Passes
that schedule recurrences themselves, such as the whole-program memory budget,
run this first: they know how to checkpoint a ``RecurrentNetwork`` over time,
not a vendor kernel's workspace.
"""
from __future__ import annotations

from ..ir.builder import block_guard
from ..ir.location import located
from ..ir.program import Program
from ..ops.core.registry import get_op_def


def expand_fused_ops(program: Program) -> int:
    """Expand every expandable op of ``program``'s blocks in place; return how many were expanded."""
    expanded = 0
    for block in list(program.blocks):
        index = 0
        while index < len(block.ops):
            op = block.ops[index]
            expand = get_op_def(op.type).extra.get("expand")
            if expand is None:
                index += 1
                continue
            # Built at the block's end (sub-blocks, such as a recurrent step, are built into
            # their own blocks as usual), then moved to where the op was.
            end = len(block.ops)
            with block_guard(block), located(op.location):
                renames = expand(op, block)
            built = block.ops[end:]
            del block.ops[end:]
            block.remove_op(index)
            for offset, new in enumerate(built):
                # The values the op wrote keep their names (and Vars): the new writers take them.
                new.outputs = [renames.get(name, name) for name in new.outputs]
                block.insert_op(index + offset, new)
            for name in renames:
                block.vars.pop(name, None)
            for name in op.outputs:          # outputs the general form does not write (a workspace)
                if not any(name in other.outputs for other in built):
                    block.vars.pop(name, None)
            index += len(built)
            expanded += 1
    return expanded
