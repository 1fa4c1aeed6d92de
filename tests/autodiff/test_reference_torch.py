"""append_backward and gradients against PyTorch autograd, in float64.

Each test builds the same computation in retrograd and in torch from the same
NumPy arrays and compares every gradient (rtol 1e-9: both are exact formulas).
"""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg

RTOL = 1e-9
ATOL = 1e-12


def t(array, grad=True):
    return torch.tensor(np.asarray(array), dtype=torch.float64, requires_grad=grad)


def close(actual, expected):
    expected = expected.detach().numpy() if isinstance(expected, torch.Tensor) else expected
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=RTOL, atol=ATOL)


def build():
    """A fresh (main, startup) pair; tests build inside ``rg.program_guard(*progs)``."""
    return rg.Program(), rg.Program()


def run(progs, feed, fetch):
    exe = rg.Executor()
    exe.run(progs[1])
    return exe.run(progs[0], feed=feed, fetch_list=fetch)


def param(name, array):
    return rg.create_parameter(name, list(np.shape(array)), dtype="float64", init=np.asarray(array))


R = np.random.default_rng(1234)


def randn(*shape):
    return R.standard_normal(shape)


# --- whole models ---------------------------------------------------------------------------------

def test_mlp_with_fan_out_matches_torch():
    n, d, h, c = 5, 4, 6, 3
    xv, labels = randn(n, d), R.integers(0, c, n)
    init = {"w1": randn(d, h) * 0.5, "b1": randn(h), "w2": randn(h, c) * 0.5, "b2": randn(c),
            "w3": randn(h, h) * 0.3}
    progs = build()
    with rg.program_guard(*progs):
        x = rg.data("x", [-1, d], dtype="float64")
        y = rg.data("y", [-1], dtype="int64")
        p = {k: param(k, v) for k, v in init.items()}
        hid = rg.tanh(x @ p["w1"] + p["b1"])               # hid feeds four consumers
        hid2 = rg.relu(hid @ p["w3"]) + hid                # residual: fan-out and reconvergence
        logits = hid2 @ p["w2"] + p["b2"]
        loss = rg.mean(rg.softmax_cross_entropy(logits, y)) + 0.1 * rg.mean(hid * hid) \
            + rg.sum(rg.sigmoid(hid)) * 0.01
        params_grads = rg.append_backward(loss)
    assert [pv.name for pv, _ in params_grads] == list(init)
    got = run(progs, {"x": xv, "y": labels}, [loss] + [g for _, g in params_grads])

    tp = {k: t(v) for k, v in init.items()}
    thid = torch.tanh(t(xv, False) @ tp["w1"] + tp["b1"])
    thid2 = torch.relu(thid @ tp["w3"]) + thid
    tlogits = thid2 @ tp["w2"] + tp["b2"]
    tloss = torch.nn.functional.cross_entropy(tlogits, torch.tensor(labels)) + 0.1 * (thid * thid).mean() \
        + torch.sigmoid(thid).sum() * 0.01
    tloss.backward()
    close(got[0], tloss)
    for value, name in zip(got[1:], init):
        close(value, tp[name].grad)


def test_broadcasting_gradients_reduce_to_each_shape():
    av, bv, cv, xv = randn(3, 1), randn(4), randn(), randn(2, 3, 4)
    progs = build()
    with rg.program_guard(*progs):
        x = rg.data("x", [-1, 3, 4], dtype="float64")
        a, b, c = param("a", av), param("b", bv), param("c", cv)
        y = (x * a + b) / (1.5 + b * b) - c * x + rg.exp(c) * a
        loss = rg.sum(y * y) + rg.mean(x - a)
        grads = [g for _, g in rg.append_backward(loss)]
    got = run(progs, {"x": xv}, grads)
    ta, tb, tc, tx = t(av), t(bv), t(cv), t(xv, False)
    ty = (tx * ta + tb) / (1.5 + tb * tb) - tc * tx + torch.exp(tc) * ta
    ((ty * ty).sum() + (tx - ta).mean()).backward()
    for value, ref in zip(got, (ta, tb, tc)):
        assert np.shape(value) == tuple(ref.shape)
        close(value, ref.grad)


def test_softmax_cross_entropy_on_3d_logits():
    logits_v, labels = randn(2, 3, 5) * 3.0, R.integers(0, 5, (2, 3))
    progs = build()
    with rg.program_guard(*progs):
        labels_var = rg.data("labels", [2, 3], dtype="int64")
        logits = param("logits", logits_v)
        per_example = rg.softmax_cross_entropy(logits, labels_var)
        loss = rg.sum(per_example * rg.constant(np.arange(6.0).reshape(2, 3), dtype="float64"))
        (_, grad), = rg.append_backward(loss)
    got_loss, got_grad = run(progs, {"labels": labels}, [loss, grad])
    tl = t(logits_v)
    per = torch.nn.functional.cross_entropy(tl.reshape(6, 5), torch.tensor(labels).reshape(6),
                                            reduction="none").reshape(2, 3)
    tloss = (per * torch.arange(6.0, dtype=torch.float64).reshape(2, 3)).sum()
    tloss.backward()
    close(got_loss, tloss)
    close(got_grad, tl.grad)


def test_embedding_gather_with_repeated_ids_accumulates():
    table_v, ids = randn(6, 3), np.array([[1, 2, 1], [5, 1, 0]])
    progs = build()
    with rg.program_guard(*progs):
        ids_var = rg.data("ids", [-1, 3], dtype="int64")
        table = param("emb.w", table_v)
        vecs = rg.gather(table, ids_var)                       # [2, 3, 3]
        loss = rg.sum(rg.tanh(vecs) * rg.sum(vecs, axis=1, keepdims=True))
        (_, grad), = rg.append_backward(loss)
    got, = run(progs, {"ids": ids}, [grad])
    tt = t(table_v)
    tv = torch.nn.functional.embedding(torch.tensor(ids), tt)
    (torch.tanh(tv) * tv.sum(dim=1, keepdim=True)).sum().backward()
    close(got, tt.grad)
    assert np.all(got[3] == 0.0) and np.all(got[4] == 0.0)    # rows never looked up


def test_where_clip_maximum_minimum():
    xv = np.array([[-1.3, -0.2, 0.4, 1.7], [0.9, -0.6, 0.05, -2.0]])
    wv = np.array([0.8, -1.1, 1.9, 0.3])
    progs = build()
    with rg.program_guard(*progs):
        x = rg.data("x", [2, 4], dtype="float64")
        w = param("w", wv)
        xw = x * w
        y = rg.where(x > 0.0, xw, -w) + rg.clip(xw, -0.5, 0.5) + rg.maximum(x, w * 0.5) \
            + rg.minimum(xw, 0.25) + rg.abs(xw)
        loss = rg.sum(y * y)
        (_, grad), = rg.append_backward(loss)
    got, = run(progs, {"x": xv}, [grad])
    tw, tx = t(wv), t(xv, False)
    txw = tx * tw
    ty = torch.where(tx > 0, txw, -tw.expand(2, 4)) + torch.clamp(txw, -0.5, 0.5) \
        + torch.maximum(tx, tw * 0.5) + torch.minimum(txw, torch.tensor(0.25, dtype=torch.float64)) \
        + torch.abs(txw)
    (ty * ty).sum().backward()
    close(got, tw.grad)


def test_maximum_ties_split_the_gradient_like_torch():
    av = np.array([1.0, 2.0, 3.0])
    progs = build()
    with rg.program_guard(*progs):
        a = param("a", av)
        b = param("b", np.array([1.0, 0.0, 3.0]))
        loss = rg.sum(rg.maximum(a, b) * rg.constant([1.0, 2.0, 3.0], dtype="float64"))
        grads = [g for _, g in rg.append_backward(loss)]
    ga, gb = run(progs, {}, grads)
    ta, tb = t(av), t([1.0, 0.0, 3.0])
    (torch.maximum(ta, tb) * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum().backward()
    close(ga, ta.grad)
    close(gb, tb.grad)


def test_dropout_gradient_uses_the_forward_mask():
    xv, wv = randn(4, 6), randn(6)
    progs = build()
    with rg.program_guard(*progs):
        x = rg.data("x", [-1, 6], dtype="float64")
        w = param("w", wv)
        h = rg.dropout(x * w, 0.5, seed=3)
        loss = rg.sum(h * h * 0.5 + h)
        (_, grad), = rg.append_backward(loss)
    dropout_op, = [op for op in progs[0].global_block().ops if op.type == "Dropout"]
    mask_name = dropout_op.outputs[1]
    exe = rg.Executor()
    exe.run(progs[1])
    for _ in range(2):                       # a new mask every run; each run's gradient uses its own
        got_grad, mask = exe.run(progs[0], feed={"x": xv}, fetch_list=[grad, mask_name])
        assert set(np.unique(mask)) <= {0.0, 2.0} and 0 < np.count_nonzero(mask) < mask.size
        tw = t(wv)
        th = t(xv, False) * tw * torch.tensor(mask)
        (th * th * 0.5 + th).sum().backward()
        close(got_grad, tw.grad)


# --- what gets a gradient -----------------------------------------------------------------------------

def _two_layer(progs, xv, w1v, w2v):
    with rg.program_guard(*progs):
        x = rg.data("x", [-1, 3], dtype="float64")
        w1, w2 = param("w1", w1v), param("w2", w2v)
        h1 = rg.tanh(x @ w1)
        out = h1 @ w2
        loss = rg.mean(out * out) + rg.sum(w1 * w1)
    return x, w1, w2, h1, loss


def test_no_grad_set_blocks_names_and_vars():
    xv, w1v, w2v = randn(4, 3), randn(3, 5), randn(5, 2)
    progs = build()
    x, w1, w2, h1, loss = _two_layer(progs, xv, w1v, w2v)
    with rg.program_guard(*progs):
        params_grads = rg.append_backward(loss, no_grad_set={h1.name})
    got = run(progs, {"x": xv}, [g for _, g in params_grads])
    tw1, tw2 = t(w1v), t(w2v)
    th1 = torch.tanh(t(xv, False) @ tw1).detach()
    ((th1 @ tw2).pow(2).mean() + (tw1 * tw1).sum()).backward()
    assert [p.name for p, _ in params_grads] == ["w1", "w2"]
    close(got[0], tw1.grad)            # only the direct w1*w1 term reaches w1
    close(got[1], tw2.grad)

    progs = build()
    x, w1, w2, h1, loss = _two_layer(progs, xv, w1v, w2v)
    with rg.program_guard(*progs):
        params_grads = rg.append_backward(loss, no_grad_set=[w2])
    assert [p.name for p, _ in params_grads] == ["w1"]


def test_parameter_list_by_name_and_var_in_given_order():
    xv, w1v, w2v = randn(4, 3), randn(3, 5), randn(5, 2)
    for chosen in (["w2", "w1"], "vars"):
        progs = build()
        x, w1, w2, h1, loss = _two_layer(progs, xv, w1v, w2v)
        with rg.program_guard(*progs):
            params_grads = rg.append_backward(loss, parameter_list=[w2, w1] if chosen == "vars" else chosen)
        assert [p.name for p, _ in params_grads] == ["w2", "w1"]
        assert params_grads[0][0] is w2 and params_grads[1][0] is w1
        got = run(progs, {"x": xv}, [g for _, g in params_grads])
        tw1, tw2 = t(w1v), t(w2v)
        ((torch.tanh(t(xv, False) @ tw1) @ tw2).pow(2).mean() + (tw1 * tw1).sum()).backward()
        close(got[0], tw2.grad)
        close(got[1], tw1.grad)

    progs = build()
    x, w1, w2, h1, loss = _two_layer(progs, xv, w1v, w2v)
    with rg.program_guard(*progs):
        only = rg.append_backward(loss, parameter_list=["w2"])
    assert [p.name for p, _ in only] == ["w2"]
    assert not any(op.outputs and "w1" in op.inputs and op.type == "MatMul" and op.attrs.get("transpose_x")
                   for op in progs[0].global_block().ops), "no gradient op should compute dw1"


def test_stop_gradient_op_and_flag():
    xv, w1v, w2v = randn(4, 3), randn(3, 5), randn(5, 2)
    progs = build()
    with rg.program_guard(*progs):
        x = rg.data("x", [-1, 3], dtype="float64")
        w1, w2 = param("w1", w1v), param("w2", w2v)
        h = rg.tanh(x @ w1)
        frozen = rg.stop_gradient(h)
        loss = rg.sum((frozen @ w2) * (h @ w2))      # h reaches the loss both frozen and not
        grads = [g for _, g in rg.append_backward(loss)]
    got = run(progs, {"x": xv}, grads)
    tw1, tw2 = t(w1v), t(w2v)
    th = torch.tanh(t(xv, False) @ tw1)
    ((th.detach() @ tw2) * (th @ tw2)).sum().backward()
    close(got[0], tw1.grad)
    close(got[1], tw2.grad)

    progs = build()
    with rg.program_guard(*progs):
        x = rg.data("x", [-1, 3], dtype="float64")
        w1, w2 = param("w1", w1v), param("w2", w2v)
        h = rg.tanh(x @ w1)
        h.stop_gradient = True
        loss = rg.sum(h @ w2)
        params_grads = rg.append_backward(loss)
    assert [p.name for p, _ in params_grads] == ["w2"]


# --- gradients(): VJPs, HVPs, data vars, repeated use ---------------------------------------------------

def test_vector_jacobian_product_with_target_gradients():
    xv, wv, v1, v2 = randn(3, 4), randn(4, 2), randn(3, 2), randn(3, 4)
    progs = build()
    with rg.program_guard(*progs):
        x = rg.data("x", [-1, 4], dtype="float64")
        w = param("w", wv)
        y1 = rg.sigmoid(x @ w)
        y2 = rg.exp(x) * rg.sum(w)
        s1 = rg.data("s1", [-1, 2], dtype="float64")
        s2 = rg.data("s2", [-1, 4], dtype="float64")
        gx, gw = rg.gradients([y1, y2], [x, w], target_gradients=[s1, s2])
    got = run(progs, {"x": xv, "s1": v1, "s2": v2}, [gx, gw])
    tx, tw = t(xv), t(wv)
    ty1, ty2 = torch.sigmoid(tx @ tw), torch.exp(tx) * tw.sum()
    ref = torch.autograd.grad([ty1, ty2], [tx, tw], grad_outputs=[torch.tensor(v1), torch.tensor(v2)])
    close(got[0], ref[0])
    close(got[1], ref[1])


def test_non_scalar_target_without_target_gradients_is_seeded_with_ones():
    xv = randn(2, 3)
    progs = build()
    with rg.program_guard(*progs):
        x = rg.data("x", [2, 3], dtype="float64")
        gx, = rg.gradients(rg.tanh(x) * x, x)
    got, = run(progs, {"x": xv}, [gx])
    tx = t(xv)
    close(got, torch.autograd.grad((torch.tanh(tx) * tx).sum(), tx)[0])


def test_hessian_vector_product_by_double_backward():
    xv, w1v, w2v, vv = randn(5, 3), randn(3, 4), randn(4, 2), randn(3, 4)
    progs = build()
    with rg.program_guard(*progs):
        x = rg.data("x", [-1, 3], dtype="float64")
        w1, w2 = param("w1", w1v), param("w2", w2v)
        logits = rg.tanh(x @ w1) @ w2
        loss = rg.mean(rg.log_softmax(logits) * rg.softmax(logits)) + rg.sum(rg.pow(w1, 4.0))
        (_, g1), _ = rg.append_backward(loss)
        v = rg.data("v", [3, 4], dtype="float64")
        hv, hv2 = rg.gradients(g1, [w1, w2], target_gradients=v)     # H v, both blocks of rows
        hv_again, = rg.gradients(rg.sum(g1 * v), w1)                   # the same product, other way
    got = run(progs, {"x": xv, "v": vv}, [hv, hv2, hv_again])
    tw1, tw2 = t(w1v), t(w2v)
    tlogits = torch.tanh(t(xv, False) @ tw1) @ tw2
    tloss = (torch.log_softmax(tlogits, -1) * torch.softmax(tlogits, -1)).mean() + tw1.pow(4).sum()
    tg1, = torch.autograd.grad(tloss, tw1, create_graph=True)
    ref = torch.autograd.grad(tg1, [tw1, tw2], grad_outputs=torch.tensor(vv))
    close(got[0], ref[0])
    close(got[1], ref[1])
    close(got[2], ref[0])


def test_gradients_answer_for_data_vars_and_none_when_unreachable():
    xv, zv, wv = randn(3, 4), randn(3, 4), randn(4)
    progs = build()
    with rg.program_guard(*progs):
        x = rg.data("x", [-1, 4], dtype="float64")
        z = rg.data("z", [-1, 4], dtype="float64")          # not used by the loss
        ids = rg.data("ids", [3], dtype="int64")
        w = param("w", wv)
        assert x.stop_gradient                            # data vars default to stop_gradient
        loss = rg.sum(rg.square(x * w) + rg.gather(x, ids))
        params_grads = rg.append_backward(loss)
        gx, gz, gids, gw = rg.gradients(loss, [x, z, ids, w])
    assert gz is None and gids is None
    assert [p.name for p, _ in params_grads] == ["w"]    # x gets no gradient op from append_backward
    got = run(progs, {"x": xv, "ids": np.array([0, 2, 2])}, [gx, gw, params_grads[0][1]])
    tx, tw = t(xv), t(wv)
    ((tx * tw).pow(2) + tx[torch.tensor([0, 2, 2])]).sum().backward()
    close(got[0], tx.grad)
    close(got[1], tw.grad)
    close(got[2], tw.grad)


def test_gradients_after_append_backward_and_twice_have_distinct_names():
    xv, wv = randn(3, 2), randn(2, 2)
    progs = build()
    with rg.program_guard(*progs):
        x = rg.data("x", [-1, 2], dtype="float64")
        w = param("w", wv)
        loss = rg.sum(rg.tanh(x @ w) * rg.sigmoid(x @ w))
        (_, g0), = rg.append_backward(loss)
        g1, gx1 = rg.gradients(loss, [w, x])
        g2, gx2 = rg.gradients([loss], [w, x])
    names = [v.name for v in (g0, g1, g2, gx1, gx2)]
    assert len(set(names)) == 5, names
    block = progs[0].global_block()
    for var in (g0, g1, g2, gx1, gx2):
        assert block.vars[var.name] is var
    written = [n for op in block.ops for n in op.outputs]
    assert len(written) == len(set(written)), "a name is written twice"
    got = run(progs, {"x": xv}, [g0, g1, g2, gx1, gx2])
    tw, tx = t(wv), t(xv)
    (torch.tanh(tx @ tw) * torch.sigmoid(tx @ tw)).sum().backward()
    for value in got[:3]:
        close(value, tw.grad)
    for value in got[3:]:
        close(value, tx.grad)


def test_gradient_names_are_readable():
    progs = build()
    with rg.program_guard(*progs):
        x = rg.data("x", [-1, 2], dtype="float64")
        w, b = param("fc.w", randn(2, 3)), param("fc.b", randn(3))
        loss = rg.mean(rg.tanh(x @ w + b))
        params_grads = rg.append_backward(loss)
        gx, = rg.gradients(loss, x)
    assert [g.name for _, g in params_grads] == ["fc.w.grad", "fc.b.grad"]
    assert gx.name == "x.grad"


# --- callbacks -----------------------------------------------------------------------------------------

def test_callbacks_called_once_per_grad_op_with_block_and_context():
    calls = []

    def callback(block, context):
        op = context["__current_op__"]
        assert block.ops[-1] is op, "called right after the op is appended"
        calls.append((block, op, dict(context)))

    progs = build()
    with rg.program_guard(*progs):
        x = rg.data("x", [-1, 3], dtype="float64")
        w1, w2 = param("w1", randn(3, 4)), param("w2", randn(4, 1))
        h = rg.tanh(x @ w1)
        loss = rg.mean(h @ w2) + rg.mean(h * h)
        block = progs[0].global_block()
        last_forward = block.ops[-1]
        params_grads = rg.append_backward(loss, callbacks=[callback])
    # The backward follows the forward's last op (shape stand-ins may be inserted within the forward).
    appended = block.ops[next(i for i, op in enumerate(block.ops) if op is last_forward) + 1:]
    called_ops = [op for _, op, _ in calls]
    assert all(b is block for b, _, _ in calls)
    assert len(called_ops) == len({id(op) for op in called_ops}), "an op reported twice"
    # Every op append_backward wrote except the loss's seed is reported, in order.
    assert called_ops == appended[1:]
    for param_var, grad in params_grads:
        producer = next(i for i, (_, op, _) in enumerate(calls) if grad.name in op.outputs)
        context = calls[producer][2]
        assert context[grad.name] is param_var, "context maps gradient names to forward Vars"
    h_grads = [name for _, _, ctx in calls for name, var in ctx.items() if var is h]
    assert h_grads, "the gradient of the fan-out var h is in the context"


def test_gradient_penalty_through_append_backward():
    """append_backward over a loss that contains a gradient (WGAN-GP style penalty)."""
    xv, wv = randn(4, 3), randn(3, 2)
    progs = build()
    with rg.program_guard(*progs):
        x = rg.data("x", [-1, 3], dtype="float64")
        w = param("w", wv)
        out = rg.sigmoid(x @ w)
        gx, = rg.gradients(rg.sum(out), x)                       # d out / d x, per example
        penalty = rg.mean(rg.square(rg.sqrt(rg.sum(gx * gx, axis=1) + 1e-3) - 1.0))
        loss = rg.reshape(rg.mean(out) + penalty, [1])          # a [1]-shaped loss is fine too
        (_, grad), = rg.append_backward(loss)
    got_loss, got = run(progs, {"x": xv}, [loss, grad])
    tw, tx = t(wv), t(xv)
    tout = torch.sigmoid(tx @ tw)
    tgx, = torch.autograd.grad(tout.sum(), tx, create_graph=True)
    tloss = tout.mean() + ((tgx.pow(2).sum(1) + 1e-3).sqrt() - 1.0).pow(2).mean()
    tloss.backward()
    close(got_loss, tloss.reshape(1))
    close(got, tw.grad)


def test_callbacks_may_append_ops_that_later_gradient_ops_see():
    """A Paddle-style error-clip callback: clip each gradient of h in place as it appears."""
    from retrograd.ops.core.registry import append_op
    xv, w1v, w2v = randn(4, 3), randn(3, 5), randn(5, 2) * 3.0

    def clip_grads_of(target):
        def callback(block, context):
            op = context["__current_op__"]
            for name in op.outputs:
                if context.get(name) is target and name not in done:
                    done.add(name)
                    append_op("Clip", [block.var(name)], {"lo": -0.05, "hi": 0.05},
                              outputs=[block.var(name)], block=block)
        done = set()
        return callback

    progs = build()
    with rg.program_guard(*progs):
        x = rg.data("x", [-1, 3], dtype="float64")
        w1, w2 = param("w1", w1v), param("w2", w2v)
        h = rg.tanh(x @ w1)
        loss = rg.sum(rg.square(h @ w2))
        params_grads = rg.append_backward(loss, callbacks=[clip_grads_of(h)])
    got = run(progs, {"x": xv}, [g for _, g in params_grads])
    tw1, tw2 = t(w1v), t(w2v)
    th = torch.tanh(t(xv, False) @ tw1)
    th.register_hook(lambda grad: grad.clamp(-0.05, 0.05))
    ((th @ tw2) ** 2).sum().backward()
    close(got[0], tw1.grad)
    close(got[1], tw2.grad)


def test_untrainable_parameters_and_gradients_no_grad_set():
    xv, w1v, w2v = randn(4, 3), randn(3, 5), randn(5, 2)
    progs = build()
    with rg.program_guard(*progs):
        x = rg.data("x", [-1, 3], dtype="float64")
        w1 = param("w1", w1v)
        w2 = rg.create_parameter("w2", [5, 2], dtype="float64", init=w2v, trainable=False)
        h = rg.sigmoid(x @ w1)
        loss = rg.sum((h @ w2) * (h @ w2))
        params_grads = rg.append_backward(loss)
        g1, g2 = rg.gradients(loss, [w1, w2], no_grad_set=[h.name])
    assert [p.name for p, _ in params_grads] == ["w1"]
    assert g1 is None                                  # its only path runs through h
    got = run(progs, {"x": xv}, [params_grads[0][1], g2])
    tw1, tw2 = t(w1v), t(w2v)
    th = torch.sigmoid(t(xv, False) @ tw1)
    ((th @ tw2) ** 2).sum().backward()
    close(got[0], tw1.grad)
    tw2.grad = None
    ((th.detach() @ tw2) ** 2).sum().backward()
    close(got[1], tw2.grad)


def test_targets_that_feed_each_other():
    """Regression: a target read by an op on the path of another target (the counts of
    expected contributions were once built from the target -> seed dict)."""
    xv = randn(3, 2)
    progs = build()
    with rg.program_guard(*progs):
        x = rg.data("x", [3, 2], dtype="float64")
        h = rg.tanh(x)
        loss = rg.sum(h * h)
        gx, = rg.gradients([h, loss, h], x)
    assert "Add" not in {op.type for op in progs[0].global_block().ops}, "a stray op was built"
    got, = run(progs, {"x": xv}, [gx])
    tx = t(xv)
    th = torch.tanh(tx)
    ones = torch.ones_like(th)
    ref, = torch.autograd.grad([th, (th * th).sum(), th], tx, grad_outputs=[ones, None, ones])
    close(got, ref)
