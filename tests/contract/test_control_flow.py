"""Contract: cond, while_loop, do -- closures over enclosing variables, gradients vs PyTorch."""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg

RNG = np.random.default_rng(11)
WV = RNG.standard_normal((3, 3)) * 0.5
XV = RNG.standard_normal((2, 3))


def _params():
    w = rg.create_parameter("w", [3, 3], dtype="float64", init=WV)
    return w


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_closure_forward_and_gradients(sign):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], dtype="float64")
        s = rg.data("s", [], dtype="float64")
        w = _params()
        h = x @ w
        out = rg.cond(s > 0.0, lambda: rg.tanh(h) * 2.0, lambda: rg.square(h) - x)
        loss = rg.sum(out * out)
        (p, gw), = rg.append_backward(loss)
        gx, = rg.gradients([loss], [x])
    exe = rg.Executor()
    exe.run(startup)
    lv, gwv, gxv = exe.run(main, feed={"x": XV, "s": np.array(sign)}, fetch_list=[loss, gw, gx])
    wt = torch.tensor(WV, requires_grad=True)
    xt = torch.tensor(XV, requires_grad=True)
    ht = xt @ wt
    ot = torch.tanh(ht) * 2.0 if sign > 0 else ht * ht - xt
    lt = (ot * ot).sum()
    lt.backward()
    np.testing.assert_allclose(lv, lt.item(), rtol=1e-12)
    np.testing.assert_allclose(gwv, wt.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(gxv, xt.grad.numpy(), rtol=1e-10)


def test_cond_tuple_outputs():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [3], dtype="float64")
        a, b = rg.cond(rg.sum(x) > 0.0, lambda: (x * 2.0, x + 1.0), lambda: (x * 3.0, x - 1.0))
    for xv in (np.array([1.0, 2, 3]), np.array([-1.0, -2, 0])):
        av, bv = rg.Executor().run(main, feed={"x": xv}, fetch_list=[a, b])
        if xv.sum() > 0:
            np.testing.assert_allclose(av, xv * 2); np.testing.assert_allclose(bv, xv + 1)
        else:
            np.testing.assert_allclose(av, xv * 3); np.testing.assert_allclose(bv, xv - 1)


def _while_program():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], dtype="float64")
        n = rg.data("n", [], dtype="int64")
        w = _params()                                       # read inside the body: a closure
        i0 = rg.constant(0)
        i, h = rg.while_loop(lambda i, h: i < n, lambda i, h: [i + 1, rg.tanh(h @ w) + x], [i0, x])
        loss = rg.sum(h * h)
        pg = rg.append_backward(loss)
        gx, = rg.gradients([loss], [x])
    return main, startup, i, h, loss, pg, gx


@pytest.mark.parametrize("trips", [0, 1, 3, 7])
def test_while_loop_runtime_trip_count_vs_torch(trips):
    main, startup, i, h, loss, pg, gx = _while_program()
    exe = rg.Executor()
    exe.run(startup)
    iv, lv, gwv, gxv = exe.run(main, feed={"x": XV, "n": np.array(trips, "int64")},
                               fetch_list=[i, loss, pg[0][1], gx])
    assert int(iv) == trips
    wt = torch.tensor(WV, requires_grad=True)
    xt = torch.tensor(XV, requires_grad=True)
    ht = xt
    for _ in range(trips):
        ht = torch.tanh(ht @ wt) + xt
    lt = (ht * ht).sum()
    lt.backward()
    np.testing.assert_allclose(lv, lt.item(), rtol=1e-12)
    ref_gw = wt.grad.numpy() if wt.grad is not None else np.zeros_like(WV)   # 0 trips: w unused
    np.testing.assert_allclose(gwv, ref_gw, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(gxv, xt.grad.numpy(), rtol=1e-10)


def test_while_loop_data_dependent_trip_count_and_nested_cond():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [3], dtype="float64")
        w = rg.create_parameter("w", [3], dtype="float64", init=np.array([0.9, 1.1, 0.7]))

        def body(k, v):
            v2 = rg.cond(rg.sum(v) > 2.0, lambda: v * w, lambda: v * w + 0.5)
            return [k + 1, v2]

        k, v = rg.while_loop(lambda k, v: rg.sum(v) < 6.0, body, [rg.constant(0), x])
        loss = rg.sum(v)
        (_, gw), = rg.append_backward(loss)
    exe = rg.Executor()
    exe.run(startup)
    xv = np.array([0.3, 0.2, 0.4])
    kv, lv, gwv = exe.run(main, feed={"x": xv}, fetch_list=[k, loss, gw])
    wt = torch.tensor([0.9, 1.1, 0.7], dtype=torch.float64, requires_grad=True)
    vt = torch.tensor(xv)
    trips = 0
    while vt.sum().item() < 6.0:
        vt = vt * wt if vt.sum().item() > 2.0 else vt * wt + 0.5
        trips += 1
    vt.sum().backward()
    assert int(kv) == trips and trips > 2
    np.testing.assert_allclose(lv, vt.sum().item(), rtol=1e-12)
    np.testing.assert_allclose(gwv, wt.grad.numpy(), rtol=1e-10)


def test_do_with_inputs_and_closure():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], dtype="float64")
        x.stop_gradient = False
        w = _params()
        y = rg.do(lambda a: rg.tanh(a @ w), x)
        a, b = rg.do(lambda p, q: (p * q, p + q), y, x)
        loss = rg.sum(a) + rg.sum(b * b)
        (_, gw), = rg.append_backward(loss)
        gx, = rg.gradients([loss], [x])
    exe = rg.Executor()
    exe.run(startup)
    lv, gwv, gxv = exe.run(main, feed={"x": XV}, fetch_list=[loss, gw, gx])
    wt = torch.tensor(WV, requires_grad=True)
    xt = torch.tensor(XV, requires_grad=True)
    yt = torch.tanh(xt @ wt)
    lt = (yt * xt).sum() + ((yt + xt) ** 2).sum()
    lt.backward()
    np.testing.assert_allclose(lv, lt.item(), rtol=1e-12)
    np.testing.assert_allclose(gwv, wt.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(gxv, xt.grad.numpy(), rtol=1e-10)


def test_hvp_through_while_loop():
    main, startup = rg.Program(), rg.Program()
    a0 = np.array([0.3, -0.2, 0.5])
    v = np.array([1.0, 0.5, -2.0])
    with rg.program_guard(main, startup):
        w = rg.create_parameter("w", [3], dtype="float64", init=a0)
        vv = rg.data("v", [3], dtype="float64")
        _, h = rg.while_loop(lambda i, h: i < 4, lambda i, h: [i + 1, rg.tanh(h * w + 0.1)],
                             [rg.constant(0), rg.fill([3], 1.0, dtype="float64")])
        f = rg.sum(h * h)
        g, = rg.gradients([f], [w])
        hv, = rg.gradients([rg.sum(g * vv)], [w])
    exe = rg.Executor()
    exe.run(startup)
    hvv, = exe.run(main, feed={"v": v}, fetch_list=[hv])
    wt = torch.tensor(a0, requires_grad=True)
    ht = torch.ones(3, dtype=torch.float64)
    for _ in range(4):
        ht = torch.tanh(ht * wt + 0.1)
    gt, = torch.autograd.grad((ht * ht).sum(), [wt], create_graph=True)
    hvt, = torch.autograd.grad((gt * torch.tensor(v)).sum(), [wt])
    np.testing.assert_allclose(hvv, hvt.numpy(), rtol=1e-9)


def test_builder_functions_are_called_once():
    calls = {"t": 0, "f": 0, "c": 0, "b": 0, "d": 0, "s": 0}

    def count(key, value):
        calls[key] += 1
        return value

    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [2], dtype="float64")
        w = rg.create_parameter("w", [2], dtype="float64", init=np.array([0.5, -0.5]))
        y = rg.cond(rg.sum(x) > 0.0, lambda: count("t", x * w), lambda: count("f", x - w))
        _, z = rg.while_loop(lambda i, v: count("c", i < 5), lambda i, v: count("b", [i + 1, v * w + y]),
                             [rg.constant(0), x])
        u = rg.do(lambda a: count("d", a * 2.0), z)
        seq = rg.data("seq", [-1, -1, 2], dtype="float64")
        alls, lasts = rg.recurrent(lambda xs, hs: count("s", [hs[0] * w + xs[0]]), [seq],
                                   [rg.reshape(u, [1, 2])])
        loss = rg.sum(lasts[0])
        pg = rg.append_backward(loss)
    assert calls == {"t": 1, "f": 1, "c": 1, "b": 1, "d": 1, "s": 1}
    exe = rg.Executor()
    exe.run(startup)
    xv, sv = np.array([1.0, 2.0]), np.ones((3, 1, 2))
    lv, = exe.run(main, feed={"x": xv, "seq": sv}, fetch_list=[loss])
    wv = np.array([0.5, -0.5])
    yv = xv * wv
    v = xv
    for _ in range(5):
        v = v * wv + yv
    h = v * 2.0
    for t in range(3):
        h = h * wv + sv[t, 0]
    np.testing.assert_allclose(lv, h.sum(), rtol=1e-12)
    assert calls == {"t": 1, "f": 1, "c": 1, "b": 1, "d": 1, "s": 1}
