"""A budgeted recurrent op takes its hoisted input projection back into its step.

``layers.lstm`` (and gru, milstm) hoist ``x @ w_ih + b`` out of the step: one
``SeqLinear`` over all ``T`` steps, a ``[T, N, G*H]`` tensor the op reads as
its sequence. That is fast, but under a memory budget the tensor (and its
``[T, N, G*H]`` gradient) would stay whole outside the budget: larger than
everything the budget bounds. So before the backward of a budgeted op is
built, each sequence that a ``SeqLinear`` over a ``[T, N, D]`` input makes
(and nothing else reads) is computed per step instead: the step gets the
``SeqLinear`` on ``x[t]``, the op reads ``x``. Its weight gradient is batched
over the steps of each segment (``RecurrentNetworkBudgetGrad``), so nothing
``T``-long remains but ``x`` and its own gradient. Before/after::

    before                                     after
    p = SeqLinear(x, w_ih, b)                  (gone)
    ... = RecurrentNetwork(p, ...)             ... = RecurrentNetwork(x, ..., w_ih, b)
      step: g = Add(p_t, MatMul(h, w_hh))        step: p_t = SeqLinear(x_t, w_ih, b)
                                                       g = Add(p_t, MatMul(h, w_hh))
"""
from __future__ import annotations

from ...autodiff.rewrites import register_backward_rewrite
from ...ir.analysis import op_reads
from ...ir.program import Block, Op
from ...ops.recurrent.steps import RnnLayout, fresh_name, is_budget


@register_backward_rewrite("before_backward")
def unhoist_budgeted_inputs(block: Block) -> int:
    """Move the hoisted projections of budgeted RecurrentNetwork ops of ``block`` into their steps;
    returns how many were moved."""
    moved = 0
    for op in [o for o in block.ops if o.type == "RecurrentNetwork" and is_budget(o.attrs.get("recompute"))]:
        lay = RnnLayout.of(op.attrs, len(op.inputs))
        for i in range(lay.n_seq):
            producer = _sole_projection(block, op, op.inputs[i])
            if producer is not None:
                _move_into_step(block, op, i, producer)
                moved += 1
    return moved


def _sole_projection(block: Block, rnn: Op, name: str) -> Op | None:
    """The SeqLinear over a [T, N, D] input writing ``name``, when only ``rnn`` reads ``name``."""
    writers = [op for op in block.ops if name in op.outputs]
    if len(writers) != 1 or writers[0].type != "SeqLinear" or block.var(writers[0].inputs[0]).ndim != 3:
        return None
    if any(name in op_reads(op) for op in block.ops if op is not rnn) or rnn.inputs.count(name) != 1:
        return None
    var = block.find_var(name)
    return writers[0] if var is not None and not var.persistable else None


def _move_into_step(block: Block, rnn: Op, i: int, projection: Op) -> None:
    attrs = rnn.attrs
    step: Block = attrs["step"]
    x = block.var(projection.inputs[0])
    old = attrs["inputs_t"][i]
    x_t = step.create_var(fresh_name(block.program, f"{old}.in"), x.shape[1:], x.dtype)
    step.insert_op(0, Op("SeqLinear", [x_t.name] + list(projection.inputs[1:]), [old], dict(projection.attrs),
                         location=projection.location))
    attrs["inputs_t"] = [x_t.name if k == i else n for k, n in enumerate(attrs["inputs_t"])]
    rnn.inputs[i] = x.name
    for name in projection.inputs[1:]:          # the weight and bias: outer values of the op now
        if name not in rnn.inputs[RnnLayout.of(attrs, len(rnn.inputs)).outer_start:]:
            rnn.inputs.append(name)
    block.remove_op(block.ops.index(projection))
    block.program.bump()
