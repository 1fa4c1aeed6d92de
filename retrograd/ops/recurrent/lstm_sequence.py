"""``LSTMSequence``: a whole LSTM layer (one direction) as one op, with a vendor kernel where there is one.

``layers.lstm`` builds it when nothing needs the step-by-step ``RecurrentNetwork``
(no per-op ``recompute``, no ``seq_lengths``); a whole-program ``memory_budget``
expands it back into that general form first (``expand``), so the budget passes
see the recurrence they know how to schedule.

Inputs ``x [T, N, D]``, ``w_ih [D, 4H]``, ``w_hh [H, 4H]``, ``b [4H]`` (optional),
``h0 [N, H]``, ``c0 [N, H]``; gate order i, f, g, o as ``layers.lstm``.
Outputs ``h_all [T, N, H]``, ``h_last``, ``c_all [T, N, H]``, ``c_last`` and
``workspace``: an opaque float vector that only ``LSTMSequenceGrad`` reads.
``c_all`` is computed only when something reads it (the executor's live outputs);
a gradient through ``c_all`` (rare) makes the op run its general kernels, which
accept one (attr ``general``, set when the backward is built).

Kernels: a backend with a fused LSTM (``Backend.fused_lstm_forward`` /
``fused_lstm_backward``: torch's oneDNN primitive on CPU) runs it and its
workspace; elsewhere (NumPy, CuPy, float64) the general kernels below run: one
GEMM for the input projection, one small GEMM and the cell's elementwise work
per step, the activations and cells kept as the workspace, and in the backward
one GEMM each for ``dx``, ``dw_ih``, ``dw_hh`` after the reverse loop. Both give
the same numbers to rounding. ONNX: the forward is ONNX ``LSTM``; the gradient
recomputes the gates from ``h_all`` (one GEMM, no recurrence) and runs the
reverse loop as a ``Loop``.
"""
from __future__ import annotations

from ...errors import ShapeError
from ...ir.program import Var
from ..core.lowering import lowers
from ..core.registry import append_op, defop
from .cells import lstm_activations, lstm_unit_grad_math
from .sequence_onnx import flip_time, input_projection, rows_at, time_major_shape
from ..core.shapes import require_float


def _split_inputs(ins):
    """(x, w_ih, w_hh, b or None, h0, c0) of the forward op's inputs."""
    if len(ins) == 6:
        return tuple(ins)
    x, w_ih, w_hh, h0, c0 = ins
    return x, w_ih, w_hh, None, h0, c0


def _rule(ins, attrs):
    x, w_ih, w_hh, b, h0, c0 = _split_inputs(ins)
    require_float(x, "x")
    if x.ndim != 3 or w_ih.ndim != 2 or w_hh.ndim != 2:
        raise ShapeError(f"needs x [T, N, D], w_ih [D, 4H], w_hh [H, 4H], got {x.type_str()}, "
                         f"{w_ih.type_str()}, {w_hh.type_str()}")
    hidden = w_hh.shape[0]
    expected = {"w_ih": (x.shape[2], 4 * hidden), "w_hh": (hidden, 4 * hidden), "h0": (x.shape[1], hidden),
                "c0": (x.shape[1], hidden)}
    given = {"w_ih": w_ih, "w_hh": w_hh, "h0": h0, "c0": c0}
    if b is not None:
        expected["b"], given["b"] = (4 * hidden,), b
    for what, var in given.items():
        want = expected[what]
        if var.dtype != x.dtype or var.ndim != len(want) or any(
                a >= 0 and w >= 0 and a != w for a, w in zip(var.shape, want)):
            raise ShapeError(f"{what} must be {x.dtype}{list(want)}, got {var.type_str()}")
    steps, batch = x.shape[0], x.shape[1]
    seq, state = ((steps, batch, hidden), x.dtype), ((batch, hidden), x.dtype)
    return [seq, state, seq, state, ((-1,), x.dtype)]


def _grad(g):
    h_all, h_last, c_all, c_last, workspace = g.out
    from ..array.creation import zeros_like
    dh_all, dh_last, dc_all, dc_last = g.dout[:4]
    dh_all = dh_all if dh_all is not None else zeros_like(h_all)
    if dh_last is None and dc_last is None:     # one zero [N, H] for both (kernels only read them)
        dh_last = dc_last = zeros_like(h_last)
    dh_last, dc_last = (d if d is not None else zeros_like(out) for d, out in ((dh_last, h_last), (dc_last, c_last)))
    attrs = dict(g.attrs)
    if dc_all is not None:
        # Vendor kernels take no gradient for every step's cell: forward and backward run general.
        g.op.attrs["general"] = attrs["general"] = attrs["with_dc_all"] = True
        g.block.program.bump()
    ins = list(g.x) + [h_all, h_last, c_last, workspace, dh_all, dh_last, dc_last]
    return append_op("LSTMSequenceGrad", ins + ([dc_all] if dc_all is not None else []), attrs,
                     name="lstm_sequence_grad")


def _split_grad_inputs(ins, attrs):
    """(forward inputs, [h_all, h_last, c_last, workspace, dh_all, dh_last, dc_last], dc_all or None)."""
    tail = 8 if attrs.get("with_dc_all") else 7
    head, rest = list(ins[:len(ins) - tail]), list(ins[len(ins) - tail:])
    return head, rest[:7], (rest[7] if tail == 8 else None)


def _grad_rule(ins, attrs):
    head, _, _ = _split_grad_inputs(ins, attrs)
    return [(v.shape, v.dtype) for v in head]


# --- the general kernels (any Array API namespace) ----------------------------------------------

def _flip(xp, a, reverse: bool):
    return xp.flip(a, axis=0) if reverse else a


def general_forward(k, x, w_ih, w_hh, b, h0, c0):
    """(h_all, h_last, c_all, c_last, workspace): the workspace is [acts [T,N,4H], cells [T,N,H]] flattened,
    or with ``keep="cells"`` the cells alone (the backward makes each step's activations again)."""
    xp, hidden, reverse = k.xp, w_hh.shape[0], k.attrs["reverse"]
    steps, batch = x.shape[0], x.shape[1]
    x = _flip(xp, x, reverse)
    proj = k.backend.matmul(xp.reshape(x, (-1, x.shape[2])), w_ih)
    proj = xp.reshape(proj if b is None else proj + b, (steps, batch, 4 * hidden))
    acts = xp.zeros((steps, batch, 4 * hidden), dtype=x.dtype)
    cells = xp.zeros((steps, batch, hidden), dtype=x.dtype)
    hs = xp.zeros((steps, batch, hidden), dtype=x.dtype)
    h, c, fb = h0, c0, k.attrs["forget_bias"]
    for t in range(steps):
        # LSTMUnit's arithmetic (one tanh pass over the gates), written into the workspace.
        act = lstm_activations(xp, proj[t] + k.backend.matmul(h, w_hh), fb)
        c = act[:, hidden:2 * hidden] * c + act[:, :hidden] * act[:, 2 * hidden:3 * hidden]
        h = act[:, 3 * hidden:] * xp.tanh(c)
        acts[t], cells[t], hs[t] = act, c, h
    kept = [cells] if k.attrs.get("keep") == "cells" else [acts, cells]
    workspace = xp.concat([xp.reshape(a, (-1,)) for a in kept])
    return _flip(xp, hs, reverse), h, _flip(xp, cells, reverse), c, workspace


def general_backward(k, x, w_ih, w_hh, b, h0, c0, h_all, workspace, dh_all, dh_last, dc_last, dc_all=None):
    """(dx, dw_ih, dw_hh, db or None, dh0, dc0) from the general forward's workspace."""
    xp, hidden, reverse = k.xp, w_hh.shape[0], k.attrs["reverse"]
    steps, batch = x.shape[0], x.shape[1]
    x, h_all, dh_all = (_flip(xp, a, reverse) for a in (x, h_all, dh_all))
    if dc_all is not None:
        dc_all = _flip(xp, dc_all, reverse)
    h_prev = xp.concat([xp.expand_dims(h0, axis=0), h_all[:-1]], axis=0) if steps else h_all
    cells = xp.reshape(workspace[-steps * batch * hidden:] if steps * batch * hidden else workspace[:0],
                       (steps, batch, hidden))
    if k.attrs.get("keep") == "cells":
        def acts_at(t):     # the step's activations again: its two small GEMMs and one tanh pass
            gates = k.backend.matmul(x[t], w_ih) + k.backend.matmul(h_prev[t], w_hh)
            return lstm_activations(xp, gates if b is None else gates + b, k.attrs["forget_bias"])
    else:
        acts = xp.reshape(workspace[:steps * batch * 4 * hidden], (steps, batch, 4 * hidden))

        def acts_at(t):
            return acts[t]
    dgates = xp.zeros((steps, batch, 4 * hidden), dtype=x.dtype)
    dh, dc = dh_last, dc_last
    for t in range(steps - 1, -1, -1):
        dgates[t], dc = lstm_unit_grad_math(xp, acts_at(t), cells[t - 1] if t else c0, cells[t],
                                            dh + dh_all[t], dc if dc_all is None else dc + dc_all[t])
        dh = k.backend.matmul(dgates[t], w_hh, transpose_y=True)
    flat_dg = xp.reshape(dgates, (-1, 4 * hidden))
    dx = xp.reshape(k.backend.matmul(flat_dg, w_ih, transpose_y=True), tuple(x.shape))
    dw_ih = k.backend.matmul(xp.reshape(x, (-1, x.shape[2])), flat_dg, transpose_x=True)
    dw_hh = k.backend.matmul(xp.reshape(h_prev, (-1, hidden)), flat_dg, transpose_x=True)
    db = None if b is None else xp.sum(flat_dg, axis=0)
    return _flip(xp, dx, reverse), dw_ih, dw_hh, db, dh, dc


# --- the ops ------------------------------------------------------------------------------------

def _fused(k, method: str):
    """The backend's fused kernel, when it has one and the op keeps everything (a vendor kernel's
    workspace is all or nothing; ``keep="cells"`` runs the general kernels) and no gradient
    flows through ``c_all`` (attr ``general``)."""
    if k.attrs.get("keep", "all") != "all" or k.attrs.get("general"):
        return None
    return getattr(k.backend, method, None)


def _expand(op, block) -> None:
    """Build the general form of ``op`` (``seq_linear`` + a ``RecurrentNetwork`` of ``LSTMUnit``
    steps) at the end of ``block``; return {name built: ``op``'s output it stands for} (h_all,
    h_last, c_all, c_last). The caller renames those, puts the new ops where ``op`` was and drops
    it. Passes that schedule recurrences (the whole-program memory budget) call it through
    ``OpDef.extra["expand"]``."""
    from ..math.elementwise import matmul
    from .network import recurrent
    from .cells import lstm_unit, seq_linear
    x, w_ih, w_hh, b, h0, c0 = _split_inputs([block.var(n) for n in op.inputs])
    fb, reverse = op.attrs["forget_bias"], op.attrs["reverse"]
    x_proj = seq_linear(x, w_ih, b)

    def step(x_t, states):
        h, c = states
        return list(lstm_unit(x_t[0], c, fb, h_gates=matmul(h, w_hh)))
    all_states, last_states = recurrent(step, [x_proj], [h0, c0], reverse=reverse)
    return {value.name: name for value, name in
            zip((all_states[0], last_states[0], all_states[1], last_states[1]), op.outputs[:4])}


@defop("LSTMSequence", inputs=("x", "w_ih", "w_hh", "b?", "h0", "c0"),
       outputs=("h_all", "h_last", "c_all", "c_last", "workspace"), infer=_rule, grad=_grad, expand=_expand)
def _lstm_sequence(k, *ins):
    """A whole LSTM layer: the backend's fused kernel where it has one, else the general loop."""
    x, w_ih, w_hh, b, h0, c0 = _split_inputs(ins)
    fused = _fused(k, "fused_lstm_forward")
    out = fused(x, w_ih, w_hh, b, h0, c0, k.attrs["forget_bias"], k.attrs["reverse"]) if fused else None
    if out is None:
        return general_forward(k, x, w_ih, w_hh, b, h0, c0)
    h_all, h_last, c_last, workspace = out
    c_all = cells_of(k, x, w_ih, w_hh, b, h0, c0, h_all) if 2 in k.live_outputs else None
    return h_all, h_last, c_all, c_last, workspace


def cells_of(k, x, w_ih, w_hh, b, h0, c0, h_all):
    """Every step's cell state, from the inputs and ``h_all`` (a vendor kernel returns no cells):
    each step's gates again from the state before it, then ``c_t = f_t c_(t-1) + i_t g_t``."""
    xp, hidden, reverse = k.xp, w_hh.shape[0], k.attrs["reverse"]
    x, h_all = _flip(xp, x, reverse), _flip(xp, h_all, reverse)
    cells, c = [], c0
    for t in range(x.shape[0]):
        gates = k.backend.matmul(x[t], w_ih) + k.backend.matmul(h_all[t - 1] if t else h0, w_hh)
        act = lstm_activations(xp, gates if b is None else gates + b, k.attrs["forget_bias"])
        c = act[:, hidden:2 * hidden] * c + act[:, :hidden] * act[:, 2 * hidden:3 * hidden]
        cells.append(c)
    return _flip(xp, xp.stack(cells) if cells else xp.zeros(tuple(h_all.shape), dtype=x.dtype), reverse)


@defop("LSTMSequenceGrad", inputs=("x", "w_ih", "w_hh", "b?", "h0", "c0", "h_all", "h_last", "c_last",
                                   "workspace", "dh_all", "dh_last", "dc_last", "dc_all?"),
       outputs=("dx", "dw_ih", "dw_hh", "db?", "dh0", "dc0"), infer=_grad_rule)
def _lstm_sequence_grad(k, *ins):
    """The gradient of ``LSTMSequence`` from its workspace, with the kernel the forward used."""
    head, rest, dc_all = _split_grad_inputs(ins, k.attrs)
    x, w_ih, w_hh, b, h0, c0 = _split_inputs(head)
    h_all, h_last, c_last, workspace, dh_all, dh_last, dc_last = rest
    fused = _fused(k, "fused_lstm_backward")
    out = fused(x, w_ih, w_hh, b, h0, c0, h_all, h_last, c_last, workspace, dh_all, dh_last, dc_last,
                k.attrs["forget_bias"], k.attrs["reverse"]) if fused else None
    if out is None:
        out = general_backward(k, x, w_ih, w_hh, b, h0, c0, h_all, workspace, dh_all, dh_last, dc_last,
                               dc_all)
    dx, dw_ih, dw_hh, db, dh0, dc0 = out
    return (dx, dw_ih, dw_hh, dh0, dc0) if b is None else (dx, dw_ih, dw_hh, db, dh0, dc0)


def lstm_sequence(x: Var, w_ih: Var, w_hh: Var, b: Var | None, h0: Var, c0: Var, forget_bias: float = 0.0,
                  reverse: bool = False, keep: str = "all") -> tuple[Var, Var, Var, Var]:
    """A whole one-direction LSTM layer as one op: ``(h_all [T,N,H], h_last, c_all [T,N,H], c_last)``.

    The math of ``layers.lstm`` (gate order i, f, g, o, ``forget_bias`` added to
    f); ``reverse=True`` reads right to left. Runs the backend's fused kernel
    (oneDNN on torch CPU, float32) where there is one. ``keep="cells"`` keeps
    only each step's cell state for the backward, which makes the step's gate
    activations again (``layers.lstm(recompute="steps")``; general kernels).

    Example::

        h_all, h_last, c_all, c_last = rg.lstm_sequence(x, w_ih, w_hh, b, h0, c0)
    """
    if keep not in ("all", "cells"):
        raise ShapeError(f"lstm_sequence: keep must be 'all' or 'cells', got {keep!r}")
    ins = [x, w_ih, w_hh] + ([b] if b is not None else []) + [h0, c0]
    attrs = {"forget_bias": float(forget_bias), "reverse": bool(reverse), "keep": keep}
    h_all, h_last, c_all, c_last, _ = append_op("LSTMSequence", ins, attrs, name="lstm_sequence")
    return h_all, h_last, c_all, c_last


# --- ONNX ---------------------------------------------------------------------------------------

def _onnx_gate_order(g, w: str, axis: int) -> str:
    """Blocks i, f, g, o along ``axis`` reordered to ONNX's i, o, f, c."""
    i, f, c, o = g.node("Split", [w, g.const([int(g.in_vars[2].shape[0])] * 4, "int64")], n_out=4, axis=axis)
    return g.node("Concat", [i, o, f, c], axis=axis)


@lowers("LSTMSequence")
def _lstm_sequence_onnx(g):
    """ONNX ``LSTM`` (float32: onnxruntime's LSTM has no float64 kernel, which runs as a ``Loop``)."""
    if g.in_vars[0].dtype != "float32":
        return _lstm_sequence_loop_onnx(g)
    x, w_ih, w_hh, b, h0, c0 = _split_inputs(g.ins)
    dtype, hidden = g.in_vars[0].dtype, int(g.in_vars[2].shape[0])
    zero = g.const([0], "int64")
    w = g.node("Unsqueeze", [g.node("Transpose", [_onnx_gate_order(g, w_ih, 1)], perm=[1, 0]), zero])
    r = g.node("Unsqueeze", [g.node("Transpose", [_onnx_gate_order(g, w_hh, 1)], perm=[1, 0]), zero])
    bias = b if b is not None else g.fill(g.const([4 * hidden], "int64"), 0.0, dtype)
    if g.attrs["forget_bias"]:
        shift = [0.0] * hidden + [0.0] * hidden + [g.attrs["forget_bias"]] * hidden + [0.0] * hidden
        bias = g.node("Add", [_onnx_gate_order(g, bias, 0), g.const(shift, dtype)])
    else:
        bias = _onnx_gate_order(g, bias, 0)
    both = g.node("Unsqueeze", [g.node("Concat", [bias, g.fill(g.const([4 * hidden], "int64"), 0.0, dtype)],
                                       axis=0), zero])
    direction = "reverse" if g.attrs["reverse"] else "forward"
    y, y_h, y_c = g.node("LSTM", [x, w, r, both, "", g.node("Unsqueeze", [h0, zero]),
                                  g.node("Unsqueeze", [c0, zero])], n_out=3, hidden_size=hidden,
                         direction=direction)
    one = g.const([1], "int64")
    # onnxruntime's LSTM over no steps leaves Y_h / Y_c unset: the last states are then h0 / c0.
    empty = g.node("Equal", [g.dim(x, 0), zero])
    h_last = g.node("Where", [empty, h0, g.node("Squeeze", [y_h, zero])])
    c_last = g.node("Where", [empty, c0, g.node("Squeeze", [y_c, zero])])
    h_all = g.node("Squeeze", [y, one])
    # ONNX's LSTM returns no per-step cells: c_all (when read) from h_all, as the kernels do.
    flip = flip_time if g.attrs["reverse"] else (lambda _, v: v)
    c_all = flip(g, _gates_and_cells(g, flip(g, x), flip(g, h_all), w_ih, w_hh, b, h0, c0)[2])
    # The ONNX form keeps no workspace: its gradient recomputes the gates from h_all.
    return [h_all, h_last, c_all, c_last, g.fill(zero, 0.0, dtype)]


def _lstm_sequence_loop_onnx(g):
    """The forward as a ``Loop`` over time: the input projection once, one GEMM and the cell per step."""
    x, w_ih, w_hh, b, h0, c0 = _split_inputs(g.ins)
    dtype, hidden = g.in_vars[0].dtype, int(g.in_vars[2].shape[0])
    reverse = g.attrs["reverse"]
    x, proj = input_projection(g, x, w_ih, b, reverse)
    zero = g.const([0], "int64")
    body = g.child()
    t = body.input("t", "int64", [])
    cond = body.input("cond", "bool", [])
    h = body.input("h", dtype, None)
    c = body.input("c", dtype, None)
    gates = body.node("Add", [rows_at(body, proj, t), body.node("MatMul", [h, w_hh])])
    i, f, gg, o = body.node("Split", [gates, body.const([hidden] * 4, "int64")], n_out=4, axis=-1)
    if g.attrs["forget_bias"]:
        f = body.node("Add", [f, body.const(g.attrs["forget_bias"], dtype)])
    c = body.node("Add", [body.node("Mul", [body.node("Sigmoid", [f]), c]),
                          body.node("Mul", [body.node("Sigmoid", [i]), body.node("Tanh", [gg])])])
    h = body.node("Mul", [body.node("Sigmoid", [o]), body.node("Tanh", [c])])
    graph = body.finish("lstm_steps", [(body.node("Identity", [cond]), "bool", []), (h, dtype, None),
                                       (c, dtype, None), (body.node("Identity", [h]), dtype, None),
                                       (body.node("Identity", [c]), dtype, None)])
    count = g.node("Squeeze", [g.dim(x, 0), zero])
    h_last, c_last, h_all, c_all = g.node("Loop", [count, g.const(True, "bool"), h0, c0], n_out=4, body=graph)
    shape = time_major_shape(g, x, hidden)
    h_all, c_all = (g.node("Reshape", [v, shape], allowzero=1) for v in (h_all, c_all))
    if reverse:
        h_all, c_all = flip_time(g, h_all), flip_time(g, c_all)
    return [h_all, h_last, c_all, c_last, g.fill(zero, 0.0, dtype)]


def _gates_and_cells(g, x: str, h_all: str, w_ih: str, w_hh: str, b: str | None, h0: str, c0: str):
    """(h_prev, [i, f, g, o] activations, cells) of every step in processing order, from ``h_all``:
    the gates in two GEMMs (each step's previous state is known), the cells by a ``Loop``."""
    dtype, hidden = g.in_vars[0].dtype, int(g.in_vars[2].shape[0])
    zero, steps = g.const([0], "int64"), g.dim(x, 0)
    h_prev = g.node("Slice", [g.node("Concat", [g.node("Unsqueeze", [h0, zero]), h_all], axis=0), zero, steps, zero])
    gates = g.node("Add", [g.node("MatMul", [x, w_ih]), g.node("MatMul", [h_prev, w_hh])])
    if b is not None:
        gates = g.node("Add", [gates, b])
    i, f, gg, o = g.node("Split", [gates, g.const([hidden] * 4, "int64")], n_out=4, axis=-1)
    if g.attrs["forget_bias"]:
        f = g.node("Add", [f, g.const(g.attrs["forget_bias"], dtype)])
    acts = [g.node("Sigmoid", [i]), g.node("Sigmoid", [f]), g.node("Tanh", [gg]), g.node("Sigmoid", [o])]
    body = g.child()
    t = body.input("t", "int64", [])
    cond = body.input("cond", "bool", [])
    c = body.input("c", dtype, None)
    c = body.node("Add", [body.node("Mul", [rows_at(body, acts[1], t), c]),
                          body.node("Mul", [rows_at(body, acts[0], t), rows_at(body, acts[2], t)])])
    graph = body.finish("lstm_cells", [(body.node("Identity", [cond]), "bool", []), (c, dtype, None),
                                       (body.node("Identity", [c]), dtype, None)])
    _, cells = g.node("Loop", [g.node("Squeeze", [steps, zero]), g.const(True, "bool"), c0], n_out=2, body=graph)
    return h_prev, acts, g.node("Reshape", [cells, time_major_shape(g, x, hidden)], allowzero=1)


@lowers("LSTMSequenceGrad")
def _lstm_sequence_grad_onnx(g):
    """The gates again from ``h_all`` (one GEMM: no recurrence), the cells by a ``Loop``, then the
    reverse loop (a ``Loop`` over reversed time) and one GEMM each for the weight and input gradients."""
    head, rest, dc_all = _split_grad_inputs(g.ins, g.attrs)
    x, w_ih, w_hh, b, h0, c0 = _split_inputs(head)
    h_all, _, _, _, dh_all, dh_last, dc_last = rest
    dtype, hidden = g.in_vars[0].dtype, int(g.in_vars[2].shape[0])
    reverse = g.attrs["reverse"]
    if reverse:
        x, h_all, dh_all = (flip_time(g, v) for v in (x, h_all, dh_all))
        dc_all = None if dc_all is None else flip_time(g, dc_all)
    zero, steps = g.const([0], "int64"), g.dim(x, 0)
    h_prev, (i, f, gg, o), cells = _gates_and_cells(g, x, h_all, w_ih, w_hh, b, h0, c0)
    count = g.node("Squeeze", [steps, zero])
    c_prev = g.node("Slice", [g.node("Concat", [g.node("Unsqueeze", [c0, zero]), cells], axis=0), zero, steps, zero])

    body = g.child()
    j = body.input("j", "int64", [])
    cond = body.input("cond", "bool", [])
    dh = body.input("dh", dtype, None)
    dc = body.input("dc", dtype, None)
    t = body.node("Sub", [body.node("Sub", [count, body.const(1, "int64")]), j])
    it, ft, gt, ot = (rows_at(body, v, t) for v in (i, f, gg, o))
    one = body.const(1.0, dtype)
    dh = body.node("Add", [dh, rows_at(body, dh_all, t)])
    if dc_all is not None:
        dc = body.node("Add", [dc, rows_at(body, dc_all, t)])
    tc = body.node("Tanh", [rows_at(body, cells, t)])
    dc = body.node("Add", [dc, body.node("Mul", [body.node("Mul", [dh, ot]),
                                                 body.node("Sub", [one, body.node("Mul", [tc, tc])])])])

    def slope(a):
        return body.node("Mul", [a, body.node("Sub", [one, a])])
    dgates = body.node("Concat", [
        body.node("Mul", [body.node("Mul", [dc, gt]), slope(it)]),
        body.node("Mul", [body.node("Mul", [dc, rows_at(body, c_prev, t)]), slope(ft)]),
        body.node("Mul", [body.node("Mul", [dc, it]), body.node("Sub", [one, body.node("Mul", [gt, gt])])]),
        body.node("Mul", [body.node("Mul", [dh, tc]), slope(ot)])], axis=-1)
    dc_next = body.node("Mul", [dc, ft])
    dh_next = body.node("MatMul", [dgates, body.node("Transpose", [w_hh], perm=[1, 0])])
    graph = body.finish("lstm_backward", [(body.node("Identity", [cond]), "bool", []), (dh_next, dtype, None),
                                          (dc_next, dtype, None), (dgates, dtype, None)])
    dh0, dc0, dgates = g.node("Loop", [count, g.const(True, "bool"), dh_last, dc_last], n_out=3, body=graph)
    gate_shape = g.node("Concat", [g.node("Slice", [g.shape(x), zero, g.const([2], "int64")]),
                                   g.const([4 * hidden], "int64")], axis=0)
    dgates = flip_time(g, g.node("Reshape", [dgates, gate_shape], allowzero=1))     # back to time order
    flat_dg = g.node("Reshape", [dgates, g.const([-1, 4 * hidden], "int64")])
    d_in = int(g.in_vars[0].shape[2])
    dx = g.node("Reshape", [g.node("MatMul", [flat_dg, g.node("Transpose", [w_ih], perm=[1, 0])]), g.shape(x)],
                allowzero=1)
    dw_ih = g.node("MatMul", [g.node("Transpose", [g.node("Reshape", [x, g.const([-1, d_in], "int64")])],
                                     perm=[1, 0]), flat_dg])
    dw_hh = g.node("MatMul", [g.node("Transpose", [g.node("Reshape", [h_prev, g.const([-1, hidden], "int64")])],
                                     perm=[1, 0]), flat_dg])
    if reverse:
        dx = flip_time(g, dx)
    outs = [dx, dw_ih, dw_hh]
    if b is not None:
        outs.append(g.node("ReduceSum", [flat_dg, zero], keepdims=0))
    return outs + [dh0, dc0]
