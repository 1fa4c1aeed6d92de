"""The time loops of RecurrentNetwork and its gradients as ONNX ``Loop``s (for their lowerings).

``forward_loop_onnx`` runs the step block over t = 0..T-1 carrying the
states and stacking, per step, the new states and the step values a
backward reads; ``backward_loop_onnx`` runs the backward step block over
t = T-1..0 as ``RecurrentNetworkGrad``'s kernel does (``recurrent_grad.py``).
The store-all lowering (``recurrent.py``, ``recurrent_grad.py``) and the
budgeted one (``memory/rnn_budget.py``: every step re-run, then the same
backward) share them. Both work for T = 0 and any batch.
"""
from __future__ import annotations

from typing import Sequence

from ..ir.analysis import free_reads
from .recurrent_steps import RnnLayout, flip_onnx, step_mask_onnx, timestep_onnx, with_first_onnx

_END = 1 << 62


def forward_loop_onnx(g, attrs: dict, lay: RnnLayout, saved: Sequence[str],
                      first: str | None = None) -> tuple[list, list, list]:
    """(all per state [T, N, ...], last per state, a [T, ...] stack per name of ``saved``) of the
    steps of ``attrs["step"]`` over the op's forward inputs (``g.ins[:lay.n_inputs]``).
    ``first``: a bool scalar that must hold for the first step to run (a run-time check's)."""
    seqs, inits, lengths, outers = lay.split(g.ins)
    k, step = lay.n_state, attrs["step"]
    body = g.child()
    t = body.input("t", "int64", [])
    body.stream(t)
    cond = body.input("cond", "bool", [])
    prev = [body.input(name, step.var(name).dtype, None) for name in attrs["states"]]
    binds = dict(zip(g.op.inputs[lay.outer_start:lay.n_inputs], outers))
    binds.update({name: body.node("Gather", [seq, t], axis=0) for name, seq in zip(attrs["inputs_t"], seqs)})
    binds.update(zip(attrs["states"], prev))
    if attrs.get("timestep"):
        binds[attrs["timestep"]] = timestep_onnx(body, step.var(attrs["timestep"]), t)
    values = body.lower(step, binds, list(attrs["state_outs"]) + list(saved))
    new = values[:k]
    if lengths is not None:   # finished examples keep their state
        new = [body.node("Where", [step_mask_onnx(body, lengths, t, step.var(name).ndim), v, p])
               for v, p, name in zip(new, prev, attrs["states"])]
    state_vars = [step.var(n) for n in attrs["states"]]
    outputs = ([(cond, "bool", [])] + list(zip(new, state_vars)) + list(zip(new, state_vars))
               + [(v, step.var(n)) for v, n in zip(values[k:], saved)])
    outs = g.nodes("Loop", [g.scalar_dim(seqs[0], 0), first or "", *inits], len(outputs) - 1,
                   body=body.finish(f"{g.op.outputs[0]}.step", outputs))
    # all = states[1:], rebuilt from slot 0 so that zero steps give [0, N, ...] as the kernel does
    alls = [g.node("Slice", [with_first_onnx(g, init, stack), g.const([1], "int64"), g.const([_END], "int64"),
                             g.const([0], "int64")]) for init, stack in zip(inits, outs[k:2 * k])]
    return alls, outs[:k], outs[2 * k:]


def backward_loop_onnx(g, attrs: dict, lay: RnnLayout, alls: list, saved: list, saved_names: Sequence[str],
                       d_all: list, d_last: list) -> list:
    """The gradients ``attrs["grad_of"]`` lists, from the backward step block ``attrs["backward"]``
    run over t = T-1..0: a Loop carrying each state's incoming gradient and each outer value's
    sum, stacking d(input_t) and the values of the gradients batched over time."""
    a = attrs
    seqs, inits, lengths, outers = lay.split(g.ins)
    seq_vars, init_vars, _, outer_vars = lay.split(g.in_vars)
    block, n_seq, k = a["backward"], lay.n_seq, lay.n_state
    saved_names = list(saved_names)
    steps = g.scalar_dim(seqs[0], 0)
    prevs = [with_first_onnx(g, init, all_) for init, all_ in zip(inits, alls)]
    fetch_seq = [n if i in a["grad_of"] else None for i, n in enumerate(a["fetch_seq"])]
    summed = [j for j, n in enumerate(a["fetch_outer"]) if n]
    per_step = list(dict.fromkeys([n for n in fetch_seq if n] + [d for *_, d in a["batched"]]
                                  + [ref for _, kind, ref, _ in a["batched"]
                                     if kind == "value" and ref not in saved_names]))
    last = g.node("Sub", [steps, g.const(1, "int64")])      # outside the loop: one node less per step
    body = g.child()
    it = body.input("iter", "int64", [])
    cond = body.input("cond", "bool", [])
    dcur = [body.input(f"{n}.dcur", v.dtype, None) for n, v in zip(a["dnext"], init_vars)]
    accs = [body.input(f"{g.op.inputs[lay.outer_start + j]}.acc", outer_vars[j].dtype, None) for j in summed]
    t = body.node("Sub", [last, it])
    body.stream(t)     # step t of the backward replays forward step t's draws
    binds = dict(zip(g.op.inputs[lay.outer_start:lay.n_inputs], outers))
    carries = []
    for i in range(k):
        dn = dcur[i]
        if d_all[i] is not None:
            dn = body.node("Add", [dn, body.node("Gather", [d_all[i], t], axis=0)])
        carry = None
        if lengths is not None:   # rows past their length pass the gradient straight to the previous slot
            mask = step_mask_onnx(body, lengths, t, init_vars[i].ndim)
            zero = body.const(0, init_vars[i].dtype)
            carry = body.node("Where", [mask, zero, dn])
            dn = body.node("Where", [mask, dn, zero])
        binds[a["dnext"][i]] = dn
        carries.append(carry)
    reads = set(free_reads(block))           # a Gather per step only for what the block reads
    for names, stacks in ((a["inputs_t"], seqs), (a["states"], prevs), (a["state_outs"], alls),
                          (saved_names, saved)):
        binds.update({n: body.node("Gather", [s, t], axis=0) for n, s in zip(names, stacks) if n in reads})
    if a.get("timestep") and a["timestep"] in block.vars:
        binds[a["timestep"]] = timestep_onnx(body, block.var(a["timestep"]), t)
    fetch = [n for n in a["fetch_state"] if n] + [a["fetch_outer"][j] for j in summed] + per_step
    values = dict(zip(fetch, body.lower(block, binds, fetch)))
    new_dcur = []
    for i, name in enumerate(a["fetch_state"]):
        parts = [p for p in (values.get(name) if name else None, carries[i]) if p is not None]
        new_dcur.append(parts[0] if len(parts) == 1 else body.node("Add", parts) if parts
                        else body.fill(body.shape(dcur[i]), 0, init_vars[i].dtype))
    new_accs = [body.node("Add", [acc, values[a["fetch_outer"][j]]]) for acc, j in zip(accs, summed)]
    outputs = ([(cond, "bool", [])] + list(zip(new_dcur, init_vars))
               + [(v, outer_vars[j]) for v, j in zip(new_accs, summed)]
               + [(values[n], block.find_var(n)) for n in per_step])
    starts = [d if d is not None else g.fill(g.shape(init), 0, v.dtype)
              for d, init, v in zip(d_last, inits, init_vars)]
    starts += [g.fill(g.shape(outers[j]), 0, outer_vars[j].dtype) for j in summed]
    outs = g.nodes("Loop", [steps, "", *starts], len(outputs) - 1,
                   body=body.finish(f"{g.op.outputs[0]}.step", outputs))
    dstate, acc = outs[:k], dict(zip(summed, outs[k:k + len(summed)]))
    stacks = {n: flip_onnx(g, v) for n, v in zip(per_step, outs[k + len(summed):])}
    _add_time_batched(g, a, block, acc, stacks, seqs, alls, prevs, saved, saved_names)
    results = []
    for position in a["grad_of"]:
        if position < n_seq:
            name = fetch_seq[position]
            shape = g.shape(seqs[position])
            results.append(g.node("Reshape", [stacks[name], shape], allowzero=1) if name
                           else g.fill(shape, 0, seq_vars[position].dtype))
        elif position < n_seq + k:
            results.append(dstate[position - n_seq])
        else:
            j = position - lay.outer_start
            results.append(acc[j] if j in acc else g.fill(g.shape(outers[j]), 0, outer_vars[j].dtype))
    return results


def _add_time_batched(g, a, block, acc: dict, stacks: dict, seqs, alls, prevs, saved, saved_names) -> None:
    """``acc[j] += A^T D`` for each gradient batched over time (``TimeBatches.products``)."""
    zero, last = g.const([0], "int64"), g.const([-1], "int64")
    sources = {"seq": seqs, "new": alls, "prev": [g.node("Slice", [p, zero, last, zero]) for p in prevs]}
    for j, kind, ref, d in a["batched"]:
        if kind == "value":
            stack = saved[saved_names.index(ref)] if ref in saved_names else stacks[ref]
        else:
            stack = sources[kind][ref]
        product = g.node("MatMul", [g.node("Transpose", [_rows_onnx(g, stack)], perm=[1, 0]),
                                    _rows_onnx(g, stacks[d], block.find_var(d).shape[-1])])
        acc[j] = g.node("Add", [acc[j], product]) if j in acc else product


def _rows_onnx(g, stack: str, width: int = -1) -> str:
    """``stack [T, N, ..., W]`` as ``[T*N*..., W]`` (W from the Var when known, else at run time)."""
    if width >= 0:
        return g.node("Reshape", [stack, g.const([-1, width], "int64")])
    return g.node("Reshape", [stack, g.node("Concat", [g.const([-1], "int64"),
                                                      g.node("Shape", [stack], start=-1)], axis=0)])
