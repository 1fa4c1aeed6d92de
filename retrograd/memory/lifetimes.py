"""Who writes and who reads each value of a block split into a forward and a backward part.

The memory passes ask the same few questions: which op writes a value, which
forward ops read it later, and which values the backward part reads. They
are answered once here, from the IR alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ProgramError
from ..ir.analysis import op_reads
from ..ir.program import Block, Var
from ..ops.core.registry import get_op_def


@dataclass
class ForwardValues:
    """Reads and writes of ``block.ops[:n_forward]`` (the forward) and of the ops after it."""
    block: Block
    n_forward: int
    writers: dict[str, list[int]] = field(default_factory=dict)      # forward op indices writing a name
    readers: dict[str, list[int]] = field(default_factory=dict)      # forward op indices reading a name
    backward_reads: dict[str, int] = field(default_factory=dict)     # forward value -> #backward ops reading it

    @staticmethod
    def of(block: Block, n_forward: int) -> "ForwardValues":
        info = ForwardValues(block, n_forward)
        for i, op in enumerate(block.ops[:n_forward]):
            for name in dict.fromkeys(op_reads(op)):
                info.readers.setdefault(name, []).append(i)
            for name in op.outputs:
                info.writers.setdefault(name, []).append(i)
        inputs: dict[str, bool] = {}      # name -> _is_input, asked once per name
        for op in block.ops[n_forward:]:
            for name in dict.fromkeys(op_reads(op)):
                if name not in info.writers:
                    found = inputs.get(name)
                    if found is None:
                        found = inputs[name] = _is_input(block, name)
                    if not found:
                        continue
                info.backward_reads[name] = info.backward_reads.get(name, 0) + 1
        return info

    def producer(self, name: str) -> int | None:
        """Index of the one forward op writing ``name``; None when none or several do."""
        found = self.writers.get(name, [])
        return found[0] if len(found) == 1 else None

    def is_temporary(self, name: str) -> bool:
        """Written exactly once by a forward op, not persistable: freed and recomputable."""
        var = self.block.find_var(name)
        return var is not None and not var.persistable and self.producer(name) is not None

    def read_after(self, name: str, index: int) -> bool:
        """True when a forward op at position >= ``index`` reads ``name``."""
        return any(i >= index for i in self.readers.get(name, ()))


def _is_input(block: Block, name: str) -> bool:
    var = block.find_var(name)
    return var is not None and (var.is_data or var.persistable)


def ancestors(block: Block, n_forward: int, target: str) -> tuple[set[str], set[int]]:
    """Names and forward op indices that ``target`` depends on (including itself)."""
    names, ops = {target}, set()
    for i in range(n_forward - 1, -1, -1):
        op = block.ops[i]
        if any(n in names for n in op.outputs):
            ops.add(i)
            names.update(op_reads(op))
    return names, ops


def backward_start(block: Block, loss: Var | str | None = None) -> int:
    """Index of the first op of the backward part of ``block``.

    With ``loss``: the op after the last one writing it. Without: the op that
    seeds the backward (``append_backward`` and ``gradients`` start from a
    value that only reads the shape of a scalar, filled with 1), found as the
    first op whose inputs are all read for their shape only and whose one
    input is a float scalar written earlier in the block.
    """
    if loss is not None:
        name = loss.name if isinstance(loss, Var) else loss
        written = [i for i, op in enumerate(block.ops) if name in op.outputs]
        if not written:
            raise ProgramError(f"no op of block {block.idx} writes the loss '{name}'")
        return written[-1] + 1
    written: set[str] = set()
    for i, op in enumerate(block.ops):
        if _is_seed(op, block, written):
            return i
        written.update(op.outputs)
    raise ProgramError(f"block {block.idx} has no backward part (no op seeds a gradient); call "
                       "rg.append_backward first, or pass loss=")


def _is_seed(op, block: Block, written: set[str]) -> bool:
    if len(op.inputs) != 1 or op.inputs[0] not in written or op.sub_blocks():
        return False
    opdef = get_op_def(op.type)
    if opdef.input_differentiable(0) or op.attrs.get("value") != 1.0:
        return False
    var = block.find_var(op.inputs[0])
    return var is not None and var.dtype.startswith("float") and all(d == 1 for d in var.shape)
