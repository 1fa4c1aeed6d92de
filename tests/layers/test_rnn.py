"""layers.lstm / gru / milstm against PyTorch (weights copied), in float64.

Our layouts: ``w_ih [D, G*H]`` and ``w_hh [H, G*H]`` multiply from the right,
torch's ``weight_ih_l0 [G*H, D]`` from the left, so weights are copied
transposed; torch's LSTM has two biases, ours one (``b = b_ih + b_hh``).
Every test compares values *and* gradients of a loss that mixes all outputs
with fixed random weights, with respect to the input, the initial states and
every parameter.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd.backends import to_numpy
from retrograd.testing import check_gradients

T, N, D, H = 5, 3, 4, 6
pytestmark = pytest.mark.engine     # these tests also run on the onnxruntime engine

LSTM_PARAMS = ("w_ih", "w_hh", "b")
GRU_PARAMS = ("w_ih", "w_hh", "b_ih", "b_hh")
MILSTM_PARAMS = ("w_ih", "b_ih", "w_hh", "b_hh", "alpha", "beta1", "beta2", "b")


@pytest.fixture(autouse=True)
def _on_every_backend(backend, monkeypatch):
    """Every test here runs on each backend of the ``backend`` fixture: ``rg.Executor()`` in
    this module makes that backend's executor (results come back as NumPy arrays)."""
    monkeypatch.setattr(rg, "Executor", functools.partial(rg.Executor, **backend.kwargs))


class Built:
    """A layer built over data x [T?, N?, D] (and optional states), with its loss gradients."""

    def __init__(self, layer, n_states: int, params, given_states: bool, with_lengths: bool = False,
                 dtype: str = "float64", static: bool = False, **kwargs):
        self.main, self.startup = rg.Program(), rg.Program()
        self.params = params
        with rg.program_guard(self.main, self.startup):
            shape = [T, N, D] if static else [-1, -1, D]
            self.x = rg.data("x", shape, dtype, stop_gradient=False)
            self.states = [rg.data(f"s{i}", [-1, H], dtype, stop_gradient=False)
                           for i in range(n_states)] if given_states else []
            lengths = rg.data("lengths", [-1], "int64") if with_lengths else None
            extra = {"seq_lengths": lengths} if with_lengths else {}
            self.outs = list(layer(self.x, H, *self.states, name="rnn", **extra, **kwargs))
            # weights for a loss mixing every output; fed so T and N may change between runs
            self.weights = [rg.data(f"p{i}", list(o.shape), dtype) for i, o in enumerate(self.outs)]
            self.loss = rg.add_n([rg.sum(o * w) for o, w in zip(self.outs, self.weights)])
            self.param_vars = [self.main.global_block().var(f"rnn.{p}") for p in params]
            wrt = [self.x] + self.states + self.param_vars
            self.grads = rg.gradients(self.loss, wrt)
        self.exe = rg.Executor()
        self.exe.run(self.startup)

    def run(self, x, states=(), weights=(), lengths=None, params=None):
        for name, value in (params or {}).items():
            self.exe.scope.set(f"rnn.{name}", value)
        feed = {"x": x, **{f"s{i}": s for i, s in enumerate(states)},
                **{f"p{i}": w for i, w in enumerate(weights)}}
        if lengths is not None:
            feed["lengths"] = lengths
        fetched = self.exe.run(self.main, feed=feed, fetch_list=self.outs + self.grads)
        return fetched[:len(self.outs)], fetched[len(self.outs):]


def _weights_for(outs_shapes, r):
    return [r.standard_normal(s) for s in outs_shapes]


def _lstm_shapes(t, n):
    return [(t, n, H), (n, H), (t, n, H), (n, H)]


def _torch_grads(loss, tensors):
    return [g.numpy() for g in torch.autograd.grad(loss, tensors)]


def _torch_lstm(params, x, h0, c0, lengths=None):
    """torch.nn.LSTM with our parameters copied in; returns outputs (torch) and the tensors."""
    mod = torch.nn.LSTM(D, H).double()
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    weights = {"weight_ih_l0": tp["w_ih"].T, "weight_hh_l0": tp["w_hh"].T, "bias_ih_l0": tp["b"],
               "bias_hh_l0": torch.zeros(4 * H, dtype=torch.float64)}
    tx, th, tc = (torch.tensor(a, requires_grad=True) for a in (x, h0, c0))
    seq = tx
    if lengths is not None:
        seq = torch.nn.utils.rnn.pack_padded_sequence(tx, torch.tensor(lengths), enforce_sorted=False)
    out, (hn, cn) = torch.func.functional_call(mod, weights, (seq, (th[None], tc[None])))
    if lengths is not None:
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=x.shape[0])
    return out, hn[0], cn[0], [tx, th, tc] + [tp[k] for k in LSTM_PARAMS]


def _random_params(r, shapes: dict, scale=0.5):
    return {k: r.standard_normal(s) * scale for k, s in shapes.items()}


def _lstm_param_shapes(d=D):
    return {"w_ih": (d, 4 * H), "w_hh": (H, 4 * H), "b": (4 * H,)}


def test_lstm_matches_torch_values_and_gradients():
    r = np.random.default_rng(0)
    built = Built(rg.layers.lstm, 2, LSTM_PARAMS, given_states=True)
    params = _random_params(r, _lstm_param_shapes())
    x, h0, c0 = r.standard_normal((T, N, D)), r.standard_normal((N, H)), r.standard_normal((N, H))
    weights = _weights_for(_lstm_shapes(T, N), r)
    outs, grads = built.run(x, (h0, c0), weights, params=params)

    out, hn, cn, tensors = _torch_lstm(params, x, h0, c0)
    # torch's LSTM returns only h for every step; c_all comes from a cell loop below
    np.testing.assert_allclose(outs[0], out.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(outs[1], hn.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(outs[3], cn.detach().numpy(), rtol=1e-10, atol=1e-12)
    c_all = _torch_lstm_c_all(params, x, h0, c0)
    np.testing.assert_allclose(outs[2], c_all, rtol=1e-10, atol=1e-12)

    loss = (out * torch.tensor(weights[0])).sum() + (hn * torch.tensor(weights[1])).sum() \
        + (cn * torch.tensor(weights[3])).sum()
    # c_all enters the loss through torch cells run with the same tensors
    loss = loss + (_torch_cell_loop(tensors)[1] * torch.tensor(weights[2])).sum()
    for name, got, want in zip(["x", "h0", "c0", *LSTM_PARAMS], grads, _torch_grads(loss, tensors)):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11, err_msg=name)


def _torch_cell_loop(tensors, lengths=None):
    """h_all, c_all of an LSTM written as a loop of torch.nn.LSTMCell (states carried past lengths)."""
    tx, th, tc, w_ih, w_hh, b = tensors
    cell = torch.nn.LSTMCell(D, H).double()
    weights = {"weight_ih": w_ih.T, "weight_hh": w_hh.T, "bias_ih": b,
               "bias_hh": torch.zeros(4 * H, dtype=torch.float64)}
    hs, cs = [], []
    h, c = th, tc
    for t in range(tx.shape[0]):
        h2, c2 = torch.func.functional_call(cell, weights, (tx[t], (h, c)))
        if lengths is not None:
            keep = torch.tensor(t < np.asarray(lengths))[:, None]
            h2, c2 = torch.where(keep, h2, h), torch.where(keep, c2, c)
        h, c = h2, c2
        hs.append(h)
        cs.append(c)
    return torch.stack(hs), torch.stack(cs)


def _torch_lstm_c_all(params, x, h0, c0):
    tensors = [torch.tensor(a) for a in (x, h0, c0)] + [torch.tensor(params[k]) for k in LSTM_PARAMS]
    return _torch_cell_loop(tensors)[1].numpy()


def test_lstm_with_static_shapes_matches_the_dynamic_build():
    r = np.random.default_rng(11)
    params = _random_params(r, _lstm_param_shapes())
    x, h0, c0 = r.standard_normal((T, N, D)), r.standard_normal((N, H)), r.standard_normal((N, H))
    weights = _weights_for(_lstm_shapes(T, N), r)
    static = Built(rg.layers.lstm, 2, LSTM_PARAMS, given_states=True, static=True)
    assert static.outs[0].shape == (T, N, H) and static.outs[1].shape == (N, H)
    dynamic = Built(rg.layers.lstm, 2, LSTM_PARAMS, given_states=True)
    got = static.run(x, (h0, c0), weights, params=params)
    want = dynamic.run(x, (h0, c0), weights, params=params)
    for a, b in zip(got[0] + got[1], want[0] + want[1]):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)


def test_lstm_default_states_are_zeros_and_batch_and_length_may_change():
    r = np.random.default_rng(1)
    built = Built(rg.layers.lstm, 2, LSTM_PARAMS, given_states=False)
    params = _random_params(r, _lstm_param_shapes())
    for t, n in [(5, 3), (7, 6), (2, 1), (5, 3)]:      # grows, then shrinks, then back
        x = r.standard_normal((t, n, D))
        weights = _weights_for(_lstm_shapes(t, n), r)
        outs, grads = built.run(x, (), weights, params=params)
        zeros = np.zeros((n, H))
        tensors = [torch.tensor(x, requires_grad=True), torch.tensor(zeros), torch.tensor(zeros)] + \
            [torch.tensor(params[k], requires_grad=True) for k in LSTM_PARAMS]
        h_all, c_all = _torch_cell_loop(tensors)
        refs = [h_all, h_all[-1], c_all, c_all[-1]]
        for got, want in zip(outs, refs):
            np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-10, atol=1e-12)
        loss = sum((ref * torch.tensor(w)).sum() for ref, w in zip(refs, weights))
        wants = _torch_grads(loss, [tensors[0]] + tensors[3:])
        for got, want in zip(grads, wants):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)


def test_lstm_seq_lengths_match_packed_torch_and_a_masked_loop():
    r = np.random.default_rng(2)
    lengths = np.array([5, 2, 4], dtype=np.int64)
    built = Built(rg.layers.lstm, 2, LSTM_PARAMS, given_states=True, with_lengths=True)
    params = _random_params(r, _lstm_param_shapes())
    x, h0, c0 = r.standard_normal((T, N, D)), r.standard_normal((N, H)), r.standard_normal((N, H))
    weights = _weights_for(_lstm_shapes(T, N), r)
    outs, grads = built.run(x, (h0, c0), weights, lengths=lengths, params=params)

    # values: torch's packed LSTM (zero-padded past each length; its h_n/c_n are taken at the length)
    out, hn, cn, _ = _torch_lstm(params, x, h0, c0, lengths)
    valid = (np.arange(T)[:, None] < lengths[None, :])[..., None]
    np.testing.assert_allclose(outs[0] * valid, out.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(outs[1], hn.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(outs[3], cn.detach().numpy(), rtol=1e-10, atol=1e-12)
    # past its length each example's state is carried unchanged
    for n, length in enumerate(lengths):
        for t in range(length, T):
            np.testing.assert_array_equal(outs[0][t, n], outs[1][n])
            np.testing.assert_array_equal(outs[2][t, n], outs[3][n])

    # gradients: a torch cell loop that carries states past the lengths the same way
    tensors = [torch.tensor(a, requires_grad=True) for a in (x, h0, c0)] + \
        [torch.tensor(params[k], requires_grad=True) for k in LSTM_PARAMS]
    h_all, c_all = _torch_cell_loop(tensors, lengths)
    idx = torch.tensor(lengths - 1)
    h_last, c_last = h_all[idx, torch.arange(N)], c_all[idx, torch.arange(N)]
    refs = [h_all, h_last, c_all, c_last]
    loss = sum((ref * torch.tensor(w)).sum() for ref, w in zip(refs, weights))
    for name, got, want in zip(["x", "h0", "c0", *LSTM_PARAMS], grads, _torch_grads(loss, tensors)):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11, err_msg=name)
    # the input past an example's length gets no gradient
    assert np.all(grads[0][~valid[..., 0]] == 0.0)


def test_lstm_forget_bias_matches_shifted_bias():
    r = np.random.default_rng(3)
    params = _random_params(r, _lstm_param_shapes())
    x = r.standard_normal((T, N, D))
    weights = _weights_for(_lstm_shapes(T, N), r)
    with_bias = Built(rg.layers.lstm, 2, LSTM_PARAMS, given_states=False, forget_bias=1.5)
    outs, grads = with_bias.run(x, (), weights, params=params)
    shifted = dict(params, b=params["b"] + np.r_[np.zeros(H), np.full(H, 1.5), np.zeros(2 * H)])
    plain = Built(rg.layers.lstm, 2, LSTM_PARAMS, given_states=False)
    ref_outs, ref_grads = plain.run(x, (), weights, params=shifted)
    for got, want in zip(outs + grads, ref_outs + ref_grads):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


def _torch_gru(params, x, h0, lengths=None):
    mod = torch.nn.GRU(D, H).double()
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    weights = {"weight_ih_l0": tp["w_ih"].T, "weight_hh_l0": tp["w_hh"].T,
               "bias_ih_l0": tp["b_ih"], "bias_hh_l0": tp["b_hh"]}
    tx, th = torch.tensor(x, requires_grad=True), torch.tensor(h0, requires_grad=True)
    seq = tx
    if lengths is not None:
        seq = torch.nn.utils.rnn.pack_padded_sequence(tx, torch.tensor(lengths), enforce_sorted=False)
    out, hn = torch.func.functional_call(mod, weights, (seq, th[None]))
    if lengths is not None:
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=x.shape[0])
    return out, hn[0], [tx, th] + [tp[k] for k in GRU_PARAMS]


def _gru_param_shapes():
    return {"w_ih": (D, 3 * H), "w_hh": (H, 3 * H), "b_ih": (3 * H,), "b_hh": (3 * H,)}


def test_gru_matches_torch_values_and_gradients():
    r = np.random.default_rng(4)
    built = Built(rg.layers.gru, 1, GRU_PARAMS, given_states=True)
    params = _random_params(r, _gru_param_shapes())
    x, h0 = r.standard_normal((T, N, D)), r.standard_normal((N, H))
    weights = _weights_for([(T, N, H), (N, H)], r)
    outs, grads = built.run(x, (h0,), weights, params=params)
    out, hn, tensors = _torch_gru(params, x, h0)
    np.testing.assert_allclose(outs[0], out.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(outs[1], hn.detach().numpy(), rtol=1e-10, atol=1e-12)
    loss = (out * torch.tensor(weights[0])).sum() + (hn * torch.tensor(weights[1])).sum()
    for name, got, want in zip(["x", "h0", *GRU_PARAMS], grads, _torch_grads(loss, tensors)):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11, err_msg=name)


def test_gru_seq_lengths_and_default_state_match_packed_torch():
    r = np.random.default_rng(5)
    lengths = np.array([3, 5, 1], dtype=np.int64)
    built = Built(rg.layers.gru, 1, GRU_PARAMS, given_states=False, with_lengths=True)
    params = _random_params(r, _gru_param_shapes())
    x = r.standard_normal((T, N, D))
    valid = (np.arange(T)[:, None] < lengths[None, :])[..., None]
    # the loss only looks where torch's padded output is defined, so gradients compare directly
    weights = [r.standard_normal((T, N, H)) * valid, r.standard_normal((N, H))]
    outs, grads = built.run(x, (), weights, lengths=lengths, params=params)
    out, hn, tensors = _torch_gru(params, x, np.zeros((N, H)), lengths)
    np.testing.assert_allclose(outs[0] * valid, out.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(outs[1], hn.detach().numpy(), rtol=1e-10, atol=1e-12)
    loss = (out * torch.tensor(weights[0])).sum() + (hn * torch.tensor(weights[1])).sum()
    wants = _torch_grads(loss, [tensors[0]] + tensors[2:])
    for name, got, want in zip(["x", *GRU_PARAMS], grads, wants):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11, err_msg=name)


def _milstm_reference(tensors, forget_bias):
    """MILSTM written out in torch, following arXiv 1606.06630 (eq. for the MI gates)."""
    x, h, c, w_ih, b_ih, w_hh, b_hh, alpha, beta1, beta2, b = tensors
    hs, cs = [], []
    for t in range(x.shape[0]):
        xw = x[t] @ w_ih + b_ih
        hu = h @ w_hh + b_hh
        gates = alpha * xw * hu + beta1 * hu + beta2 * xw + b
        i, f, g, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f + forget_bias) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        hs.append(h)
        cs.append(c)
    return torch.stack(hs), h, torch.stack(cs), c


def test_milstm_matches_a_reference_written_from_the_paper():
    r = np.random.default_rng(6)
    built = Built(rg.layers.milstm, 2, MILSTM_PARAMS, given_states=True, forget_bias=0.5)
    g = 4 * H
    shapes = {"w_ih": (D, g), "b_ih": (g,), "w_hh": (H, g), "b_hh": (g,), "alpha": (g,),
              "beta1": (g,), "beta2": (g,), "b": (g,)}
    params = _random_params(r, shapes)
    x, h0, c0 = r.standard_normal((T, N, D)), r.standard_normal((N, H)), r.standard_normal((N, H))
    weights = _weights_for(_lstm_shapes(T, N), r)
    outs, grads = built.run(x, (h0, c0), weights, params=params)
    tensors = [torch.tensor(a, requires_grad=True) for a in (x, h0, c0)] + \
        [torch.tensor(params[k], requires_grad=True) for k in MILSTM_PARAMS]
    refs = _milstm_reference(tensors, 0.5)
    for got, want in zip(outs, refs):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-10, atol=1e-12)
    loss = sum((ref * torch.tensor(w)).sum() for ref, w in zip(refs, weights))
    for name, got, want in zip(["x", "h0", "c0", *MILSTM_PARAMS], grads, _torch_grads(loss, tensors)):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11, err_msg=name)


def test_milstm_initial_parameters_follow_the_paper():
    built = Built(rg.layers.milstm, 2, MILSTM_PARAMS, given_states=False)
    def get(name):
        return to_numpy(built.exe.scope.get(name))
    for name, value in [("alpha", 1.0), ("beta1", 1.0), ("beta2", 1.0), ("b", 0.0)]:
        np.testing.assert_array_equal(get(f"rnn.{name}"), np.full(4 * H, value))
    # with alpha = beta1 = beta2 = 1 and b = 0 the gates are xW*hU + hU + xW
    r = np.random.default_rng(7)
    x = r.standard_normal((T, N, D))
    outs, _ = built.run(x, (), _weights_for(_lstm_shapes(T, N), r))
    tensors = [torch.tensor(x), torch.zeros(N, H, dtype=torch.float64), torch.zeros(N, H, dtype=torch.float64)] \
        + [torch.tensor(get(f"rnn.{k}")) for k in MILSTM_PARAMS]
    np.testing.assert_allclose(outs[0], _milstm_reference(tensors, 0.0)[0].numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_parameters_are_created_in_the_input_dtype_with_the_contract_layout(dtype):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], dtype)
        rg.layers.lstm(x, H, name="a")
        rg.layers.gru(x, H, name="g")
        rg.layers.milstm(x, H, name="m")
    expected = {"a.w_ih": (D, 4 * H), "a.w_hh": (H, 4 * H), "a.b": (4 * H,),
                "g.w_ih": (D, 3 * H), "g.w_hh": (H, 3 * H), "g.b_ih": (3 * H,), "g.b_hh": (3 * H,),
                **{f"m.{k}": ((D, 4 * H) if k == "w_ih" else (H, 4 * H) if k == "w_hh" else (4 * H,))
                   for k in MILSTM_PARAMS}}
    params = {v.name: v for v in main.all_parameters()}
    assert set(params) == set(expected)
    for name, shape in expected.items():
        assert params[name].shape == shape and params[name].dtype == dtype, name
    exe = rg.Executor()
    exe.run(startup)
    bound = 1.0 / np.sqrt(H)
    w = to_numpy(exe.scope.get("a.w_hh"))
    assert w.dtype == np.dtype(dtype)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.5 * bound   # U(-1/sqrt(H), 1/sqrt(H))


def test_input_projection_is_hoisted_out_of_the_step():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1, D])
        rg.layers.lstm(x, H, name="enc")
    top = [op for op in main.global_block().ops]
    assert any(op.type == "SeqLinear" and "enc.w_ih" in op.inputs for op in top)
    step_ops = [op for block in main.blocks[1:] for op in block.ops]
    assert step_ops, "the step should be a sub-block of the recurrent op"
    assert not any("enc.w_ih" in op.inputs for op in step_ops)
    assert sum(op.type == "MatMul" for op in step_ops) == 1
    assert sum(op.type == "LSTMUnit" for op in step_ops) == 1


def test_small_lstm_and_gru_pass_finite_differences():
    r = np.random.default_rng(8)
    inputs = {"x": r.standard_normal((3, 2, 2)), "h": r.standard_normal((2, 3)), "c": r.standard_normal((2, 3))}
    check_gradients(lambda x, h, c: list(rg.layers.lstm(x, 3, h, c, name="l")), inputs)
    check_gradients(lambda x, h: list(rg.layers.gru(x, 3, h, name="g")), {k: inputs[k] for k in ("x", "h")})
    check_gradients(lambda x, h, c: list(rg.layers.milstm(x, 3, h, c, name="m")), inputs)


def test_recompute_steps_gives_identical_gradients():
    r = np.random.default_rng(9)
    params = _random_params(r, _lstm_param_shapes())
    x = r.standard_normal((T, N, D))
    weights = _weights_for(_lstm_shapes(T, N), r)
    stored = Built(rg.layers.lstm, 2, LSTM_PARAMS, given_states=False)
    recomputed = Built(rg.layers.lstm, 2, LSTM_PARAMS, given_states=False, recompute="steps")
    ref_outs, ref_grads = stored.run(x, (), weights, params=params)
    outs, grads = recomputed.run(x, (), weights, params=params)
    for got, want in zip(outs + grads, ref_outs + ref_grads):
        np.testing.assert_array_equal(got, want)


def test_layer_errors_are_program_errors():
    with rg.program_guard(rg.Program(), rg.Program()):
        with pytest.raises(rg.ProgramError, match="layers.lstm needs x"):
            rg.layers.lstm(rg.data("x2", [-1, D]), H)
        with pytest.raises(rg.ProgramError, match="feature size"):
            rg.layers.gru(rg.data("x3", [-1, -1, -1]), H)
        x = rg.data("x", [-1, -1, D])
        with pytest.raises(rg.ProgramError, match=r"h0 must be \[N, 6\]"):
            rg.layers.milstm(x, H, h0=rg.data("h", [-1, H + 1]))


@pytest.mark.parametrize("layer", ["lstm", "gru"])
def test_zero_length_sequence_with_default_states(layer):
    """Regression (issue #10): default states were sized from x's first step, so T = 0 failed
    in a Squeeze. They are zeros [N, H]; the last states of an empty sequence are those zeros."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], dtype="float64")
        outs = getattr(rg.layers, layer)(x, H, name="rnn")
        loss = rg.sum(outs[1] * outs[1]) + rg.sum(outs[0])
        [dx] = rg.gradients(loss, [x])
    exe = rg.Executor()
    exe.run(startup)
    for steps in (0, 2):
        xb = np.random.default_rng(steps).standard_normal((steps, N, D))
        got = exe.run(main, feed={"x": xb}, fetch_list=list(outs) + [dx])
        assert got[0].shape == (steps, N, H) and got[1].shape == (N, H) and got[-1].shape == xb.shape
        if steps == 0:
            for value in got[1::2][:2] if layer == "lstm" else [got[1]]:
                np.testing.assert_array_equal(value, np.zeros((N, H)))
        else:
            np.testing.assert_allclose(got[1], got[0][-1])


def test_lstm_step_is_two_ops_and_its_backward_has_no_sum_to():
    """The recurrent half h @ w_hh goes into LSTMUnit (h_gates): no Add per step forward and no
    broadcast-undoing SumTo per step backward (each is ~10 ONNX nodes run T times)."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1, D], stop_gradient=False)
        h_all, _, _, _ = rg.layers.lstm(x, H, name="enc")
        rg.gradients(rg.sum(h_all), [x])
    rnn = next(op for op in main.global_block().ops if op.type == "RecurrentNetwork")
    grad = next(op for op in main.global_block().ops if op.type == "RecurrentNetworkGrad")
    assert [op.type for op in rnn.attrs["step"].ops] == ["MatMul", "LSTMUnit"]
    assert [op.type for op in grad.attrs["backward"].ops] == ["LSTMUnitGrad", "MatMul"]
