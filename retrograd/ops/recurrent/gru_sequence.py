"""``GRUSequence``: a whole GRU layer (one direction) as one op, with a vendor kernel where there is one.

The GRU counterpart of ``LSTMSequence`` (see ops/lstm_sequence.py for the
design): ``layers.gru(..., fused=True)`` builds it where nothing needs the
step-by-step ``RecurrentNetwork``; a whole-program ``memory_budget`` expands it
back into that general form first (``extra["expand"]``).

Inputs ``x [T, N, D]``, ``w_ih [D, 3H]``, ``w_hh [H, 3H]``, ``b_ih [3H]`` and
``b_hh [3H]`` (both or neither: attr ``has_bias``), ``h0 [N, H]``; gate order
r, z, n as ``torch.nn.GRU`` and ``layers.gru``:
``n = tanh(x W_n + b_in + r * (h U_n + b_hn))``, ``h' = (1 - z) * n + z * h``.
Outputs ``h_all [T, N, H]``, ``h_last`` and ``workspace``: an opaque float
vector that only ``GRUSequenceGrad`` reads.

Kernels: a backend with a fused GRU (``Backend.fused_gru_forward`` /
``fused_gru_backward``: cuDNN through torch on CUDA) runs it and its
workspace; elsewhere the general kernels below run (there is no oneDNN GRU
reachable on CPU): one GEMM for the input projection, one small GEMM and
GRUUnit's elementwise work per step, both projections kept as the workspace;
the backward runs GRUUnitGrad's arithmetic per step, then one GEMM each for
``dx``, ``dw_ih``, ``dw_hh``. ONNX: the forward is ONNX ``GRU``
(``linear_before_reset=1``; a ``Loop`` for float64); the gradient recomputes
both projections from ``h_all`` (two GEMMs, no recurrence) and runs the
reverse loop as a ``Loop``.
"""
from __future__ import annotations

from ...errors import ShapeError
from ...ir.program import Var
from ..core.lowering import lowers
from ..core.registry import append_op, defop
from .cells import gru_activations, gru_unit_grad_math
from .sequence_onnx import flip_time, input_projection, rows_at, time_major_shape
from ..core.shapes import require_float


def _split_inputs(ins, attrs):
    """(x, w_ih, w_hh, b_ih or None, b_hh or None, h0) of the forward op's inputs."""
    if attrs["has_bias"]:
        return tuple(ins[:6])
    x, w_ih, w_hh, h0 = ins[:4]
    return x, w_ih, w_hh, None, None, h0


def _forward_arity(attrs) -> int:
    return 6 if attrs["has_bias"] else 4


def _rule(ins, attrs):
    x, w_ih, w_hh, b_ih, b_hh, h0 = _split_inputs(ins, attrs)
    require_float(x, "x")
    if x.ndim != 3 or w_ih.ndim != 2 or w_hh.ndim != 2:
        raise ShapeError(f"needs x [T, N, D], w_ih [D, 3H], w_hh [H, 3H], got {x.type_str()}, "
                         f"{w_ih.type_str()}, {w_hh.type_str()}")
    hidden = w_hh.shape[0]
    expected = {"w_ih": (x.shape[2], 3 * hidden), "w_hh": (hidden, 3 * hidden), "h0": (x.shape[1], hidden)}
    given = {"w_ih": w_ih, "w_hh": w_hh, "h0": h0}
    if b_ih is not None:
        expected.update(b_ih=(3 * hidden,), b_hh=(3 * hidden,))
        given.update(b_ih=b_ih, b_hh=b_hh)
    for what, var in given.items():
        want = expected[what]
        if var.dtype != x.dtype or var.ndim != len(want) or any(
                a >= 0 and w >= 0 and a != w for a, w in zip(var.shape, want)):
            raise ShapeError(f"{what} must be {x.dtype}{list(want)}, got {var.type_str()}")
    return [((x.shape[0], x.shape[1], hidden), x.dtype), ((x.shape[1], hidden), x.dtype), ((-1,), x.dtype)]


def _grad(g):
    from ..array.creation import zeros_like
    h_all, h_last, workspace = g.out
    dh_all, dh_last = (d if d is not None else zeros_like(out)
                       for d, out in ((g.dout[0], h_all), (g.dout[1], h_last)))
    return append_op("GRUSequenceGrad", list(g.x) + [h_all, h_last, workspace, dh_all, dh_last],
                     dict(g.attrs), name="gru_sequence_grad")


def _grad_rule(ins, attrs):
    return [(v.shape, v.dtype) for v in ins[:_forward_arity(attrs)]]


# --- the general kernels (any Array API namespace) ----------------------------------------------

def _flip(xp, a, reverse: bool):
    return xp.flip(a, axis=0) if reverse else a


def _hidden_projection(k, h, w_hh, b_hh):
    proj = k.backend.matmul(h, w_hh)
    return proj if b_hh is None else proj + b_hh


def general_forward(k, x, w_ih, w_hh, b_ih, b_hh, h0):
    """(h_all, h_last, workspace): the workspace is both projections ``[xproj; hproj]`` of every
    step ``[2, T, N, 3H]`` flattened, in processing order."""
    xp, hidden, reverse = k.xp, w_hh.shape[0], k.attrs["reverse"]
    steps, batch = x.shape[0], x.shape[1]
    x = _flip(xp, x, reverse)
    xproj = k.backend.matmul(xp.reshape(x, (-1, x.shape[2])), w_ih)
    xproj = xp.reshape(xproj if b_ih is None else xproj + b_ih, (steps, batch, 3 * hidden))
    hproj = xp.zeros((steps, batch, 3 * hidden), dtype=x.dtype)
    hs = xp.zeros((steps, batch, hidden), dtype=x.dtype)
    h = h0
    for t in range(steps):
        hproj[t] = _hidden_projection(k, h, w_hh, b_hh)
        _, z, n = gru_activations(xp, xproj[t], hproj[t], hidden)
        h = n + z * (h - n)
        hs[t] = h
    workspace = xp.concat([xp.reshape(xproj, (-1,)), xp.reshape(hproj, (-1,))])
    return _flip(xp, hs, reverse), h, workspace


def general_backward(k, x, w_ih, w_hh, b_ih, b_hh, h0, h_all, workspace, dh_all, dh_last):
    """(dx, dw_ih, dw_hh, db_ih or None, db_hh or None, dh0) from the general forward's workspace."""
    xp, hidden, reverse = k.xp, w_hh.shape[0], k.attrs["reverse"]
    steps, batch = x.shape[0], x.shape[1]
    x, h_all, dh_all = (_flip(xp, a, reverse) for a in (x, h_all, dh_all))
    h_prev = xp.concat([xp.expand_dims(h0, axis=0), h_all[:-1]], axis=0) if steps else h_all
    size = steps * batch * 3 * hidden
    xproj = xp.reshape(workspace[:size], (steps, batch, 3 * hidden))
    hproj = xp.reshape(workspace[size:2 * size], (steps, batch, 3 * hidden))
    dxproj = xp.zeros((steps, batch, 3 * hidden), dtype=x.dtype)
    dhproj = xp.zeros((steps, batch, 3 * hidden), dtype=x.dtype)
    dh = dh_last
    for t in range(steps - 1, -1, -1):
        dxproj[t], dhproj[t], direct = gru_unit_grad_math(xp, xproj[t], hproj[t], h_prev[t], dh + dh_all[t])
        dh = direct + k.backend.matmul(dhproj[t], w_hh, transpose_y=True)
    flat_dx, flat_dh = xp.reshape(dxproj, (-1, 3 * hidden)), xp.reshape(dhproj, (-1, 3 * hidden))
    dx = xp.reshape(k.backend.matmul(flat_dx, w_ih, transpose_y=True), tuple(x.shape))
    dw_ih = k.backend.matmul(xp.reshape(x, (-1, x.shape[2])), flat_dx, transpose_x=True)
    dw_hh = k.backend.matmul(xp.reshape(h_prev, (-1, hidden)), flat_dh, transpose_x=True)
    db_ih = None if b_ih is None else xp.sum(flat_dx, axis=0)
    db_hh = None if b_hh is None else xp.sum(flat_dh, axis=0)
    return _flip(xp, dx, reverse), dw_ih, dw_hh, db_ih, db_hh, dh


# --- the ops ------------------------------------------------------------------------------------

def _expand(op, block) -> dict:
    """Build the general form of ``op`` (``seq_linear`` + a ``RecurrentNetwork`` of ``GRUUnit``
    steps, as ``layers.gru`` builds it) at the end of ``block``; return {name built: ``op``'s
    output it stands for} (h_all, h_last). See ops/lstm_sequence.py's ``_expand``."""
    from ..math.elementwise import matmul
    from .network import recurrent
    from .cells import gru_unit, seq_linear
    x, w_ih, w_hh, b_ih, b_hh, h0 = _split_inputs([block.var(n) for n in op.inputs], op.attrs)
    x_proj = seq_linear(x, w_ih, b_ih)

    def step(x_t, states):
        h, = states
        h_proj = matmul(h, w_hh)
        return [gru_unit(x_t[0], h_proj if b_hh is None else h_proj + b_hh, h)]
    all_states, last_states = recurrent(step, [x_proj], [h0], reverse=op.attrs["reverse"])
    return {all_states[0].name: op.outputs[0], last_states[0].name: op.outputs[1]}


@defop("GRUSequence", inputs=("x", "w_ih", "w_hh", "b_ih?", "b_hh?", "h0"),
       outputs=("h_all", "h_last", "workspace"), infer=_rule, grad=_grad, expand=_expand)
def _gru_sequence(k, *ins):
    """A whole GRU layer: the backend's fused kernel where it has one, else the general loop."""
    x, w_ih, w_hh, b_ih, b_hh, h0 = _split_inputs(ins, k.attrs)
    fused = getattr(k.backend, "fused_gru_forward", None)
    out = fused(x, w_ih, w_hh, b_ih, b_hh, h0, k.attrs["reverse"]) if fused else None
    return out if out is not None else general_forward(k, x, w_ih, w_hh, b_ih, b_hh, h0)


@defop("GRUSequenceGrad", inputs=("x", "w_ih", "w_hh", "b_ih?", "b_hh?", "h0", "h_all", "h_last", "workspace",
                                  "dh_all", "dh_last"),
       outputs=("dx", "dw_ih", "dw_hh", "db_ih?", "db_hh?", "dh0"), infer=_grad_rule)
def _gru_sequence_grad(k, *ins):
    """The gradient of ``GRUSequence`` from its workspace, with the kernel the forward used."""
    arity = _forward_arity(k.attrs)
    x, w_ih, w_hh, b_ih, b_hh, h0 = _split_inputs(ins[:arity], k.attrs)
    h_all, h_last, workspace, dh_all, dh_last = ins[arity:]
    fused = getattr(k.backend, "fused_gru_backward", None)
    out = fused(x, w_ih, w_hh, b_ih, b_hh, h0, h_all, h_last, workspace, dh_all, dh_last,
                k.attrs["reverse"]) if fused else None
    if out is None:
        out = general_backward(k, x, w_ih, w_hh, b_ih, b_hh, h0, h_all, workspace, dh_all, dh_last)
    dx, dw_ih, dw_hh, db_ih, db_hh, dh0 = out
    return (dx, dw_ih, dw_hh, db_ih, db_hh, dh0) if k.attrs["has_bias"] else (dx, dw_ih, dw_hh, dh0)


def gru_sequence(x: Var, w_ih: Var, w_hh: Var, b_ih: Var | None, b_hh: Var | None, h0: Var,
                 reverse: bool = False) -> tuple[Var, Var]:
    """A whole one-direction GRU layer as one op: ``(h_all [T,N,H], h_last [N,H])``.

    The math of ``layers.gru`` and ``torch.nn.GRU`` (gate order r, z, n;
    ``n = tanh(x W_n + b_in + r * (h U_n + b_hn))``); ``b_ih`` and ``b_hh`` are
    both given or both None; ``reverse=True`` reads right to left. Runs the
    backend's fused kernel (cuDNN on torch CUDA) where there is one, else one
    general loop that is faster than the step-by-step recurrence.

    Example::

        h_all, h_last = rg.gru_sequence(x, w_ih, w_hh, b_ih, b_hh, h0)
    """
    if (b_ih is None) != (b_hh is None):
        raise ShapeError("gru_sequence: give both b_ih and b_hh, or neither")
    ins = [x, w_ih, w_hh] + ([b_ih, b_hh] if b_ih is not None else []) + [h0]
    attrs = {"reverse": bool(reverse), "has_bias": b_ih is not None}
    h_all, h_last, _ = append_op("GRUSequence", ins, attrs, name="gru_sequence")
    return h_all, h_last


# --- ONNX ---------------------------------------------------------------------------------------

def _onnx_zrn(g, w: str, axis: int) -> str:
    """Blocks r, z, n along ``axis`` reordered to ONNX's z, r, h."""
    hidden = int(g.in_vars[2].shape[0])
    r, z, n = g.node("Split", [w, g.const([hidden] * 3, "int64")], n_out=3, axis=axis)
    return g.node("Concat", [z, r, n], axis=axis)


@lowers("GRUSequence")
def _gru_sequence_onnx(g):
    """ONNX ``GRU`` with ``linear_before_reset=1`` (torch's GRU); a ``Loop`` for float64.

    onnxruntime's GRU aborts the process on an empty sequence, so the node sits in the
    ``else`` branch of an ``If`` whose ``then`` branch answers ``T == 0`` (``h_last = h0``)."""
    if g.in_vars[0].dtype != "float32":
        return _gru_sequence_loop_onnx(g)
    x, h0 = g.ins[0], _split_inputs(g.ins, g.attrs)[5]
    dtype, hidden = g.in_vars[0].dtype, int(g.in_vars[2].shape[0])
    zero = g.const([0], "int64")
    empty = g.node("Squeeze", [g.node("Equal", [g.dim(x, 0), zero]), zero])
    no_steps = g.child()
    no_steps_graph = no_steps.finish("gru_no_steps", [
        (no_steps.fill(time_major_shape(no_steps, x, hidden), 0.0, dtype), dtype, [None] * 3),
        (no_steps.node("Identity", [h0]), dtype, [None] * 2)])
    steps = g.child()
    steps_graph = steps.finish("gru_steps", [(v, dtype, [None] * n) for v, n in zip(_gru_node(steps), (3, 2))])
    h_all, h_last = g.node("If", [empty], n_out=2, then_branch=no_steps_graph, else_branch=steps_graph)
    return [h_all, h_last, g.fill(zero, 0.0, dtype)]


def _gru_node(g) -> tuple[str, str]:
    """(h_all, h_last) from one ONNX ``GRU`` node (at least one step)."""
    x, w_ih, w_hh, b_ih, b_hh, h0 = _split_inputs(g.ins, g.attrs)
    hidden = int(g.in_vars[2].shape[0])
    zero = g.const([0], "int64")
    w = g.node("Unsqueeze", [g.node("Transpose", [_onnx_zrn(g, w_ih, 1)], perm=[1, 0]), zero])
    r = g.node("Unsqueeze", [g.node("Transpose", [_onnx_zrn(g, w_hh, 1)], perm=[1, 0]), zero])
    bias = ""
    if b_ih is not None:
        bias = g.node("Unsqueeze", [g.node("Concat", [_onnx_zrn(g, b_ih, 0), _onnx_zrn(g, b_hh, 0)], axis=0), zero])
    direction = "reverse" if g.attrs["reverse"] else "forward"
    y, y_h = g.node("GRU", [x, w, r, bias, "", g.node("Unsqueeze", [h0, zero])], n_out=2, hidden_size=hidden,
                    direction=direction, linear_before_reset=1)
    return g.node("Squeeze", [y, g.const([1], "int64")]), g.node("Squeeze", [y_h, zero])


def _projections(g, x: str, h_prev: str, w_ih: str, w_hh: str, b_ih, b_hh) -> tuple[str, str]:
    xproj = g.node("MatMul", [x, w_ih])
    hproj = g.node("MatMul", [h_prev, w_hh])
    if b_ih is not None:
        xproj, hproj = g.node("Add", [xproj, b_ih]), g.node("Add", [hproj, b_hh])
    return xproj, hproj


def _activations(g, xproj: str, hproj: str, hidden: int):
    """(r, z, n, h_n) of rows of both projections."""
    sizes = g.const([hidden] * 3, "int64")
    xr, xz, xn = g.node("Split", [xproj, sizes], n_out=3, axis=-1)
    hr, hz, hn = g.node("Split", [hproj, sizes], n_out=3, axis=-1)
    r = g.node("Sigmoid", [g.node("Add", [xr, hr])])
    z = g.node("Sigmoid", [g.node("Add", [xz, hz])])
    n = g.node("Tanh", [g.node("Add", [xn, g.node("Mul", [r, hn])])])
    return r, z, n, hn


def _gru_sequence_loop_onnx(g):
    """The forward as a ``Loop`` over time: the input projection once, one GEMM and the cell per step."""
    x, w_ih, w_hh, b_ih, b_hh, h0 = _split_inputs(g.ins, g.attrs)
    dtype, hidden = g.in_vars[0].dtype, int(g.in_vars[2].shape[0])
    reverse = g.attrs["reverse"]
    x, xproj = input_projection(g, x, w_ih, b_ih, reverse)
    zero = g.const([0], "int64")
    body = g.child()
    t = body.input("t", "int64", [])
    cond = body.input("cond", "bool", [])
    h = body.input("h", dtype, None)
    hproj = body.node("MatMul", [h, w_hh])
    if b_hh is not None:
        hproj = body.node("Add", [hproj, b_hh])
    _, z, n, _ = _activations(body, rows_at(body, xproj, t), hproj, hidden)
    h = body.node("Add", [n, body.node("Mul", [z, body.node("Sub", [h, n])])])
    graph = body.finish("gru_steps", [(body.node("Identity", [cond]), "bool", []), (h, dtype, None),
                                      (body.node("Identity", [h]), dtype, None)])
    count = g.node("Squeeze", [g.dim(x, 0), zero])
    h_last, h_all = g.node("Loop", [count, g.const(True, "bool"), h0], n_out=2, body=graph)
    h_all = g.node("Reshape", [h_all, time_major_shape(g, x, hidden)], allowzero=1)
    if reverse:
        h_all = flip_time(g, h_all)
    return [h_all, h_last, g.fill(zero, 0.0, dtype)]


@lowers("GRUSequenceGrad")
def _gru_sequence_grad_onnx(g):
    """Both projections again from ``h_all`` (two GEMMs: no recurrence), the reverse loop as a
    ``Loop`` over reversed time, then one GEMM each for the weight and input gradients."""
    arity = _forward_arity(g.attrs)
    x, w_ih, w_hh, b_ih, b_hh, h0 = _split_inputs(g.ins[:arity], g.attrs)
    h_all, _, _, dh_all, dh_last = g.ins[arity:]
    dtype, hidden = g.in_vars[0].dtype, int(g.in_vars[2].shape[0])
    reverse = g.attrs["reverse"]
    if reverse:
        x, h_all, dh_all = (flip_time(g, v) for v in (x, h_all, dh_all))
    zero, steps = g.const([0], "int64"), g.dim(x, 0)
    h_prev = g.node("Slice", [g.node("Concat", [g.node("Unsqueeze", [h0, zero]), h_all], axis=0), zero, steps,
                              zero])
    r, z, n, hn = _activations(g, *_projections(g, x, h_prev, w_ih, w_hh, b_ih, b_hh), hidden)
    count = g.node("Squeeze", [steps, zero])

    body = g.child()
    j = body.input("j", "int64", [])
    cond = body.input("cond", "bool", [])
    dh = body.input("dh", dtype, None)
    t = body.node("Sub", [body.node("Sub", [count, body.const(1, "int64")]), j])
    rt, zt, nt, hnt, hpt = (rows_at(body, v, t) for v in (r, z, n, hn, h_prev))
    one = body.const(1.0, dtype)
    dh = body.node("Add", [dh, rows_at(body, dh_all, t)])

    def slope(a):
        return body.node("Mul", [a, body.node("Sub", [one, a])])
    dn = body.node("Mul", [body.node("Mul", [dh, body.node("Sub", [one, zt])]),
                           body.node("Sub", [one, body.node("Mul", [nt, nt])])])
    dz = body.node("Mul", [body.node("Mul", [dh, body.node("Sub", [hpt, nt])]), slope(zt)])
    dr = body.node("Mul", [body.node("Mul", [dn, hnt]), slope(rt)])
    dxproj = body.node("Concat", [dr, dz, dn], axis=-1)
    dhproj = body.node("Concat", [dr, dz, body.node("Mul", [dn, rt])], axis=-1)
    dh_next = body.node("Add", [body.node("Mul", [dh, zt]),
                                body.node("MatMul", [dhproj, body.node("Transpose", [w_hh], perm=[1, 0])])])
    graph = body.finish("gru_backward", [(body.node("Identity", [cond]), "bool", []), (dh_next, dtype, None),
                                         (dxproj, dtype, None), (dhproj, dtype, None)])
    dh0, dxproj, dhproj = g.node("Loop", [count, g.const(True, "bool"), dh_last], n_out=3, body=graph)
    gate_shape = time_major_shape(g, x, 3 * hidden)
    flat = g.const([-1, 3 * hidden], "int64")
    # back to time order, then [T*N, 3H]
    flat_dx, flat_dh = (g.node("Reshape", [flip_time(g, g.node("Reshape", [v, gate_shape], allowzero=1)), flat])
                        for v in (dxproj, dhproj))
    d_in = int(g.in_vars[0].shape[2])
    dx = g.node("Reshape", [g.node("MatMul", [flat_dx, g.node("Transpose", [w_ih], perm=[1, 0])]), g.shape(x)],
                allowzero=1)

    def weight_grad(inputs: str, width: int, dproj: str) -> str:
        rows = g.node("Reshape", [inputs, g.const([-1, width], "int64")])
        return g.node("MatMul", [g.node("Transpose", [rows], perm=[1, 0]), dproj])
    outs = [flip_time(g, dx) if reverse else dx, weight_grad(x, d_in, flat_dx), weight_grad(h_prev, hidden, flat_dh)]
    if b_ih is not None:
        outs += [g.node("ReduceSum", [flat_dx, zero], keepdims=0), g.node("ReduceSum", [flat_dh, zero], keepdims=0)]
    return outs + [dh0]
