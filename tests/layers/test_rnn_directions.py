"""layers.lstm / layers.gru with reverse=True and bidirectional=True against torch.nn.LSTM / GRU
(bidirectional=True, packed sequences for lengths) and against the forward layer on flipped input."""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd.testing import build_program as build, started_executor as executor

T, N, D, H = 5, 3, 4, 2
LENGTHS = np.array([5, 2, 4], dtype=np.int64)
GATES = {"lstm": 4, "gru": 3}
PARAMS = {"lstm": ("w_ih", "w_hh", "b"), "gru": ("w_ih", "w_hh", "b_ih", "b_hh")}


def _params(layer, r):
    g = GATES[layer]
    shapes = {"w_ih": (D, g * H), "w_hh": (H, g * H), "b": (g * H,), "b_ih": (g * H,), "b_hh": (g * H,)}
    return {f"{k}{s}": r.standard_normal(shapes[k]) * 0.5 for k in PARAMS[layer] for s in ("", "_reverse")}


def _ours(layer, params, x, lengths, weights, **kwargs):
    """Our layer's (all, last) and the gradients of sum(all * w0) + sum(last * w1) wrt x and its parameters."""
    def model():
        xv = rg.data("x", [-1, -1, D], dtype="float64", stop_gradient=False)
        lv = rg.data("lengths", [-1], dtype="int64") if lengths is not None else None
        outs = getattr(rg.layers, layer)(xv, H, seq_lengths=lv, name="rnn", **kwargs)
        w = [rg.data(f"w{i}", [-1] * o.ndim, "float64") for i, o in enumerate(outs[:2])]
        loss = rg.sum(outs[0] * w[0]) + rg.sum(outs[1] * w[1])
        block = rg.default_main_program().global_block()
        names = [k for k in params if block.find_var(f"rnn.{k}") is not None]
        return list(outs[:2]) + rg.gradients(loss, [xv] + [block.var(f"rnn.{k}") for k in names]), names
    main, startup, (fetch, names) = build(model)
    exe = executor(startup)
    for k in names:
        exe.scope.set(f"rnn.{k}", params[k])
    feed = {"x": x, "w0": weights[0], "w1": weights[1], **({"lengths": lengths} if lengths is not None else {})}
    return exe.run(main, feed=feed, fetch_list=fetch), names


def _valid(lengths):
    return np.ones((T, N, 1)) if lengths is None else (np.arange(T)[:, None] < lengths[None, :])[..., None] * 1.0


def _torch(layer, params, x, lengths, weights, names, bidirectional=True):
    mod = (torch.nn.LSTM if layer == "lstm" else torch.nn.GRU)(D, H, bidirectional=bidirectional).double()
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    state = {}
    for ours, theirs in (("", ""), ("_reverse", "_reverse")):
        if not bidirectional and ours:
            continue
        state[f"weight_ih_l0{theirs}"] = tp[f"w_ih{ours}"].T
        state[f"weight_hh_l0{theirs}"] = tp[f"w_hh{ours}"].T
        if layer == "lstm":
            state[f"bias_ih_l0{theirs}"] = tp[f"b{ours}"]
            state[f"bias_hh_l0{theirs}"] = torch.zeros(4 * H, dtype=torch.float64)
        else:
            state[f"bias_ih_l0{theirs}"], state[f"bias_hh_l0{theirs}"] = tp[f"b_ih{ours}"], tp[f"b_hh{ours}"]
    tx = torch.tensor(x, requires_grad=True)
    seq = tx if lengths is None else torch.nn.utils.rnn.pack_padded_sequence(tx, torch.tensor(lengths),
                                                                             enforce_sorted=False)
    out, hn = torch.func.functional_call(mod, state, (seq,))
    hn = hn[0] if layer == "lstm" else hn
    if lengths is not None:
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=T)
    last = torch.cat(list(hn), dim=-1)
    loss = (out * torch.tensor(weights[0])).sum() + (last * torch.tensor(weights[1])).sum()
    grads = torch.autograd.grad(loss, [tx] + [tp[k] for k in names])
    return out, last, grads


@pytest.mark.parametrize("layer", ["lstm", "gru"])
@pytest.mark.parametrize("with_lengths", [False, True])
def test_bidirectional_matches_torch(layer, with_lengths):
    """torch's packed output is zero past each length (ours carries the states there): the loss
    weighs only the valid steps on both sides, and values are compared there."""
    r = np.random.default_rng(1)
    params, x = _params(layer, r), r.standard_normal((T, N, D))
    lengths = LENGTHS if with_lengths else None
    valid = _valid(lengths)
    weights = [r.standard_normal((T, N, 2 * H)) * valid, r.standard_normal((N, 2 * H))]
    got, names = _ours(layer, params, x, lengths, weights, bidirectional=True)
    out, last, grads = _torch(layer, params, x, lengths, weights, names)
    assert got[0].shape == (T, N, 2 * H) and got[1].shape == (N, 2 * H) and sorted(names) == sorted(params)
    np.testing.assert_allclose(got[0] * valid, out.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got[1], last.detach().numpy(), rtol=1e-10, atol=1e-12)
    for name, ours, ref in zip(["x"] + names, got[2:], grads):
        np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-9, atol=1e-11, err_msg=name)


@pytest.mark.parametrize("layer", ["lstm", "gru"])
def test_reverse_equals_the_forward_layer_on_each_flipped_sequence(layer):
    """reverse=True with lengths: torch's forward layer run on each example's reversed valid prefix."""
    r = np.random.default_rng(2)
    params, x = _params(layer, r), r.standard_normal((T, N, D))
    weights = [r.standard_normal((T, N, H)) * _valid(LENGTHS), r.standard_normal((N, H))]
    got, names = _ours(layer, params, x, LENGTHS, weights, reverse=True)
    forward = {k: v for k, v in params.items() if not k.endswith("_reverse")}
    for n, length in enumerate(LENGTHS):
        flipped = x[:length, n:n + 1][::-1].copy()
        w0 = weights[0][:length, n:n + 1][::-1].copy()
        out, last, _ = _torch(layer, forward, flipped, None, [w0, weights[1][n:n + 1]], sorted(forward),
                              bidirectional=False)
        np.testing.assert_allclose(got[0][:length, n:n + 1], out.detach().numpy()[::-1], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got[1][n:n + 1], last.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert sorted(names) == sorted(forward)


def test_bidirectional_initial_states_must_be_pairs():
    with pytest.raises(rg.ProgramError, match="pair"):
        build(lambda: rg.layers.gru(rg.data("x", [-1, -1, D], "float64"), H, h0=rg.data("h", [-1, H], "float64"),
                                    bidirectional=True))
