"""The backward of ``RecurrentNetwork``: a backward step block and the ``RecurrentNetworkGrad`` op.

The gradient maker builds, once, a *backward step block* (a child of the
step block, so it sees the step's values) with ``build_backward``: from the
gradients of the step's results (``dnext``, bound per step) to the gradients
of the step inputs, the previous states and the outer values. Two rewrites
of that block follow, both visible in the printed program:

* **batching over time** (``ROW_SUMS``): an outer gradient that is a sum
  over rows, ``dW += a_t^T @ d_t``, leaves the block; the op keeps ``d_t`` for
  every step in one ``[T, N, M]`` buffer and computes ``A^T @ D`` once after
  the loop (one large GEMM instead of T thin ones);
* **recomputation** (``recompute="steps"`` or ``recompute_blobs_on_backward``):
  copies of the forward ops that produce the chosen step values are put at
  the start of the block, so those values are recomputed instead of stored.

What the block then reads of the step's intermediates is stored by the
forward op (``saved``), each as one ``[T, ...]`` tensor; a value read only for
its shape (the ``like`` of ``SumTo``, ...) is stored as a zero-stride view.

``RecurrentNetworkGrad`` runs the block for t = T-1 .. 0::

    dnext_i  = d(all_i)[t] + (t == T-1 ? d(last_i) : 0) + dprev_i from step t+1
               (rows past their length pass dnext straight on to dprev)
    run block: step inputs = seq[t], prev states = slot t, results = slot t+1, saved[t]
    dseq[t]  = d(input_t)        written into one preallocated [T, N, ...] buffer
    acc_o   += d(outer o)        one buffer per outer value, owned by the op, never aliased
    D[t]     = d_t               for the batched outer gradients

No gradient buffer is ever an alias of another one, so running the same
program with a larger, then smaller batch gives right answers (the Caffe2
alias-and-swap bug in the seed ``caffe2-recurrent-param-grad-alias-fix``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from ...errors import ProgramError, ShapeError
from ...ir.analysis import op_reads
from ...ir.dtypes import is_float
from ...ir.program import Block, Op, Var
from ..core import streams
from .network_onnx import backward_loop_onnx
from .steps import (Held, RnnLayout, StepRunner, add_optional, budget_variant, fresh_name,
                    is_budget, per_state, step_mask, time_steps, timestep_value)
from ..core.lowering import lowers
from .network_grad_scan import rnn_grad_grad
from ..core.registry import GradCtx, append_op, build_sub_backward, defop, get_op_def


# --- Rewrite rules ------------------------------------------------------------------------------

def _matmul_row_sum(op: Op) -> tuple[str, str] | None:
    """``matmul(a, d, transpose_x=True)`` is ``sum over rows r of a[r]^T d[r]``."""
    if op.attrs.get("transpose_x") and not op.attrs.get("transpose_y"):
        return op.inputs[0], op.inputs[1]
    return None


# Ops whose result, for 2-D per-step operands (a_t, d_t), is sum_rows(a_t^T d_t): summed over
# time it is the same op on the steps stacked along the rows. One entry per op type.
ROW_SUMS: dict[str, Callable[[Op], tuple[str, str] | None]] = {"MatMul": _matmul_row_sum}


def shape_only_inputs(op: Op) -> frozenset[int]:
    """Input positions the op reads only for their run-time shape (OpDef extra ``shape_only``)."""
    return frozenset(get_op_def(op.type).extra.get("shape_only", ()))


# --- The backward step ---------------------------------------------------------------------------

@dataclass
class BackwardStep:
    """The backward step block and how the grad op drives it."""
    block: Block
    dnext: list[str]                       # per state: the bound incoming gradient
    fetch_seq: list[str | None]            # per sequence: d(input_t) in the block
    fetch_state: list[str | None]          # per state: d(previous state)
    fetch_outer: list[str | None]          # per outer value: its per-step gradient left in the block
    batched: list[list] = field(default_factory=list)   # [outer index, A kind, A ref, D name]
    saved: list[str] = field(default_factory=list)      # step values read with their data
    saved_shape: list[str] = field(default_factory=list)  # step values read only for their shape


class _StepNames:
    """The roles of the step block's names, for one RecurrentNetwork op."""

    def __init__(self, op: Op):
        attrs = op.attrs
        self.step: Block = attrs["step"]
        self.lay = RnnLayout.of(attrs, len(op.inputs))
        self.inputs_t = list(attrs["inputs_t"])
        self.states = list(attrs["states"])
        self.state_outs = list(attrs["state_outs"])
        self.timestep = attrs.get("timestep")
        self.outers = list(op.inputs[self.lay.outer_start:])
        bound = set(self.inputs_t) | set(self.states) | set(self.state_outs) | {self.timestep}
        self.intermediates = {n for n in self.step.vars if n not in bound}


def build_backward_step(op: Op, wanted: list[bool], parent: Block | None = None,
                        callbacks: Sequence[Callable] = ()) -> BackwardStep:
    """Build the backward step block of RecurrentNetwork ``op`` for the wanted input gradients.

    The block is built as a child of the step block (so gradient makers see
    the step's values); with ``parent`` it is then moved under ``parent`` (the
    block the gradient op goes into, which need not see the step block: a
    while loop's backward), declaring the step values it uses as its own.
    ``callbacks`` (``append_backward``'s) are called for its gradient ops too.
    """
    names = _StepNames(op)
    step, lay = names.step, names.lay
    program = step.program
    block = program.create_block(step)
    dnext, targets = [], {}
    for out in names.state_outs:
        var = step.var(out)
        d = block.create_var(fresh_name(program, f"{out}.dnext"), var.shape, var.dtype)
        dnext.append(d.name)
        if is_float(var.dtype):
            targets[out] = d
    wanted_seq = wanted[:lay.n_seq]
    wanted_outer = wanted[lay.outer_start:lay.n_inputs]
    wrt = [n for n, w in zip(names.inputs_t, wanted_seq) if w]
    wrt += [n for n in names.states if is_float(step.var(n).dtype)]
    wrt += [n for n, w in zip(names.outers, wanted_outer) if w]
    result = build_sub_backward(list(step.ops), step, block, targets, wrt, callbacks=callbacks)
    # Control-flow ops in the step add outputs (values their backward keeps) while it is built.
    names.intermediates = _StepNames(op).intermediates

    def grad_name(name: str, want: bool = True) -> str | None:
        grad = result.grads.get(name) if want else None
        return None if grad is None else grad.name

    bstep = BackwardStep(
        block=block, dnext=dnext,
        fetch_seq=[grad_name(n, w) for n, w in zip(names.inputs_t, wanted_seq)],
        fetch_state=[grad_name(n) for n in names.states],
        fetch_outer=[grad_name(n, w) for n, w in zip(names.outers, wanted_outer)])
    batched_a = _batch_over_time(bstep, names)
    _insert_recompute(bstep, names, recomputable(op.attrs.get("recompute"), names), batched_a)
    _choose_saved(bstep, names)
    _drop_unused_vars(block, set(dnext))
    if parent is not None:
        _move_under(block, step, parent)
    return bstep


def _move_under(block: Block, step: Block, parent: Block) -> None:
    """Re-parent ``block`` under ``parent``; the step values it reads or writes become its own Vars
    (bound by the gradient op, or written by its recompute copies)."""
    names: dict[str, None] = {}
    for op in block.ops:
        names.update(dict.fromkeys(op_reads(op) + list(op.outputs)))
    for name in names:
        var = step.vars.get(name)
        if var is not None and name not in block.vars:
            block.create_var(name, var.shape, var.dtype)
    block.parent_idx = parent.idx
    block.program.bump()


def _drop_unused_vars(block: Block, keep: set[str]) -> None:
    """Forget Vars whose ops were pruned or moved out (else they would print as bound inputs)."""
    used = {n for op in block.ops for n in list(op_reads(op)) + list(op.outputs)}
    for name in [n for n in block.vars if n not in used and n not in keep]:
        del block.vars[name]
    block.program.bump()


def _readers(block: Block, name: str) -> list[Op]:
    return [op for op in block.ops if name in op_reads(op)]


def _producer(block: Block, name: str) -> Op | None:
    for op in reversed(block.ops):
        if name in op.outputs:
            return op
    return None


def _batch_over_time(bstep: BackwardStep, names: _StepNames) -> set[str]:
    """Move outer gradients of the form sum_t a_t^T d_t out of the block; return the step values used as A."""
    block, step = bstep.block, names.step
    fetched = set(filter(None, bstep.fetch_seq + bstep.fetch_state))
    used_a: set[str] = set()
    for j, grad in enumerate(bstep.fetch_outer):
        if grad is None or grad in fetched or bstep.fetch_outer.count(grad) > 1:
            continue
        producer = _producer(block, grad)
        if producer is None:
            continue
        # build_backward sums concurrent contributions with AddN; look through it.
        parts = list(producer.inputs) if _sums_inputs(producer) else [grad]
        kept = []
        for part in parts:
            found = _row_sum(block, step, part, parts, producer, fetched)
            if found is None:
                kept.append(part)
                continue
            part_op, a, d = found
            block.remove_op(block.ops.index(part_op))
            bstep.batched.append([j, *_a_source(a, names), d])
            used_a.add(a)
        if len(kept) == len(parts):
            continue
        if _sums_inputs(producer) and len(kept) >= 2:
            producer.inputs = kept
            block.program.bump()
            continue
        if _sums_inputs(producer):
            block.remove_op(block.ops.index(producer))
        bstep.fetch_outer[j] = kept[0] if kept else None
    return {a for a in used_a if a in names.intermediates}


def _sums_inputs(op: Op) -> bool:
    """True for ops that only add their inputs (how build_backward sums contributions)."""
    return bool(get_op_def(op.type).extra.get("sums_inputs"))


def _row_sum(block: Block, step: Block, part: str, parts: list[str], addn: Op, fetched: set[str]):
    """(op, a, d) when ``part`` is written by a ROW_SUMS op over 2-D per-step values and used only here."""
    op = _producer(block, part)
    rule = ROW_SUMS.get(op.type) if op is not None else None
    found = rule(op) if rule is not None else None
    if found is None or part in fetched or parts.count(part) > 1:
        return None
    readers = _readers(block, part)
    if any(r is not addn for r in readers) or (not _sums_inputs(addn) and readers):
        return None
    a, d = found
    if _producer(block, d) is None:   # d_t must be a backward value (not a forward one: x @ V^T gives d = x)
        return None
    for name in (a, d):
        var = block.find_var(name)
        if var is None or var.ndim != 2 or var.block not in (block, step):
            return None
    return op, a, d


def _a_source(a: str, names: _StepNames) -> list:
    """Where the stacked A of a batched product comes from: [kind, ref]."""
    if a in names.inputs_t:
        return ["seq", names.inputs_t.index(a)]
    if a in names.states:
        return ["prev", names.states.index(a)]
    if a in names.state_outs:
        return ["new", names.state_outs.index(a)]
    return ["value", a]  # a step intermediate (stored or recomputed) or a backward value: fetched per step


def _value_reads(block: Block) -> dict[str, bool]:
    """Names the block reads before writing them -> whether any read needs the data (not just the shape)."""
    written: set[str] = set()
    reads: dict[str, bool] = {}
    for op in block.ops:
        shape_only = shape_only_inputs(op)
        for i, name in enumerate(op.inputs):
            if name not in written:
                reads[name] = reads.get(name, False) or i not in shape_only
        for name in op_reads(op)[len(op.inputs):]:
            if name not in written:
                reads[name] = True
        written.update(op.outputs)
    return reads


def recomputable(policy, names: _StepNames) -> set[str]:
    """The policy: which step values the backward recomputes rather than reads stored.

    ``"steps"``: every intermediate; a list: those named (``recompute_blobs_on_backward``);
    None: none. Values made from nothing (constants, fills) always are: storing T copies is waste.
    """
    allowed = set(names.intermediates) if policy == "steps" else set(policy or ())
    return allowed | {n for op in names.step.ops if not op.inputs for n in op.outputs}


def _insert_recompute(bstep: BackwardStep, names: _StepNames, allowed: set[str], batched_a: set[str]) -> None:
    """The mechanism: copies of the forward ops producing the ``allowed`` values the backward
    needs go at the start of the block (ops with sub-blocks are never copied)."""
    reads = _value_reads(bstep.block)
    need = {n for n, full in reads.items() if full and n in names.intermediates} | batched_a
    clones = []
    for op in reversed(names.step.ops):
        outs = set(op.outputs)
        if not outs & need & allowed or op.sub_blocks():   # random ops replay: same stream (rng_id, t)
            continue
        clones.append(Op(op.type, list(op.inputs), list(op.outputs), dict(op.attrs),
                          location=op.location))
        need -= outs
        need |= {n for n in op.inputs if n in names.intermediates}
    for i, clone in enumerate(reversed(clones)):
        bstep.block.insert_op(i, clone)


def _choose_saved(bstep: BackwardStep, names: _StepNames) -> None:
    """What the forward must store per step: intermediates the block reads (data or shape only)."""
    block = bstep.block
    written = {n for op in block.ops for n in op.outputs}
    reads = _value_reads(block)
    for entry in bstep.batched:
        if entry[1] == "value" and entry[2] in names.intermediates and entry[2] not in written:
            reads[entry[2]] = True
    for name, full in reads.items():
        if name in names.intermediates:
            (bstep.saved if full else bstep.saved_shape).append(name)
    unknown = [n for n in reads if n not in names.intermediates and n not in block.vars
               and n not in names.outers and n not in names.inputs_t and n not in names.states
               and n not in names.state_outs and n != names.timestep]
    if unknown:
        raise ProgramError(f"backward step block {block.idx} reads {', '.join(unknown)}, which the "
                           "RecurrentNetwork op does not bind")


# --- The gradient maker ----------------------------------------------------------------------------

def gradient_request(g: GradCtx):
    """``(layout, output grads, wanted input grads)`` for a RecurrentNetwork, or None if no gradient.

    Shared by the store-all and the budgeted gradient makers: honours
    ``outputs_with_grads``, never differentiates ``seq_lengths`` or integer
    inputs, and refuses a gradient through a ``forward_only`` op.
    """
    op, attrs = g.op, g.attrs
    lay = RnnLayout.of(attrs, len(op.inputs))
    owg = attrs.get("outputs_with_grads")
    douts = [d if owg is None or i in owg else None for i, d in enumerate(g.dout[:2 * lay.n_state])]
    wanted = [bool(w) and is_float(x.dtype) for w, x in zip(g.wanted, g.x)]
    if lay.has_lengths:
        wanted[lay.n_seq + lay.n_state] = False
    if all(d is None for d in douts) or not any(wanted):
        return None
    if attrs.get("forward_only"):
        raise ProgramError(f"{op.where()} was built with forward_only=True, but a gradient flows through "
                           f"it (to '{op.outputs[0]}' ...); build it with forward_only=False")
    return lay, douts, wanted


def rnn_grad_maker(g: GradCtx) -> list[Var | None]:
    """RecurrentNetwork's gradient: one RecurrentNetworkGrad op over a backward step block."""
    op, attrs = g.op, g.attrs
    if is_budget(attrs.get("recompute")):   # recompute=<bytes>: checkpointed over time steps
        return budget_variant("RecurrentNetwork").grad(g)
    request = gradient_request(g)
    if request is None:
        return [None] * len(op.inputs)
    lay, douts, wanted = request
    k = lay.n_state
    bstep = build_backward_step(op, wanted, parent=g.block, callbacks=g.callbacks)
    saved_vars = _keep_saved(op, bstep)
    alls = [g.block.var(n) for n in op.outputs[0:2 * k:2]]
    d_all, d_last = douts[0::2], douts[1::2]
    inputs = list(g.x[:lay.n_inputs]) + alls + saved_vars
    inputs += [d for d in d_all if d is not None] + [d for d in d_last if d is not None]
    grad_of = [i for i, w in enumerate(wanted) if w]
    grad_attrs = {
        "backward": bstep.block,
        "inputs_t": list(attrs["inputs_t"]), "states": list(attrs["states"]),
        "state_outs": list(attrs["state_outs"]), "timestep": attrs.get("timestep"),
        "has_lengths": lay.has_lengths, "n_outer": lay.n_outer,
        "saved": bstep.saved + bstep.saved_shape,
        "dall_given": [d is not None for d in d_all], "dlast_given": [d is not None for d in d_last],
        "dnext": bstep.dnext, "fetch_seq": bstep.fetch_seq, "fetch_state": bstep.fetch_state,
        "fetch_outer": bstep.fetch_outer, "batched": bstep.batched, "grad_of": grad_of,
        "step_block": attrs["step"].idx,   # the forward step, recomputed by the second derivative
    }
    streams.copy_stream(attrs, grad_attrs)   # step t of the backward replays forward step t's draws
    outs = append_op("RecurrentNetworkGrad", inputs, grad_attrs, name="rnn_grad")
    grads: list[Var | None] = [None] * len(op.inputs)
    for position, out in zip(grad_of, outs):
        grads[position] = out
    return grads


def _keep_saved(op: Op, bstep: BackwardStep) -> list[Var]:
    """Make the forward op output the step values the backward reads; return their [T, ...] Vars."""
    attrs = op.attrs
    saved, full = list(attrs.get("saved", ())), list(attrs.get("saved_full", ()))
    block = op.block
    base = 2 * len(attrs["states"])
    for name, keep_data in [(n, True) for n in bstep.saved] + [(n, False) for n in bstep.saved_shape]:
        if name in saved:
            full[saved.index(name)] = full[saved.index(name)] or keep_data
            continue
        var = attrs["step"].var(name)
        steps = block.var(op.outputs[0]).shape[0]
        out = block.create_var(fresh_name(block.program, f"{name}.steps"), (steps,) + var.shape, var.dtype)
        op.outputs.append(out.name)
        saved.append(name)
        full.append(keep_data)
    attrs["saved"], attrs["saved_full"] = saved, full
    block.program.bump()
    return [block.var(op.outputs[base + saved.index(n)]) for n in bstep.saved + bstep.saved_shape]


# --- RecurrentNetworkGrad ------------------------------------------------------------------------

@dataclass(frozen=True)
class _GradLayout:
    fwd: RnnLayout
    n_saved: int
    n_dall: int
    n_dlast: int

    @staticmethod
    def of(attrs: dict) -> "_GradLayout":
        n_seq, n_state = len(attrs["inputs_t"]), len(attrs["states"])
        fwd = RnnLayout(n_seq, n_state, bool(attrs["has_lengths"]), int(attrs["n_outer"]))
        return _GradLayout(fwd, len(attrs["saved"]), sum(map(bool, attrs["dall_given"])),
                           sum(map(bool, attrs["dlast_given"])))

    def split(self, items):
        """(forward inputs, state alls, saved, d_all per state (None if absent), d_last per state)."""
        n = self.fwd.n_inputs
        k = self.fwd.n_state
        fwd, rest = list(items[:n]), list(items[n:])
        alls, rest = rest[:k], rest[k:]
        saved, rest = rest[:self.n_saved], rest[self.n_saved:]
        return fwd, alls, saved, rest[:self.n_dall], rest[self.n_dall:self.n_dall + self.n_dlast]


def _grad_rule(ins: list[Var], attrs: dict):
    lay = _GradLayout.of(attrs)
    expected = lay.fwd.n_inputs + lay.fwd.n_state + lay.n_saved + lay.n_dall + lay.n_dlast
    if len(ins) != expected:
        raise ShapeError(f"expects {expected} inputs from its attributes, got {len(ins)}")
    return [(ins[i].shape, ins[i].dtype) for i in attrs["grad_of"]]


@defop("RecurrentNetworkGrad", inputs=("forward_inputs*", "state_alls*", "saved*", "d_all*", "d_last*"),
       outputs=("grads*",), infer=_grad_rule, grad=rnn_grad_grad)
def _rnn_grad_kernel(k, *arrays):
    """Run the backward step block in reverse time; return the gradients listed in ``grad_of``."""
    attrs, xp, op, run = k.attrs, k.xp, k.op, k.run
    lay = _GradLayout.of(attrs)
    fwd, alls, saved, d_all, d_last = lay.split(arrays)
    d_all, d_last = per_state(attrs["dall_given"], d_all), per_state(attrs["dlast_given"], d_last)
    seqs, inits, lengths, outers = lay.fwd.split(fwd)
    steps = time_steps(op, seqs)
    block: Block = attrs["backward"]
    held = Held(run.meter)
    grad_of = set(attrs["grad_of"])
    n_seq, n_state = lay.fwd.n_seq, lay.fwd.n_state
    dseq = [held.add(xp.empty(seq.shape, dtype=seq.dtype) if name else xp.zeros(seq.shape, dtype=seq.dtype))
            if i in grad_of else None
            for i, (seq, name) in enumerate(zip(seqs, attrs["fetch_seq"]))]
    fetch_seq = [name if dseq[i] is not None else None for i, name in enumerate(attrs["fetch_seq"])]
    collect = TimeBatches(xp, held, steps, attrs["batched"], fetch_seq, attrs["saved"])
    fetch = [n for n in fetch_seq + attrs["fetch_state"] + attrs["fetch_outer"] if n] + collect.names
    index = {name: i for i, name in enumerate(fetch)}
    acc: list = [None] * lay.fwd.n_outer
    bindings = dict(zip(op.inputs[lay.fwd.outer_start:lay.fwd.n_inputs], outers))
    dcur: list = list(d_last)   # gradient arriving at slot t+1 from later steps; None = zero
    zeros = [None] * n_state
    timestep = attrs.get("timestep")
    if timestep and timestep not in block.vars:
        timestep = None        # the backward step does not read it
    bound = (list(bindings) + attrs["dnext"] + attrs["inputs_t"] + attrs["states"] + attrs["state_outs"]
             + list(attrs["saved"]) + ([timestep] if timestep else []))
    run_step = StepRunner(op, run, block, bound, fetch)
    for t in range(steps - 1, -1, -1):
        carry = [None] * n_state
        for i in range(n_state):
            dn = add_optional(dcur[i], None if d_all[i] is None else d_all[i][t, ...])
            if dn is None:
                if zeros[i] is None:
                    zeros[i] = xp.zeros(inits[i].shape, dtype=inits[i].dtype)
                dn = zeros[i]
            elif lengths is not None:
                mask = step_mask(xp, lengths, t, dn.ndim)
                carry[i] = xp.where(mask, xp.zeros_like(dn), dn)
                dn = xp.where(mask, dn, xp.zeros_like(dn))
            bindings[attrs["dnext"][i]] = dn
        for name, seq in zip(attrs["inputs_t"], seqs):
            bindings[name] = seq[t, ...]
        for i, (name, out) in enumerate(zip(attrs["states"], attrs["state_outs"])):
            bindings[name] = inits[i] if t == 0 else alls[i][t - 1, ...]
            bindings[out] = alls[i][t, ...]
        for name, values in zip(attrs["saved"], saved):
            bindings[name] = values[t, ...]
        if timestep:
            bindings[timestep] = timestep_value(xp, block, timestep, t)
        values = run_step(bindings, streams.stream(attrs, t))   # forward step t's random stream
        for i, name in enumerate(fetch_seq):
            if name:
                dseq[i][t, ...] = values[index[name]]
        for i, name in enumerate(attrs["fetch_state"]):
            dcur[i] = add_optional(values[index[name]] if name else None, carry[i])
        for j, name in enumerate(attrs["fetch_outer"]):
            if name:
                value = values[index[name]]
                if acc[j] is None:
                    acc[j] = held.add(xp.asarray(value, copy=True))
                else:
                    acc[j] += value
        collect.store(t, values, index, dseq)
    for j, product in collect.products(seqs, inits, alls, saved, dseq):
        acc[j] = product if acc[j] is None else acc[j] + product
    held.release()
    results = []
    for position in attrs["grad_of"]:
        if position < n_seq:
            results.append(dseq[position])
        elif position < n_seq + n_state:
            i = position - n_seq
            results.append(dcur[i] if dcur[i] is not None else xp.zeros(inits[i].shape, dtype=inits[i].dtype))
        else:
            j = position - lay.fwd.outer_start
            results.append(acc[j] if acc[j] is not None else xp.zeros(outers[j].shape, dtype=outers[j].dtype))
    return results[0] if len(results) == 1 else tuple(results)


@lowers("RecurrentNetworkGrad")
def _rnn_grad_onnx(g):
    """A Loop over t = T-1..0 doing what the kernel above does (``recurrent_onnx.py``)."""
    a, lay = g.attrs, _GradLayout.of(g.attrs)
    _, alls, saved, d_all, d_last = lay.split(g.ins)
    return backward_loop_onnx(g, a, lay.fwd, alls, saved, a["saved"], per_state(a["dall_given"], d_all),
                              per_state(a["dlast_given"], d_last))


class TimeBatches:
    """Per-step values kept in [T, ...] buffers for the gradients batched over time."""

    def __init__(self, xp, held: Held, steps: int, batched: list, fetch_seq: list, saved_names: list):
        self.xp, self.held, self.steps = xp, held, steps
        self.batched = batched
        self.saved_names = list(saved_names)
        names = []
        for _, kind, ref, d in batched:
            names.append(d)
            if kind == "value" and ref not in self.saved_names:
                names.append(ref)
        self.names = list(dict.fromkeys(names))
        self.buffers: dict[str, object] = {}
        self.fetch_seq = fetch_seq
        self.alias: dict[str, int] = {}     # name -> sequence whose gradient buffer already holds it

    def store(self, t: int, values: list, index: dict, dseq: list) -> None:
        for name in self.names:
            value = values[index[name]]
            seq = self.alias.get(name)
            if seq is not None and value is values[index[self.fetch_seq[seq]]]:
                continue
            buf = self.buffers.get(name)
            if buf is None:
                seq = self._same_as_seq(name, value, values, index) if t == self.steps - 1 else None
                if seq is not None:
                    self.alias[name] = seq
                    continue
                buf = self.held.add(self.xp.empty((self.steps,) + tuple(value.shape), dtype=value.dtype))
                if name in self.alias:   # was the same array as d(input_t) so far; no longer
                    buf[t + 1:, ...] = dseq[self.alias.pop(name)][t + 1:, ...]
                self.buffers[name] = buf
            buf[t, ...] = value

    def _same_as_seq(self, name, value, values, index):
        for i, seq_name in enumerate(self.fetch_seq):
            if seq_name and values[index[seq_name]] is value:
                return i
        return None

    def stacked(self, name: str, dseq: list):
        if name in self.alias:
            return dseq[self.alias[name]]
        return self.buffers[name]

    def products(self, seqs, inits, alls, saved, dseq_buffers):
        """(outer index, sum_t a_t^T d_t) for each batched gradient (none when there are no steps)."""
        xp = self.xp
        saved_names = self.saved_names
        if self.steps == 0:
            return
        for j, kind, ref, d in self.batched:
            dstack = self.stacked(d, dseq_buffers)
            width = dstack.shape[-1]
            d2 = xp.reshape(dstack, (-1, width))
            if kind == "prev":   # slot t of the states: the initial state, then all[:-1]
                first = xp.matmul(inits[ref].T, dstack[0, ...])
                if self.steps > 1:
                    rest = xp.reshape(alls[ref][:-1, ...], (-1, alls[ref].shape[-1]))
                    first = first + xp.matmul(rest.T, xp.reshape(dstack[1:, ...], (-1, width)))
                yield j, first
                continue
            if kind == "seq":
                a = seqs[ref]
            elif kind == "new":
                a = alls[ref]
            elif ref in saved_names:
                a = saved[saved_names.index(ref)]
            else:
                a = self.stacked(ref, dseq_buffers)
            yield j, xp.matmul(xp.reshape(a, (-1, a.shape[-1])).T, d2)
