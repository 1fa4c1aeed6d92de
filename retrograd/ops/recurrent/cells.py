"""Fused recurrent-cell ops: ``LSTMUnit``, ``GRUUnit`` and the sequence projection ``SeqLinear``.

A recurrent step written with ordinary ops runs a dozen small kernels per
time step, forward and backward; these ops do the elementwise part of a step
in one kernel, and their gradient ops (``LSTMUnitGrad``, ``GRUUnitGrad``)
compute every input gradient in one kernel too. The fused gradient kernels
are an optimisation only: each has its own gradient maker written with the
ordinary builders, so gradients of gradients still work.

``LSTMUnit`` has a third output, the gate activations, which its gradient
reads instead of recomputing them (``lstm_unit`` returns only ``(h, c)``);
``GRUUnitGrad`` recomputes r, z, n from the projections it already needs.

Gate layouts (the columns of the last axis, each ``H`` wide)::

    LSTMUnit   gates  [N, 4H] = | i | f | g | o |
               c' = sig(f + forget_bias) * c + sig(i) * tanh(g);  h' = sig(o) * tanh(c')

    GRUUnit    xproj  [N, 3H] = | r | z | n |   (x @ w_ih + b_ih)
               hproj  [N, 3H] = | r | z | n |   (h @ w_hh + b_hh)
               r = sig(x_r + h_r), z = sig(x_z + h_z), n = tanh(x_n + r * h_n)
               h' = (1 - z) * n + z * h

Kernels compute the sigmoids through one ``tanh`` over the whole gate block,
``sig(a) = 0.5 + 0.5 * tanh(a / 2)``: one transcendental pass instead of four,
and no overflow for large ``|a|``.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ...errors import ExecutionError, ShapeError
from ...ir.program import Var
from ..array.creation import zeros_like
from ..math.elementwise import add_n, matmul, sigmoid, tanh
from ..reduce.reductions import sum as reduce_sum
from ..core.registry import append_op, defop
from ..core.lowering import lowers
from ..core.shapes import require_float
from ..array.tensor import concat, reshape, split


# --- shape-rule helpers ------------------------------------------------------------------

def _merge(a: int, b: int, what: str) -> int:
    if a >= 0 and b >= 0 and a != b:
        raise ShapeError(f"{what} differ: {a} vs {b}")
    return a if a >= 0 else b


def _check_cell(gates: Var, state: Var, n_gates: int) -> tuple[int, int]:
    """(N, H) of a cell whose gate block ``[N, n_gates*H]`` goes with a state ``[N, H]``."""
    for v in (gates, state):
        require_float(v)
        if v.ndim != 2:
            raise ShapeError(f"'{v.name}' must be 2-D [N, ...], got {v.type_str()}")
    if gates.dtype != state.dtype:
        raise ShapeError(f"'{gates.name}' and '{state.name}' must share a dtype, "
                         f"got {gates.dtype} and {state.dtype}")
    width, hidden = gates.shape[1], state.shape[1]
    if width >= 0 and hidden >= 0 and width != n_gates * hidden:
        raise ShapeError(f"'{gates.name}' has {width} columns, expected {n_gates} x {hidden} = "
                         f"{n_gates * hidden} ({n_gates} gates as wide as '{state.name}')")
    if hidden < 0 and width >= 0:
        hidden = width // n_gates
    return _merge(gates.shape[0], state.shape[0], "batch sizes"), hidden


def _like_inputs(*positions: int):
    """A shape rule: output k has the shape and dtype of input ``positions[k]``."""
    def rule(ins, attrs):
        return [(ins[p].shape, ins[p].dtype) for p in positions]
    return rule


# --- sums and products of optional terms (for the second-order makers) -----------------

def _prod(*factors):
    """Product of the factors, or None when any is None (a gradient that is absent)."""
    if any(f is None for f in factors):
        return None
    out = factors[0]
    for f in factors[1:]:
        out = out * f
    return out


def _total(*terms):
    """Sum of the terms that are present, or None when none is."""
    present = [t for t in terms if t is not None]
    if not present:
        return None
    return present[0] if len(present) == 1 else add_n(present)


def _pieces(x: Var | None, n: int) -> list:
    return [None] * n if x is None else split(x, n, axis=-1)


def _joined(parts: Sequence, likes: Sequence[Var]) -> Var | None:
    """Concatenate gradient pieces along the last axis, zeros standing in for absent ones."""
    if all(p is None for p in parts):
        return None
    return concat([p if p is not None else zeros_like(like) for p, like in zip(parts, likes)], axis=-1)


# --- array helpers used by the kernels ---------------------------------------------------

_GATE_SCALES: dict = {}


def _gate_scale(xp, dtype, hidden: int):
    """Per-column vectors (scale, offset, tanh_cols) for the LSTM gate block | i | f | g | o |.

    scale is 0.5 on sigmoid columns and 1 on the tanh column, offset 0.5 and 0,
    tanh_cols 0 and 1: ``tanh(scale * a) * scale + offset`` is sig(a) on sigmoid
    columns and tanh(a) on the tanh column, and ``(1 - s) * (s + tanh_cols)`` is
    the slope of either activation from its value s (s(1-s), or 1-s^2). Cached:
    kernels ask once per time step.
    """
    key = (id(xp), dtype, hidden)
    vectors = _GATE_SCALES.get(key)
    if vectors is None:
        scale = xp.concat([xp.full((hidden,), 0.5 if kind == "s" else 1.0, dtype=dtype) for kind in "ssts"])
        vectors = _GATE_SCALES[key] = (scale, 1.0 - scale, 2.0 * scale - 1.0)
    return vectors


def lstm_activations(xp, gates, forget_bias: float):
    """[sig(i), sig(f + forget_bias), tanh(g), sig(o)] of gates [N, 4H], in one tanh pass."""
    hidden = gates.shape[1] // 4
    scale, offset, _ = _gate_scale(xp, gates.dtype, hidden)
    pre = gates * scale
    if forget_bias:
        pre[:, hidden:2 * hidden] += 0.5 * forget_bias
    acts = xp.tanh(pre)
    acts *= scale
    acts += offset
    return acts


# --- LSTMUnit ----------------------------------------------------------------------------
#
# LSTMUnit's third output ``acts`` holds the gate activations [i, f, g, o] (after sigmoid /
# tanh). The gradient kernel reads them instead of recomputing them from the gates, so a
# recurrent network keeps acts per step (as large as the gates, which it no longer needs).

def _lstm_unit_rule(ins, attrs):
    gates, c_prev = ins[:2]
    n, hidden = _check_cell(gates, c_prev, 4)
    if len(ins) == 3:             # the recurrent half h @ w_hh, added in the kernel: same shape only
        h_gates = ins[2]
        n = _merge(n, _check_cell(h_gates, c_prev, 4)[0], "batch sizes")
        if h_gates.dtype != gates.dtype:
            raise ShapeError(f"'{h_gates.name}' is {h_gates.dtype}, '{gates.name}' is {gates.dtype}")
    return [((n, hidden), gates.dtype), ((n, hidden), gates.dtype), ((n, 4 * hidden), gates.dtype)]


def _lstm_unit_grad_maker(g):
    c_prev = g.x[1]
    h, c, acts = g.out
    dh, dc, dacts = g.dout
    dgates, dc_prev = lstm_unit_grad(acts, c_prev, c, dh if dh is not None else zeros_like(h),
                                     dc if dc is not None else zeros_like(c))
    if dacts is not None:      # only in higher-order gradients, where LSTMUnitGrad read acts
        i, f, gg, o = split(acts, 4, axis=-1)
        slopes = concat([i * (1.0 - i), f * (1.0 - f), 1.0 - gg * gg, o * (1.0 - o)], axis=-1)
        dgates = dgates + dacts * slopes
    return [dgates, dc_prev] + ([dgates] if len(g.x) == 3 else [])


@defop("LSTMUnit", inputs=("gates", "c_prev", "h_gates?"), outputs=("h", "c", "acts"),
       infer=_lstm_unit_rule, grad=_lstm_unit_grad_maker)
def _lstm_unit(k, gates, c_prev, h_gates=None):
    """One LSTM step from pre-activation gates [N, 4H] (order i, f, g, o) and c [N, H];
    also returns the gate activations for the gradient. ``h_gates`` (same shape as
    ``gates``), when given, is added to the gates first."""
    hidden = c_prev.shape[1]
    if h_gates is not None:
        if tuple(h_gates.shape) != tuple(gates.shape):
            raise ExecutionError(f"{k.op.where()}: gates {list(gates.shape)} and h_gates "
                                 f"{list(h_gates.shape)} must have one shape (no broadcasting)")
        gates = gates + h_gates
    acts = lstm_activations(k.xp, gates, k.attrs["forget_bias"])
    c = acts[:, hidden:2 * hidden] * c_prev
    c += acts[:, :hidden] * acts[:, 2 * hidden:3 * hidden]
    h = k.xp.tanh(c)
    h *= acts[:, 3 * hidden:]
    return h, c, acts


@lowers("LSTMUnit")
def _lstm_unit_onnx(g):
    gates, c_prev = g.ins[:2]
    dtype = g.in_vars[0].dtype
    if len(g.ins) == 3:
        gates = g.node("Add", [gates, g.ins[2]])
    hidden = g.in_vars[1].shape[1]
    if hidden >= 0:
        return _lstm_unit_onnx_fused(g, gates, c_prev, hidden, dtype)
    half = g.const(0.5, dtype)
    i, f, gg, o = g.node("Split", [gates], n_out=4, axis=1, num_outputs=4)
    if g.attrs["forget_bias"]:
        f = g.node("Add", [f, g.const(g.attrs["forget_bias"], dtype)])
    i, f, o = (_sigmoid_onnx(g, a, half) for a in (i, f, o))
    gg = g.node("Tanh", [gg])
    c = g.node("Add", [g.node("Mul", [f, c_prev]), g.node("Mul", [i, gg])])
    h = g.node("Mul", [g.node("Tanh", [c]), o])
    return [h, c, g.node("Concat", [i, f, gg, o], axis=1)]


def _lstm_unit_onnx_fused(g, gates: str, c_prev: str, hidden: int, dtype: str) -> list:
    """The kernel's own arithmetic as few nodes as possible (the nodes of a recurrent step are
    run T times): every gate activated at once, ``tanh(gates * scale) * scale + offset``."""
    scale = np.concatenate([np.full(hidden, 0.5 if kind == "s" else 1.0) for kind in "ssts"])
    scale_c = g.const(scale, dtype)
    pre = g.node("Mul", [gates, scale_c])
    if g.attrs["forget_bias"]:
        shift = np.zeros(4 * hidden)
        shift[hidden:2 * hidden] = 0.5 * g.attrs["forget_bias"]
        pre = g.node("Add", [pre, g.const(shift, dtype)])
    acts = g.node("Add", [g.node("Mul", [g.node("Tanh", [pre]), scale_c]), g.const(1.0 - scale, dtype)])
    i, f, gg, o = g.node("Split", [acts], n_out=4, axis=1, num_outputs=4)
    c = g.node("Add", [g.node("Mul", [f, c_prev]), g.node("Mul", [i, gg])])
    h = g.node("Mul", [g.node("Tanh", [c]), o])
    return [h, c, acts]


def _sigmoid_onnx(g, a: str, half: str) -> str:
    """``0.5 + 0.5 * tanh(a / 2)``: the kernels' form of the sigmoid."""
    return g.node("Add", [g.node("Mul", [g.node("Tanh", [g.node("Mul", [a, half])]), half]), half])


def lstm_unit(gates: Var, c_prev: Var, forget_bias: float = 0.0,
              h_gates: Var | None = None) -> tuple[Var, Var]:
    """One fused LSTM step: ``(h, c)`` from pre-activation gates ``[N, 4H]`` (order i, f, g, o).

    ``c = sig(f + forget_bias) * c_prev + sig(i) * tanh(g)``, ``h = sig(o) * tanh(c)``.

    Args:
        gates: The pre-activation gates ``[N, 4H]``.
        c_prev: The previous cell state ``[N, H]``.
        forget_bias: Added to the forget gate's input.
        h_gates: The recurrent half ``h_prev @ w_hh`` (``gates``' shape), added to
            ``gates`` inside the op: one op fewer per step forward, and no
            broadcast-undoing ``SumTo`` per step in the backward.

    Returns:
        ``(h, c)``, each ``[N, H]``.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            gates = rg.data("gates", [-1, 4])              # H = 1
            c_prev = rg.data("c_prev", [-1, 1])
            h, c = rg.lstm_unit(gates, c_prev, forget_bias=1.0)
        gv = np.array([[0.5, -0.5, 0.2, 1.0]], "float32")
        cv = np.array([[2.0]], "float32")
        hv, c_new = rg.Executor().run(main, feed={"gates": gv, "c_prev": cv}, fetch_list=[h, c])
        sig = lambda z: 1 / (1 + np.exp(-z))
        expected_c = sig(-0.5 + 1.0) * 2.0 + sig(0.5) * np.tanh(0.2)
        assert np.allclose(c_new, expected_c) and np.allclose(hv, sig(1.0) * np.tanh(expected_c))
        ```
    """
    ins = [gates, c_prev] + ([h_gates] if h_gates is not None else [])
    h, c, _ = append_op("LSTMUnit", ins, {"forget_bias": float(forget_bias)}, name="lstm_unit")
    return h, c


def _lstm_unit_grad_grad(g):
    """Gradient of LSTMUnitGrad, from ordinary ops.

    With acts = [i, f, g, o], tc = tanh(c), dct = dc + dh*o*(1-tc^2) and the
    slopes i' = i(1-i), f' = f(1-f), g' = 1-g^2, o' = o(1-o), LSTMUnitGrad
    returns dgates = [dct*g*i', dct*c_prev*f', dct*i*g', dh*tc*o'] and
    dc_prev = dct*f. This maker differentiates those expressions by hand.
    """
    acts, cp, c, dh, dc = g.x
    g_dgates, g_dcp = g.dout
    i, f, gg, o = split(acts, 4, axis=-1)
    tc = tanh(c)
    i1, f1, o1 = i * (1.0 - i), f * (1.0 - f), o * (1.0 - o)
    g1, tc1 = 1.0 - gg * gg, 1.0 - tc * tc
    dct = dc + dh * o * tc1
    b_i, b_f, b_g, b_o = _pieces(g_dgates, 4)

    g_dct = _total(_prod(b_i, gg, i1), _prod(b_f, cp, f1), _prod(b_g, i, g1), _prod(g_dcp, f))
    g_dh = _total(_prod(b_o, tc, o1), _prod(g_dct, o, tc1))
    g_cp = _prod(b_f, dct, f1)
    g_c = _prod(_total(_prod(b_o, dh, o1), _prod(g_dct, dh, o, tc, -2.0)), tc1)
    g_i = _prod(dct, _total(_prod(b_i, gg, 1.0 - 2.0 * i), _prod(b_g, g1)))
    g_f = _prod(dct, _total(_prod(b_f, cp, 1.0 - 2.0 * f), g_dcp))
    g_g = _prod(dct, _total(_prod(b_i, i1), _prod(b_g, i, gg, -2.0)))
    g_o = _total(_prod(b_o, dh, tc, 1.0 - 2.0 * o), _prod(g_dct, dh, tc1))
    return [_joined([g_i, g_f, g_g, g_o], [i, f, gg, o]), g_cp, g_c, g_dh, g_dct]


@defop("LSTMUnitGrad", inputs=("acts", "c_prev", "c", "dh", "dc"), outputs=("dgates", "dc_prev"),
       infer=_like_inputs(0, 1), grad=_lstm_unit_grad_grad)
def _lstm_unit_grad(k, acts, c_prev, c, dh, dc):
    """Both input gradients of LSTMUnit in one kernel, from the stored gate activations."""
    return lstm_unit_grad_math(k.xp, acts, c_prev, c, dh, dc)


def lstm_unit_grad_math(xp, acts, c_prev, c, dh, dc):
    """``(dgates, dc_prev)`` of one LSTM step as arrays (LSTMUnitGrad's kernel; LSTMSequence's
    general backward runs it per step)."""
    hidden = c_prev.shape[1]
    tc = xp.tanh(c)
    o = acts[:, 3 * hidden:]
    dct = 1.0 - tc * tc
    dct *= o
    dct *= dh
    dct += dc
    partner = xp.empty(acts.shape, dtype=acts.dtype)
    partner[:, :hidden] = dct * acts[:, 2 * hidden:3 * hidden]
    partner[:, hidden:2 * hidden] = dct * c_prev
    partner[:, 2 * hidden:3 * hidden] = dct * acts[:, :hidden]
    partner[:, 3 * hidden:] = dh * tc
    _, _, tanh_cols = _gate_scale(xp, acts.dtype, hidden)
    partner *= 1.0 - acts              # times the slope (1 - s) * (s + tanh_cols)
    partner *= acts + tanh_cols
    dct *= acts[:, hidden:2 * hidden]
    return partner, dct


@lowers("LSTMUnitGrad")
def _lstm_unit_grad_onnx(g):
    acts, c_prev, c, dh, dc = g.ins
    hidden = g.in_vars[1].shape[1]
    if hidden >= 0:
        return _lstm_unit_grad_onnx_fused(g, hidden)
    one = g.const(1.0, g.in_vars[0].dtype)
    i, f, gg, o = g.node("Split", [acts], n_out=4, axis=1, num_outputs=4)
    tc = g.node("Tanh", [c])
    dct = g.node("Add", [g.node("Mul", [g.node("Mul", [g.node("Sub", [one, g.node("Mul", [tc, tc])]), o]), dh]),
                         dc])

    def sig_slope(s):
        return g.node("Mul", [s, g.node("Sub", [one, s])])
    di = g.node("Mul", [g.node("Mul", [dct, gg]), sig_slope(i)])
    df = g.node("Mul", [g.node("Mul", [dct, c_prev]), sig_slope(f)])
    dg = g.node("Mul", [g.node("Mul", [dct, i]), g.node("Sub", [one, g.node("Mul", [gg, gg])])])
    do = g.node("Mul", [g.node("Mul", [dh, tc]), sig_slope(o)])
    return [g.node("Concat", [di, df, dg, do], axis=1), g.node("Mul", [dct, f])]


def _lstm_unit_grad_onnx_fused(g, hidden: int) -> list:
    """The kernel's arithmetic, in its order: the slopes over the whole gate block at once."""
    acts, c_prev, c, dh, dc = g.ins
    dtype = g.in_vars[0].dtype
    one = g.const(1.0, dtype)
    i, f, gg, o = g.node("Split", [acts], n_out=4, axis=1, num_outputs=4)
    tc = g.node("Tanh", [c])
    dct = g.node("Add", [g.node("Mul", [g.node("Mul", [g.node("Sub", [one, g.node("Mul", [tc, tc])]), o]), dh]),
                         dc])
    partner = g.node("Concat", [g.node("Mul", [dct, gg]), g.node("Mul", [dct, c_prev]),
                                g.node("Mul", [dct, i]), g.node("Mul", [dh, tc])], axis=1)
    tanh_cols = np.concatenate([np.full(hidden, 1.0 if kind == "t" else 0.0) for kind in "ssts"])
    partner = g.node("Mul", [partner, g.node("Sub", [one, acts])])
    dgates = g.node("Mul", [partner, g.node("Add", [acts, g.const(tanh_cols, dtype)])])
    return [dgates, g.node("Mul", [dct, f])]


def lstm_unit_grad(acts: Var, c_prev: Var, c: Var, dh: Var, dc: Var) -> list[Var]:
    """``[dgates, dc_prev]`` of LSTMUnit from its gate activations ``acts``, ``c_prev``, its
    output ``c`` and the gradients of ``h`` and ``c``."""
    return append_op("LSTMUnitGrad", [acts, c_prev, c, dh, dc], name="lstm_unit_grad")


# --- GRUUnit -----------------------------------------------------------------------------

def _gru_unit_rule(ins, attrs):
    xproj, hproj, h_prev = ins
    n, hidden = _check_cell(xproj, h_prev, 3)
    _check_cell(hproj, h_prev, 3)
    n = _merge(n, hproj.shape[0], "batch sizes")
    return [((n, hidden), h_prev.dtype)]


def _gru_unit_grad_maker(g):
    xproj, hproj, h_prev = g.x
    return gru_unit_grad(xproj, hproj, h_prev, g.dy)


def gru_activations(xp, xproj, hproj, hidden: int):
    """(r, z, n) of a GRU step as arrays (GRUUnit's kernel; GRUSequence's general kernels)."""
    pre = xproj[:, :2 * hidden] + hproj[:, :2 * hidden]
    pre *= 0.5
    rz = xp.tanh(pre)
    rz *= 0.5
    rz += 0.5
    r, z = rz[:, :hidden], rz[:, hidden:]
    n = r * hproj[:, 2 * hidden:]
    n += xproj[:, 2 * hidden:]
    return r, z, xp.tanh(n)


@defop("GRUUnit", inputs=("xproj", "hproj", "h_prev"), outputs=("h",), infer=_gru_unit_rule,
       grad=_gru_unit_grad_maker)
def _gru_unit(k, xproj, hproj, h_prev):
    """One GRU step from the input and hidden projections [N, 3H] (order r, z, n) and h [N, H]."""
    _, z, n = gru_activations(k.xp, xproj, hproj, h_prev.shape[1])
    h = h_prev - n
    h *= z
    h += n
    return h


@lowers("GRUUnit")
def _gru_unit_onnx(g):
    h_prev = g.ins[2]
    r, z, n, _ = _gru_activations_onnx(g)
    return [g.node("Add", [g.node("Mul", [g.node("Sub", [h_prev, n]), z]), n])]


def _gru_activations_onnx(g):
    """(r, z, n) of a GRU step, with the kernels' sigmoid form."""
    half = g.const(0.5, g.in_vars[0].dtype)
    xr, xz, xn = g.node("Split", [g.ins[0]], n_out=3, axis=1, num_outputs=3)
    hr, hz, hn = g.node("Split", [g.ins[1]], n_out=3, axis=1, num_outputs=3)
    r = _sigmoid_onnx(g, g.node("Add", [xr, hr]), half)
    z = _sigmoid_onnx(g, g.node("Add", [xz, hz]), half)
    n = g.node("Tanh", [g.node("Add", [g.node("Mul", [r, hn]), xn])])
    return r, z, n, hn


def gru_unit(xproj: Var, hproj: Var, h_prev: Var) -> Var:
    """One fused GRU step (gate order r, z, n, as ``torch.nn.GRU``).

    Returns ``h = (1 - z) * n + z * h_prev`` with ``n = tanh(x_n + r * h_n)``.

    Args:
        xproj: ``x @ w_ih + b_ih``, ``[N, 3H]``.
        hproj: ``h_prev @ w_hh + b_hh``, ``[N, 3H]``.
        h_prev: The previous state ``[N, H]``.

    Returns:
        The new state ``[N, H]``.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            xproj = rg.data("xproj", [-1, 3])              # H = 1
            hproj = rg.data("hproj", [-1, 3])
            h_prev = rg.data("h_prev", [-1, 1])
            h = rg.gru_unit(xproj, hproj, h_prev)
        feed = {"xproj": np.array([[0.1, 0.2, 0.3]], "float32"), "hproj": np.array([[0.4, -0.2, 0.5]], "float32"),
                "h_prev": np.array([[1.0]], "float32")}
        (out,) = rg.Executor().run(main, feed=feed, fetch_list=[h])
        sig = lambda z: 1 / (1 + np.exp(-z))
        r, z = sig(0.1 + 0.4), sig(0.2 - 0.2)
        n = np.tanh(0.3 + r * 0.5)
        assert np.allclose(out, (1 - z) * n + z * 1.0)
        ```
    """
    return append_op("GRUUnit", [xproj, hproj, h_prev], name="gru_unit")[0]


def _gru_unit_grad_grad(g):
    """Gradient of GRUUnitGrad, from ordinary ops.

    GRUUnitGrad returns, with dn = dh*(1-z)*(1-n^2) and primes the derivatives
    of the sigmoids: dxproj = [dn*h_n*r', dh*(h-n)*z', dn],
    dhproj = [dn*h_n*r', dh*(h-n)*z', dn*r] and dh_prev = dh*z.
    """
    xproj, hproj, hp, dh = g.x
    g_dx, g_du, g_dhp = g.dout
    xr, xz, xn = split(xproj, 3, axis=-1)
    ur, uz, un = split(hproj, 3, axis=-1)
    r, z = sigmoid(xr + ur), sigmoid(xz + uz)
    n = tanh(xn + r * un)
    r1, z1, n1 = r * (1.0 - r), z * (1.0 - z), 1.0 - n * n
    dn = dh * (1.0 - z) * n1
    bxr, bxz, bxn = _pieces(g_dx, 3)
    bur, buz, bun = _pieces(g_du, 3)
    a_r, a_z = _total(bxr, bur), _total(bxz, buz)

    g_dn = _total(_prod(a_r, un, r1), _prod(bun, r), bxn)
    g_dh = _total(_prod(g_dn, 1.0 - z, n1), _prod(a_z, hp - n, z1), _prod(g_dhp, z))
    g_z = _total(_prod(g_dn, dh, n1, -1.0), _prod(a_z, dh, hp - n, 1.0 - 2.0 * z), _prod(g_dhp, dh))
    g_n = _total(_prod(g_dn, dh, 1.0 - z, n, -2.0), _prod(a_z, dh, z1, -1.0))
    g_hp = _prod(a_z, dh, z1)
    g_an = _prod(g_n, n1)
    g_r = _total(_prod(a_r, dn, un, 1.0 - 2.0 * r), _prod(bun, dn), _prod(g_an, un))
    g_un = _total(_prod(a_r, dn, r1), _prod(g_an, r))
    g_ar, g_az = _prod(g_r, r1), _prod(g_z, z1)
    return [_joined([g_ar, g_az, g_an], [xr, xz, xn]), _joined([g_ar, g_az, g_un], [ur, uz, un]),
            g_hp, g_dh]


@defop("GRUUnitGrad", inputs=("xproj", "hproj", "h_prev", "dh"),
       outputs=("dxproj", "dhproj", "dh_prev"), infer=_like_inputs(0, 1, 2), grad=_gru_unit_grad_grad)
def _gru_unit_grad(k, xproj, hproj, h_prev, dh):
    """All three input gradients of GRUUnit in one kernel (r, z, n recomputed)."""
    return gru_unit_grad_math(k.xp, xproj, hproj, h_prev, dh)


def gru_unit_grad_math(xp, xproj, hproj, h_prev, dh):
    """``(dxproj, dhproj, dh_prev)`` of one GRU step as arrays (``dh_prev`` the direct path
    ``dh * z`` only); GRUUnitGrad's kernel, and GRUSequence's general backward per step."""
    hidden = h_prev.shape[1]
    r, z, n = gru_activations(xp, xproj, hproj, hidden)
    dx = xp.empty(xproj.shape, dtype=xproj.dtype)
    dn = dx[:, 2 * hidden:]
    dn[...] = 1.0 - n * n
    dn *= 1.0 - z
    dn *= dh
    dz = dx[:, hidden:2 * hidden]
    dz[...] = h_prev - n
    dz *= dh
    dz *= z * (1.0 - z)
    dr = dx[:, :hidden]
    dr[...] = dn * hproj[:, 2 * hidden:]
    dr *= r * (1.0 - r)
    du = xp.empty(hproj.shape, dtype=hproj.dtype)
    du[:, :2 * hidden] = dx[:, :2 * hidden]
    du[:, 2 * hidden:] = dn * r
    return dx, du, dh * z


@lowers("GRUUnitGrad")
def _gru_unit_grad_onnx(g):
    h_prev, dh = g.ins[2], g.ins[3]
    one = g.const(1.0, g.in_vars[0].dtype)
    r, z, n, hn = _gru_activations_onnx(g)

    def slope(s):
        return g.node("Mul", [s, g.node("Sub", [one, s])])
    dn = g.node("Mul", [g.node("Mul", [g.node("Sub", [one, g.node("Mul", [n, n])]),
                                       g.node("Sub", [one, z])]), dh])
    dz = g.node("Mul", [g.node("Mul", [g.node("Sub", [h_prev, n]), dh]), slope(z)])
    dr = g.node("Mul", [g.node("Mul", [dn, hn]), slope(r)])
    return [g.node("Concat", [dr, dz, dn], axis=1), g.node("Concat", [dr, dz, g.node("Mul", [dn, r])], axis=1),
            g.node("Mul", [dh, z])]


def gru_unit_grad(xproj: Var, hproj: Var, h_prev: Var, dh: Var) -> list[Var]:
    """``[dxproj, dhproj, dh_prev]`` of GRUUnit (``dh_prev`` is the direct path ``dh * z`` only)."""
    return append_op("GRUUnitGrad", [xproj, hproj, h_prev, dh], name="gru_unit_grad")


# --- SeqLinear: one GEMM over every leading axis -------------------------------------------

def _seq_linear_rule(ins, attrs):
    x, w, *bias = ins
    require_float(x)
    if any(v.dtype != x.dtype for v in (w, *bias)):
        raise ShapeError(f"'{x.name}', '{w.name}' and the bias must share a dtype")
    if x.ndim < 1 or w.ndim != 2:
        raise ShapeError(f"need x [..., D] and a 2-D weight, got {x.type_str()} and {w.type_str()}")
    d_in, d_out = (w.shape[1], w.shape[0]) if attrs["transpose_w"] else w.shape
    _merge(x.shape[-1], d_in, "inner dimensions")
    if len(bias) > 1 or (bias and bias[0].ndim != 1):
        raise ShapeError("takes at most one bias, of shape [K]")
    if bias:
        d_out = _merge(bias[0].shape[0], d_out, "bias and output sizes")
    return [(x.shape[:-1] + (d_out,), x.dtype)]


def _seq_linear_grad(g):
    x, w, *bias = g.x
    transpose_w = g.attrs["transpose_w"]
    dx = seq_linear(g.dy, w, transpose_w=not transpose_w)
    d_in, d_out = (w.shape[1], w.shape[0]) if transpose_w else w.shape
    x2, dy2 = _flat(x, d_in), _flat(g.dy, d_out)
    dw = matmul(dy2, x2, transpose_x=True) if transpose_w else matmul(x2, dy2, transpose_x=True)
    return [dx, dw] + [reduce_sum(dy2, axis=0) for _ in bias]


def _flat(x: Var, width: int) -> Var:
    """``x [..., width]`` as ``[-1, width]`` (``width`` is the weight's, always known)."""
    return x if x.ndim == 2 else reshape(x, [-1, width])


@defop("SeqLinear", inputs=("x", "w", "b*"), infer=_seq_linear_rule, grad=_seq_linear_grad, row_wise=(0,),
       flops=lambda ins, outs, attrs: 2 * math.prod(outs[0]) * ins[0][-1])
def _seq_linear(k, x, w, *bias):
    """``x [..., D] @ w [D, K] (+ b)`` as one GEMM over all leading axes (``w.T`` with
    transpose_w); the bias is added in place, without a second [..., K] array
    (``Backend.linear``; torch: ``addmm``)."""
    xp = k.xp
    if k.attrs["transpose_w"]:
        w = xp.matrix_transpose(w) if hasattr(xp, "matrix_transpose") else xp.swapaxes(w, -1, -2)
    lead = tuple(x.shape[:-1])
    flat = xp.reshape(x, (math.prod(lead), x.shape[-1]))
    out = k.backend.linear(flat, w, bias[0]) if len(bias) == 1 else xp.matmul(flat, w)
    return xp.reshape(out, lead + (w.shape[-1],))


@lowers("SeqLinear")
def _seq_linear_onnx(g):
    x, w, *bias = g.ins
    d_in, d_out = g.in_vars[1].shape
    if len(bias) == 1 and not g.attrs["transpose_w"] and 0 <= d_in < d_out:
        # the bias as the product's last term, [x, 1] @ [w; b]: onnxruntime then makes no second
        # pass over the [..., K] output (an input projection [64, 32, 64] @ [64, 512]: 1.03 ->
        # 0.79 ms); worth it while x (copied once, with its ones) is narrower than the output
        dtype = g.in_vars[0].dtype
        ones = g.fill(g.node("Concat", [g.node("Shape", [x], end=-1), g.const([1], "int64")], axis=0), 1, dtype)
        return [g.node("MatMul", [g.node("Concat", [x, ones], axis=-1),
                                  g.node("Concat", [w, g.node("Unsqueeze", [bias[0], g.const([0], "int64")])],
                                         axis=0)])]
    if g.attrs["transpose_w"]:
        w = g.node("Transpose", [w], perm=[1, 0])
    out = g.node("MatMul", [x, w])
    for b in bias:
        out = g.node("Add", [out, b])
    return [out]


def seq_linear(x: Var, w: Var, b: Var | None = None, transpose_w: bool = False) -> Var:
    """``x @ w (+ b)`` over the last axis of ``x [..., D]`` as one GEMM, whatever the leading axes.

    A ``[T, N, D]`` sequence is one ``[T*N, D] x [D, K]`` product; its weight
    gradient is one GEMM too.

    Args:
        x: A float Var ``[..., D]``.
        w: The weights ``[D, K]`` (``[K, D]`` with ``transpose_w``).
        b: The bias ``[K]``, or None.
        transpose_w: Multiply by ``w``'s transpose.

    Returns:
        A Var ``[..., K]``.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [-1, -1, 3])                  # [T, N, D]
            w = rg.data("w", [3, 8])
            b = rg.data("b", [8])
            x_proj = rg.seq_linear(x, w, b)                # [T, N, 8]
        feed = {"x": np.random.rand(4, 2, 3).astype("float32"), "w": np.random.rand(3, 8).astype("float32"),
                "b": np.ones(8, "float32")}
        (out,) = rg.Executor().run(main, feed=feed, fetch_list=[x_proj])
        assert np.allclose(out, feed["x"] @ feed["w"] + feed["b"], atol=1e-6)
        ```
    """
    inputs = [x, w] if b is None else [x, w, b]
    return append_op("SeqLinear", inputs, {"transpose_w": bool(transpose_w)}, name="seq_linear")[0]
