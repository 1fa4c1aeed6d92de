"""Ops applied to every time step outside a recurrence, moved into it: the output layer and the
loss of a language model recomputed step by step with the recurrence's own checkpoints.

A recurrent op's ``h_all [T, N, H]`` feeding ``[T, N, ...]`` row-wise ops (the
output layer, the loss: ``LinearCrossEntropy``, ``SeqLinear``, a bias ``Add``,
``SoftmaxCrossEntropy``, activations) is a whole tensor in the forward, and so
is its gradient in the backward, whatever the recurrence's own budget. Those
ops compute each time step's rows from that step's rows alone, so they can
run inside the step::

    Before:   h_all, .. = RecurrentNetwork(x, h0, ..)      loss = LinearCrossEntropy(h_all, w, b, labels)
    After:    h_all, .., loss, _ = RecurrentNetwork(x, labels, h0, .., zeros)
                  step: .. h_t ..;  loss_t = LinearCrossEntropy(h_t, w, b, labels_t)

The values read outside the moved ops (``loss [T, N]``) become per-step
outputs of the recurrence (a state the step never reads, as
``recurrent(..)``'s step outputs), their sequences (``labels``) step inputs,
and their parameters values the step reads from outside. Under a
``memory_budget`` the recurrence then checkpoints and recomputes them with
its steps, in segments of time steps (``rnn_budget.py``): ``h_all`` and its
gradient are never whole unless something else reads them, and the output
layer's weight gradients accumulate step by step. The whole-program budget
runs this before building the backward when storing everything does not
fit (``budget.py``); gradients are store-all's to rounding.
"""
from __future__ import annotations

from ...ir.analysis import op_reads
from ...ir.builder import block_guard
from ...ir.location import located
from ...ir.program import Block, Op, Program
from ...ops.recurrent.outputs import output_init
from ...ops.recurrent.steps import fresh_name
from ...ops.core.registry import ROW_WISE_ELEMENTWISE, get_op_def
from ..sizes import Shapes

LOOP = "RecurrentNetwork"


def sink_time_step_ops(program: Program, block: Block, shapes: Shapes) -> int:
    """Move the row-wise ops reading a recurrent op's states tensors into its step (in place);
    return how many ops moved. ``shapes`` are the resolved shapes (``sizes.resolve_shapes``).

    Example::

        moved = sink_time_step_ops(main, main.global_block(), resolve_shapes(block, feed_shapes))
    """
    moved = 0
    for op in [op for op in block.ops if op.type == LOOP]:
        for i in range(len(op.attrs["states"])):
            moved += _sink_state(program, block, op, i, shapes)
    if moved:
        program.bump()
    return moved


def _sink_state(program: Program, block: Block, rnn: Op, i: int, shapes: Shapes) -> int:
    attrs = rnn.attrs
    if attrs.get("has_lengths") or attrs.get("forward_only") or attrs.get("saved"):
        return 0
    whole = rnn.outputs[2 * i]
    rows = shapes.get(whole, (-1, -1))[:2]
    if len(rows) < 2 or min(rows) < 0:
        return 0
    start = block.ops.index(rnn)
    per_step = {whole: attrs["state_outs"][i]}          # a whole [T, N, ..] value -> its step value
    sunk: list[tuple[Op, list]] = []
    for op in block.ops[start + 1:]:
        if not set(op_reads(op)) & set(per_step):
            continue
        roles = _roles(block, op, per_step, rows, shapes, start)
        if roles is None:
            break
        sunk.append((op, roles))
        for name in op.outputs:
            per_step[name] = None                        # named in the step below
    readers = _readers_outside(program, [op for op, _ in sunk])
    if not sunk or readers.get(whole):
        return 0
    _move(program, block, rnn, sunk, per_step, readers)
    return len(sunk)


def _roles(block: Block, op: Op, per_step: dict, rows: tuple, shapes: Shapes, start: int) -> list | None:
    """Per input of ``op``: "step" (a moved value), "seq" (an outside [T, N, ..] sequence read row by
    row) or "outer" (read whole by every step); None when ``op`` cannot run per step."""
    opdef = get_op_def(op.type)
    rule = opdef.extra.get("row_wise")         # declared with the op (ops/registry.py)
    if rule is None or op.sub_blocks() or opdef.random:
        return None
    rank = len(shapes.get(op.outputs[0], block.var(op.outputs[0]).shape))
    roles = []
    for p, name in enumerate(op.inputs):
        shape = shapes.get(name, block.var(name).shape)
        by_rows = (len(shape) == rank if rule == ROW_WISE_ELEMENTWISE
                   else p in {q % len(op.inputs) for q in rule})
        if name in per_step:
            roles.append("step" if by_rows else None)
        elif by_rows:
            roles.append("seq" if tuple(shape[:2]) == tuple(rows) and _written_before(block, name, start) else None)
        else:
            roles.append("outer" if _written_before(block, name, start) else None)
    return None if None in roles else roles


def _written_before(block: Block, name: str, index: int) -> bool:
    """True when every op of ``block`` writing ``name`` comes before ``block.ops[index]``."""
    return block.find_var(name) is not None and all(
        j < index for j, op in enumerate(block.ops) if name in op.outputs)


def _readers_outside(program: Program, sunk: list[Op]) -> dict[str, int]:
    """How many ops (in any block) other than ``sunk`` read each name."""
    count: dict[str, int] = {}
    moving = {id(op) for op in sunk}
    for block in program.blocks:
        for op in block.ops:
            if id(op) not in moving:
                for name in dict.fromkeys(op_reads(op)):
                    count[name] = count.get(name, 0) + 1
    return count


def _move(program: Program, block: Block, rnn: Op, sunk: list, per_step: dict, readers: dict) -> None:
    attrs, step = rnn.attrs, rnn.attrs["step"]
    prefix = rnn.outputs[0]
    n_seq, n_state = len(attrs["inputs_t"]), len(attrs["states"])
    seqs, outers = [], []
    for op, roles in sunk:
        for name, role in zip(op.inputs, roles):
            if role == "seq" and name not in per_step:
                var = block.var(name)
                per_step[name] = step.create_var(fresh_name(program, f"{prefix}.{name}_t"), var.shape[1:],
                                                 var.dtype).name
                seqs.append(name)
            elif role == "outer" and name not in rnn.inputs and name not in outers:
                outers.append(name)
        for name in op.outputs:
            var = block.var(name)
            per_step[name] = step.create_var(fresh_name(program, f"{prefix}.{name}_t"), var.shape[1:],
                                             var.dtype).name
        step.append_op(Op(op.type, [per_step.get(n, n) if r != "outer" else n for n, r in zip(op.inputs, roles)],
                          [per_step[n] for n in op.outputs], dict(op.attrs), location=op.location))
    # Values read outside the moved ops: per-step outputs (states the step never reads).
    results = [name for op, _ in sunk for name in op.outputs if readers.get(name) or block.var(name).persistable]
    index = block.ops.index(rnn)
    # N for the zeros from a moved sequence where there is one: the op's own (a hoisted projection)
    # may be moved into the step later, and must then be read by nothing else (unhoist.py).
    batch_from = block.var(seqs[0] if seqs else rnn.inputs[0])
    inits = _inits(program, block, rnn, batch_from, [step.var(per_step[n]) for n in results], index)
    index += len(inits[1])
    placeholders = [step.create_var(fresh_name(program, f"{prefix}.{n}_prev"), step.var(per_step[n]).shape,
                                    step.var(per_step[n]).dtype).name for n in results]
    lasts = [block.create_var(fresh_name(program, f"{n}_last"), block.var(n).shape[1:], block.var(n).dtype).name
             for n in results]
    rnn.inputs = (rnn.inputs[:n_seq] + seqs + rnn.inputs[n_seq:n_seq + n_state] + inits[0]
                  + rnn.inputs[n_seq + n_state:] + outers)
    attrs["inputs_t"] = list(attrs["inputs_t"]) + [per_step[n] for n in seqs]
    attrs["states"] = list(attrs["states"]) + placeholders
    attrs["state_outs"] = list(attrs["state_outs"]) + [per_step[n] for n in results]
    pairs = [name for pair in zip(results, lasts) for name in pair]
    rnn.outputs = rnn.outputs[:2 * n_state] + pairs + rnn.outputs[2 * n_state:]
    if attrs.get("outputs_with_grads") is not None:
        attrs["outputs_with_grads"] = list(attrs["outputs_with_grads"]) + [
            2 * (n_state + j) for j in range(len(results))]
    for op, _ in sunk:
        block.remove_op(block.ops.index(op))
    for name in {n for op, _ in sunk for n in op.outputs} - set(results):
        block.vars.pop(name, None)


def _inits(program: Program, block: Block, rnn: Op, seq, outputs: list, index: int) -> tuple[list[str], list[Op]]:
    """Zeros ``[N, ..]`` (``N`` from ``seq [T, N, ..]``) starting each per-step output, built before
    ``block.ops[index]``: (names, ops built)."""
    end = len(block.ops)
    with block_guard(block), located(rnn.location):
        names = [output_init(var, seq, "step output").name for var in outputs]
    built = block.ops[end:]
    del block.ops[end:]
    for offset, op in enumerate(built):
        block.insert_op(index + offset, op)
    return names, built
