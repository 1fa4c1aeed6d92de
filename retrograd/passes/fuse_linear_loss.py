"""``fuse_linear_cross_entropy``: an output layer feeding ``softmax_cross_entropy`` becomes one
``LinearCrossEntropy`` op, whose forward and backward hold one chunk of logits at a time.

The pattern, in the forward ops of a block (what ``layers.fc(h, V)`` followed by
``softmax_cross_entropy`` builds)::

    y      = MatMul(h, w)  |  SeqLinear(h, w)  |  SeqLinear(h, w, b)
    logits = Add(y, b)                 (b [V]; absent after a SeqLinear with its bias)
    loss   = SoftmaxCrossEntropy(logits, labels)

becomes ``loss, lse = LinearCrossEntropy(h, w, b, labels)``. ``y`` and ``logits``
must be read by nothing else (in any block) and not persist: they are no
longer computed. The whole-program memory budget runs this before building
the backward when storing everything does not fit (``memory/budget.py``).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..ir.analysis import read_counts
from ..ir.program import Block, Op, Program
from ..ops.nn.linear_cross_entropy import CHUNK_BYTES

# Linear ops the pattern starts from: a check of the op -> (h, w, b or None) where it is x @ w (+ b).
LINEAR: dict[str, Callable[[Op], tuple | None]] = {
    "MatMul": lambda op: None if op.attrs.get("transpose_x") or op.attrs.get("transpose_y") else
    (op.inputs[0], op.inputs[1], None),
    "SeqLinear": lambda op: None if op.attrs.get("transpose_w") else
    (op.inputs[0], op.inputs[1], op.inputs[2] if len(op.inputs) == 3 else None),
}
BIAS_ADD = "Add"
LOSS = "SoftmaxCrossEntropy"


def fuse_linear_cross_entropy(program: Program, block: Block | None = None, end: int | None = None,
                              chunk_bytes: int = CHUNK_BYTES) -> int:
    """Rewrite every match among ``block.ops[:end]`` (default: the global block, all ops) in place;
    return how many were fused. Each fused op computes ``chunk_bytes`` of logits at a time.

    Example::

        logits = rg.layers.fc(h, 32768, name="head")
        loss = rg.mean(rg.softmax_cross_entropy(logits, labels))
        rg.passes.fuse_linear_cross_entropy(main)      # one LinearCrossEntropy op instead
    """
    block = block if block is not None else program.global_block()
    end = len(block.ops) if end is None else end
    readers = read_counts(program)
    fused = 0
    index = 0
    while index < end:
        match = _match(block, block.ops[index], readers)
        if match is None:
            index += 1
            continue
        ops, (h, w, b, labels) = match
        loss_op = block.ops[index]
        width = block.var(w).shape[1]
        rows = max(1, chunk_bytes // max(1, width * np.dtype(block.var(w).dtype).itemsize))
        lse = block.create_var(program.unique_name(f"{loss_op.outputs[0]}.lse"), block.var(loss_op.outputs[0]).shape,
                               block.var(h).dtype)
        new = Op("LinearCrossEntropy", [h, w] + ([b] if b is not None else []) + [labels],
                 [loss_op.outputs[0], lse.name], {"chunk_rows": int(rows)}, location=loss_op.location)
        for op in ops:
            for name in op.outputs:
                if name != loss_op.outputs[0]:
                    block.vars.pop(name, None)
        positions = sorted((block.ops.index(op) for op in ops), reverse=True)
        for position in positions:
            block.remove_op(position)
        index -= len(ops) - 1
        end -= len(ops) - 1
        block.insert_op(index, new)
        index += 1
        fused += 1
    if fused:
        program.bump()
    return fused


def _match(block: Block, loss_op: Op, readers: dict[str, int]):
    """(the pattern's ops, (h, w, b, labels)) when ``loss_op`` ends the pattern; else None."""
    if loss_op.type != LOSS:
        return None
    logits, labels = loss_op.inputs
    producer = _only_use(block, logits, readers)
    if producer is None:
        return None
    if producer.type == BIAS_ADD:
        y, b = producer.inputs
        linear = _only_use(block, y, readers)
        found = LINEAR[linear.type](linear) if linear is not None and linear.type in LINEAR else None
        if found is None or found[2] is not None or not _is_bias(block, b, found[1]):
            return None
        return [linear, producer, loss_op], (found[0], found[1], b, labels)
    found = LINEAR[producer.type](producer) if producer.type in LINEAR else None
    if found is None or not _is_weight(block, found[1]) or (
            found[2] is not None and not _is_bias(block, found[2], found[1])):
        return None
    return [producer, loss_op], (*found, labels)


def _is_weight(block: Block, w: str) -> bool:
    weight = block.find_var(w)
    return weight is not None and weight.ndim == 2 and weight.shape[1] >= 1 and weight.dtype.startswith("float")


def _only_use(block: Block, name: str, readers: dict[str, int]) -> Op | None:
    """The one op of ``block`` writing ``name`` when exactly one op anywhere reads it and it does
    not persist (the value may then go uncomputed)."""
    var = block.find_var(name)
    writers = [op for op in block.ops if name in op.outputs]
    if var is None or var.persistable or len(writers) != 1 or readers.get(name, 0) != 1:
        return None
    return writers[0]


def _is_bias(block: Block, b: str, w: str) -> bool:
    bias, weight = block.find_var(b), block.find_var(w)
    return (_is_weight(block, w) and bias is not None and bias.ndim == 1
            and bias.shape[0] == weight.shape[1] and bias.dtype == weight.dtype)


