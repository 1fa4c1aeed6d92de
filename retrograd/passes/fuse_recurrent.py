"""``fuse_recurrent_cells``: an LSTM or GRU built step by step becomes one ``LSTMSequence`` /
``GRUSequence`` op.

A backend with a vendor recurrent kernel (torch: oneDNN's LSTM on the CPU,
cuDNN's LSTM and GRU on CUDA) runs a whole layer and its gradient in two calls;
the step-by-step ``RecurrentNetwork`` runs one small GEMM and one cell op per
step. The executor applies this pass to its own copy of a program when its
backend declares the kernel (``Backend.fused_lstm_dtypes``,
``Backend.fused_gru_dtypes``); NumPy and the other backends run the program as
written, so their numbers are the general path's.

The patterns, in one block (what ``layers.lstm`` / ``layers.gru`` build, and a
``rg.recurrent`` whose step is the same cell)::

    x_proj = SeqLinear(x, w_ih, b?)                      x [T, N, D], nothing else reads x_proj
    LSTM:  ... = RecurrentNetwork(x_proj, h0, c0, w_hh)  step: m = MatMul(h, w_hh)
                                                               h', c', _ = LSTMUnit(x_t, c, h_gates=m)
                                                         (or LSTMUnit(x_t + m, c))
    GRU:   ... = RecurrentNetwork(x_proj, h0, w_hh, b_hh?)  step: m = MatMul(h, w_hh) (+ b_hh)
                                                                  h' = GRUUnit(x_t, m, h)
                                                         (b and b_hh both or neither)

with no ``seq_lengths``, no timestep, no ``recompute`` (``"steps"`` and byte
budgets keep the general path), no step outputs, and not built with
``layers.lstm(fused=False)`` / ``layers.gru(fused=False)``. Its gradient, when
there is one, is the ``RecurrentNetworkGrad`` of that step and the ops
``SeqLinear``'s gradient maker builds from the gradient of ``x_proj`` (``dx``,
``dw_ih``, ``db``); an LSTM's gradient must not flow through every step's cell
state (``c_all``), which the vendor kernels do not take. Both become the fused
op and its gradient op writing the same names (h_all, h_last, c_all, c_last,
and dx, dw_ih, dw_hh, the biases' gradients, dh0, dc0), so fetches and
everything downstream are unchanged. A value the pattern no longer computes
(``x_proj``, its gradient, the saved step values) must not be in ``keep``
(what the run fetches): such a recurrence is left as it is.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..ir.program import Block, Op, Program
from ..ops.recurrent.steps import fresh_name

FUSED_LSTM = "LSTMSequence"
FUSED_LSTM_GRAD = "LSTMSequenceGrad"
FUSED_GRU = "GRUSequence"
FUSED_GRU_GRAD = "GRUSequenceGrad"


@dataclass(frozen=True)
class _Step:
    """A recurrence's step that is a cell this pass fuses."""
    cell: _Cell
    order: tuple[int, ...]     # the recurrence's states in the fused op's order: (h, c) or (h,)
    w_hh: str
    b_hh: str | None           # a GRU's hidden bias (an outer input of the recurrence)
    attrs: dict                # the cell's attrs the fused op takes (an LSTM's forget_bias)


@dataclass(frozen=True)
class _Cell:
    """One kind of cell: how to recognise its step and the fused ops it becomes."""
    fused: str
    fused_grad: str
    gates: int                                        # gate blocks of the weights: [D, gates*H]
    paired_bias: bool                                 # the input and hidden biases both or neither
    match: Callable[[list[Op], dict], _Step | None]   # (the step's ops, the recurrence's attrs)
    fused_attrs: Callable[[_Step, bool, bool], dict]  # (step, reverse, has_bias) -> the fused op's attrs


@dataclass
class _Match:
    """One fusible recurrence: the ops to replace and the names the fused ops read and write."""
    rnn: Op
    proj: Op
    grad: Op | None
    step: _Step
    reverse: bool = False
    outs: list = field(default_factory=list)        # the recurrence's (all, last) names per state
    removed: list[Op] = field(default_factory=list)  # ops besides rnn, proj and grad that go
    d_proj: str | None = None  # the gradient of x_proj (in time order)
    dh_all: str | None = None  # the gradient of h_all (in time order), when given
    dx: str | None = None
    dw_ih: str | None = None
    db: str | None = None

    @property
    def order(self) -> tuple[int, ...]:
        return self.step.order


def fuse_recurrent_cells(program: Program, keep=(), dtypes=("float32",), gru_dtypes=()) -> int:
    """Rewrite every LSTM recurrence of ``program`` (and its gradient) into ``LSTMSequence`` ops, and
    every GRU recurrence into ``GRUSequence`` ops, in place; return how many were fused. Only LSTMs
    in one of ``dtypes`` and GRUs in one of ``gru_dtypes`` (none by default) are fused, and none
    whose removed values are in ``keep`` (names a run fetches).

    ``rg.Executor`` runs this on its own copy of a program when its backend has a vendor recurrent
    kernel (``dtypes=backend.fused_lstm_dtypes``, ``gru_dtypes=backend.fused_gru_dtypes``); the
    user's program is never changed.

    Example::

        h_all, _, _, _ = rg.layers.lstm(x, 128, name="enc")
        g_all, _ = rg.layers.gru(x, 128, name="dec")
        rg.optim.SGD(0.1).minimize(rg.mean(h_all) + rg.mean(g_all))
        fast = main.clone()
        rg.passes.fuse_recurrent_cells(fast, gru_dtypes=("float32",))   # LSTMSequence, GRUSequence (+ Grad)
    """
    keep = frozenset(keep)
    by_cell = {FUSED_LSTM: tuple(dtypes), FUSED_GRU: tuple(gru_dtypes)}
    fused = 0
    for block in list(program.blocks):
        readers = _readers(program)
        for rnn in [op for op in block.ops if op.type == "RecurrentNetwork"]:
            match = _match(program, block, rnn, readers, keep, by_cell)
            if match is not None:
                _rewrite(program, block, match)
                readers = _readers(program)
                fused += 1
    if fused:
        program.bump()
    return fused


def has_recurrences(program: Program) -> bool:
    """Whether ``program`` has a ``RecurrentNetwork`` this pass could look at (a cheap check the
    executor makes before copying a program to rewrite it)."""
    return any(op.type == "RecurrentNetwork" and op.attrs.get("fuse", True) is not False
               for block in program.blocks for op in block.ops)


# --- matching ----------------------------------------------------------------------------------

def _readers(program: Program) -> dict[str, list[Op]]:
    """The ops (of any block) that take each name as an input."""
    found: dict[str, list[Op]] = {}
    for block in program.blocks:
        for op in block.ops:
            for name in dict.fromkeys(op.inputs):
                found.setdefault(name, []).append(op)
    return found


def _step(rnn: Op) -> _Step | None:
    """The cell of ``rnn``'s step when it is one this pass fuses, over the whole of its one input
    sequence, with the hidden weights (and bias) as the recurrence's only outer inputs; else None."""
    a = rnn.attrs
    if (a.get("fuse", True) is False or len(a["inputs_t"]) != 1 or a.get("timestep") is not None
            or a.get("has_lengths") or a.get("recompute") is not None):
        return None
    block: Block = a["step"]
    found = next((step for step in (cell.match(block.ops, a) for cell in _CELLS) if step is not None), None)
    if found is None:
        return None
    outer = [found.w_hh] + ([found.b_hh] if found.b_hh is not None else [])
    if rnn.inputs[1 + len(a["states"]):] != outer or any(name in block.vars for name in outer):
        return None
    return found


def _plain_matmul(op: Op) -> bool:
    return not op.attrs.get("transpose_x") and not op.attrs.get("transpose_y")


def _lstm_step(ops: list[Op], a: dict) -> _Step | None:
    """(h, c) states, ``MatMul(h, w_hh)`` and ``LSTMUnit(x_t, c, h_gates=m)`` or ``LSTMUnit(x_t + m, c)``."""
    if len(a["states"]) != 2:
        return None
    types = [op.type for op in ops]
    if types == ["MatMul", "LSTMUnit"] and len(ops[1].inputs) == 3:
        matmul, unit = ops
        gates = unit.inputs[0] if unit.inputs[2] == matmul.outputs[0] else None
    elif types == ["MatMul", "Add", "LSTMUnit"] and len(ops[2].inputs) == 2:
        matmul, add, unit = ops
        others = [n for n in add.inputs if n != matmul.outputs[0]]
        gates = others[0] if len(others) == 1 and unit.inputs[0] == add.outputs[0] else None
    else:
        return None
    if gates != a["inputs_t"][0] or not _plain_matmul(matmul):
        return None
    h_prev, w_hh = matmul.inputs
    c_prev = unit.inputs[1]
    states = list(a["states"])
    if h_prev == c_prev or sorted(states) != sorted([h_prev, c_prev]):
        return None
    h, c = states.index(h_prev), states.index(c_prev)
    if a["state_outs"][h] != unit.outputs[0] or a["state_outs"][c] != unit.outputs[1]:
        return None
    return _Step(_LSTM, (h, c), w_hh, None, {"forget_bias": float(unit.attrs.get("forget_bias", 0.0))})


def _gru_step(ops: list[Op], a: dict) -> _Step | None:
    """One state h, ``m = MatMul(h, w_hh)`` (``+ b_hh``) and ``GRUUnit(x_t, m, h)``."""
    if len(a["states"]) != 1:
        return None
    types = [op.type for op in ops]
    if types == ["MatMul", "GRUUnit"]:
        matmul, unit = ops
        h_proj, b_hh = matmul.outputs[0], None
    elif types == ["MatMul", "Add", "GRUUnit"] and len(ops[1].inputs) == 2:
        matmul, add, unit = ops
        others = [n for n in add.inputs if n != matmul.outputs[0]]
        if len(others) != 1:
            return None
        h_proj, b_hh = add.outputs[0], others[0]
    else:
        return None
    h_prev, w_hh = matmul.inputs
    if (not _plain_matmul(matmul) or list(unit.inputs) != [a["inputs_t"][0], h_proj, h_prev]
            or h_prev != a["states"][0] or a["state_outs"][0] != unit.outputs[0]):
        return None
    return _Step(_GRU, (0,), w_hh, b_hh, {})


def _lstm_attrs(step: _Step, reverse: bool, has_bias: bool) -> dict:
    return {"forget_bias": step.attrs["forget_bias"], "reverse": reverse, "keep": "all"}


def _gru_attrs(step: _Step, reverse: bool, has_bias: bool) -> dict:
    return {"reverse": reverse, "has_bias": has_bias}


_LSTM = _Cell(FUSED_LSTM, FUSED_LSTM_GRAD, 4, False, _lstm_step, _lstm_attrs)
_GRU = _Cell(FUSED_GRU, FUSED_GRU_GRAD, 3, True, _gru_step, _gru_attrs)
_CELLS = (_LSTM, _GRU)


def _projection(block: Block, name: str, step: _Step, dtypes) -> Op | None:
    """The ``SeqLinear(x [T,N,D], w_ih [D,G*H], b [G*H]?)`` of ``block`` writing ``name``, in a fused
    dtype (G: the cell's gate blocks; a GRU's ``b`` is there exactly when its ``b_hh`` is)."""
    writers = [op for op in block.ops if name in op.outputs]
    if len(writers) != 1 or writers[0].type != "SeqLinear" or writers[0].attrs.get("transpose_w"):
        return None
    proj, gates = writers[0], step.cell.gates
    x, w_ih = block.find_var(proj.inputs[0]), block.find_var(proj.inputs[1])
    w = block.find_var(step.w_hh)
    if x is None or w_ih is None or w is None or x.ndim != 3 or w.ndim != 2 or w_ih.ndim != 2:
        return None
    hidden = w.shape[0]
    if hidden < 1 or tuple(w.shape) != (hidden, gates * hidden) or w_ih.shape[1] != gates * hidden:
        return None
    biases = list(proj.inputs[2:])
    if step.b_hh is not None:
        b_hh = block.find_var(step.b_hh)
        if b_hh is None or tuple(b_hh.shape) != (gates * hidden,):
            return None
        biases.append(step.b_hh)
    if step.cell.paired_bias and len(biases) == 1:
        return None
    if x.dtype not in dtypes or any(block.find_var(n).dtype != x.dtype for n in [*proj.inputs, *biases]):
        return None
    return proj


def _match(program: Program, block: Block, rnn: Op, readers, keep, dtypes: dict) -> _Match | None:
    cell_step = _step(rnn)
    if cell_step is None:
        return None
    seq = rnn.inputs[0]
    flip = _reversal(block, seq)          # layers.lstm(reverse=True): ReverseSequence(x_proj) is the input
    x_proj = flip.inputs[0] if flip is not None else seq
    proj = _projection(block, x_proj, cell_step, dtypes[cell_step.cell.fused])
    if proj is None or _writes_between(block, proj, rnn, proj.inputs):
        return None
    step = rnn.attrs["step"]
    grads = [op for b in program.blocks for op in b.ops
             if op.type == "RecurrentNetworkGrad" and op.attrs.get("step_block") == step.idx]
    if len(grads) > 1 or any(op is not rnn and step in op.sub_blocks() for b in program.blocks for op in b.ops):
        return None
    grad = grads[0] if grads else None
    m = _Match(rnn, proj, grad, cell_step, reverse=flip is not None)
    internal = {id(rnn)} | ({id(grad)} if grad is not None else set())
    if flip is not None:
        if not _only_read_by(readers, x_proj, {id(flip)}):
            return None
        m.removed.append(flip)
    if not _only_read_by(readers, seq, internal) or any(
            not _only_read_by(readers, name, {id(grad)}) for name in rnn.outputs[2 * len(m.order):]):
        return None
    m.outs = list(rnn.outputs[:2 * len(m.order)])
    if m.reverse and not _reversed_outputs(block, m, readers, internal):
        return None
    if grad is not None and not _match_grad(block, m, readers, keep):
        return None
    m.removed += _orphan_reshapes(block, m.removed, [m.proj, m.rnn, m.grad] + m.removed, readers)
    gone = _dropped_names(m)
    if any(name in keep or getattr(block.find_var(name), "persistable", False) for name in gone):
        return None
    return m


def _reversal(block: Block, name: str) -> Op | None:
    """The ``ReverseSequence`` (over whole sequences: no lengths) of ``block`` writing ``name``."""
    writers = [op for op in block.ops if name in op.outputs]
    if len(writers) == 1 and writers[0].type == "ReverseSequence" and len(writers[0].inputs) == 1:
        return writers[0]
    return None


def _only_read_by(readers, name: str, allowed: set[int]) -> bool:
    return all(id(op) in allowed for op in readers.get(name, []))


def _reversed_outputs(block: Block, m: _Match, readers, internal: set[int]) -> bool:
    """For a reversed recurrence, the all-steps outputs back in time order (``ReverseSequence`` of
    each, which the fused op writes instead); a state's all-steps output nothing reads gets a new name."""
    for state in m.order:
        name = m.rnn.outputs[2 * state]
        outside = [op for op in readers.get(name, []) if id(op) not in internal]
        if len(outside) > 1 or (outside and (outside[0].type != "ReverseSequence" or len(outside[0].inputs) != 1
                                             or outside[0].block is not block)):
            return False
        m.outs[2 * state] = outside[0].outputs[0] if outside else None
        m.removed += outside
    return True


def _dropped_names(m: _Match) -> list[str]:
    """Names that the replaced ops wrote and the fused ops do not."""
    written = {n for n in m.outs if n is not None} | {m.dx, m.dw_ih, m.db}
    gone = [m.proj, m.rnn] + m.removed
    if m.grad is not None:
        written |= {n for position, n in zip(m.grad.attrs["grad_of"], m.grad.outputs) if position != 0}
        gone.append(m.grad)
    return list(dict.fromkeys(n for op in gone for n in op.outputs if n not in written))


def _writes_between(block: Block, first: Op, last: Op, names) -> bool:
    """Whether an op between ``first`` and ``last`` of ``block`` writes one of ``names``."""
    start, end = block.ops.index(first), block.ops.index(last)
    return any(name in op.outputs for op in block.ops[start + 1:end] for name in names)


def _grad_inputs(grad: Op, n_inputs: int) -> tuple[list[str | None], list[str | None]]:
    """(d_all per state, d_last per state) of a RecurrentNetworkGrad of a recurrence with
    ``n_inputs`` inputs, None where not given."""
    a = grad.attrs
    rest = grad.inputs[n_inputs + len(a["states"]) + len(a["saved"]):]
    d_all, d_last = [], []
    for given in a["dall_given"]:
        d_all.append(rest.pop(0) if given else None)
    for given in a["dlast_given"]:
        d_last.append(rest.pop(0) if given else None)
    return d_all, d_last


def _match_grad(block: Block, m: _Match, readers, keep) -> bool:
    """Check the gradient side of ``m`` and note the ops it replaces (SeqLinear's gradient, the
    reversals of a reversed recurrence)."""
    grad, rnn = m.grad, m.rnn
    n_in, n_states = len(rnn.inputs), len(m.order)
    if grad.block is not block or grad.inputs[:n_in] != rnn.inputs or block.ops.index(grad) < block.ops.index(rnn):
        return False
    d_all, _ = _grad_inputs(grad, n_in)
    if grad.inputs[n_in:n_in + n_states] != rnn.outputs[0:2 * n_states:2]:
        return False
    if any(d_all[state] is not None for state in m.order[1:]):
        return False            # a gradient through every step's cell: the vendor kernels take none
    m.dh_all = d_all[m.order[0]]
    if m.reverse and m.dh_all is not None:
        flip = _reversal(block, m.dh_all)
        if flip is None or not _only_read_by(readers, m.dh_all, {id(grad)}):
            return False
        m.removed.append(flip)
        m.dh_all = flip.inputs[0]
    grad_of = list(grad.attrs["grad_of"])
    if 0 not in grad_of:
        return True
    d_proj = grad.outputs[grad_of.index(0)]
    if m.reverse:
        flips = readers.get(d_proj, [])
        if len(flips) != 1 or flips[0].type != "ReverseSequence" or len(flips[0].inputs) != 1:
            return False
        m.removed.append(flips[0])
        d_proj = flips[0].outputs[0]
    m.d_proj = d_proj
    x, w_ih = m.proj.inputs[0], m.proj.inputs[1]
    width = block.find_var(w_ih).shape[1]
    for op in readers.get(d_proj, []):
        if op.block is not block:
            return False
        if op.type == "SeqLinear" and op.inputs == [d_proj, w_ih] and op.attrs.get("transpose_w") and m.dx is None:
            m.dx = op.outputs[0]
        elif not (op.type == "Reshape" and op.inputs == [d_proj] and list(op.attrs.get("shape", ())) == [-1, width]
                  and _weight_grads(block, m, op.outputs[0], x, readers)):
            return False
        m.removed.append(op)
    return True


def _weight_grads(block: Block, m: _Match, rows: str, x: str, readers) -> bool:
    """Whether every reader of ``rows`` (d x_proj as [T*N, 4H]) is SeqLinear's weight or bias
    gradient; note them in ``m``."""
    has_bias = len(m.proj.inputs) == 3
    for op in readers.get(rows, []):
        if op.block is not block:
            return False
        if (op.type == "MatMul" and op.inputs[1] == rows and op.attrs.get("transpose_x")
                and not op.attrs.get("transpose_y") and m.dw_ih is None and _rows_of(block, op.inputs[0], x)):
            m.dw_ih = op.outputs[0]
        elif (op.type == "Sum" and op.inputs == [rows] and op.attrs.get("axis") in (0, [0], (0,))
              and not op.attrs.get("keepdims") and has_bias and m.db is None):
            m.db = op.outputs[0]
        else:
            return False
        m.removed.append(op)
    return True


def _rows_of(block: Block, name: str, x: str) -> bool:
    """Whether ``name`` is ``x [T, N, D]`` reshaped to ``[T*N, D]``."""
    writers = [op for op in block.ops if name in op.outputs]
    return (len(writers) == 1 and writers[0].type == "Reshape" and writers[0].inputs == [x]
            and list(writers[0].attrs.get("shape", ())) == [-1, block.find_var(x).shape[2]])


# --- rewriting ---------------------------------------------------------------------------------

def _rewrite(program: Program, block: Block, m: _Match) -> None:
    rnn, step = m.rnn, m.step
    x, w_ih = m.proj.inputs[0], m.proj.inputs[1]
    biases = list(m.proj.inputs[2:]) + ([step.b_hh] if step.b_hh is not None else [])
    states = [rnn.inputs[1 + state] for state in m.order]
    if len(states) == 2 and _same_value(block, *states):    # both default zero states: one is computed
        states[1] = states[0]                                # (as layers.lstm builds a fused layer)
    dead = _dropped_names(m)
    outs = [name for state in m.order for name in (m.outs[2 * state], m.outs[2 * state + 1])]   # (all, last) each
    for i, name in enumerate(outs):
        if name is None:         # a reversed state's all-steps output nothing reads
            like = block.var(rnn.outputs[0])
            outs[i] = block.create_var(fresh_name(program, f"{rnn.outputs[0]}.fused"), like.shape, like.dtype).name
    workspace = block.create_var(fresh_name(program, f"{outs[0]}.workspace"), (-1,), block.find_var(x).dtype)
    attrs = step.cell.fused_attrs(step, m.reverse, bool(biases))
    ins = [x, w_ih, step.w_hh] + biases + states
    forward = Op(step.cell.fused, ins, outs + [workspace.name], dict(attrs), location=rnn.location)
    gone = [m.proj] + ([m.grad] if m.grad is not None else []) + m.removed
    if m.grad is not None:
        at = block.ops.index(m.grad)
        for offset, op in enumerate(_backward_ops(program, block, m, ins, outs, workspace.name, attrs)):
            block.insert_op(at + offset, op)
    block.ops[block.ops.index(rnn)] = forward
    forward.block = block
    for op in gone:
        block.remove_op(block.ops.index(op))
    written = {name for op in block.ops for name in op.outputs}
    for name in dead:
        if name not in written:
            block.vars.pop(name, None)


# Deterministic ops with no state: two of them of one type, with equal attributes and inputs,
# write equal values (what ``layers.rnn``'s zero states are built from).
PURE_OPS = frozenset({"Slice", "FillLike", "Fill", "Sum", "Add"})


def _same_value(block: Block, a: str, b: str, depth: int = 8) -> bool:
    """Whether ``a`` and ``b`` hold equal values: the same name, or each written once in ``block``
    by ops of ``PURE_OPS`` of one type and attributes whose inputs hold equal values.

    Example::

        h0 = fill_like(slice(x, ...), 0.0) ...; c0 = (the same ops again)
        _same_value(block, h0.name, c0.name)      # True
    """
    if a == b:
        return True
    if depth == 0:
        return False
    writers = [[op for op in block.ops if name in op.outputs] for name in (a, b)]
    if any(len(ops) != 1 for ops in writers):
        return False
    (op_a,), (op_b,) = writers
    return (op_a.type == op_b.type and op_a.type in PURE_OPS and len(op_a.outputs) == 1
            and op_a.attrs == op_b.attrs and len(op_a.inputs) == len(op_b.inputs)
            and all(_same_value(block, x, y, depth - 1) for x, y in zip(op_a.inputs, op_b.inputs)))


def _orphan_reshapes(block: Block, removed: list[Op], gone: list[Op], readers) -> list[Op]:
    """The ``Reshape(x)`` ops that only the removed weight-gradient MatMuls read."""
    found = []
    for op in removed:
        if op.type == "MatMul":
            rows = op.inputs[0]
            if all(any(r is g for g in gone) for r in readers.get(rows, [])):
                found += [w for w in block.ops if rows in w.outputs]
    return found


def _backward_ops(program: Program, block: Block, m: _Match, ins: list[str], outs: list[str], workspace: str,
                  attrs: dict) -> list[Op]:
    """The fused gradient op (and zeros for the output gradients not given), writing the names the
    replaced gradient ops wrote (fresh names for gradients nothing read)."""
    grad, order = m.grad, m.order
    _, d_last = _grad_inputs(grad, len(m.rnn.inputs))
    h_all, lasts = outs[0], outs[1::2]
    ops, given = [], []
    for name, like in [(m.dh_all, h_all)] + [(d_last[state], last) for state, last in zip(order, lasts)]:
        if name is None:
            zeros = block.create_var(fresh_name(program, f"{like}.grad_zeros"), block.var(like).shape,
                                     block.var(like).dtype)
            ops.append(Op("FillLike", [like], [zeros.name], {"value": 0.0, "dtype": None}, location=grad.location))
            name = zeros.name
        given.append(name)
    by_position = dict(zip(grad.attrs["grad_of"], grad.outputs))   # 0 x_proj, 1.. states, then w_hh, b_hh
    hidden_weights = 1 + len(order)
    wanted = [m.dx, m.dw_ih, by_position.get(hidden_weights)] + ([m.db] if len(m.proj.inputs) == 3 else []) + (
        [by_position.get(hidden_weights + 1)] if m.step.b_hh is not None else []) + [
        by_position.get(1 + state) for state in order]
    names = []
    for name, like in zip(wanted, ins):
        if name is None:
            var = block.find_var(like)
            name = block.create_var(fresh_name(program, f"{like}.fused_grad"), var.shape, var.dtype).name
        names.append(name)
    ops.append(Op(m.step.cell.fused_grad, ins + [h_all] + lasts + [workspace] + given, names, dict(attrs),
                  location=grad.location))
    return ops
