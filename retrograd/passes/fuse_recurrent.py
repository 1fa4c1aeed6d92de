"""``fuse_recurrent_cells``: an LSTM built step by step becomes one ``LSTMSequence`` op.

A backend with a vendor LSTM kernel (torch: oneDNN on the CPU, cuDNN on CUDA)
runs a whole layer and its gradient in two calls; the step-by-step
``RecurrentNetwork`` runs one small GEMM and one cell op per step. The
executor applies this pass to its own copy of a program when its backend
declares the kernel (``Backend.fused_lstm_dtypes``); NumPy and the other
backends run the program as written, so their numbers are the general path's.

The pattern, in one block (what ``layers.lstm`` builds, and a ``rg.recurrent``
whose step is the same cell)::

    x_proj = SeqLinear(x, w_ih, b?)                      x [T, N, D], nothing else reads x_proj
    ...    = RecurrentNetwork(x_proj, h0, c0, w_hh)      step: m = MatMul(h, w_hh)
                                                               h', c', _ = LSTMUnit(x_t, c, h_gates=m)
                                                         (or LSTMUnit(x_t + m, c))

with no ``seq_lengths``, no timestep, no ``recompute`` (``"steps"`` and byte
budgets keep the general path), no step outputs, and not built with
``layers.lstm(fused=False)``. Its gradient, when there is one, is the
``RecurrentNetworkGrad`` of that step and the ops ``SeqLinear``'s gradient
maker builds from the gradient of ``x_proj`` (``dx``, ``dw_ih``, ``db``); the
gradient must not flow through every step's cell state (``c_all``), which the
vendor kernels do not take. Both become ``LSTMSequence`` /
``LSTMSequenceGrad`` writing the same names (h_all, h_last, c_all, c_last,
and dx, dw_ih, dw_hh, db, dh0, dc0), so fetches and everything downstream
are unchanged. A value the pattern no longer computes (``x_proj``, its
gradient, the saved step values) must not be in ``keep`` (what the run
fetches): such a recurrence is left as it is.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.program import Block, Op, Program
from ..ops.recurrent_steps import fresh_name

FUSED_LSTM = "LSTMSequence"
FUSED_LSTM_GRAD = "LSTMSequenceGrad"


@dataclass
class _Match:
    """One fusible recurrence: the ops to replace and the names the fused ops read and write."""
    rnn: Op
    proj: Op
    grad: Op | None
    h: int                     # which state of the recurrence is h (0 or 1); the other is c
    w_hh: str
    forget_bias: float
    reverse: bool = False
    outs: list = field(default_factory=list)        # names the fused op writes: h_all, h_last, c_all, c_last
    removed: list[Op] = field(default_factory=list)  # ops besides rnn, proj and grad that go
    d_proj: str | None = None  # the gradient of x_proj (in time order)
    dh_all: str | None = None  # the gradient of h_all (in time order), when given
    dx: str | None = None
    dw_ih: str | None = None
    db: str | None = None

    @property
    def c(self) -> int:
        return 1 - self.h


def fuse_recurrent_cells(program: Program, keep=(), dtypes=("float32",)) -> int:
    """Rewrite every LSTM recurrence of ``program`` (and its gradient) into ``LSTMSequence`` ops in
    place; return how many were fused. Only recurrences in one of ``dtypes`` are fused, and none
    whose removed values are in ``keep`` (names a run fetches).

    ``rg.Executor`` runs this on its own copy of a program when its backend has a vendor LSTM
    kernel (``dtypes=backend.fused_lstm_dtypes``); the user's program is never changed.

    Example::

        h_all, _, _, _ = rg.layers.lstm(x, 128, name="enc")
        rg.optim.SGD(0.1).minimize(rg.mean(h_all))
        fast = main.clone()
        rg.passes.fuse_recurrent_cells(fast)      # one LSTMSequence (+ LSTMSequenceGrad) per layer
    """
    keep = frozenset(keep)
    fused = 0
    for block in list(program.blocks):
        readers = _readers(program)
        for rnn in [op for op in block.ops if op.type == "RecurrentNetwork"]:
            match = _match(program, block, rnn, readers, keep, dtypes)
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


def _cell(rnn: Op) -> tuple[int, str, float] | None:
    """(position of the h state, w_hh, forget_bias) when ``rnn``'s step is an LSTM cell over the
    whole of its one input sequence; else None."""
    a = rnn.attrs
    if (a.get("fuse", True) is False or len(a["inputs_t"]) != 1 or len(a["states"]) != 2
            or a.get("timestep") is not None or a.get("has_lengths") or a.get("recompute") is not None
            or len(rnn.inputs) != 4):
        return None
    step: Block = a["step"]
    ops, types = step.ops, [op.type for op in step.ops]
    if types == ["MatMul", "LSTMUnit"] and len(ops[1].inputs) == 3:
        matmul, unit = ops
        gates = unit.inputs[0] if unit.inputs[2] == matmul.outputs[0] else None
    elif types == ["MatMul", "Add", "LSTMUnit"] and len(ops[2].inputs) == 2:
        matmul, add, unit = ops
        others = [n for n in add.inputs if n != matmul.outputs[0]]
        gates = others[0] if len(others) == 1 and unit.inputs[0] == add.outputs[0] else None
    else:
        return None
    if gates != a["inputs_t"][0] or matmul.attrs.get("transpose_x") or matmul.attrs.get("transpose_y"):
        return None
    h_prev, w_hh = matmul.inputs
    c_prev = unit.inputs[1]
    states = list(a["states"])
    if h_prev == c_prev or sorted(states) != sorted([h_prev, c_prev]) or w_hh in step.vars or rnn.inputs[3] != w_hh:
        return None
    h, c = states.index(h_prev), states.index(c_prev)
    if a["state_outs"][h] != unit.outputs[0] or a["state_outs"][c] != unit.outputs[1]:
        return None
    return h, w_hh, float(unit.attrs.get("forget_bias", 0.0))


def _projection(block: Block, name: str, w_hh: str, dtypes) -> Op | None:
    """The ``SeqLinear(x [T,N,D], w_ih [D,4H], b [4H]?)`` of ``block`` writing ``name``, in a fused dtype."""
    writers = [op for op in block.ops if name in op.outputs]
    if len(writers) != 1 or writers[0].type != "SeqLinear" or writers[0].attrs.get("transpose_w"):
        return None
    proj = writers[0]
    x, w_ih = block.find_var(proj.inputs[0]), block.find_var(proj.inputs[1])
    w = block.find_var(w_hh)
    if x is None or w_ih is None or w is None or x.ndim != 3 or w.ndim != 2 or w_ih.ndim != 2:
        return None
    hidden = w.shape[0]
    if hidden < 1 or tuple(w.shape) != (hidden, 4 * hidden) or w_ih.shape[1] != 4 * hidden:
        return None
    if x.dtype not in dtypes or any(block.find_var(n).dtype != x.dtype for n in proj.inputs):
        return None
    return proj


def _match(program: Program, block: Block, rnn: Op, readers, keep, dtypes) -> _Match | None:
    cell = _cell(rnn)
    if cell is None:
        return None
    h, w_hh, forget_bias = cell
    seq = rnn.inputs[0]
    flip = _reversal(block, seq)          # layers.lstm(reverse=True): ReverseSequence(x_proj) is the input
    x_proj = flip.inputs[0] if flip is not None else seq
    proj = _projection(block, x_proj, w_hh, dtypes)
    if proj is None or _writes_between(block, proj, rnn, proj.inputs):
        return None
    step = rnn.attrs["step"]
    grads = [op for b in program.blocks for op in b.ops
             if op.type == "RecurrentNetworkGrad" and op.attrs.get("step_block") == step.idx]
    if len(grads) > 1 or any(op is not rnn and step in op.sub_blocks() for b in program.blocks for op in b.ops):
        return None
    grad = grads[0] if grads else None
    m = _Match(rnn, proj, grad, h, w_hh, forget_bias, reverse=flip is not None)
    internal = {id(rnn)} | ({id(grad)} if grad is not None else set())
    if flip is not None:
        if not _only_read_by(readers, x_proj, {id(flip)}):
            return None
        m.removed.append(flip)
    if not _only_read_by(readers, seq, internal) or any(
            not _only_read_by(readers, name, {id(grad)}) for name in rnn.outputs[4:]):
        return None
    m.outs = list(rnn.outputs[:4])
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
    for state in (m.h, m.c):
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


def _grad_inputs(grad: Op) -> tuple[list[str | None], list[str | None]]:
    """(d_all per state, d_last per state) of a RecurrentNetworkGrad, None where not given."""
    a = grad.attrs
    rest = grad.inputs[4 + 2 + len(a["saved"]):]
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
    if grad.block is not block or grad.inputs[:4] != rnn.inputs or block.ops.index(grad) < block.ops.index(rnn):
        return False
    d_all, _ = _grad_inputs(grad)
    if grad.inputs[4:6] != [rnn.outputs[0], rnn.outputs[2]] or d_all[m.c] is not None:
        return False            # a gradient through every step's cell: the vendor kernels take none
    m.dh_all = d_all[m.h]
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
    rnn, h, c = m.rnn, m.h, m.c
    x, w_ih = m.proj.inputs[0], m.proj.inputs[1]
    b = m.proj.inputs[2] if len(m.proj.inputs) == 3 else None
    h0, c0 = rnn.inputs[1 + h], rnn.inputs[1 + c]
    if _same_value(block, h0, c0):       # both default zero states: one is computed (as layers.lstm
        c0 = h0                          # builds a fused layer); plans skip the other's ops
    dead = _dropped_names(m)
    outs = [m.outs[2 * h], m.outs[2 * h + 1], m.outs[2 * c], m.outs[2 * c + 1]]
    for i, name in enumerate(outs):
        if name is None:         # a reversed state's all-steps output nothing reads
            like = block.var(rnn.outputs[0])
            outs[i] = block.create_var(fresh_name(program, f"{rnn.outputs[0]}.fused"), like.shape, like.dtype).name
    workspace = block.create_var(fresh_name(program, f"{outs[0]}.workspace"), (-1,), block.find_var(x).dtype)
    attrs = {"forget_bias": m.forget_bias, "reverse": m.reverse, "keep": "all"}
    ins = [x, w_ih, m.w_hh] + ([b] if b is not None else []) + [h0, c0]
    forward = Op(FUSED_LSTM, ins, outs + [workspace.name], dict(attrs), location=rnn.location)
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
    """``LSTMSequenceGrad`` (and zeros for the output gradients not given), writing the names the
    replaced gradient ops wrote (fresh names for gradients nothing read)."""
    grad, h, c = m.grad, m.h, m.c
    _, d_last = _grad_inputs(grad)
    h_all, h_last, _, c_last = outs
    ops, given = [], []
    for name, like in ((m.dh_all, h_all), (d_last[h], h_last), (d_last[c], c_last)):
        if name is None:
            zeros = block.create_var(fresh_name(program, f"{like}.grad_zeros"), block.var(like).shape,
                                     block.var(like).dtype)
            ops.append(Op("FillLike", [like], [zeros.name], {"value": 0.0, "dtype": None}, location=grad.location))
            name = zeros.name
        given.append(name)
    by_position = dict(zip(grad.attrs["grad_of"], grad.outputs))
    has_bias = len(ins) == 6
    wanted = [m.dx, m.dw_ih, by_position.get(3)] + ([m.db] if has_bias else []) + [
        by_position.get(1 + h), by_position.get(1 + c)]
    names = []
    for name, like in zip(wanted, ins):
        if name is None:
            var = block.find_var(like)
            name = block.create_var(fresh_name(program, f"{like}.fused_grad"), var.shape, var.dtype).name
        names.append(name)
    ops.append(Op(FUSED_LSTM_GRAD, ins + [h_all, h_last, c_last, workspace] + given, names, dict(attrs),
                  location=grad.location))
    return ops
