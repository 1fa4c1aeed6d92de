"""Contract: recurrent, recurrent_net, layers.lstm / gru / milstm vs PyTorch and NumPy (float64)."""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg

T, N, D, H = 5, 3, 4, 6
F64 = "float64"


def _rng(seed):
    return np.random.default_rng(seed)


def _sig(z):
    return 1.0 / (1.0 + np.exp(-z))


# --- layers.lstm vs torch.nn.LSTM ---------------------------------------------------------------

def _lstm_program(given_states, name="enc", lengths=False, recompute=None, forget_bias=0.0):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], dtype=F64, stop_gradient=False)
        h0 = rg.data("h0", [-1, H], dtype=F64, stop_gradient=False) if given_states else None
        c0 = rg.data("c0", [-1, H], dtype=F64, stop_gradient=False) if given_states else None
        sl = rg.data("lengths", [-1], dtype="int64") if lengths else None
        kw = {} if name is None else {"name": name}
        outs = rg.layers.lstm(x, H, h0=h0, c0=c0, seq_lengths=sl, forget_bias=forget_bias,
                              recompute=recompute, **kw)
        wa = rg.data("wa", [-1, -1, H], dtype=F64)
        wl = rg.data("wl", [-1, H], dtype=F64)
        h_all, h_last, c_all, c_last = outs
        loss = rg.sum(h_all * wa) + rg.sum(h_last * wl) + rg.sum(c_all * wa * 0.5) + rg.sum(c_last)
        pg = rg.append_backward(loss)
        wrt = [x] + ([h0, c0] if given_states else [])
        ig = rg.gradients([loss], wrt)
    return main, startup, outs, loss, pg, ig


def _feed(seed, t=T, n=N, states=True):
    r = _rng(seed)
    f = {"x": r.standard_normal((t, n, D)), "wa": r.standard_normal((t, n, H)),
         "wl": r.standard_normal((n, H))}
    if states:
        f["h0"] = r.standard_normal((n, H))
        f["c0"] = r.standard_normal((n, H))
    return f


def test_lstm_param_names_shapes_in_startup():
    main, startup, outs, *_ = _lstm_program(True)
    sv = startup.global_block().vars
    assert tuple(sv["enc.w_ih"].shape) == (D, 4 * H)
    assert tuple(sv["enc.w_hh"].shape) == (H, 4 * H)
    assert tuple(sv["enc.b"].shape) == (4 * H,)
    assert all(sv[f"enc.{p}"].dtype == F64 for p in ("w_ih", "w_hh", "b"))
    assert isinstance(outs, tuple) and len(outs) == 4
    h_all, h_last, c_all, c_last = outs
    assert h_all.shape[-1] == H and len(h_all.shape) == 3
    assert h_last.shape[-1] == H and len(h_last.shape) == 2


@pytest.mark.parametrize("given_states", [True, False])
def test_lstm_vs_torch_values_and_all_gradients(given_states):
    main, startup, outs, loss, pg, ig = _lstm_program(given_states)
    exe = rg.Executor()
    exe.run(startup)
    r = _rng(1)
    wih, whh, b = r.standard_normal((D, 4 * H)) * 0.4, r.standard_normal((H, 4 * H)) * 0.4, r.standard_normal(4 * H) * 0.3
    exe.scope.set("enc.w_ih", wih)
    exe.scope.set("enc.w_hh", whh)
    exe.scope.set("enc.b", b)
    feed = _feed(2, states=given_states)
    vals = exe.run(main, feed=feed, fetch_list=list(outs) + [loss] + [g for _, g in pg] + ig)

    mod = torch.nn.LSTM(D, H).double()
    with torch.no_grad():
        mod.weight_ih_l0.copy_(torch.tensor(wih.T))
        mod.weight_hh_l0.copy_(torch.tensor(whh.T))
        mod.bias_ih_l0.copy_(torch.tensor(b))
        mod.bias_hh_l0.zero_()
    xt = torch.tensor(feed["x"], requires_grad=True)
    h0t = torch.tensor(feed["h0"] if given_states else np.zeros((N, H)), requires_grad=True)
    c0t = torch.tensor(feed["c0"] if given_states else np.zeros((N, H)), requires_grad=True)
    out, (hn, cn) = mod(xt, (h0t[None], c0t[None]))
    # c_all from a hand cell loop with the same weights (torch's LSTM does not return it)
    hs, cs, hh, cc = [], [], h0t, c0t
    for t in range(T):
        z = xt[t] @ mod.weight_ih_l0.T + hh @ mod.weight_hh_l0.T + mod.bias_ih_l0 + mod.bias_hh_l0
        i, f, g, o = z.split(H, dim=1)
        cc = torch.sigmoid(f) * cc + torch.sigmoid(i) * torch.tanh(g)
        hh = torch.sigmoid(o) * torch.tanh(cc)
        hs.append(hh); cs.append(cc)
    C = torch.stack(cs)
    np.testing.assert_allclose(torch.stack(hs).detach().numpy(), out.detach().numpy(), rtol=1e-12)
    wa, wl = torch.tensor(feed["wa"]), torch.tensor(feed["wl"])
    lt = (out * wa).sum() + (hn[0] * wl).sum() + (C * wa * 0.5).sum() + cn[0].sum()
    lt.backward()
    np.testing.assert_allclose(vals[0], out.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(vals[1], hn[0].detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(vals[2], C.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(vals[3], cn[0].detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(vals[4], lt.item(), rtol=1e-10)
    grads = dict(zip([p.name for p, _ in pg], vals[5:5 + len(pg)]))
    assert set(grads) == {"enc.w_ih", "enc.w_hh", "enc.b"}
    np.testing.assert_allclose(grads["enc.w_ih"], mod.weight_ih_l0.grad.numpy().T, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grads["enc.w_hh"], mod.weight_hh_l0.grad.numpy().T, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grads["enc.b"], mod.bias_ih_l0.grad.numpy(), rtol=1e-9, atol=1e-12)
    rest = vals[5 + len(pg):]
    np.testing.assert_allclose(rest[0], xt.grad.numpy(), rtol=1e-9, atol=1e-12)
    if given_states:
        np.testing.assert_allclose(rest[1], h0t.grad.numpy(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(rest[2], c0t.grad.numpy(), rtol=1e-9, atol=1e-12)


def _np_lstm(x, wih, whh, b, h, c, fb=0.0, lengths=None):
    hs, cs = [], []
    for t in range(x.shape[0]):
        z = x[t] @ wih + h @ whh + b
        i, f, g, o = np.split(z, 4, axis=1)
        c2 = _sig(f + fb) * c + _sig(i) * np.tanh(g)
        h2 = _sig(o) * np.tanh(c2)
        if lengths is not None:
            live = (t < lengths)[:, None]
            c2 = np.where(live, c2, c)
            h2 = np.where(live, h2, h)
        h, c = h2, c2
        hs.append(h); cs.append(c)
    return np.stack(hs), h, np.stack(cs), c


def test_lstm_forget_bias_and_seq_lengths_vs_numpy():
    main, startup, outs, loss, pg, ig = _lstm_program(True, lengths=True, forget_bias=1.0)
    exe = rg.Executor()
    exe.run(startup)
    feed = _feed(3)
    lengths = np.array([5, 2, 0], "int64")
    feed["lengths"] = lengths
    vals = exe.run(main, feed=feed, fetch_list=list(outs))
    p = {k: np.asarray(exe.scope.get(f"enc.{k}")) for k in ("w_ih", "w_hh", "b")}
    ref = _np_lstm(feed["x"], p["w_ih"], p["w_hh"], p["b"], feed["h0"], feed["c0"], 1.0, lengths)
    for v, r in zip(vals, ref):
        np.testing.assert_allclose(v, r, rtol=1e-10, atol=1e-12)
    # carried unchanged past each length; example 2 (length 0) keeps its initial state
    np.testing.assert_allclose(vals[1][2], feed["h0"][2])
    np.testing.assert_allclose(vals[1][1], vals[0][1, 1])
    np.testing.assert_allclose(vals[0][4, 1], vals[0][1, 1])


def test_lstm_seq_lengths_gradients_vs_masked_torch():
    main, startup, outs, loss, pg, ig = _lstm_program(True, lengths=True)
    exe = rg.Executor()
    exe.run(startup)
    feed = _feed(4)
    lengths = np.array([3, 5, 1], "int64")
    feed["lengths"] = lengths
    vals = exe.run(main, feed=feed, fetch_list=[loss] + [g for _, g in pg] + ig)
    p = {k: torch.tensor(np.asarray(exe.scope.get(f"enc.{k}")), requires_grad=True) for k in ("w_ih", "w_hh", "b")}
    xt = torch.tensor(feed["x"], requires_grad=True)
    h = torch.tensor(feed["h0"], requires_grad=True)
    c = torch.tensor(feed["c0"], requires_grad=True)
    h0t, c0t = h, c
    hs, cs = [], []
    for t in range(T):
        z = xt[t] @ p["w_ih"] + h @ p["w_hh"] + p["b"]
        i, f, g, o = z.split(H, 1)
        c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h2 = torch.sigmoid(o) * torch.tanh(c2)
        live = torch.tensor(t < lengths)[:, None]
        h, c = torch.where(live, h2, h), torch.where(live, c2, c)
        hs.append(h); cs.append(c)
    Hs, Cs = torch.stack(hs), torch.stack(cs)
    wa, wl = torch.tensor(feed["wa"]), torch.tensor(feed["wl"])
    lt = (Hs * wa).sum() + (h * wl).sum() + (Cs * wa * 0.5).sum() + c.sum()
    lt.backward()
    np.testing.assert_allclose(vals[0], lt.item(), rtol=1e-10)
    for (param, _), v in zip(pg, vals[1:4]):
        np.testing.assert_allclose(v, p[param.name.split(".")[1]].grad.numpy(), rtol=1e-9, atol=1e-12)
    for v, ref in zip(vals[4:], (xt, h0t, c0t)):
        np.testing.assert_allclose(v, ref.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_lstm_name_omitted_gives_distinct_params_and_batch_changes():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D])
        a = rg.layers.lstm(x, H)
        b = rg.layers.lstm(a[0], H)
    params = [v for v in startup.global_block().vars.values()]
    names = {v.name for v in params}
    assert len(names) == 6 and all(v.dtype == "float32" for v in params)
    exe = rg.Executor()
    exe.run(startup)
    for t, n in ((4, 3), (2, 7), (6, 1)):
        hv, = exe.run(main, feed={"x": np.ones((t, n, D), "float32")}, fetch_list=[b[1]])
        assert hv.shape == (n, H) and hv.dtype == np.float32


@pytest.mark.parametrize("recompute", ["steps", 2000])
def test_lstm_recompute_identical_gradients(recompute):
    feed = _feed(5, t=12)
    res = []
    for rc in (None, recompute):
        main, startup, outs, loss, pg, ig = _lstm_program(True, recompute=rc)
        exe = rg.Executor()
        exe.run(startup)
        res.append(exe.run(main, feed=feed, fetch_list=list(outs) + [g for _, g in pg] + ig))
    for a, b in zip(*res):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


# --- layers.gru vs torch.nn.GRU -------------------------------------------------------------------

@pytest.mark.parametrize("given_h0", [True, False])
def test_gru_vs_torch(given_h0):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], dtype=F64, stop_gradient=False)
        h0 = rg.data("h0", [-1, H], dtype=F64, stop_gradient=False) if given_h0 else None
        h_all, h_last = rg.layers.gru(x, H, h0=h0, name="g")
        wa = rg.data("wa", [-1, -1, H], dtype=F64)
        loss = rg.sum(h_all * wa) + rg.sum(h_last * h_last)
        pg = rg.append_backward(loss)
        ig = rg.gradients([loss], [x] + ([h0] if given_h0 else []))
    sv = startup.global_block().vars
    for k, s in (("w_ih", (D, 3 * H)), ("w_hh", (H, 3 * H)), ("b_ih", (3 * H,)), ("b_hh", (3 * H,))):
        assert tuple(sv[f"g.{k}"].shape) == s
    exe = rg.Executor()
    exe.run(startup)
    r = _rng(6)
    P = {"w_ih": r.standard_normal((D, 3 * H)) * 0.4, "w_hh": r.standard_normal((H, 3 * H)) * 0.4,
         "b_ih": r.standard_normal(3 * H) * 0.3, "b_hh": r.standard_normal(3 * H) * 0.3}
    for k, v in P.items():
        exe.scope.set(f"g.{k}", v)
    feed = _feed(7, states=False)
    feed.pop("wl")
    if given_h0:
        feed["h0"] = r.standard_normal((N, H))
    vals = exe.run(main, feed=feed, fetch_list=[h_all, h_last, loss] + [g for _, g in pg] + ig)
    mod = torch.nn.GRU(D, H).double()
    with torch.no_grad():
        mod.weight_ih_l0.copy_(torch.tensor(P["w_ih"].T))
        mod.weight_hh_l0.copy_(torch.tensor(P["w_hh"].T))
        mod.bias_ih_l0.copy_(torch.tensor(P["b_ih"]))
        mod.bias_hh_l0.copy_(torch.tensor(P["b_hh"]))
    xt = torch.tensor(feed["x"], requires_grad=True)
    h0t = torch.tensor(feed.get("h0", np.zeros((N, H))), requires_grad=True)
    out, hn = mod(xt, h0t[None])
    lt = (out * torch.tensor(feed["wa"])).sum() + (hn[0] * hn[0]).sum()
    lt.backward()
    np.testing.assert_allclose(vals[0], out.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(vals[1], hn[0].detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(vals[2], lt.item(), rtol=1e-10)
    tg = {"g.w_ih": mod.weight_ih_l0.grad.numpy().T, "g.w_hh": mod.weight_hh_l0.grad.numpy().T,
          "g.b_ih": mod.bias_ih_l0.grad.numpy(), "g.b_hh": mod.bias_hh_l0.grad.numpy()}
    assert {p.name for p, _ in pg} == set(tg)
    for (p, _), v in zip(pg, vals[3:3 + len(pg)]):
        np.testing.assert_allclose(v, tg[p.name], rtol=1e-9, atol=1e-12)
    rest = vals[3 + len(pg):]
    np.testing.assert_allclose(rest[0], xt.grad.numpy(), rtol=1e-9, atol=1e-12)
    if given_h0:
        np.testing.assert_allclose(rest[1], h0t.grad.numpy(), rtol=1e-9, atol=1e-12)


# --- layers.milstm vs NumPy / torch written here -----------------------------------------------------

MI = ("w_ih", "b_ih", "w_hh", "b_hh", "alpha", "beta1", "beta2", "b")


def _mi_params(r):
    return {"w_ih": r.standard_normal((D, 4 * H)) * 0.4, "b_ih": r.standard_normal(4 * H) * 0.2,
            "w_hh": r.standard_normal((H, 4 * H)) * 0.4, "b_hh": r.standard_normal(4 * H) * 0.2,
            "alpha": 1 + r.standard_normal(4 * H) * 0.3, "beta1": 1 + r.standard_normal(4 * H) * 0.3,
            "beta2": 1 + r.standard_normal(4 * H) * 0.3, "b": r.standard_normal(4 * H) * 0.2}


def _mi_cell(lib, P, x, h, c, fb):
    xW = x @ P["w_ih"] + P["b_ih"]
    hU = h @ P["w_hh"] + P["b_hh"]
    gates = P["alpha"] * xW * hU + P["beta1"] * hU + P["beta2"] * xW + P["b"]
    if lib is np:
        i, f, g, o = np.split(gates, 4, axis=1)
        sig, tanh = _sig, np.tanh
    else:
        i, f, g, o = gates.split(H, 1)
        sig, tanh = torch.sigmoid, torch.tanh
    c2 = sig(f + fb) * c + sig(i) * tanh(g)
    return sig(o) * tanh(c2), c2


def test_milstm_vs_reference():
    fb = 0.5
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], dtype=F64, stop_gradient=False)
        h0 = rg.data("h0", [-1, H], dtype=F64, stop_gradient=False)
        c0 = rg.data("c0", [-1, H], dtype=F64, stop_gradient=False)
        outs = rg.layers.milstm(x, H, h0=h0, c0=c0, forget_bias=fb, name="mi")
        wa = rg.data("wa", [-1, -1, H], dtype=F64)
        loss = rg.sum(outs[0] * wa) + rg.sum(outs[3] * outs[1])
        pg = rg.append_backward(loss)
        ig = rg.gradients([loss], [x, h0, c0])
    sv = startup.global_block().vars
    shapes = {"w_ih": (D, 4 * H), "w_hh": (H, 4 * H)}
    for k in MI:
        assert tuple(sv[f"mi.{k}"].shape) == shapes.get(k, (4 * H,)), k
    assert len(outs) == 4
    exe = rg.Executor()
    exe.run(startup)
    P = _mi_params(_rng(8))
    for k, v in P.items():
        exe.scope.set(f"mi.{k}", v)
    feed = _feed(9)
    feed.pop("wl")
    vals = exe.run(main, feed=feed, fetch_list=list(outs) + [loss] + [g for _, g in pg] + ig)
    # forward: NumPy
    h, c, hs, cs = feed["h0"], feed["c0"], [], []
    for t in range(T):
        h, c = _mi_cell(np, P, feed["x"][t], h, c, fb)
        hs.append(h); cs.append(c)
    for v, r in zip(vals[:4], (np.stack(hs), h, np.stack(cs), c)):
        np.testing.assert_allclose(v, r, rtol=1e-10, atol=1e-12)
    # gradients: the same cell in torch
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in P.items()}
    xt, h0t, c0t = (torch.tensor(feed[k], requires_grad=True) for k in ("x", "h0", "c0"))
    h, c, hs = h0t, c0t, []
    for t in range(T):
        h, c = _mi_cell(torch, tp, xt[t], h, c, fb)
        hs.append(h)
    lt = (torch.stack(hs) * torch.tensor(feed["wa"])).sum() + (c * h).sum()
    lt.backward()
    np.testing.assert_allclose(vals[4], lt.item(), rtol=1e-10)
    assert {p.name for p, _ in pg} == {f"mi.{k}" for k in MI}
    for (p, _), v in zip(pg, vals[5:5 + len(pg)]):
        np.testing.assert_allclose(v, tp[p.name[3:]].grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=p.name)
    for v, ref in zip(vals[5 + len(pg):], (xt, h0t, c0t)):
        np.testing.assert_allclose(v, ref.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_milstm_and_gru_take_recompute():
    feed = _feed(10, t=8)
    for layer in (rg.layers.milstm, rg.layers.gru):
        res = []
        for rc in (None, "steps", 3000):
            main, startup = rg.Program(), rg.Program()
            with rg.program_guard(main, startup):
                x = rg.data("x", [-1, -1, D], dtype=F64)
                outs = layer(x, H, name="L", recompute=rc)
                loss = rg.sum(outs[1] * outs[1])
                pg = rg.append_backward(loss)
            exe = rg.Executor()
            exe.run(startup)
            res.append(exe.run(main, feed={"x": feed["x"]}, fetch_list=[loss] + [g for _, g in pg]))
        for other in res[1:]:
            for a, b in zip(res[0], other):
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


# --- rg.recurrent -------------------------------------------------------------------------------------

def _recurrent_program(recompute=None, owg=None, forward_only=False, lengths=False):
    main, startup = rg.Program(), rg.Program()
    r = _rng(12)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], dtype=F64, stop_gradient=False)
        y = rg.data("y", [-1, -1, 2], dtype=F64, stop_gradient=False)
        h0 = rg.data("h0", [-1, H], dtype=F64, stop_gradient=False)
        a0 = rg.data("a0", [-1, 2], dtype=F64, stop_gradient=False)
        w = rg.create_parameter("w", [D, H], dtype=F64, init=r.standard_normal((D, H)) * 0.5)
        u = rg.create_parameter("u", [H, H], dtype=F64, init=r.standard_normal((H, H)) * 0.5)
        v = rg.create_parameter("v", [H, 2], dtype=F64, init=r.standard_normal((H, 2)) * 0.5)
        sl = rg.data("lengths", [-1], dtype="int64") if lengths else None

        def step(xs, states):
            x_t, y_t = xs
            h, acc = states
            h2 = rg.tanh(x_t @ w + h @ u)                 # closure over w, u, v
            return [h2, acc + (h2 @ v) * y_t]

        all_states, last_states = rg.recurrent(step, [x, y], [h0, a0], seq_lengths=sl,
                                               outputs_with_grads=owg, recompute=recompute,
                                               forward_only=forward_only)
        loss = None
        if not forward_only:
            loss = rg.sum(all_states[0] * all_states[0]) + rg.sum(last_states[1] * last_states[1])
            pg = rg.append_backward(loss)
            ig = rg.gradients([loss], [x, y, h0, a0])
        else:
            pg, ig = [], []
    return main, startup, all_states, last_states, loss, pg, ig


def _rec_feed(seed, t=T, n=N):
    r = _rng(seed)
    return {"x": r.standard_normal((t, n, D)), "y": r.standard_normal((t, n, 2)),
            "h0": r.standard_normal((n, H)), "a0": r.standard_normal((n, 2))}


def _torch_recurrent(feed, scope, lengths=None):
    p = {k: torch.tensor(np.asarray(scope.get(k)), requires_grad=True) for k in ("w", "u", "v")}
    t_in = {k: torch.tensor(v, requires_grad=True) for k, v in feed.items() if k != "lengths"}
    h, acc, hs = t_in["h0"], t_in["a0"], []
    for t in range(feed["x"].shape[0]):
        h2 = torch.tanh(t_in["x"][t] @ p["w"] + h @ p["u"])
        acc2 = acc + (h2 @ p["v"]) * t_in["y"][t]
        if lengths is not None:
            live = torch.tensor(t < lengths)[:, None]
            h2, acc2 = torch.where(live, h2, h), torch.where(live, acc2, acc)
        h, acc = h2, acc2
        hs.append(h)
    Hs = torch.stack(hs)
    loss = (Hs * Hs).sum() + (acc * acc).sum()
    loss.backward()
    return Hs, h, acc, loss, p, t_in


@pytest.mark.parametrize("recompute", [None, "steps", 1500])
def test_recurrent_returns_lists_and_matches_torch(recompute):
    main, startup, alls, lasts, loss, pg, ig = _recurrent_program(recompute=recompute)
    assert isinstance(alls, list) and isinstance(lasts, list) and len(alls) == len(lasts) == 2
    exe = rg.Executor()
    exe.run(startup)
    feed = _rec_feed(13)
    vals = exe.run(main, feed=feed, fetch_list=[alls[0], lasts[0], alls[1], lasts[1], loss]
                   + [g for _, g in pg] + ig)
    Hs, h, acc, lt, p, t_in = _torch_recurrent(feed, exe.scope)
    assert np.shape(vals[0]) == (T, N, H) and np.shape(vals[2]) == (T, N, 2)
    np.testing.assert_allclose(vals[0], Hs.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(vals[1], h.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(vals[3], acc.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(vals[4], lt.item(), rtol=1e-10)
    assert [q.name for q, _ in pg] == ["w", "u", "v"]
    for (q, _), v in zip(pg, vals[5:8]):
        np.testing.assert_allclose(v, p[q.name].grad.numpy(), rtol=1e-9, atol=1e-12)
    for v, k in zip(vals[8:], ("x", "y", "h0", "a0")):
        np.testing.assert_allclose(v, t_in[k].grad.numpy(), rtol=1e-9, atol=1e-12)


def test_recurrent_seq_lengths_data_var_and_batch_resizing():
    main, startup, alls, lasts, loss, pg, ig = _recurrent_program(lengths=True)
    exe = rg.Executor()
    exe.run(startup)
    for seed, t, n in ((14, 5, 3), (15, 7, 5), (16, 3, 2)):
        feed = _rec_feed(seed, t, n)
        feed["lengths"] = _rng(seed).integers(0, t + 1, size=n).astype("int64")
        vals = exe.run(main, feed=feed, fetch_list=[lasts[0], lasts[1], loss] + [g for _, g in pg] + ig)
        Hs, h, acc, lt, p, t_in = _torch_recurrent(feed, exe.scope, feed["lengths"])
        np.testing.assert_allclose(vals[0], h.detach().numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(vals[1], acc.detach().numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(vals[2], lt.item(), rtol=1e-10)
        for (q, _), v in zip(pg, vals[3:6]):
            np.testing.assert_allclose(v, p[q.name].grad.numpy(), rtol=1e-9, atol=1e-12)
        for v, k in zip(vals[6:], ("x", "y", "h0", "a0")):
            np.testing.assert_allclose(v, t_in[k].grad.numpy(), rtol=1e-9, atol=1e-12)


def test_recurrent_outputs_with_grads_and_forward_only():
    feed = _rec_feed(17)
    # all outputs used by the loss are listed: same as None
    main, startup, alls, lasts, loss, pg, ig = _recurrent_program(owg=[0, 3])
    exe = rg.Executor()
    exe.run(startup)
    a = exe.run(main, feed=feed, fetch_list=[g for _, g in pg])
    main2, startup2, *_, pg2, _ = _recurrent_program()
    exe2 = rg.Executor()
    exe2.run(startup2)
    b = exe2.run(main2, feed=feed, fetch_list=[g for _, g in pg2])
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-12)
    # listing only the all-steps output of state 0 drops the last_1 term's gradient
    main3, startup3, alls3, lasts3, loss3, pg3, _ = _recurrent_program(owg=[0])
    exe3 = rg.Executor()
    exe3.run(startup3)
    gv = dict((p.name, g) for p, g in pg3)
    if "v" in gv:   # v only reaches the loss through last_1
        vv, = exe3.run(main3, feed=feed, fetch_list=[gv["v"]])
        np.testing.assert_array_equal(vv, np.zeros_like(vv))
    # forward_only: same values
    main4, startup4, alls4, lasts4, *_ = _recurrent_program(forward_only=True)
    exe4 = rg.Executor()
    exe4.run(startup4)
    f4 = exe4.run(main4, feed=feed, fetch_list=[alls4[0], lasts4[1]])
    f1 = exe.run(main, feed=feed, fetch_list=[alls[0], lasts[1]])
    for x, y in zip(f4, f1):
        np.testing.assert_allclose(x, y, rtol=1e-12)


# --- rg.recurrent_net (Caffe2 signature) ------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["vars", "names"])
def test_recurrent_net_caffe2_signature(spelling):
    main, startup = rg.Program(), rg.Program()
    r = _rng(18)
    W, U = r.standard_normal((D, H)) * 0.5, r.standard_normal((H, H)) * 0.5
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], dtype=F64, stop_gradient=False)
        h0 = rg.data("h0", [-1, H], dtype=F64, stop_gradient=False)
        c0 = rg.data("c0", [-1, H], dtype=F64, stop_gradient=False)
        w = rg.create_parameter("w", [D, H], dtype=F64, init=W)
        u = rg.create_parameter("u", [H, H], dtype=F64, init=U)
        cell = main.create_block(main.global_block())
        with rg.block_guard(cell):
            x_t = cell.create_var("x_t", [-1, D], F64)
            h_prev = cell.create_var("h_prev", [-1, H], F64)
            c_prev = cell.create_var("c_prev", [-1, H], F64)
            ts = cell.create_var("timestep", [], "int64")
            c_t = c_prev * 0.5 + rg.tanh(x_t @ w + h_prev @ u)
            h_t = rg.tanh(c_t) * (rg.cast(ts, F64) + 1.0)
        if spelling == "vars":
            outs = rg.recurrent_net(cell, inputs=[(x_t, x)], initial_cell_inputs=[(h_prev, h0), (c_prev, c0)],
                                    links={h_prev: h_t, c_prev: c_t}, timestep=ts,
                                    outputs_with_grads=[0, 1, 2, 3])
        else:
            outs = rg.recurrent_net(cell, inputs=[("x_t", "x")],
                                    initial_cell_inputs=[("h_prev", "h0"), ("c_prev", "c0")],
                                    links={"h_prev": h_t.name, "c_prev": c_t.name}, timestep="timestep",
                                    outputs_with_grads=[0, 1, 2, 3])
        assert isinstance(outs, list) and len(outs) == 4
        h_all, h_last, c_all, c_last = outs
        loss = rg.sum(h_all * h_all) + rg.sum(c_last) + rg.sum(h_last)
        pg = rg.append_backward(loss)
        ig = rg.gradients([loss], [x, h0, c0])
    exe = rg.Executor()
    exe.run(startup)
    feed = {"x": r.standard_normal((T, N, D)), "h0": r.standard_normal((N, H)), "c0": r.standard_normal((N, H))}
    vals = exe.run(main, feed=feed, fetch_list=outs + [loss] + [g for _, g in pg] + ig)
    wt, ut = torch.tensor(W, requires_grad=True), torch.tensor(U, requires_grad=True)
    ti = {k: torch.tensor(v, requires_grad=True) for k, v in feed.items()}
    h, c, hs, cs = ti["h0"], ti["c0"], [], []
    for t in range(T):
        c = c * 0.5 + torch.tanh(ti["x"][t] @ wt + h @ ut)
        h = torch.tanh(c) * (t + 1.0)
        hs.append(h); cs.append(c)
    Hs = torch.stack(hs)
    lt = (Hs * Hs).sum() + c.sum() + h.sum()
    lt.backward()
    for v, ref in zip(vals[:5], (Hs, h, torch.stack(cs), c, lt)):
        np.testing.assert_allclose(v, ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    for v, ref in zip(vals[5:], (wt, ut, ti["x"], ti["h0"], ti["c0"])):
        np.testing.assert_allclose(v, ref.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_recurrent_net_default_outputs_with_grads_loss_on_last():
    """A loss on out_last with outputs_with_grads left at its default still gets its gradient."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], dtype=F64)
        h0 = rg.data("h0", [-1, H], dtype=F64)
        w = rg.create_parameter("w", [D, H], dtype=F64, init=np.full((D, H), 0.1))
        cell = main.create_block()
        with rg.block_guard(cell):
            x_t = cell.create_var("x_t", [-1, D], F64)
            h_prev = cell.create_var("h_prev", [-1, H], F64)
            h_t = rg.tanh(x_t @ w + h_prev)
        h_all, h_last = rg.recurrent_net(cell, inputs=[(x_t, x)], initial_cell_inputs=[(h_prev, h0)],
                                         links={h_prev: h_t})
        loss = rg.sum(h_last)
        (_, gw), = rg.append_backward(loss)
    exe = rg.Executor()
    exe.run(startup)
    xv = _rng(19).standard_normal((T, N, D))
    gv, = exe.run(main, feed={"x": xv, "h0": np.zeros((N, H))}, fetch_list=[gw])
    wt = torch.full((D, H), 0.1, dtype=torch.float64, requires_grad=True)
    h = torch.zeros(N, H, dtype=torch.float64)
    for t in range(T):
        h = torch.tanh(torch.tensor(xv[t]) @ wt + h)
    h.sum().backward()
    np.testing.assert_allclose(gv, wt.grad.numpy(), rtol=1e-10)


def test_recurrent_net_recompute_blobs_on_backward_and_forward_only():
    def build(recompute, forward_only=False):
        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, -1, D], dtype=F64)
            h0 = rg.data("h0", [-1, H], dtype=F64)
            w = rg.create_parameter("w", [D, H], dtype=F64, init=np.full((D, H), 0.1))
            u = rg.create_parameter("u", [H, H], dtype=F64, init=np.eye(H) * 0.5)
            cell = main.create_block()
            with rg.block_guard(cell):
                x_t = cell.create_var("x_t", [-1, D], F64)
                h_prev = cell.create_var("h_prev", [-1, H], F64)
                xw = x_t @ w
                hu = h_prev @ u
                pre = xw + hu
                act = rg.tanh(pre)
                h_t = act * rg.sigmoid(pre)
            # recomputing a value needs its inputs: name the whole chain, as in Caffe2
            outs = rg.recurrent_net(cell, inputs=[(x_t, x)], initial_cell_inputs=[(h_prev, h0)],
                                    links={h_prev: h_t},
                                    recompute_blobs_on_backward=[xw, hu, pre, act] if recompute else None,
                                    forward_only=forward_only)
            loss = rg.sum(outs[0] * outs[0])
            pg = [] if forward_only else rg.append_backward(loss)
        exe = rg.Executor()
        exe.run(startup)
        r = _rng(30)
        vals = exe.run(main, feed={"x": r.standard_normal((40, 8, D)), "h0": r.standard_normal((8, H))},
                       fetch_list=[loss] + [g for _, g in pg])
        return vals, exe.last_stats.peak_bytes
    (a, pa), (b, pb), (c, pc) = build(False), build(True), build(False, forward_only=True)
    for u, v in zip(a, b):
        np.testing.assert_allclose(v, u, rtol=1e-12)
    np.testing.assert_allclose(c[0], a[0], rtol=1e-12)
    assert pb < pa and pc < pa
