"""Recurrent layers: ``lstm``, ``gru`` and ``milstm`` over ``x [T, N, D]``.

Each layer is a thin builder over ``rg.recurrent``:

1. the input projection ``x @ w_ih + b`` does not depend on the recurrence, so
   it is hoisted out of the step: one ``[T*N, D] x [D, G*H]`` GEMM before the
   loop (``seq_linear``), and its gradient is one GEMM after it;
2. the step block is ``h @ w_hh`` plus one fused cell op (``LSTMUnit`` /
   ``GRUUnit``), whose gradient is one fused kernel;
3. missing initial states are zeros ``[N, H]`` with ``N`` taken from ``x`` at
   run time, so one program serves any batch size and sequence length.

Parameters are named ``<name>.<param>`` (``<name>.l<k>.<param>`` for layer k of
a stack, ``num_layers > 1``), created in the input's dtype and initialised like
PyTorch's: ``U(-1/sqrt(H), 1/sqrt(H))``.
"""
from __future__ import annotations

import math

from ..errors import ProgramError
from ..ir.builder import default_main_program
from ..ir.program import Var
from ..ops.array.creation import create_parameter, fill, fill_like
from ..ops.nn.softmax_dropout import dropout as dropout_op
from ..ops.recurrent.gru_sequence import gru_sequence
from ..ops.recurrent.lstm_sequence import lstm_sequence
from ..ops.math.elementwise import matmul
from ..ops.recurrent.network import recurrent
from ..ops.reduce.reductions import sum as reduce_sum
from ..ops.recurrent.cells import gru_unit, lstm_unit, seq_linear
from ..ops.array.tensor import concat, slice


def _check_input(x: Var, layer: str) -> int:
    """The feature size D of ``x [T, N, D]`` (must be known to size the weights)."""
    if not isinstance(x, Var) or x.ndim != 3:
        what = x.type_str() if isinstance(x, Var) else type(x).__name__
        raise ProgramError(f"layers.{layer} needs x [T, N, D] (time-major), got {what}")
    if x.shape[-1] < 0:
        raise ProgramError(f"layers.{layer}: the feature size of '{x.name}' ({x.type_str()}) must be "
                           "known to size the weights")
    if x.dtype not in ("float32", "float64"):
        raise ProgramError(f"layers.{layer} needs a float input, '{x.name}' is {x.dtype}")
    return x.shape[-1]


def _params(name: str, hidden: int, dtype: str, shapes: dict, fixed: dict | None = None) -> dict:
    """Create ``<name>.<param>`` for each entry; uniform(+-1/sqrt(H)) unless a constant is fixed."""
    bound = 1.0 / math.sqrt(hidden)
    fixed = fixed or {}
    return {key: create_parameter(f"{name}.{key}", shape, dtype,
                                  init=fixed.get(key, ("uniform", -bound, bound)))
            for key, shape in shapes.items()}


def _zero_state(x_proj: Var, hidden: int) -> Var:
    """Zeros ``[N, H]`` with N read from ``x_proj [T, N, >=H]`` at run time.

    N comes from a sum over time of zeros ``[T, N, 1]``, not from the first
    step, so that an empty sequence (T = 0) has states too.
    """
    column = fill_like(slice(x_proj, axes=[2], starts=[0], ends=[1]), 0.0)
    return reduce_sum(column, axis=0) + fill([hidden], 0.0, x_proj.dtype)


def _state(given: Var | None, x_proj: Var, hidden: int, what: str, layer: str) -> Var:
    if given is None:
        return _zero_state(x_proj, hidden)
    if not isinstance(given, Var) or given.ndim != 2 or given.shape[1] not in (hidden, -1):
        shape = given.type_str() if isinstance(given, Var) else type(given).__name__
        raise ProgramError(f"layers.{layer}: {what} must be [N, {hidden}], got {shape}")
    if given.dtype != x_proj.dtype:
        raise ProgramError(f"layers.{layer}: {what} '{given.name}' is {given.dtype}, the input is "
                           f"{x_proj.dtype}")
    return given


def _name(name: str | None, layer: str) -> str:
    return name if name is not None else default_main_program().unique_name(layer)


def _check_hidden(hidden: int, layer: str) -> int:
    if not isinstance(hidden, int) or hidden < 1:
        raise ProgramError(f"layers.{layer}: hidden must be a positive int, got {hidden!r}")
    return hidden


def lstm(x: Var, hidden: int, h0=None, c0=None, seq_lengths: Var | None = None, forget_bias: float = 0.0,
         name: str | None = None, recompute=None, reverse: bool = False, bidirectional: bool = False,
         num_layers: int = 1, bias: bool = True, dropout: float = 0.0,
         fused: bool | None = None) -> tuple[Var, Var, Var, Var]:
    """An LSTM over ``x [T, N, D]``; returns ``(h_all [T,N,H], h_last [N,H], c_all, c_last)``.

    Parameters ``<name>.w_ih [D, 4H]``, ``<name>.w_hh [H, 4H]``, ``<name>.b [4H]``;
    gate order i, f, g, o: ``c' = sig(f + forget_bias) * c + sig(i) * tanh(g)``,
    ``h' = sig(o) * tanh(c')``. ``h0``/``c0`` default to zeros; with
    ``seq_lengths`` (int64 ``[N]``) states stop changing after each example's
    length and ``h_last``/``c_last`` are taken there. ``recompute`` is passed to
    ``rg.recurrent`` (None, ``"steps"`` or a byte budget).

    ``reverse=True`` reads the sequence right to left (each example's own
    steps with ``seq_lengths``): ``h_all[t]`` is the state after reading
    ``x[t]``, ``h_last`` the state after ``x[0]``. ``bidirectional=True`` runs
    both directions, the right-to-left one with parameters
    ``<name>.w_ih_reverse`` etc., and concatenates them on the last axis as
    ``torch.nn.LSTM(bidirectional=True)`` does: ``h_all [T,N,2H]``,
    ``h_last [N,2H]`` (forward then reverse); ``h0``/``c0`` are then pairs
    ``(forward, reverse)`` of ``[N, H]`` (or None).

    ``num_layers > 1`` stacks layers as ``torch.nn.LSTM(num_layers=...)``: layer k
    reads layer k-1's ``h_all`` (after ``dropout`` in training, between layers only),
    its parameters are ``<name>.l<k>.w_ih`` etc., ``h0``/``c0`` are then lists with
    one state (or pair) per layer, and the results are the top layer's.
    ``bias=False`` creates no bias.

    By default (``fused=None``) the layer is the step-by-step recurrence, and an
    executor whose backend has a vendor LSTM kernel (torch: oneDNN on the CPU,
    as ``torch.nn.LSTM``; cuDNN on CUDA; float32) runs each layer and direction
    as one ``LSTMSequence`` op and its gradient as one ``LSTMSequenceGrad``
    (``rg.passes.fuse_recurrent_cells`` on the executor's copy of the program);
    NumPy, CuPy and onnxruntime run the recurrence. Per-op ``recompute`` and
    ``seq_lengths`` keep the recurrence everywhere. ``fused=False`` keeps it
    on every backend. ``fused=True`` builds the ``LSTMSequence`` ops in the
    program itself (``rg.lstm_sequence``; general kernels where the backend has
    no vendor kernel; with ``recompute="steps"`` it keeps only the cells); it
    needs ``recompute`` None or ``"steps"`` and no ``seq_lengths`` (otherwise
    the layer builds the recurrence). A whole-program ``memory_budget`` turns
    it back into that recurrence. Results agree to rounding.

    Example::

        x = rg.data("x", [-1, -1, 32])                     # [T, N, D]
        h_all, h_last, c_all, c_last = rg.layers.lstm(x, 64, name="enc")
        both, _, _, _ = rg.layers.lstm(x, 64, name="bi", bidirectional=True)   # [T, N, 128]
        deep, _, _, _ = rg.layers.lstm(x, 64, num_layers=2, dropout=0.1, name="deep")  # deep.l0.w_ih ...
    """
    hidden = _check_hidden(hidden, "lstm")

    def one_layer(inp, prefix, h0, c0):
        d_in = _check_input(inp, "lstm")

        def direction(suffix: str, h0, c0, backwards: bool):
            shapes = {f"w_ih{suffix}": [d_in, 4 * hidden], f"w_hh{suffix}": [hidden, 4 * hidden]}
            if bias:
                shapes[f"b{suffix}"] = [4 * hidden]
            p = _params(prefix, hidden, inp.dtype, shapes)
            # One op: both default initial states are one zero tensor (five ops fewer per run).
            one_zero_state = fused and h0 is None and c0 is None
            h0 = _state(h0, inp, hidden, "h0", "lstm")    # N from x: under a budget x_proj is made per step
            c0 = h0 if one_zero_state else _state(c0, inp, hidden, "c0", "lstm")
            if fused and recompute in (None, "steps") and seq_lengths is None:     # one op
                return _fused_lstm(inp, p[f"w_ih{suffix}"], p[f"w_hh{suffix}"], p.get(f"b{suffix}"), h0, c0,
                                   forget_bias, backwards, "all" if recompute is None else "cells")
            x_proj = seq_linear(inp, p[f"w_ih{suffix}"], p.get(f"b{suffix}"))

            def step(x_t, states):
                h, c = states
                return list(lstm_unit(x_t[0], c, forget_bias, h_gates=matmul(h, p[f"w_hh{suffix}"])))

            all_states, last_states = recurrent(step, [x_proj], [h0, c0], seq_lengths=seq_lengths,
                                                recompute=recompute, reverse=backwards)
            if fused is False:
                _keep_general(last_states[0])
            return all_states[0], last_states[0], all_states[1], last_states[1]

        if not bidirectional:
            return direction("", h0, c0, reverse)
        (h0_f, h0_b), (c0_f, c0_b) = _pair(h0, "h0", "lstm"), _pair(c0, "c0", "lstm")
        return _joined(direction("", h0_f, c0_f, False), direction("_reverse", h0_b, c0_b, True))

    return _stacked(one_layer, x, [h0, c0], _name(name, "lstm"), num_layers, dropout, "lstm")


def gru(x: Var, hidden: int, h0=None, seq_lengths: Var | None = None, name: str | None = None,
        recompute=None, reverse: bool = False, bidirectional: bool = False, num_layers: int = 1,
        bias: bool = True, dropout: float = 0.0, fused: bool | None = None) -> tuple[Var, Var]:
    """A GRU over ``x [T, N, D]`` (as ``torch.nn.GRU``); returns ``(h_all [T,N,H], h_last [N,H])``.

    Parameters ``w_ih [D, 3H]``, ``w_hh [H, 3H]``, ``b_ih [3H]``, ``b_hh [3H]``;
    gate order r, z, n: ``n = tanh(xW_n + b_in + r * (hU_n + b_hn))``,
    ``h' = (1 - z) * n + z * h``. ``reverse``, ``bidirectional`` (then
    ``h_all [T,N,2H]``, ``h_last [N,2H]``, ``h0`` a pair, parameters
    ``<name>.w_ih_reverse`` etc.), ``num_layers`` (parameters ``<name>.l<k>.w_ih``
    ..., ``h0`` a list per layer, the top layer's results), ``dropout`` between
    layers and ``bias=False`` work as for ``lstm``.

    By default (``fused=None``) the layer is the step-by-step recurrence, and an
    executor whose backend has a vendor GRU kernel (torch on CUDA: cuDNN; float32
    and float64) runs each layer and direction as one ``GRUSequence`` op and its
    gradient as one ``GRUSequenceGrad`` (``rg.passes.fuse_recurrent_cells`` on the
    executor's copy of the program); NumPy, torch on the CPU (no vendor GRU
    there), CuPy and onnxruntime run the recurrence. ``recompute`` and
    ``seq_lengths`` keep the recurrence everywhere; ``fused=False`` keeps it on
    every backend. ``fused=True`` builds each layer and direction as one
    ``GRUSequence`` op in the program itself (``rg.gru_sequence``: cuDNN on the
    torch CUDA backend, one general kernel elsewhere) where there is no
    ``recompute`` and no ``seq_lengths``. Results agree to rounding.

    Example::

        h_all, h_last = rg.layers.gru(x, 64, name="gru")
        h_all, h_last = rg.layers.gru(x, 64, num_layers=3, bias=False, name="deep")
    """
    hidden = _check_hidden(hidden, "gru")

    def one_layer(inp, prefix, h0):
        d_in = _check_input(inp, "gru")

        def direction(suffix: str, h0, backwards: bool):
            shapes = {f"w_ih{suffix}": [d_in, 3 * hidden], f"w_hh{suffix}": [hidden, 3 * hidden]}
            if bias:
                shapes.update({f"b_ih{suffix}": [3 * hidden], f"b_hh{suffix}": [3 * hidden]})
            p = _params(prefix, hidden, inp.dtype, shapes)
            h0 = _state(h0, inp, hidden, "h0", "gru")
            if fused and recompute is None and seq_lengths is None:          # one op
                return gru_sequence(inp, p[f"w_ih{suffix}"], p[f"w_hh{suffix}"], p.get(f"b_ih{suffix}"),
                                    p.get(f"b_hh{suffix}"), h0, backwards)
            x_proj = seq_linear(inp, p[f"w_ih{suffix}"], p.get(f"b_ih{suffix}"))

            def step(x_t, states):
                h, = states
                h_proj = matmul(h, p[f"w_hh{suffix}"])
                if bias:
                    h_proj = h_proj + p[f"b_hh{suffix}"]
                return [gru_unit(x_t[0], h_proj, h)]

            all_states, last_states = recurrent(step, [x_proj], [h0], seq_lengths=seq_lengths,
                                                recompute=recompute, reverse=backwards)
            if fused is False:
                _keep_general(last_states[0])
            return all_states[0], last_states[0]

        if not bidirectional:
            return direction("", h0, reverse)
        h0_f, h0_b = _pair(h0, "h0", "gru")
        return _joined(direction("", h0_f, False), direction("_reverse", h0_b, True))

    return _stacked(one_layer, x, [h0], _name(name, "gru"), num_layers, dropout, "gru")


def _fused_lstm(x, w_ih, w_hh, b, h0, c0, forget_bias: float, backwards: bool, keep: str):
    """One direction of one layer as one ``LSTMSequence`` op: (h_all, h_last, c_all, c_last)."""
    return lstm_sequence(x, w_ih, w_hh, b, h0, c0, forget_bias, backwards, keep)


def _keep_general(last_state: Var) -> None:
    """Mark the ``RecurrentNetwork`` writing ``last_state`` as one no executor fuses
    (``passes.fuse_recurrent_cells`` skips ops with ``attrs["fuse"] = False``)."""
    block = last_state.block
    writer = next(op for op in reversed(block.ops) if last_state.name in op.outputs)
    writer.attrs["fuse"] = False
    block.program.bump()


def _stacked(one_layer, x: Var, initial: list, name: str, num_layers: int, dropout: float, layer: str):
    """``num_layers`` of ``one_layer(input, prefix, *initial states)``, each reading the one below.

    One layer keeps the names ``<name>.<param>``; a stack names layer k's ``<name>.l<k>.<param>``
    and takes its initial states from per-layer lists. ``dropout`` applies to every layer's output
    but the top one (torch's convention); the results are the top layer's.
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ProgramError(f"layers.{layer}: num_layers must be an int >= 1, got {num_layers!r}")
    if not 0.0 <= dropout < 1.0:
        raise ProgramError(f"layers.{layer}: dropout must be in [0, 1), got {dropout!r}")
    if num_layers == 1:
        return one_layer(x, name, *initial)
    per_layer = [_per_layer(given, num_layers, what, layer) for given, what in zip(initial, ("h0", "c0"))]
    out = None
    for k in range(num_layers):
        if k and dropout:
            x = dropout_op(x, dropout)
        out = one_layer(x, f"{name}.l{k}", *(states[k] for states in per_layer))
        x = out[0]
    return out


def _per_layer(given, num_layers: int, what: str, layer: str) -> list:
    """A stacked layer's initial states: None, or one state (pair, when bidirectional) per layer."""
    if given is None:
        return [None] * num_layers
    if isinstance(given, (list, tuple)) and len(given) == num_layers:
        return list(given)
    raise ProgramError(f"layers.{layer}(num_layers={num_layers}): {what} must be None or a list of "
                       f"{num_layers} initial states, one per layer, got {given!r}")


def _pair(given, what: str, layer: str) -> tuple:
    """A bidirectional layer's initial state: None, or (forward, reverse)."""
    if given is None:
        return None, None
    if isinstance(given, (list, tuple)) and len(given) == 2:
        return tuple(given)
    raise ProgramError(f"layers.{layer}(bidirectional=True): {what} must be None or a pair "
                       f"(forward [N, H], reverse [N, H]), got {given!r}")


def _joined(forward: tuple, backward: tuple) -> tuple:
    """Each result of the two directions concatenated on the last axis (forward first)."""
    return tuple(concat([f, b], axis=-1) for f, b in zip(forward, backward))


def milstm(x: Var, hidden: int, h0: Var | None = None, c0: Var | None = None,
           seq_lengths: Var | None = None, forget_bias: float = 0.0, name: str | None = None,
           recompute=None) -> tuple[Var, Var, Var, Var]:
    """A multiplicative-integration LSTM (Wu et al. 2016, arXiv 1606.06630) over ``x [T, N, D]``.

    ``xW = x @ w_ih + b_ih``, ``hU = h @ w_hh + b_hh``,
    ``gates = alpha * xW * hU + beta1 * hU + beta2 * xW + b``, then as ``lstm``
    (gate order i, f, g, o). Parameters ``w_ih [D,4H]``, ``b_ih``, ``w_hh [H,4H]``,
    ``b_hh``, and ``alpha``, ``beta1``, ``beta2``, ``b`` (all ``[4H]``, initialised
    to 1, 1, 1, 0 as in the paper). Returns ``(h_all, h_last, c_all, c_last)``.

    The step computes ``gates = hU * (alpha * xW + beta1) + (beta2 * xW + b)``:
    both brackets depend on x only, so they are computed for all T before the loop.

    Example::

        h_all, h_last, c_all, c_last = rg.layers.milstm(x, 64, name="mi")
    """
    hidden = _check_hidden(hidden, "milstm")
    d_in = _check_input(x, "milstm")
    name = _name(name, "milstm")
    g = 4 * hidden
    p = _params(name, hidden, x.dtype,
                {"w_ih": [d_in, g], "b_ih": [g], "w_hh": [hidden, g], "b_hh": [g],
                 "alpha": [g], "beta1": [g], "beta2": [g], "b": [g]},
                fixed={"alpha": 1.0, "beta1": 1.0, "beta2": 1.0, "b": 0.0})
    x_proj = seq_linear(x, p["w_ih"], p["b_ih"])
    scale = x_proj * p["alpha"] + p["beta1"]
    shift = x_proj * p["beta2"] + p["b"]
    h0 = _state(h0, x_proj, hidden, "h0", "milstm")
    c0 = _state(c0, x_proj, hidden, "c0", "milstm")

    def step(xs, states):
        scale_t, shift_t = xs
        h, c = states
        h_proj = matmul(h, p["w_hh"]) + p["b_hh"]
        return list(lstm_unit(h_proj * scale_t + shift_t, c, forget_bias))

    all_states, last_states = recurrent(step, [scale, shift], [h0, c0], seq_lengths=seq_lengths,
                                           recompute=recompute)
    return all_states[0], last_states[0], all_states[1], last_states[1]
