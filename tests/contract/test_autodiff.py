"""Contract: append_backward / gradients / checkpoints / check_gradients, vs PyTorch (float64)."""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg

RNG = np.random.default_rng(7)
W1 = RNG.standard_normal((3, 4))
B1 = RNG.standard_normal(4)
W2 = RNG.standard_normal((4, 2))
XB = RNG.standard_normal((5, 3))


def _mlp():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], dtype="float64")
        w1 = rg.create_parameter("w1", [3, 4], dtype="float64", init=W1)
        b1 = rg.create_parameter("b1", [4], dtype="float64", init=B1)
        w2 = rg.create_parameter("w2", [4, 2], dtype="float64", init=W2)
        h = rg.tanh(x @ w1 + b1)
        y = h @ w2
        loss = rg.mean(y * y) + rg.sum(h) * 0.1   # fan-out of h
    return main, startup, x, (w1, b1, w2), h, y, loss


def _torch_mlp():
    t = {k: torch.tensor(v, requires_grad=True) for k, v in (("w1", W1), ("b1", B1), ("w2", W2))}
    x = torch.tensor(XB, requires_grad=True)
    h = torch.tanh(x @ t["w1"] + t["b1"])
    y = h @ t["w2"]
    loss = (y * y).mean() + h.sum() * 0.1
    return t, x, h, y, loss


def _run(main, startup, fetch):
    exe = rg.Executor()
    exe.run(startup)
    return exe.run(main, feed={"x": XB}, fetch_list=fetch)


def test_append_backward_vs_torch_default_order():
    main, startup, x, params, h, y, loss = _mlp()
    with rg.program_guard(main, startup):
        pg = rg.append_backward(loss)
    assert [p.name for p, _ in pg] == ["w1", "b1", "w2"]
    vals = _run(main, startup, [loss] + [g for _, g in pg])
    t, *_, tl = _torch_mlp()
    tl.backward()
    np.testing.assert_allclose(vals[0], tl.item(), rtol=1e-12)
    for (p, _), v in zip(pg, vals[1:]):
        np.testing.assert_allclose(v, t[p.name].grad.numpy(), rtol=1e-10)


@pytest.mark.parametrize("spelling", ["vars", "names"])
def test_parameter_list_order_and_spellings(spelling):
    main, startup, x, (w1, b1, w2), h, y, loss = _mlp()
    plist = [w2, w1] if spelling == "vars" else ["w2", "w1"]
    with rg.program_guard(main, startup):
        pg = rg.append_backward(loss, parameter_list=plist)
    assert [p.name for p, _ in pg] == ["w2", "w1"]
    assert all(isinstance(p, rg.Var) and isinstance(g, rg.Var) for p, g in pg)
    assert "b1" not in {p.name for p, _ in pg}
    vals = _run(main, startup, [g for _, g in pg])
    t, *_, tl = _torch_mlp()
    tl.backward()
    np.testing.assert_allclose(vals[0], t["w2"].grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(vals[1], t["w1"].grad.numpy(), rtol=1e-10)


@pytest.mark.parametrize("spelling", ["set_names", "set_vars", "list_names", "list_vars"])
def test_no_grad_set_spellings(spelling):
    main, startup, x, (w1, b1, w2), h, y, loss = _mlp()
    ng = {"set_names": {"w1"}, "set_vars": {w1}, "list_names": ["w1"], "list_vars": [w1]}[spelling]
    with rg.program_guard(main, startup):
        pg = rg.append_backward(loss, no_grad_set=ng)
    names = [p.name for p, _ in pg]
    assert "w1" not in names and "w2" in names and "b1" in names
    vals = _run(main, startup, [g for _, g in pg])
    t, *_, tl = _torch_mlp()
    tl.backward()
    for (p, _), v in zip(pg, vals):
        np.testing.assert_allclose(v, t[p.name].grad.numpy(), rtol=1e-10)


def test_no_grad_set_on_intermediate_cuts_path():
    main, startup, x, (w1, b1, w2), h, y, loss = _mlp()
    with rg.program_guard(main, startup):
        pg = rg.append_backward(loss, no_grad_set={h.name})
    names = [p.name for p, _ in pg]
    # w1/b1 only reach the loss through h
    assert names == ["w2"] or dict(pg).get(w1) is None
    vals = _run(main, startup, [dict((p.name, g) for p, g in pg)["w2"]])
    t, *_, tl = _torch_mlp()
    tl.backward()
    np.testing.assert_allclose(vals[0], t["w2"].grad.numpy(), rtol=1e-10)


def test_callbacks_called_with_block_and_context():
    main, startup, x, params, h, y, loss = _mlp()
    seen = []

    def cb(block, context):
        seen.append((block, dict(context)))

    with rg.program_guard(main, startup):
        pg = rg.append_backward(loss, callbacks=[cb])
    assert seen
    blk = main.global_block()
    assert all(b is blk for b, _ in seen)
    # the last context maps each parameter's gradient name to the parameter
    last = seen[-1][1]
    for p, g in pg:
        assert g.name in last
        fwd = last[g.name]
        assert (fwd.name if isinstance(fwd, rg.Var) else fwd) == p.name
    # one call per gradient op appended, each after the forward (the loss's producer)
    cur = [c.get("__current_op__") for _, c in seen]
    assert all(op is not None for op in cur) and len({id(op) for op in cur}) == len(cur)
    loss_pos = max(i for i, op in enumerate(blk.ops) if loss.name in op.outputs)
    pos = [next(i for i, op in enumerate(blk.ops) if op is c) for c in cur]
    assert pos == sorted(pos) and pos[0] > loss_pos
    assert len(cur) >= 10   # tanh, two matmuls, add, mul, mean, sum ... each has a gradient op


def test_gradients_none_for_unreachable_and_data_inputs():
    main, startup, x, (w1, b1, w2), h, y, loss = _mlp()
    with rg.program_guard(main, startup):
        gs = rg.gradients([h], [w2, x, w1])
        gx, = rg.gradients([loss], [x])
    assert isinstance(gs, list) and len(gs) == 3
    assert gs[0] is None
    assert gs[1] is not None and gs[2] is not None
    vals = _run(main, startup, [gs[1], gs[2], gx])
    t, tx, th, ty, tl = _torch_mlp()
    gx_t, = torch.autograd.grad(th.sum(), [tx], retain_graph=True)
    np.testing.assert_allclose(vals[0], gx_t.numpy(), rtol=1e-10)
    gl_t, = torch.autograd.grad(tl, [tx])
    np.testing.assert_allclose(vals[2], gl_t.numpy(), rtol=1e-10)


def test_gradients_target_gradients_vjp_and_twice_after_append_backward():
    main, startup, x, (w1, b1, w2), h, y, loss = _mlp()
    v = RNG.standard_normal((5, 2))
    with rg.program_guard(main, startup):
        pg = rg.append_backward(loss)
        tg = rg.data("tg", [-1, 2], dtype="float64")
        g1, = rg.gradients([y], [w1], target_gradients=[tg])
        g2, = rg.gradients([y], [w1], target_gradients=[tg])
        g3, g4 = rg.gradients([loss], [w1, w2], no_grad_set={"w2"})
    exe = rg.Executor()
    exe.run(startup)
    a, b, c, d = exe.run(main, feed={"x": XB, "tg": v}, fetch_list=[g1, g2, g3, pg[0][1]])
    t, tx, th, ty, tl = _torch_mlp()
    ref, = torch.autograd.grad(ty, [t["w1"]], grad_outputs=torch.tensor(v), retain_graph=True)
    np.testing.assert_allclose(a, ref.numpy(), rtol=1e-10)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(c, d, rtol=1e-12)
    assert g4 is None


def test_hessian_vector_product_by_double_backward():
    main, startup = rg.Program(), rg.Program()
    a0 = RNG.standard_normal(4)
    v = RNG.standard_normal(4)
    with rg.program_guard(main, startup):
        w = rg.create_parameter("w", [4], dtype="float64", init=a0)
        vv = rg.data("v", [4], dtype="float64")
        f = rg.sum(rg.tanh(w) * rg.exp(w * 0.5)) + rg.sum(w * w * w)
        g, = rg.gradients([f], [w])
        hv, = rg.gradients([rg.sum(g * vv)], [w])
    exe = rg.Executor()
    exe.run(startup)
    hvv, = exe.run(main, feed={"v": v}, fetch_list=[hv])
    wt = torch.tensor(a0, requires_grad=True)
    ft = (torch.tanh(wt) * torch.exp(wt * 0.5)).sum() + (wt ** 3).sum()
    gt, = torch.autograd.grad(ft, [wt], create_graph=True)
    hvt, = torch.autograd.grad((gt * torch.tensor(v)).sum(), [wt])
    np.testing.assert_allclose(hvv, hvt.numpy(), rtol=1e-10)


def test_checkpoints_give_identical_gradients():
    def build(ckpt):
        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 16], dtype="float64")
            h = x
            hs = []
            for i in range(6):
                h = rg.layers.fc(h, 16, act="tanh", name=f"l{i}")
                h = rg.dropout(h, 0.2, seed=i)
                hs.append(h)
            loss = rg.mean(h * h)
            pg = rg.append_backward(loss, checkpoints=[hs[1], hs[3]] if ckpt else None)
        exe = rg.Executor()
        exe.run(startup)
        xb = np.random.default_rng(0).standard_normal((8, 16))
        return exe.run(main, feed={"x": xb}, fetch_list=[loss] + [g for _, g in pg]), [p.name for p, _ in pg]

    (plain, n1), (ck, n2) = build(False), build(True)
    assert n1 == n2
    for a, b in zip(plain, ck):
        np.testing.assert_array_equal(a, b)


def test_check_gradients_reports_per_variable():
    rng = np.random.default_rng(2)
    rep = rg.testing.check_gradients(lambda x, w: rg.mean(rg.tanh(x @ w)),
                                     {"x": rng.standard_normal((3, 4)), "w": rng.standard_normal((4, 2))})
    assert set(rep) == {"x", "w"}
    assert all(isinstance(e, float) and 0 <= e < 1e-6 for e in rep.values())   # a relative error


# --- bad input ---------------------------------------------------------------------------------

def _assert_retrograd(exc_info, cls):
    err = exc_info.value
    assert isinstance(err, cls)
    assert type(err) not in (KeyError, AssertionError, IndexError, ValueError, TypeError)


def test_bad_input_errors():
    main, startup, x, (w1, b1, w2), h, y, loss = _mlp()
    with rg.program_guard(main, startup):
        with pytest.raises(rg.ProgramError) as e:
            rg.append_backward(y)                      # non-scalar loss
        _assert_retrograd(e, rg.ProgramError)
        with pytest.raises(rg.ProgramError) as e:
            rg.append_backward(loss, parameter_list=[h])   # not a parameter
        assert h.name in str(e.value)
        with pytest.raises(rg.ProgramError) as e:
            rg.append_backward(loss, parameter_list=["nope"])
        assert "nope" in str(e.value)
    other = rg.Program()
    with rg.program_guard(other, rg.Program()):
        stray = rg.mean(rg.data("z", [3]))
    with rg.program_guard(main, startup):
        with pytest.raises(rg.ProgramError):
            rg.gradients([stray], [w1])


def test_target_gradients_as_arrays():
    main = rg.Program()
    v = RNG.standard_normal((4, 3))
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [4, 3], dtype="float64")
        y = rg.tanh(x) * x
        g, = rg.gradients([y], [x], target_gradients=[v])
        g2, = rg.gradients(rg.sum(y), x, target_gradients=2.0)
    xv = RNG.standard_normal((4, 3))
    a, b = rg.Executor().run(main, feed={"x": xv}, fetch_list=[g, g2])
    d = np.tanh(xv) + xv * (1 - np.tanh(xv) ** 2)
    np.testing.assert_allclose(a, v * d, rtol=1e-12)
    np.testing.assert_allclose(b, 2 * d, rtol=1e-12)


def test_gradient_maker_contract_grad_ops_and_input_grad_names():
    """DESIGN 'Ops': a gradient maker takes the op and its output-gradient names and returns
    (grad_ops, input_grad_names), ordinary ops in the same IR."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [3], dtype="float64")
        w = rg.data("w", [3], dtype="float64")
        y = x * w
        op = main.global_block().ops[-1]
        dy = rg.data("dy", [3], dtype="float64")
        grad_ops, names = rg.ops.make_grad_ops(op, [dy.name])
    assert len(names) == 2 and all(isinstance(n, str) for n in names)
    assert all(isinstance(o, rg.Op) for o in grad_ops) and grad_ops
    for o in grad_ops:
        main.global_block().append_op(o)
    xv, wv, dv = np.array([1.0, 2, 3]), np.array([4.0, 5, 6]), np.array([0.5, -1, 2])
    gx, gw = rg.Executor().run(main, feed={"x": xv, "w": wv, "dy": dv}, fetch_list=names)
    np.testing.assert_allclose(gx, dv * wv)
    np.testing.assert_allclose(gw, dv * xv)
