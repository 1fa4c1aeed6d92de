"""layers.lstm / layers.gru with num_layers, bias=False and inter-layer dropout against torch.nn.LSTM /
GRU with the same weights: outputs and gradients of x and every parameter, in every combination with
bidirectional=True and seq_lengths (torch: packed sequences)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import retrograd as rg
from retrograd.testing import build_program as build, started_executor as executor

torch = pytest.importorskip("torch")

T, N, D, H = 5, 3, 4, 3
LENGTHS = np.array([5, 2, 4], dtype=np.int64)
GATES = {"lstm": 4, "gru": 3}


def _param_shapes(layer, layers, bidirectional, bias):
    g = GATES[layer]
    shapes = {}
    for k in range(layers):
        d_in = D if k == 0 else H * (2 if bidirectional else 1)
        prefix = f"l{k}." if layers > 1 else ""
        for s in ("", "_reverse") if bidirectional else ("",):
            shapes[f"{prefix}w_ih{s}"] = (d_in, g * H)
            shapes[f"{prefix}w_hh{s}"] = (H, g * H)
            if bias and layer == "lstm":
                shapes[f"{prefix}b{s}"] = (g * H,)
            elif bias:
                shapes[f"{prefix}b_ih{s}"] = (g * H,)
                shapes[f"{prefix}b_hh{s}"] = (g * H,)
    return shapes


def _ours(layer, params, x, lengths, w_out, **kwargs):
    def model():
        xv = rg.data("x", [-1, -1, D], dtype="float64", stop_gradient=False)
        lv = rg.data("lengths", [-1], dtype="int64") if lengths is not None else None
        out = getattr(rg.layers, layer)(xv, H, seq_lengths=lv, name="rnn", **kwargs)
        loss = rg.sum(out[0] * rg.data("w", [-1, -1, -1], "float64"))
        block = rg.default_main_program().global_block()
        return [out[0]] + rg.gradients(loss, [xv] + [block.var(f"rnn.{k}") for k in params])
    main, startup, fetch = build(model)
    exe = executor(startup)
    assert sorted(p.name for p in main.all_parameters()) == sorted(f"rnn.{k}" for k in params)
    for k, v in params.items():
        exe.scope.set(f"rnn.{k}", v)
    feed = {"x": x, "w": w_out, **({"lengths": lengths} if lengths is not None else {})}
    return exe.run(main, feed=feed, fetch_list=fetch)


def _torch(layer, params, x, lengths, w_out, layers, bidirectional, bias):
    mod = (torch.nn.LSTM if layer == "lstm" else torch.nn.GRU)(
        D, H, num_layers=layers, bidirectional=bidirectional, bias=bias).double()
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    state = {}
    for k in range(layers):
        prefix = f"l{k}." if layers > 1 else ""
        for s in ("", "_reverse") if bidirectional else ("",):
            state[f"weight_ih_l{k}{s}"] = tp[f"{prefix}w_ih{s}"].T
            state[f"weight_hh_l{k}{s}"] = tp[f"{prefix}w_hh{s}"].T
            if bias and layer == "lstm":
                state[f"bias_ih_l{k}{s}"] = tp[f"{prefix}b{s}"]
                state[f"bias_hh_l{k}{s}"] = torch.zeros(4 * H, dtype=torch.float64)
            elif bias:
                state[f"bias_ih_l{k}{s}"], state[f"bias_hh_l{k}{s}"] = tp[f"{prefix}b_ih{s}"], tp[f"{prefix}b_hh{s}"]
    tx = torch.tensor(x, requires_grad=True)
    seq = tx if lengths is None else torch.nn.utils.rnn.pack_padded_sequence(tx, torch.tensor(lengths),
                                                                             enforce_sorted=False)
    out, _ = torch.func.functional_call(mod, state, (seq,))
    if lengths is not None:
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=T)
    loss = (out * torch.tensor(w_out)).sum()
    return out, torch.autograd.grad(loss, [tx] + list(tp.values()))


COMBOS = [(layer, layers, bidi, bias, lengths)
          for layer, layers, bidi, bias, lengths in itertools.product(
              ["lstm", "gru"], [2, 3], [False, True], [True, False], [False, True])
          if not (layers == 3 and bidi and lengths)]


@pytest.mark.parametrize("layer,layers,bidirectional,bias,with_lengths", COMBOS)
def test_stacked_layers_match_torch(layer, layers, bidirectional, bias, with_lengths):
    """torch's packed output is zero past each length (ours carries the states there): the loss
    weighs only the valid steps, and values are compared there."""
    r = np.random.default_rng(layers + 2 * bidirectional + 4 * bias)
    params = {k: r.standard_normal(s) * 0.5 for k, s in _param_shapes(layer, layers, bidirectional, bias).items()}
    x = r.standard_normal((T, N, D))
    lengths = LENGTHS if with_lengths else None
    valid = np.ones((T, N, 1)) if lengths is None else (np.arange(T)[:, None] < LENGTHS[None, :])[..., None] * 1.0
    w_out = r.standard_normal((T, N, H * (2 if bidirectional else 1))) * valid
    ours = _ours(layer, params, x, lengths, w_out, num_layers=layers, bidirectional=bidirectional, bias=bias)
    out, grads = _torch(layer, params, x, lengths, w_out, layers, bidirectional, bias)
    np.testing.assert_allclose(ours[0] * valid, out.detach().numpy(), rtol=1e-9, atol=1e-12)
    for name, a, b in zip(["x"] + list(params), ours[1:], grads):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)


def test_one_layer_keeps_todays_names():
    main, _, _ = build(lambda: rg.layers.lstm(rg.data("x", [-1, -1, D]), H, num_layers=1, name="enc"))
    assert sorted(p.name for p in main.all_parameters()) == ["enc.b", "enc.w_hh", "enc.w_ih"]


def test_stacked_initial_states_are_per_layer():
    r = np.random.default_rng(0)
    params = {k: r.standard_normal(s) * 0.5 for k, s in _param_shapes("gru", 2, False, True).items()}
    x, h0s = r.standard_normal((T, N, D)), [r.standard_normal((N, H)) for _ in range(2)]

    def model():
        xv = rg.data("x", [-1, -1, D], dtype="float64")
        states = [rg.data(f"h0_{k}", [-1, H], dtype="float64") for k in range(2)]
        return rg.layers.gru(xv, H, h0=states, num_layers=2, name="rnn")[0]
    main, startup, out = build(model)
    exe = executor(startup)
    for k, v in params.items():
        exe.scope.set(f"rnn.{k}", v)
    got, = exe.run(main, feed={"x": x, "h0_0": h0s[0], "h0_1": h0s[1]}, fetch_list=[out])
    mod = torch.nn.GRU(D, H, num_layers=2).double()
    with torch.no_grad():
        for k in range(2):
            getattr(mod, f"weight_ih_l{k}").copy_(torch.tensor(params[f"l{k}.w_ih"].T))
            getattr(mod, f"weight_hh_l{k}").copy_(torch.tensor(params[f"l{k}.w_hh"].T))
            getattr(mod, f"bias_ih_l{k}").copy_(torch.tensor(params[f"l{k}.b_ih"]))
            getattr(mod, f"bias_hh_l{k}").copy_(torch.tensor(params[f"l{k}.b_hh"]))
        want, _ = mod(torch.tensor(x), torch.tensor(np.stack(h0s)))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-12)


def test_dropout_acts_between_layers_only():
    """With dropout the top layer's input is masked (outputs differ from dropout=0 with the same
    weights); a one-layer stack with dropout has no layer to drop between (torch's convention)."""
    r = np.random.default_rng(3)
    x = r.standard_normal((T, N, D)).astype("float32")
    results = {}
    for layers, p in ((2, 0.0), (2, 0.5), (1, 0.0), (1, 0.5)):
        main, startup, out = build(lambda: rg.layers.lstm(rg.data("x", [-1, -1, D]), H, num_layers=layers,
                                                          dropout=p, name="rnn")[0], seed=1)
        exe = executor(startup)
        results[layers, p] = exe.run(main, feed={"x": x}, fetch_list=[out])[0]
        assert sum(op.type == "Dropout" for op in main.global_block().ops) == (1 if layers == 2 and p else 0)
    assert not np.allclose(results[2, 0.0], results[2, 0.5])
    np.testing.assert_array_equal(results[1, 0.0], results[1, 0.5])


@pytest.mark.parametrize("kwargs", [{"num_layers": 0}, {"num_layers": 1.5}, {"dropout": 1.0},
                                    {"dropout": -0.1}, {"num_layers": 2, "h0": [None]}])
def test_bad_stack_settings_raise_program_error(kwargs):
    with pytest.raises(rg.ProgramError, match="layers.gru"):
        build(lambda: rg.layers.gru(rg.data("x", [-1, -1, D]), H, **kwargs))
