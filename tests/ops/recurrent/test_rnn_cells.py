"""LSTMUnit, GRUUnit and SeqLinear against PyTorch cells and finite differences.

The torch references are the library's own cells with the projections made
trivial: ``LSTMCell`` with ``W_ih = I``, ``W_hh = 0`` and zero biases turns its
input into the pre-activation gates, so ``cell(gates, (h, c))`` is exactly
``LSTMUnit(gates, c)`` computed by torch. Double backward is checked against
torch's ``create_graph=True`` and against finite differences.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd.ops.recurrent.cells import gru_unit_grad, lstm_unit_grad
from retrograd.testing import check_gradients

N, H = 3, 4


@pytest.fixture(autouse=True)
def _on_every_backend(backend, monkeypatch):
    """Every test here runs on each backend of the ``backend`` fixture: ``rg.Executor()`` in
    this module makes that backend's executor (results come back as NumPy arrays)."""
    monkeypatch.setattr(rg, "Executor", functools.partial(rg.Executor, **backend.kwargs))


def _run(build, feed: dict, dtype: str = "float64"):
    """Build ``build(*vars)`` over data Vars named like ``feed`` and return the fetched outputs."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        vars_ = [rg.data(name, list(a.shape), dtype, stop_gradient=False) for name, a in feed.items()]
        outs = build(*vars_)
    exe = rg.Executor()
    exe.run(startup)
    return [np.asarray(o) for o in exe.run(main, feed=feed, fetch_list=list(outs))]


def _torch_lstm_unit(gates, c_prev, forget_bias):
    cell = torch.nn.LSTMCell(4 * H, H).double()
    with torch.no_grad():
        cell.weight_ih.copy_(torch.eye(4 * H, dtype=torch.float64))
        cell.weight_hh.zero_()
        cell.bias_ih.zero_()
        cell.bias_hh.zero_()
        cell.bias_ih[H:2 * H] = forget_bias
    h_prev = torch.zeros(gates.shape[0], H, dtype=torch.float64)
    return cell(gates, (h_prev, c_prev))


@pytest.mark.parametrize("forget_bias", [0.0, 1.0])
def test_lstm_unit_matches_torch_forward_and_backward(forget_bias):
    r = np.random.default_rng(0)
    gates, c_prev = r.standard_normal((N, 4 * H)) * 2.0, r.standard_normal((N, H))
    dh, dc = r.standard_normal((N, H)), r.standard_normal((N, H))

    def build(g, c, gh, gc):
        h, c2 = rg.lstm_unit(g, c, forget_bias)
        dg, dcp = rg.gradients([h, c2], [g, c], target_gradients=[gh, gc])
        return h, c2, dg, dcp

    h, c, dg, dcp = _run(build, {"g": gates, "c": c_prev, "gh": dh, "gc": dc})
    tg = torch.tensor(gates, requires_grad=True)
    tc = torch.tensor(c_prev, requires_grad=True)
    th, tc2 = _torch_lstm_unit(tg, tc, forget_bias)
    ref_dg, ref_dc = torch.autograd.grad([th, tc2], [tg, tc], [torch.tensor(dh), torch.tensor(dc)])
    np.testing.assert_allclose(h, th.detach().numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(c, tc2.detach().numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(dg, ref_dg.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dcp, ref_dc.numpy(), rtol=1e-10, atol=1e-12)


def test_lstm_unit_gradient_uses_the_fused_kernel():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        g = rg.data("g", [-1, 4 * H], "float64", stop_gradient=False)
        c = rg.data("c", [-1, H], "float64", stop_gradient=False)
        h, c2 = rg.lstm_unit(g, c)
        rg.gradients(rg.sum(h) + rg.sum(c2), [g, c])
    types = [op.type for op in main.global_block().ops]
    assert types.count("LSTMUnitGrad") == 1
    assert not {"Sigmoid", "Tanh"} & set(types)


def test_lstm_unit_double_backward_matches_torch():
    r = np.random.default_rng(1)
    gates, c_prev = r.standard_normal((N, 4 * H)), r.standard_normal((N, H))
    dh, dc = r.standard_normal((N, H)), r.standard_normal((N, H))
    p, q = r.standard_normal((N, 4 * H)), r.standard_normal((N, H))

    def build(g, c, gh, gc):
        h, c2 = rg.lstm_unit(g, c, 0.5)
        dg, dcp = rg.gradients([h, c2], [g, c], target_gradients=[gh, gc])
        second = rg.sum(dg * rg.constant(p, "float64")) + rg.sum(dcp * dcp * rg.constant(q, "float64"))
        return rg.gradients(second, [g, c, gh, gc])

    ours = _run(build, {"g": gates, "c": c_prev, "gh": dh, "gc": dc})
    tens = [torch.tensor(a, requires_grad=True) for a in (gates, c_prev, dh, dc)]
    th, tc2 = _torch_lstm_unit(tens[0], tens[1], 0.5)
    tdg, tdc = torch.autograd.grad([th, tc2], tens[:2], tens[2:], create_graph=True)
    second = (tdg * torch.tensor(p)).sum() + (tdc * tdc * torch.tensor(q)).sum()
    refs = torch.autograd.grad(second, tens)
    for got, ref in zip(ours, refs):
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-9, atol=1e-11)


def test_lstm_unit_gradients_match_finite_differences():
    r = np.random.default_rng(2)
    inputs = {"g": r.standard_normal((N, 4 * H)), "c": r.standard_normal((N, H))}
    check_gradients(lambda g, c: list(rg.lstm_unit(g, c, 0.7)), inputs)
    # only one output on the path: the other output's gradient is absent
    check_gradients(lambda g, c: rg.lstm_unit(g, c)[0], inputs)
    check_gradients(lambda g, c: rg.lstm_unit(g, c)[1], inputs)


def test_lstm_unit_grad_gradients_match_finite_differences():
    r = np.random.default_rng(3)
    inputs = {"acts": r.uniform(0.05, 0.95, (2, 4 * H)), "cp": r.standard_normal((2, H)),
              "c": r.standard_normal((2, H)), "dh": r.standard_normal((2, H)),
              "dc": r.standard_normal((2, H))}
    check_gradients(lambda *xs: lstm_unit_grad(*xs), inputs)
    check_gradients(lambda *xs: lstm_unit_grad(*xs)[0], inputs)
    check_gradients(lambda *xs: lstm_unit_grad(*xs)[1], inputs)


def test_lstm_unit_keeps_the_activations_for_its_gradient():
    r = np.random.default_rng(10)
    gates, c_prev = r.standard_normal((N, 4 * H)), r.standard_normal((N, H))
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        g = rg.data("g", [-1, 4 * H], "float64", stop_gradient=False)
        c = rg.data("c", [-1, H], "float64", stop_gradient=False)
        rg.lstm_unit(g, c, 2.0)
    unit = main.global_block().ops[-1]
    acts_name = unit.outputs[2]
    acts, = rg.Executor().run(main, feed={"g": gates, "c": c_prev}, fetch_list=[acts_name])
    sig = lambda a: 1.0 / (1.0 + np.exp(-a))   # noqa: E731
    i, f, gg, o = np.split(gates, 4, axis=1)
    np.testing.assert_allclose(acts, np.concatenate([sig(i), sig(f + 2.0), np.tanh(gg), sig(o)], axis=1),
                               rtol=1e-12, atol=1e-14)


def _torch_gru(xproj, h_prev, w_hh, b_hh):
    cell = torch.nn.GRUCell(3 * H, H).double()
    params = {"weight_ih": torch.eye(3 * H, dtype=torch.float64), "bias_ih": torch.zeros(3 * H, dtype=torch.float64),
              "weight_hh": w_hh, "bias_hh": b_hh}
    return torch.func.functional_call(cell, params, (xproj, h_prev))


def test_gru_unit_matches_torch_forward_and_backward():
    r = np.random.default_rng(4)
    xproj, h_prev = r.standard_normal((N, 3 * H)), r.standard_normal((N, H))
    w_hh, b_hh = r.standard_normal((H, 3 * H)) * 0.5, r.standard_normal(3 * H)
    dh = r.standard_normal((N, H))

    def build(x, h, w, b, gh):
        out = rg.gru_unit(x, rg.matmul(h, w) + b, h)
        return [out] + rg.gradients(out, [x, h, w, b], target_gradients=gh)

    out, dx, dhp, dw, db = _run(build, {"x": xproj, "h": h_prev, "w": w_hh, "b": b_hh, "gh": dh})
    tx, th, tw, tb = (torch.tensor(a, requires_grad=True) for a in (xproj, h_prev, w_hh.T.copy(), b_hh))
    ref = _torch_gru(tx, th, tw, tb)
    refs = torch.autograd.grad(ref, [tx, th, tw, tb], torch.tensor(dh))
    np.testing.assert_allclose(out, ref.detach().numpy(), rtol=1e-12, atol=1e-13)
    for got, want in zip([dx, dhp, dw.T, db], refs):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-12)


def test_gru_unit_double_backward_matches_torch():
    r = np.random.default_rng(5)
    xproj, h_prev = r.standard_normal((N, 3 * H)), r.standard_normal((N, H))
    w_hh, b_hh = r.standard_normal((H, 3 * H)) * 0.5, r.standard_normal(3 * H)
    dh, p = r.standard_normal((N, H)), r.standard_normal((N, 3 * H))

    def build(x, h, w, gh):
        out = rg.gru_unit(x, rg.matmul(h, w) + rg.constant(b_hh, "float64"), h)
        dx, dhp = rg.gradients(out, [x, h], target_gradients=gh)
        second = rg.sum(dx * rg.constant(p, "float64")) + rg.sum(dhp * dhp)
        return rg.gradients(second, [x, h, w, gh])

    ours = _run(build, {"x": xproj, "h": h_prev, "w": w_hh, "gh": dh})
    tx, th, tw, tgh = (torch.tensor(a, requires_grad=True) for a in (xproj, h_prev, w_hh.T.copy(), dh))
    ref = _torch_gru(tx, th, tw, torch.tensor(b_hh))
    tdx, tdh = torch.autograd.grad(ref, [tx, th], tgh, create_graph=True)
    refs = torch.autograd.grad((tdx * torch.tensor(p)).sum() + (tdh * tdh).sum(), [tx, th, tw, tgh])
    for got, want in zip([ours[0], ours[1], ours[2].T, ours[3]], refs):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-9, atol=1e-11)


def test_gru_unit_and_its_gradient_match_finite_differences():
    r = np.random.default_rng(6)
    inputs = {"x": r.standard_normal((N, 3 * H)), "u": r.standard_normal((N, 3 * H)),
              "h": r.standard_normal((N, H))}
    check_gradients(rg.gru_unit, inputs)
    check_gradients(lambda x, u, h, dh: gru_unit_grad(x, u, h, dh),
                    {**inputs, "dh": r.standard_normal((N, H))})
    check_gradients(lambda x, u, h, dh: gru_unit_grad(x, u, h, dh)[1],
                    {**inputs, "dh": r.standard_normal((N, H))})


def test_cells_keep_float32():
    r = np.random.default_rng(7)
    feed = {"g": r.standard_normal((N, 4 * H)).astype("float32"),
            "c": r.standard_normal((N, H)).astype("float32")}

    def build(g, c):
        h, c2 = rg.lstm_unit(g, c)
        return [h, c2] + rg.gradients(rg.sum(h * c2), [g, c])

    outs = _run(build, feed, dtype="float32")
    assert all(o.dtype == np.float32 for o in outs)
    ref = _run(build, {k: v.astype("float64") for k, v in feed.items()})
    for got, want in zip(outs, ref):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_sigmoids_do_not_overflow_for_large_preactivations():
    gates = np.array([[-800.0, 800.0, 50.0, -50.0]] * 2)
    h, c = _run(lambda g, c: rg.lstm_unit(g, c), {"g": gates, "c": np.ones((2, 1))})
    np.testing.assert_allclose(c, np.ones((2, 1)), atol=1e-15)    # i = 0, f = 1
    np.testing.assert_allclose(h, np.zeros((2, 1)), atol=1e-15)   # o = 0


def test_cell_shape_errors_name_the_op():
    with rg.program_guard(rg.Program(), rg.Program()):
        g = rg.data("g", [-1, 10])
        c = rg.data("c", [-1, 3])
        with pytest.raises(rg.ShapeError, match="LSTMUnit.*12"):
            rg.lstm_unit(g, c)
        with pytest.raises(rg.ShapeError, match="GRUUnit"):
            rg.gru_unit(rg.data("x", [-1, 9]), rg.data("u", [-1, 9]), rg.data("h", [-1, 4]))


def test_seq_linear_is_one_product_over_leading_axes():
    r = np.random.default_rng(8)
    x, w, b = r.standard_normal((5, 3, 4)), r.standard_normal((4, 6)), r.standard_normal(6)
    out, = _run(lambda x, w, b: [rg.seq_linear(x, w, b)], {"x": x, "w": w, "b": b})
    np.testing.assert_allclose(out, x @ w + b, rtol=1e-12)
    check_gradients(lambda x, w, b: rg.seq_linear(x, w, b), {"x": x, "w": w, "b": b})
    check_gradients(lambda x, w: rg.seq_linear(x, w, transpose_w=True),
                    {"x": x, "w": r.standard_normal((6, 4))})


def test_seq_linear_runs_with_unknown_leading_sizes():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1, 4], "float64", stop_gradient=False)
        w = rg.data("w", [4, 2], "float64", stop_gradient=False)
        y = rg.seq_linear(x, w)
        dx, dw = rg.gradients(rg.sum(y * y), [x, w])
    assert y.shape == (-1, -1, 2)
    exe = rg.Executor()
    r = np.random.default_rng(9)
    for shape in [(3, 2, 4), (7, 5, 4)]:
        xv, wv = r.standard_normal(shape), r.standard_normal((4, 2))
        yv, dxv, dwv = exe.run(main, feed={"x": xv, "w": wv}, fetch_list=[y, dx, dw])
        np.testing.assert_allclose(yv, xv @ wv, rtol=1e-12)
        np.testing.assert_allclose(dxv, 2 * (xv @ wv) @ wv.T, rtol=1e-12)
        np.testing.assert_allclose(dwv, 2 * xv.reshape(-1, 4).T @ (xv @ wv).reshape(-1, 2), rtol=1e-12)
