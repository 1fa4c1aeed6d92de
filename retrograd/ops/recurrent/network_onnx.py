"""The time loops of RecurrentNetwork and its gradients as ONNX ``Scan``s/``Loop``s (for their lowerings).

``forward_loop_onnx`` runs the step block over t = 0..T-1 carrying the
states and stacking, per step, the new states and the step values a
backward reads; ``backward_loop_onnx`` runs the backward step block over
t = T-1..0 as ``RecurrentNetworkGrad``'s kernel does (``recurrent_grad.py``).
The store-all lowering (``recurrent.py``, ``recurrent_grad.py``) and the
budgeted one (``memory/rnn_budget.py``: every step re-run, then the same
backward) share them. Both work for T = 0 and any batch: an ``If`` runs a
``Scan`` when T > 0 (its stacks are written in place, in time order: no
concatenation after the loop, no flip of the backward's stacks) and the
``Loop`` form when T = 0 (a Scan refuses zero steps).
"""
from __future__ import annotations

from typing import Sequence

from ...ir.analysis import free_reads
from ..control.loop_stacks import RaggedStacks, ragged_positions
from .steps import RnnLayout, flip_onnx, step_mask_onnx, timestep_onnx, with_first_onnx

_END = 1 << 62


def forward_loop_onnx(g, attrs: dict, lay: RnnLayout, saved: Sequence[str],
                      first: str | None = None) -> tuple[list, list, list]:
    """(all per state [T, N, ...], last per state, a [T, ...] stack per name of ``saved``) of the
    steps of ``attrs["step"]`` over the op's forward inputs (``g.ins[:lay.n_inputs]``).
    ``first``: a bool scalar that must hold for the first step to run (a run-time check's).
    A Scan when T > 0, the Loop form for T = 0 (see "Scan forms" below)."""
    step, k = attrs["step"], lay.n_state
    states = [step.var(n) for n in attrs["states"]]
    types = ([(v.dtype, v.ndim + 1) for v in states] + [(v.dtype, v.ndim) for v in states]
             + [(step.var(n).dtype, step.var(n).ndim + 1) for n in saved])
    if ragged_positions(step, saved):     # a Scan's outputs keep one shape: the Loop form alone
        return _forward_loop(g, attrs, lay, saved, first)
    outs = _if_steps(g, lay.split(g.ins)[0][0], first, types,
                     lambda b: _flat(_forward_scan(b, attrs, lay, saved)),
                     lambda b: _flat(_forward_loop(b, attrs, lay, saved, first)))
    return outs[:k], outs[k:2 * k], outs[2 * k:]


def _split_by_length(body, lengths, t: str, state_var, dn: str) -> tuple[str, str | None]:
    """(the gradient step t's backward gets, the part that skips it) of state gradient ``dn``:
    rows past their length pass the gradient straight to the previous slot (None: no lengths)."""
    if lengths is None:
        return dn, None
    mask = step_mask_onnx(body, lengths, t, state_var.ndim)
    zero = body.const(0, state_var.dtype)
    return body.node("Where", [mask, dn, zero]), body.node("Where", [mask, zero, dn])


def _flat(groups) -> list:
    return [v for group in groups for v in group]


def _forward_loop(g, attrs: dict, lay: RnnLayout, saved: Sequence[str],
                  first: str | None = None) -> tuple[list, list, list]:
    """``forward_loop_onnx``'s values from a Loop (any T, 0 included)."""
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
    kept = RaggedStacks(g, step, saved)
    outputs = ([(cond, "bool", [])] + list(zip(new, state_vars)) + kept.carry(body, values[k:])
               + list(zip(new, state_vars)) + kept.scanned([(v, step.var(n)) for v, n in zip(values[k:], saved)]))
    outs = g.nodes("Loop", [g.scalar_dim(seqs[0], 0), first or "", *inits, *kept.starts], len(outputs) - 1,
                   body=body.finish(f"{g.op.outputs[0]}.step", outputs))
    end = k + kept.width
    outs = outs[:k] + outs[end:end + k] + kept.stacks(g, outs[k:end], outs[end + k:])
    # all = states[1:], rebuilt from slot 0 so that zero steps give [0, N, ...] as the kernel does
    alls = [g.node("Slice", [with_first_onnx(g, init, stack), g.const([1], "int64"), g.const([_END], "int64"),
                             g.const([0], "int64")]) for init, stack in zip(inits, outs[k:2 * k])]
    return alls, outs[:k], outs[2 * k:]


def backward_loop_onnx(g, attrs: dict, lay: RnnLayout, alls: list, saved: list, saved_names: Sequence[str],
                       d_all: list, d_last: list) -> list:
    """The gradients ``attrs["grad_of"]`` lists, from the backward step block ``attrs["backward"]``
    run over t = T-1..0, carrying each state's incoming gradient and each outer value's sum,
    stacking d(input_t) and the values of the gradients batched over time: a Scan when T > 0,
    the Loop form for T = 0."""
    seq_vars, init_vars, _, outer_vars = lay.split(g.in_vars)
    n_seq, start = lay.n_seq, lay.outer_start
    types = [(v.dtype, v.ndim) for v in (seq_vars[p] if p < n_seq else init_vars[p - n_seq] if p < start
                                         else outer_vars[p - start] for p in attrs["grad_of"])]
    return _if_steps(g, lay.split(g.ins)[0][0], None, types,
                     lambda b: _backward_scan(b, attrs, lay, alls, saved, saved_names, d_all, d_last),
                     lambda b: _backward_loop(b, attrs, lay, alls, saved, saved_names, d_all, d_last))


def _backward_loop(g, attrs: dict, lay: RnnLayout, alls: list, saved: list, saved_names: Sequence[str],
                   d_all: list, d_last: list) -> list:
    """``backward_loop_onnx``'s gradients from a Loop (any T, 0 included)."""
    a = attrs
    seqs, inits, lengths, outers = lay.split(g.ins)
    seq_vars, init_vars, _, outer_vars = lay.split(g.in_vars)
    block, k = a["backward"], lay.n_state
    saved_names = list(saved_names)
    steps = g.scalar_dim(seqs[0], 0)
    prevs = [with_first_onnx(g, init, all_) for init, all_ in zip(inits, alls)]
    fetch_seq, summed, per_step = _backward_fetches(a, saved_names)
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
        dn, carry = _split_by_length(body, lengths, t, init_vars[i], dn)
        binds[a["dnext"][i]] = dn
        carries.append(carry)
    reads = set(free_reads(block))           # a Gather per step only for what the block reads
    for names, stacks in ((a["inputs_t"], seqs), (a["states"], prevs), (a["state_outs"], alls),
                          (saved_names, saved)):
        binds.update({n: body.node("Gather", [s, t], axis=0) for n, s in zip(names, stacks) if n in reads})
    if a.get("timestep") and a["timestep"] in block.vars:
        binds[a["timestep"]] = timestep_onnx(body, block.var(a["timestep"]), t)
    new_dcur, new_accs, values = _backward_step(body, a, block, binds, dcur, accs, carries, init_vars,
                                                summed, per_step)
    outputs = ([(cond, "bool", [])] + list(zip(new_dcur, init_vars))
               + [(v, outer_vars[j]) for v, j in zip(new_accs, summed)]
               + [(values[n], block.find_var(n)) for n in per_step])
    outs = g.nodes("Loop", [steps, "", *_backward_starts(g, inits, init_vars, outers, outer_vars, d_last, summed)],
                   len(outputs) - 1, body=body.finish(f"{g.op.outputs[0]}.step", outputs))
    dstate, acc = outs[:k], dict(zip(summed, outs[k:k + len(summed)]))
    stacks = {n: flip_onnx(g, v) for n, v in zip(per_step, outs[k + len(summed):])}
    zero, end = g.const([0], "int64"), g.const([-1], "int64")
    _add_time_batched(g, a, block, acc, stacks, seqs, alls, [g.node("Slice", [p, zero, end, zero]) for p in prevs],
                      saved, saved_names)
    return _grad_results(g, a, lay, fetch_seq, stacks, dstate, acc)


def _backward_fetches(a: dict, saved_names: list) -> tuple[list, list, list]:
    """(the per-input step gradients wanted, the outer values whose gradients are summed, the
    per-step values stacked: d(input_t) and what the time-batched products read)."""
    fetch_seq = [n if i in a["grad_of"] else None for i, n in enumerate(a["fetch_seq"])]
    summed = [j for j, n in enumerate(a["fetch_outer"]) if n]
    per_step = list(dict.fromkeys([n for n in fetch_seq if n] + [d for *_, d in a["batched"]]
                                  + [ref for _, kind, ref, _ in a["batched"]
                                     if kind == "value" and ref not in saved_names]))
    return fetch_seq, summed, per_step


def _backward_step(body, a: dict, block, binds: dict, dcur: list, accs: list, carries: list, init_vars: list,
                   summed: list, per_step: list) -> tuple[list, list, dict]:
    """The backward block lowered into ``body``: the next state gradients, the sums, the values."""
    fetch = [n for n in a["fetch_state"] if n] + [a["fetch_outer"][j] for j in summed] + per_step
    values = dict(zip(fetch, body.lower(block, binds, fetch)))
    new_dcur = []
    for i, name in enumerate(a["fetch_state"]):
        parts = [p for p in (values.get(name) if name else None, carries[i]) if p is not None]
        new_dcur.append(parts[0] if len(parts) == 1 else body.node("Add", parts) if parts
                        else body.fill(body.shape(dcur[i]), 0, init_vars[i].dtype))
    new_accs = [body.node("Add", [acc, values[a["fetch_outer"][j]]]) for acc, j in zip(accs, summed)]
    return new_dcur, new_accs, values


def _backward_starts(g, inits, init_vars, outers, outer_vars, d_last, summed) -> list:
    """The backward's initial carries: each state's incoming gradient (or zeros), zero sums."""
    starts = [d if d is not None else g.fill(g.shape(init), 0, v.dtype)
              for d, init, v in zip(d_last, inits, init_vars)]
    return starts + [g.fill(g.shape(outers[j]), 0, outer_vars[j].dtype) for j in summed]


def _grad_results(g, a: dict, lay: RnnLayout, fetch_seq: list, stacks: dict, dstate: list, acc: dict,
                  exact: bool = False) -> list:
    """The gradients of ``a["grad_of"]``'s positions, stacks in time order; ``exact``: a stack
    of the sequence's rank has its shape already (a Scan's), so no Reshape (onnxruntime copies
    a Reshape's input when, as here, the time-batched products read it too)."""
    seqs, _, _, outers = lay.split(g.ins)
    seq_vars, _, _, outer_vars = lay.split(g.in_vars)
    n_seq, k = lay.n_seq, lay.n_state
    results = []
    for position in a["grad_of"]:
        if position < n_seq:
            name = fetch_seq[position]
            shape = g.shape(seqs[position])
            if name and exact and a["backward"].find_var(name).ndim + 1 == seq_vars[position].ndim:
                results.append(stacks[name])
                continue
            results.append(g.node("Reshape", [stacks[name], shape], allowzero=1) if name
                           else g.fill(shape, 0, seq_vars[position].dtype))
        elif position < n_seq + k:
            results.append(dstate[position - n_seq])
        else:
            j = position - lay.outer_start
            results.append(acc[j] if j in acc else g.fill(g.shape(outers[j]), 0, outer_vars[j].dtype))
    return results


def _add_time_batched(g, a, block, acc: dict, stacks: dict, seqs, alls, shifted, saved, saved_names) -> None:
    """``acc[j] += A^T D`` for each gradient batched over time (``TimeBatches.products``);
    ``shifted``: per state, the state before each step ([T, ...])."""
    sources = {"seq": seqs, "new": alls, "prev": shifted}
    for j, kind, ref, d in a["batched"]:
        if kind == "value":
            stack = saved[saved_names.index(ref)] if ref in saved_names else stacks[ref]
        else:
            stack = sources[kind][ref]
        # A^T D (+ acc) as one Gemm: reads A transposed faster than Transpose + MatMul (FusedMatMul)
        rows = [_rows_onnx(g, stack), _rows_onnx(g, stacks[d], block.find_var(d).shape[-1])]
        acc[j] = g.node("Gemm", rows + ([acc[j]] if j in acc else []), transA=1)


def _rows_onnx(g, stack: str, width: int = -1) -> str:
    """``stack [T, N, ..., W]`` as ``[T*N*..., W]`` (W from the Var when known, else at run time)."""
    if width >= 0:
        return g.node("Reshape", [stack, g.const([-1, width], "int64")])
    return g.node("Reshape", [stack, g.node("Concat", [g.const([-1], "int64"),
                                                      g.node("Shape", [stack], start=-1)], axis=0)])


# --- Scan forms: what runs when T > 0 ------------------------------------------------------------
# onnxruntime's Loop keeps each iteration's outputs apart and concatenates them after the last one
# (a copy of every [T, ...] stack), and the backward's stacks, built for t = T-1..0, were flipped
# (another copy); its Scan writes each step's outputs into the stack in place, in either direction,
# and hands the body views of the steps of its sequences (no Gather per step). Scan refuses zero
# steps, so an If runs it only when T > 0, else the Loop form above.

def _if_steps(g, seq: str, first: str | None, types: list[tuple[str, int]], scan, loop) -> list[str]:
    """``If(T > 0 [and first])``: ``scan(g')`` in the then-branch, ``loop(g')`` in the else-branch,
    each returning values of ``types`` ((dtype, rank) pairs); ``loop(g)`` alone where the model
    asks for plain Loops (``rg.onnx.export``: every recurrent op becomes a Loop)."""
    if not g.graph.names.scan_loops:
        return loop(g)
    pred = g.node("Greater", [g.scalar_dim(seq, 0), g.const(0, "int64")])
    if first is not None:
        pred = g.node("And", [first, pred])
    branches = []
    for part, build in (("scan", scan), ("loop", loop)):
        branch = g.child()
        values = build(branch)
        branches.append(branch.finish(f"{g.op.outputs[0]}.{part}",
                                      [(v, dtype, [None] * rank) for v, (dtype, rank) in zip(values, types)]))
    return g.nodes("If", [pred], len(types), then_branch=branches[0], else_branch=branches[1])


def _steps_onnx(g, seq: str) -> str:
    """``range(T)`` (int64): the step numbers, scanned beside the sequences where the body needs t."""
    return g.node("Range", [g.const(0, "int64"), g.scalar_dim(seq, 0), g.const(1, "int64")])


def _forward_scan(g, attrs: dict, lay: RnnLayout, saved: Sequence[str]) -> tuple[list, list, list]:
    """``forward_loop_onnx``'s values for T > 0, from one Scan."""
    seqs, inits, lengths, outers = lay.split(g.ins)
    k, step = lay.n_state, attrs["step"]
    body = g.child()
    prev = [body.input(name, step.var(name).dtype) for name in attrs["states"]]
    binds = dict(zip(g.op.inputs[lay.outer_start:lay.n_inputs], outers))
    binds.update(zip(attrs["states"], prev))
    binds.update({name: body.input(name, step.var(name).dtype) for name in attrs["inputs_t"]})
    scanned = list(seqs)
    t = None
    if lengths is not None or attrs.get("timestep") or "rng_id" in attrs:
        t = body.input("t", "int64", [])
        scanned.append(_steps_onnx(g, seqs[0]))
        body.stream(t)
    if attrs.get("timestep"):
        binds[attrs["timestep"]] = timestep_onnx(body, step.var(attrs["timestep"]), t)
    values = body.lower(step, binds, list(attrs["state_outs"]) + list(saved))
    _hoist_big_weights(g, body, step, binds)
    new = values[:k]
    if lengths is not None:   # finished examples keep their state
        new = [body.node("Where", [step_mask_onnx(body, lengths, t, step.var(name).ndim), v, p])
               for v, p, name in zip(new, prev, attrs["states"])]
    state_vars = [step.var(n) for n in attrs["states"]]
    outputs = (list(zip(new, state_vars)) + list(zip(new, state_vars))
               + [(v, step.var(n)) for v, n in zip(values[k:], saved)])
    outs = g.nodes("Scan", [*inits, *scanned], len(outputs), num_scan_inputs=len(scanned),
                   body=body.finish(f"{g.op.outputs[0]}.step", outputs))
    return outs[k:2 * k], outs[:k], outs[2 * k:]


def _backward_scan(g, attrs: dict, lay: RnnLayout, alls: list, saved: list, saved_names: Sequence[str],
                   d_all: list, d_last: list) -> list:
    """``backward_loop_onnx``'s gradients for T > 0, from one Scan over t = T-1..0 whose stacks
    come out in time order."""
    a = attrs
    seqs, inits, lengths, outers = lay.split(g.ins)
    _, init_vars, _, outer_vars = lay.split(g.in_vars)
    block, k = a["backward"], lay.n_state
    saved_names = list(saved_names)
    zero, last = g.const([0], "int64"), g.const([-1], "int64")
    shifted = [g.node("Slice", [with_first_onnx(g, init, all_), zero, last, zero])      # state before step t
               for init, all_ in zip(inits, alls)]
    fetch_seq, summed, per_step = _backward_fetches(a, saved_names)
    body = g.child()
    dcur = [body.input(f"{n}.dcur", v.dtype) for n, v in zip(a["dnext"], init_vars)]
    accs = [body.input(f"{g.op.inputs[lay.outer_start + j]}.acc", outer_vars[j].dtype) for j in summed]
    scanned = []

    def step_of(stack: str, hint: str, dtype: str) -> str:
        scanned.append(stack)
        return body.input(hint, dtype)
    d_steps = [step_of(d, f"{n}.dall", v.dtype) if d is not None else None
               for d, n, v in zip(d_all, a["dnext"], init_vars)]
    reads = set(free_reads(block))
    binds = dict(zip(g.op.inputs[lay.outer_start:lay.n_inputs], outers))
    for names, stacks in ((a["inputs_t"], seqs), (a["states"], shifted), (a["state_outs"], alls),
                          (saved_names, saved)):
        binds.update({n: step_of(s, n, block.var(n).dtype) for n, s in zip(names, stacks) if n in reads})
    t = None
    if lengths is not None or (a.get("timestep") and a["timestep"] in block.vars) or "rng_id" in a \
            or not scanned:   # (a Scan needs a sequence)
        t = step_of(_steps_onnx(g, seqs[0]), "t", "int64")
        body.stream(t)     # step t of the backward replays forward step t's draws
    carries = []
    for i in range(k):
        dn = dcur[i] if d_steps[i] is None else body.node("Add", [dcur[i], d_steps[i]])
        dn, carry = _split_by_length(body, lengths, t, init_vars[i], dn)
        binds[a["dnext"][i]] = dn
        carries.append(carry)
    if a.get("timestep") and a["timestep"] in block.vars:
        binds[a["timestep"]] = timestep_onnx(body, block.var(a["timestep"]), t)
    new_dcur, new_accs, values = _backward_step(body, a, block, binds, dcur, accs, carries, init_vars,
                                                summed, per_step)
    outputs = (list(zip(new_dcur, init_vars)) + [(v, outer_vars[j]) for v, j in zip(new_accs, summed)]
               + [(values[n], block.find_var(n)) for n in per_step])
    outs = g.nodes("Scan", [*_backward_starts(g, inits, init_vars, outers, outer_vars, d_last, summed), *scanned],
                   len(outputs), num_scan_inputs=len(scanned), scan_input_directions=[1] * len(scanned),
                   scan_output_directions=[1] * len(per_step) or None,
                   body=body.finish(f"{g.op.outputs[0]}.step", outputs))
    dstate, acc = outs[:k], dict(zip(summed, outs[k:k + len(summed)]))
    stacks = dict(zip(per_step, outs[k + len(summed):]))
    _add_time_batched(g, a, block, acc, stacks, seqs, alls, shifted, saved, saved_names)
    return _grad_results(g, a, lay, fetch_seq, stacks, dstate, acc, exact=True)


BIG_WEIGHT = 1 << 18      # elements (1 MiB of float32): more than a core's L2 holds beside the rest


def _hoist_big_weights(g, body, step, binds: dict) -> None:
    """Rewrite the step's ``x [N, K] @ w [K, M]`` products with a big loop-invariant ``w`` (an
    outer value) as ``(w^T x^T)^T``: ``Gemm(w^T, x, transB=1)`` and a ``Transpose``, ``w^T``
    made once before the Scan. onnxruntime packs a MatMul's right operand on every call (w:
    ``K*M`` elements per step) but reads the left one in place, so the big operand goes left:
    e.g. [64, 512] @ [512, 2048] per step 1.18 -> 0.96 ms; below ``BIG_WEIGHT`` it gains
    nothing (one node more per step). Same sums, in the same order per output element."""
    eligible = {}
    for op in step.ops:
        if op.type != "MatMul" or op.attrs.get("transpose_x") or op.attrs.get("transpose_y"):
            continue
        x, w = (step.find_var(n) for n in op.inputs)
        outer = binds.get(op.inputs[1])
        if (outer is None or op.inputs[1] in step.vars or x is None or w is None or x.ndim != 2 or w.ndim != 2
                or min(w.shape) < 0 or w.shape[0] * w.shape[1] < BIG_WEIGHT or w.dtype not in ("float32", "float64")):
            continue
        eligible[op.outputs[0]] = outer
    transposed: dict[str, str] = {}
    nodes = body.graph.nodes
    for index in reversed(range(len(nodes))):
        node = nodes[index]
        base = node.output[0].split("__")[0] if node.output else ""
        if node.op_type != "MatMul" or eligible.get(base) != node.input[1]:
            continue
        if node.input[1] not in transposed:
            transposed[node.input[1]] = g.node("Transpose", [node.input[1]], perm=[1, 0])
        flipped = body.graph.node("Gemm", [transposed[node.input[1]], node.input[0]], transB=1,
                                  hint=f"{base}.t")
        body.graph.node("Transpose", [flipped], perm=[1, 0], hint=base)
        gemm, transpose = nodes[-2:]
        transpose.output[0] = node.output[0]           # the product keeps its value name
        nodes[index:index + 1] = [gemm, transpose]
        del nodes[-2:]
