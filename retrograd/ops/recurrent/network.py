"""Recurrent networks: the ``RecurrentNetwork`` op and its front ends ``recurrent`` / ``recurrent_net``.

``RecurrentNetwork`` runs a *step block* once per time step. Layout of the
op (``S`` sequences, ``K`` recurrent states, ``R`` outer values)::

    inputs   seq_0 .. seq_S-1      [T, N, ...]   bound per step to the step's inputs_t[i] = seq_i[t]
             init_0 .. init_K-1    [N, ...]      slot 0 of each state's states tensor
             seq_lengths           int [N]       only when has_lengths
             outer_0 .. outer_R-1                 whatever the step reads from outside (params, encoder outputs)
    outputs  all_0, last_0, .. all_K-1, last_K-1  per state: slots 1..T and slot T of its states tensor (views)
             saved_0 ..            [T, ...]      step values the backward reads (added by the gradient maker)

Each state has one ``(T+1) x N x ...`` states tensor: step ``t`` reads slot
``t`` (a view bound to ``states[i]``) and its result ``state_outs[i]`` is
written into slot ``t+1`` in place. With ``seq_lengths`` a finished example
keeps its state: slot ``t+1`` takes slot ``t``'s row where ``t >= length``,
so ``last`` is each example's state at its own length.

The gradient (``recurrent_grad.py``) runs the step block's backward once per
step in reverse time. Forward ops never store step values for it unless a
gradient is built: the gradient maker decides what the backward step reads
and adds those values to this op's outputs as ``[T, ...]`` tensors
(``saved``; a value the backward needs only the shape of is kept as a
zero-stride view and costs no memory).
"""
from __future__ import annotations

from typing import Callable, Sequence

from ...errors import ExecutionError, ProgramError, ShapeError
from ...ir.analysis import free_reads
from ...ir.builder import block_guard, current_block
from ...ir.dtypes import is_float
from ...ir.program import Block, Var
from ..core import streams
from ..array.creation import assign
from .network_grad import rnn_grad_maker
from .outputs import output_init, split_step_result
from .reverse_sequence import reverse_sequence
from .network_onnx import forward_loop_onnx
from .steps import (Held, RnnLayout, StepRunner, budget_variant, check_batches,
                    checked_inputs_onnx, check_state_shape, fresh_name, is_budget, step_mask,
                    time_steps, timestep_value)
from ..core.lowering import lowers
from ..core.registry import append_op, defop, infer_specs


# --- Shape rule ------------------------------------------------------------------------------

def _merge(a: int, b: int, what: str) -> int:
    if a >= 0 and b >= 0 and a != b:
        raise ShapeError(f"{what} differ: {a} vs {b}")
    return a if a >= 0 else b


def _merge_shapes(a: Sequence[int], b: Sequence[int], what: str) -> tuple[int, ...]:
    if len(a) != len(b):
        raise ShapeError(f"{what}: ranks differ, {list(a)} vs {list(b)}")
    return tuple(_merge(x, y, what) for x, y in zip(a, b))


def _rnn_rule(ins: list[Var], attrs: dict):
    lay = RnnLayout.of(attrs, len(ins))
    seqs, inits, lengths, _ = lay.split(ins)
    step: Block = attrs["step"]
    if not seqs:
        raise ShapeError("needs at least one input sequence [T, N, ...] (it sets the number of steps)")
    steps = -1
    for seq, name in zip(seqs, attrs["inputs_t"]):
        if seq.ndim < 1:
            raise ShapeError(f"sequence '{seq.name}' must be [T, N, ...], got {seq.type_str()}")
        steps = _merge(steps, seq.shape[0], "sequence lengths (axis 0)")
        inner = step.var(name)
        _merge_shapes(seq.shape[1:], inner.shape, f"sequence '{seq.name}' per step vs step input '{name}'")
        if inner.dtype != seq.dtype:
            raise ShapeError(f"sequence '{seq.name}' is {seq.dtype}, step input '{name}' is {inner.dtype}")
    if lengths is not None and (lengths.dtype not in ("int64", "int32") or lengths.ndim != 1):
        raise ShapeError(f"seq_lengths '{lengths.name}' must be int64 [N], got {lengths.type_str()}")
    specs = []
    for init, prev, out in zip(inits, attrs["states"], attrs["state_outs"]):
        prev_var, out_var = step.var(prev), step.var(out)
        for var in (prev_var, out_var):
            if var.dtype != init.dtype:
                raise ShapeError(f"initial state '{init.name}' is {init.dtype}, step value '{var.name}' "
                                 f"is {var.dtype}")
        shape = _merge_shapes(init.shape, prev_var.shape, f"initial state '{init.name}' vs '{prev}'")
        shape = _merge_shapes(shape, out_var.shape, f"state '{prev}' vs its next value '{out}'")
        specs += [((steps,) + shape, init.dtype), (shape, init.dtype)]
    for name in attrs.get("saved", ()):
        var = step.var(name)
        specs.append(((steps,) + var.shape, var.dtype))
    if attrs.get("budget_outputs"):  # recompute=<bytes>: checkpoints and schedule (memory/rnn_budget.py)
        specs += budget_variant("RecurrentNetwork").output_specs(inits, attrs)
    return specs


# --- Kernel ------------------------------------------------------------------------------------

def _rnn_kernel(k, *arrays):
    """Run the step block over time; return per state (all, last) views, then the saved step values."""
    attrs, xp, op, run = k.attrs, k.xp, k.op, k.run
    check_batches(xp, op, *RnnLayout.of(attrs, len(arrays)).split(arrays)[:3])
    if is_budget(attrs.get("recompute")):   # recompute=<bytes>: memory/rnn_budget.py runs the op
        return budget_variant("RecurrentNetwork").forward(k, *arrays)
    lay = RnnLayout.of(attrs, len(arrays))
    seqs, inits, lengths, outers = lay.split(arrays)
    steps = time_steps(op, seqs)
    step: Block = attrs["step"]
    held = Held(run.meter)
    n_state, timestep = lay.n_state, attrs.get("timestep")
    keep_all = [2 * i in k.live_outputs for i in range(n_state)]   # does this plan read all_i?
    states = []
    for init, full in zip(inits, keep_all):   # step t reads row t % rows: two rows when all_i is unread
        rows = steps + 1 if full else 2
        buf = held.add(xp.empty((rows,) + tuple(init.shape), dtype=init.dtype))
        buf[0, ...] = init
        states.append(buf)
    all_saved = list(attrs.get("saved", ()))
    live_saved = [j for j in range(len(all_saved)) if 2 * n_state + j in k.live_outputs]  # for a backward here
    saved_names = [all_saved[j] for j in live_saved]
    saved_full = [list(attrs.get("saved_full", ()))[j] for j in live_saved]
    saved: list = [None] * len(saved_names)
    bindings = dict(zip(op.inputs[lay.outer_start:], outers))
    fetch = list(attrs["state_outs"]) + saved_names
    bound = list(bindings) + list(attrs["inputs_t"]) + list(attrs["states"]) + ([timestep] if timestep else [])
    run_step = StepRunner(op, run, step, bound, fetch)
    for t in range(steps):
        for name, seq in zip(attrs["inputs_t"], seqs):
            bindings[name] = seq[t, ...]
        for name, buf in zip(attrs["states"], states):
            bindings[name] = buf[t % buf.shape[0], ...]
        if timestep:
            bindings[timestep] = timestep_value(xp, step, timestep, t)
        values = run_step(bindings, streams.stream(attrs, t))
        for i, buf in enumerate(states):
            new, slot = values[i], buf[(t + 1) % buf.shape[0], ...]
            if new.shape != slot.shape:
                check_state_shape(op, fetch[i], new, slot)
            if lengths is not None:
                new = xp.where(step_mask(xp, lengths, t, buf.ndim - 1), new, buf[t % buf.shape[0], ...])
            slot[...] = new
        for j, value in enumerate(values[n_state:]):
            buf = saved[j]
            if buf is None:
                buf = saved[j] = _saved_buffer(xp, held, steps, tuple(value.shape), value.dtype, saved_full[j])
            elif value.shape != buf.shape[1:]:
                buf = saved[j] = _widened(xp, held, op, saved_names[j], buf, value, saved_full[j])
            if not saved_full[j]:
                continue
            if value.shape == buf.shape[1:]:
                buf[t, ...] = value
            else:       # zero-padded: its readers look only at the part that was written
                buf[t, ...] = 0
                buf[(t,) + tuple(slice(0, d) for d in value.shape)] = value
    for j, name in enumerate(saved_names):
        if saved[j] is None:  # zero steps: nothing was produced
            var = step.var(name)
            saved[j] = xp.zeros((0,) + tuple(max(d, 0) for d in var.shape), dtype=getattr(xp, var.dtype))
    held.release()
    outputs = []
    for buf, full in zip(states, keep_all):   # an unread all_i is an empty stand-in (dropped at once)
        outputs += [buf[1:, ...] if full else xp.zeros((0,) + buf.shape[1:], dtype=buf.dtype),
                    buf[steps % buf.shape[0], ...]]
    kept = [xp.zeros((0,) * (1 + step.var(name).ndim), dtype=getattr(xp, step.var(name).dtype))
            for name in all_saved]
    for j, buf in zip(live_saved, saved):
        kept[j] = buf
    return tuple(outputs + kept)


def _saved_buffer(xp, held: Held, steps: int, row: tuple, dtype, full: bool, zeros: bool = False):
    """A [T, ...] buffer for a step value: real storage, or a zero-stride stand-in when only its shape is read."""
    if full:
        return held.add((xp.zeros if zeros else xp.empty)((steps,) + row, dtype=dtype))
    return xp.broadcast_to(xp.zeros((), dtype=dtype), (steps,) + row)


def _widened(xp, held: Held, op, name: str, buf, value, full: bool):
    """The buffer of a step value whose shape changes over time (the empty stand-in of a branch
    that did not run, an inner loop's varying length): rows zero-padded to the largest shape."""
    old, new = tuple(buf.shape[1:]), tuple(value.shape)
    if len(old) != len(new):
        raise ExecutionError(f"{op.where()}: step value '{name}' changes rank over time ({list(old)} then "
                             f"{list(new)}); the backward stores it per step and needs one rank")
    row = tuple(max(a, b) for a, b in zip(old, new))
    if row == old:
        return buf
    wide = _saved_buffer(xp, held, buf.shape[0], row, buf.dtype, full, zeros=True)
    if full:
        wide[(slice(None),) + tuple(slice(0, d) for d in old)] = buf
        held.drop(buf)
    return wide


defop("RecurrentNetwork", inputs=("sequences*", "initial_states*", "seq_lengths?", "outer*"),
      outputs=("all_and_last*", "saved*"), infer=_rnn_rule, grad=rnn_grad_maker)(_rnn_kernel)


@lowers("RecurrentNetwork")
def _rnn_onnx(g):
    """A Loop over the steps (``recurrent_onnx.py``). Built with ``recompute=<bytes>``, it keeps
    every state (its backward re-runs all steps: store-all), and its checkpoint and schedule
    outputs are empty (only its ONNX backward reads them, and it does not need them)."""
    a = g.attrs
    lay = RnnLayout.of(a, len(g.ins))
    budget = is_budget(a.get("recompute"))
    alls, lasts, saved = forward_loop_onnx(g, a, lay, [] if budget else list(a.get("saved", ())),
                                           checked_inputs_onnx(g, lay))
    outputs = [v for pair in zip(alls, lasts) for v in pair] + saved
    if budget and a.get("budget_outputs"):
        outputs += [g.fill(g.const([0] * var.ndim, "int64"), 0, var.dtype) for var in g.out_vars[len(outputs):-1]]
        outputs.append(g.const([0] * g.out_vars[-1].shape[0], "int64"))
    return outputs


# --- Building the op ------------------------------------------------------------------------------

def _as_list(items) -> list:
    if items is None:
        return []
    return list(items) if isinstance(items, (list, tuple)) else [items]


def _check_recompute(recompute) -> None:
    if recompute is None or recompute == "steps" or isinstance(recompute, (list, tuple)):
        return
    if is_budget(recompute):    # byte budgets are run by memory/rnn_budget.py
        if recompute < 0:
            raise ProgramError(f"recompute budget must be >= 0 bytes, got {recompute}")
        return
    raise ProgramError(f"recompute must be None, 'steps' or a byte budget (int), got {recompute!r}")


def _check_outputs_with_grads(owg, n_state: int) -> list[int] | None:
    if owg is None:
        return None
    indices = [int(i) for i in _as_list(owg)]
    bad = [i for i in indices if not 0 <= i < 2 * n_state]
    if bad:
        raise ProgramError(f"outputs_with_grads {indices}: indices must be in 0..{2 * n_state - 1} "
                           "(state i's all-steps output is 2i, its last-step output 2i+1)")
    return sorted(set(indices))


def build_recurrent_op(step: Block, sequences: list[tuple[Var, Var]], states: list[tuple[Var, Var, Var]],
                       seq_lengths: Var | None, timestep: str | None, outputs_with_grads,
                       recompute, forward_only: bool, output_names: list[str]) -> list[Var]:
    """Append a RecurrentNetwork op over a finished step block; return [all_0, last_0, all_1, ...].

    ``sequences`` pairs each step input with its ``[T, N, ...]`` sequence;
    ``states`` holds (step placeholder, initial value, step result) triples.
    """
    parent = step.parent
    _check_recompute(recompute)
    bound = {x.name for x, _ in sequences} | {p.name for p, _, _ in states} | ({timestep} if timestep else set())
    outers = []
    for name in free_reads(step):
        if name in bound:
            continue
        if name in step.vars:
            raise ProgramError(f"step block {step.idx} reads '{name}', which it declares but nothing "
                               "writes or binds: make it a step input, a state, or the timestep")
        if parent.find_var(name) is None:
            raise ProgramError(f"step block {step.idx} reads '{name}', which block {parent.idx} cannot see")
        outers.append(parent.var(name))
    if isinstance(recompute, (list, tuple)):
        recompute = [_step_value_name(step, v, "recompute_blobs_on_backward") for v in recompute]
    inputs = [seq for _, seq in sequences] + [init for _, init, _ in states]
    inputs += ([seq_lengths] if seq_lengths is not None else []) + outers
    attrs = {
        "step": step,
        "inputs_t": [x.name for x, _ in sequences],
        "states": [p.name for p, _, _ in states],
        "state_outs": [o.name for _, _, o in states],
        "timestep": timestep,
        "has_lengths": seq_lengths is not None,
        "outputs_with_grads": _check_outputs_with_grads(outputs_with_grads, len(states)),
        "recompute": recompute,
        "forward_only": bool(forward_only),
        "saved": [],
        "saved_full": [],
    }
    attrs.update(streams.stream_attrs(step))   # rng_id: step t runs in random stream (rng_id, t)
    program = parent.program
    specs = infer_specs("RecurrentNetwork", inputs, attrs, parent)   # named outputs, so typed here
    outputs = [parent.create_var(fresh_name(program, name), shape, dtype)
               for name, (shape, dtype) in zip(output_names, specs)]
    return append_op("RecurrentNetwork", inputs, attrs, outputs=outputs, block=parent)


def _step_value_name(step: Block, item, what: str) -> str:
    name = item.name if isinstance(item, Var) else item
    if not isinstance(name, str) or name not in step.vars:
        raise ProgramError(f"{what}: {item!r} is not a value of the step block {step.idx}")
    return name


def _fresh_step_output(step: Block, value, state: Var, taken: set[str], index: int) -> Var:
    """The step's result for one state, as a Var the step block itself computes (copied if needed)."""
    if not isinstance(value, Var):
        raise ProgramError(f"step function returned {type(value).__name__} for state {index} "
                           f"('{state.name}'); it must return Vars")
    if value.block is not step or value.name in taken or not any(value.name in op.outputs for op in step.ops):
        with block_guard(step):
            value = assign(value)
    taken.add(value.name)
    return value


def recurrent(step_fn: Callable[[list[Var], list[Var]], Sequence[Var]], inputs, initial_states,
              seq_lengths: Var | None = None, outputs_with_grads=None, recompute=None,
              forward_only: bool = False, name: str | None = None, reverse: bool = False):
    """Run ``step_fn`` over time; return ``(all_states, last_states)`` in the order of ``initial_states``.

    ``inputs`` are sequences ``[T, N, ...]``; ``step_fn(x_t_list, state_list)``
    is called once, to build the step block, with one ``[N, ...]`` Var per
    input (the time step's slice) and per state (the previous state), and
    returns the new states. It may read any variable of the enclosing blocks
    (parameters, encoder outputs); their gradients accumulate across steps.
    ``all_states[i]`` is ``[T, N, ...]`` (the state after each step),
    ``last_states[i]`` is ``[N, ...]``. With ``seq_lengths`` (int64 ``[N]``) an
    example's state stops changing after its length. ``outputs_with_grads``
    lists which of ``[all_0, last_0, all_1, last_1, ...]`` receive gradient
    (None: all). ``recompute="steps"`` stores only the states and recomputes
    each step's intermediates in the backward; ``forward_only=True`` forbids
    a gradient and keeps nothing per step.

    Per-step outputs that are not states (PaddlePaddle's ``step_output``):
    ``step_fn`` returns ``(new_states, outputs)``, two lists; the result is
    then ``(all_states, last_states, all_outputs)``, each output stacked to
    ``[T, N, ...]`` (its sizes after the batch axis must be known when the
    step is built; past an example's length it repeats its last value, as the
    states do). ``reverse=True`` runs right to left: step t reads
    ``x[T-1-t]`` (with ``seq_lengths``, each example's own steps reversed),
    ``all_*[t]`` is the value after reading ``x[t]`` and ``last_states`` the
    value after ``x[0]``.

    Example::

        x = rg.data("x", [-1, -1, 8])                 # [T, N, D]
        h0 = rg.data("h0", [-1, 16])
        w = rg.create_parameter("rnn.w", [8, 16]); u = rg.create_parameter("rnn.u", [16, 16])
        (h_all,), (h_last,) = rg.recurrent(
            lambda xs, hs: [rg.tanh(xs[0] @ w + hs[0] @ u)], [x], [h0])
    """
    inputs, initial_states = _as_list(inputs), _as_list(initial_states)
    _check_recompute(recompute)
    for what, items in (("inputs", inputs), ("initial_states", initial_states)):
        for item in items:
            if not isinstance(item, Var):
                raise ProgramError(f"recurrent(): {what} must be Vars, got {type(item).__name__}")
    if not inputs:
        raise ProgramError("recurrent() needs at least one input sequence [T, N, ...]")
    if not initial_states:
        raise ProgramError("recurrent() needs at least one initial state (the recurrence it carries)")
    _check_static_batches(inputs[0], initial_states)
    if reverse:         # right to left: the same recurrence over the reversed sequences
        inputs = [reverse_sequence(seq, seq_lengths) for seq in inputs]
    parent = current_block()
    program = parent.program
    prefix = name or program.unique_name("rnn")
    step = program.create_block(parent)
    with block_guard(step):
        xs = [step.create_var(fresh_name(program, f"{prefix}.{seq.name}_t"), seq.shape[1:], seq.dtype)
              for seq in inputs]
        hs = [step.create_var(fresh_name(program, f"{prefix}.{init.name}_prev"), init.shape, init.dtype)
              for init in initial_states]
        new, step_outputs = split_step_result(step_fn(list(xs), list(hs)))
        new = _as_list(new)
        if len(new) != len(hs):
            raise ProgramError(f"recurrent(): step_fn returned {len(new)} states for {len(hs)} initial states")
        taken: set[str] = set()
        new = [_fresh_step_output(step, v, h, taken, i) for i, (v, h) in enumerate(zip(new, hs))]
        outs_t = [_fresh_step_output(step, v, v, taken, len(hs) + j) for j, v in enumerate(step_outputs or [])]
    # A per-step output is a state the step never reads: its 'all' stacks the outputs.
    hs += [step.create_var(fresh_name(program, f"{prefix}.out{j}_prev"), v.shape, v.dtype)
           for j, v in enumerate(outs_t)]
    initial_states = initial_states + [output_init(v, inputs[0], f"step output {j}") for j, v in enumerate(outs_t)]
    if outputs_with_grads is not None and outs_t:
        outputs_with_grads = list(outputs_with_grads) + [2 * (len(new) + j) for j in range(len(outs_t))]
    names = []
    for init in initial_states:
        names += [f"{prefix}.{init.name}_all", f"{prefix}.{init.name}_last"]
    outs = build_recurrent_op(step, list(zip(xs, inputs)), list(zip(hs, initial_states, new + outs_t)),
                              seq_lengths, None, outputs_with_grads, recompute, forward_only, names)
    alls, lasts = outs[0::2], outs[1::2]
    if reverse:         # all_*[t] back at the step that read x[t]
        alls = [reverse_sequence(a, seq_lengths) for a in alls]
    k = len(new)
    return (alls[:k], lasts[:k]) if step_outputs is None else (alls[:k], lasts[:k], alls[k:])


def _check_static_batches(seq: Var, initial_states: list[Var]) -> None:
    """An initial state's batch (axis 0) must be the sequences' (axis 1); checked here, before
    the step is built, so the error names the state rather than an op inside the step."""
    batch = seq.shape[1] if seq.ndim >= 2 else -1
    for init in initial_states:
        if batch >= 0 and init.ndim >= 1 and init.shape[0] >= 0 and init.shape[0] != batch:
            raise ShapeError(f"recurrent(): initial state '{init.name}' ({init.type_str()}) has batch "
                             f"{init.shape[0]}, the input sequence '{seq.name}' ({seq.type_str()}, "
                             f"[T, N, ...]) has batch {batch}")


def recurrent_net(cell_net: Block, inputs, initial_cell_inputs, links, timestep=None, scope=None,
                  outputs_with_grads=None, recompute_blobs_on_backward=None, forward_only: bool = False,
                  seq_lengths: Var | None = None) -> list[Var]:
    """Caffe2's ``recurrent_net`` over a cell block; returns ``[out_all, out_last, ...]`` per cell input.

    ``cell_net`` is a block built by the caller (a child of the block the
    op goes into), declaring its per-step inputs and previous states as
    Vars no op writes. ``inputs=[(input_t, seq)]`` binds each step input to a
    ``[T, N, ...]`` sequence, ``initial_cell_inputs=[(cell_in, init)]`` gives
    each state's initial value, ``links={cell_in: cell_out}`` says which cell
    value becomes the next step's ``cell_in``. ``timestep`` names the cell's
    step counter (int64, bound to t). As in Caffe2, only the outputs listed
    in ``outputs_with_grads`` (positions in the returned list) receive
    gradient; the default ``None`` means all of them (Caffe2's ``(0,)``
    silently drops a loss on ``out_last``; pass it explicitly for that
    behaviour). ``recompute_blobs_on_backward`` names cell values recomputed in
    the backward instead of stored. Names may be given as Vars or strings.

    Example::

        cell = main.create_block(rg.default_main_program().global_block())
        with rg.block_guard(cell):
            x_t = cell.create_var("x_t", [-1, 8]); h_prev = cell.create_var("h_prev", [-1, 16])
            h = rg.tanh(x_t @ w + h_prev @ u)
        h_all, h_last = rg.recurrent_net(cell, inputs=[(x_t, x)], initial_cell_inputs=[(h_prev, h0)],
                                         links={h_prev: h})
    """
    if not isinstance(cell_net, Block) or cell_net.parent is None:
        raise ProgramError("recurrent_net: cell_net must be a sub-block (program.create_block(parent)) "
                           f"built with the step's ops, got {cell_net!r}")
    step = cell_net
    seq_pairs = [(_cell_var(step, x, "inputs"), _outer_var(step, seq, "inputs"))
                 for x, seq in _pairs(inputs, "inputs")]
    link_map = {(_cell_var(step, k, "links").name): v for k, v in dict(links).items()}
    states = []
    taken: set[str] = set()
    for cell_in, init in _pairs(initial_cell_inputs, "initial_cell_inputs"):
        cell_in, init = _cell_var(step, cell_in, "initial_cell_inputs"), _outer_var(step, init, "initial_cell_inputs")
        if cell_in.name not in link_map:
            raise ProgramError(f"recurrent_net: links has no entry for cell input '{cell_in.name}'")
        out = link_map[cell_in.name]
        out = step.vars.get(out) if isinstance(out, str) else out
        if not isinstance(out, Var) or out.block is not step:
            raise ProgramError(f"recurrent_net: links[{cell_in.name!r}] must be a value of the cell block")
        states.append((cell_in, init, _fresh_step_output(step, out, cell_in, taken, len(states))))
    timestep_name = _timestep_name(step, timestep)
    prefix = scope or step.program.unique_name("recurrent")
    names = []
    for cell_in, init, out in states:
        base = link_map[cell_in.name]
        base = base.name if isinstance(base, Var) else base
        names += [f"{prefix}/{base}_all", f"{prefix}/{base}_last"]
    return build_recurrent_op(step, seq_pairs, states, seq_lengths, timestep_name, outputs_with_grads,
                              recompute_blobs_on_backward, forward_only, names)


def _pairs(items, what: str) -> list[tuple]:
    pairs = list(items or [])
    if not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
        raise ProgramError(f"recurrent_net: {what} must be a list of (inner, outer) pairs")
    return [tuple(p) for p in pairs]


def _cell_var(step: Block, item, what: str) -> Var:
    name = item.name if isinstance(item, Var) else item
    var = step.vars.get(name) if isinstance(name, str) else None
    if var is None:
        raise ProgramError(f"recurrent_net: {what} entry {item!r} is not declared in the cell block {step.idx}")
    return var


def _outer_var(step: Block, item, what: str) -> Var:
    var = step.parent.find_var(item) if isinstance(item, str) else item
    if not isinstance(var, Var) or not step.parent.sees(var):
        raise ProgramError(f"recurrent_net: {what} entry {item!r} is not a variable the cell's parent "
                           f"block {step.parent_idx} sees")
    return var


def _timestep_name(step: Block, timestep) -> str | None:
    if timestep is None:
        var = step.vars.get("timestep")
        return "timestep" if var is not None and not is_float(var.dtype) else None
    name = timestep.name if isinstance(timestep, Var) else timestep
    if name not in step.vars:
        step.create_var(name, [], "int64")
    var = step.vars[name]
    if is_float(var.dtype) or any(name in op.outputs for op in step.ops):
        raise ProgramError(f"recurrent_net: timestep '{name}' must be an integer value no cell op writes")
    return name
