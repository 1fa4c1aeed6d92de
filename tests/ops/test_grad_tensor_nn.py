"""Gradients of the tensor and NN ops beyond the per-op table (test_gradients_table.py):

* programs declared with -1 dimensions, differentiated once and run at
  several sizes (the gradient helpers take sizes from run-time shapes);
* double and triple backward of softmax, log_softmax and cross-entropy with
  unknown batch sizes;
* what must *not* get a gradient (stop_gradient, labels, int casts) and
  dropout's use of the forward mask;
* fc / embedding / cross-entropy against PyTorch.
"""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg

RNG = np.random.default_rng(0)


def _numeric(exe, main, objective, feed, name, eps=1e-6):
    base = feed[name]
    grad = np.zeros(base.shape)
    for i in np.ndindex(base.shape):
        values = []
        for step in (eps, -eps):
            moved = base.copy()
            moved[i] += step
            out, = exe.run(main, feed={**feed, name: moved}, fetch_list=[objective])
            values.append(float(out))
        grad[i] = (values[0] - values[1]) / (2 * eps)
    return grad


def check_at_sizes(fn, declared: dict, feeds: list[dict], rtol=1e-5, atol=1e-7):
    """Build ``fn`` once over Vars declared with -1 dims; at every feed compare the
    gradient of ``sum(out * p)`` (p random, fed) with central differences, in float64."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        vars_ = {n: rg.data(n, shape, dtype, stop_gradient=False) for n, (shape, dtype) in declared.items()}
        out = fn(**vars_)
        proj = rg.data("proj", out.shape, out.dtype)
        objective = rg.sum(out * proj)
        wrt = [v for v in vars_.values() if v.dtype == "float64"]
        grads = rg.gradients(objective, wrt)
    assert all(g is not None for g in grads)
    exe = rg.Executor()
    for feed in feeds:
        out_value, = exe.run(main, feed=feed, fetch_list=[out])
        feed = {**feed, "proj": RNG.standard_normal(np.shape(out_value))}
        analytic = exe.run(main, feed=feed, fetch_list=grads)
        for var, a in zip(wrt, analytic):
            assert a.shape == feed[var.name].shape
            np.testing.assert_allclose(a, _numeric(exe, main, objective, feed, var.name),
                                       rtol=rtol, atol=atol, err_msg=var.name)


F = "float64"

DYNAMIC = {
    "reshape": (lambda x: rg.tanh(rg.reshape(x, [-1, 2])), {"x": ([-1, 4], F)},
                [{"x": RNG.standard_normal((n, 4))} for n in (1, 3)]),
    "transpose+reshape": (lambda x: rg.reshape(rg.transpose(x, [1, 0, 2]), [3, -1]) ** 2.0,
                          {"x": ([-1, 3, 2], F)}, [{"x": RNG.standard_normal((n, 3, 2))} for n in (2, 4)]),
    "concat": (lambda x, y: rg.concat([x, y * y, x], axis=0), {"x": ([-1, 2], F), "y": ([-1, 2], F)},
               [{"x": RNG.standard_normal((a, 2)), "y": RNG.standard_normal((b, 2))} for a, b in ((1, 3), (4, 2))]),
    "split, one piece unused": (lambda x: rg.split(x, [2, -1], axis=0)[1] * 3.0, {"x": ([-1, 3], F)},
                                [{"x": RNG.standard_normal((n, 3))} for n in (3, 5)]),
    "split both used": (lambda x: rg.add_n([p * p for p in rg.split(x, 2, axis=1)]), {"x": ([-1, -1], F)},
                        [{"x": RNG.standard_normal((n, 2 * n))} for n in (1, 2)]),
    "slice": (lambda x: rg.exp(rg.slice(x, [0, 1], [-3, 1], [2**31, -1])), {"x": ([-1, 4], F)},
              [{"x": RNG.standard_normal((n, 4))} for n in (2, 5)]),
    "gather repeated ids": (lambda x, ids: rg.gather(x, ids) ** 2.0, {"x": ([-1, 3], F), "ids": ([-1, -1], "int64")},
                            [{"x": RNG.standard_normal((4, 3)), "ids": np.array([[0, 3, 0], [3, 3, 1]])},
                             {"x": RNG.standard_normal((2, 3)), "ids": np.array([[1], [1]])}]),
    "squeeze/unsqueeze": (lambda x: rg.squeeze(rg.unsqueeze(rg.tanh(x), [0, -1]), [0]), {"x": ([-1], F)},
                          [{"x": RNG.standard_normal(n)} for n in (2, 3)]),
    "softmax": (lambda x: rg.softmax(x * 2.0, axis=0), {"x": ([-1, 3], F)},
                [{"x": RNG.standard_normal((n, 3))} for n in (2, 4)]),
    "log_softmax": (lambda x: rg.log_softmax(x), {"x": ([-1, -1], F)},
                    [{"x": RNG.standard_normal(s)} for s in ((2, 3), (3, 5))]),
    "cross-entropy": (lambda x, labels: rg.softmax_cross_entropy(x * 5.0, labels),
                      {"x": ([-1, 4], F), "labels": ([-1], "int64")},
                      [{"x": RNG.standard_normal((n, 4)), "labels": RNG.integers(0, 4, n)} for n in (1, 3)]),
}


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_gradient_with_unknown_sizes_matches_finite_differences(name):
    fn, declared, feeds = DYNAMIC[name]
    check_at_sizes(fn, declared, feeds)


def test_cast_between_floats_casts_the_gradient_back():
    # (finite differences through float32 are too coarse; the gradient is exact here)
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1], F, stop_gradient=False)
        y = rg.cast(rg.cast(x, "float32") * 2.0, "float64")
        dx, = rg.gradients(rg.sum(y * y), [x])
    assert dx.dtype == F
    xv = np.array([0.5, -1.25, 3.0])
    got, = rg.Executor().run(main, feed={"x": xv}, fetch_list=[dx])
    assert got.dtype == F
    np.testing.assert_allclose(got, 8.0 * xv, rtol=1e-7)


def _first_gradient(fn):
    """``x -> d/dx sum(fn(x) * q)``: differentiating it is double backward."""
    def grad(x, q):
        return rg.gradients(rg.sum(fn(x) * q), [x])[0]
    return grad


def _second_gradient(fn):
    def grad(x, q, r):
        first = _first_gradient(fn)(x, q)
        return rg.gradients(rg.sum(first * r), [x])[0]
    return grad


HIGHER = {
    "softmax": lambda x: rg.softmax(x),
    "softmax axis 0": lambda x: rg.softmax(x, axis=0),
    "log_softmax": lambda x: rg.log_softmax(x),
    "cross-entropy": lambda x: rg.unsqueeze(rg.softmax_cross_entropy(x, rg.fill_like(rg.sum(x, 1), 1, "int64")), 1),
}


@pytest.mark.parametrize("name", sorted(HIGHER))
def test_double_backward_with_unknown_batch(name):
    feeds = [{"x": RNG.standard_normal((n, 3)), "q": RNG.standard_normal((n, 3) if name != "cross-entropy"
                                                                          else (n, 1))} for n in (2, 3)]
    q_shape = [-1, 3] if name != "cross-entropy" else [-1, 1]
    check_at_sizes(_first_gradient(HIGHER[name]), {"x": ([-1, 3], F), "q": (q_shape, F)}, feeds)


@pytest.mark.parametrize("name", sorted(HIGHER))
def test_triple_backward(name):
    q_shape = (2, 3) if name != "cross-entropy" else (2, 1)
    feeds = [{"x": RNG.standard_normal((2, 3)), "q": RNG.standard_normal(q_shape),
              "r": RNG.standard_normal((2, 3))}]
    check_at_sizes(_second_gradient(HIGHER[name]),
                   {"x": ([-1, 3], F), "q": ([-1, q_shape[1]], F), "r": ([-1, 3], F)}, feeds, rtol=1e-4, atol=1e-6)


def test_cross_entropy_gradient_is_stable_for_huge_logits():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        logits = rg.data("logits", [-1, 3], stop_gradient=False)
        labels = rg.data("labels", [-1], "int64")
        loss = rg.sum(rg.softmax_cross_entropy(logits, labels))
        grad, = rg.gradients(loss, [logits])
    x = np.array([[1000.0, 0.0, -1000.0], [0.0, 0.0, 0.0]], "float32")
    got_loss, got = rg.Executor().run(main, feed={"logits": x, "labels": np.array([1, 2])}, fetch_list=[loss, grad])
    np.testing.assert_allclose(got_loss, 1000.0 + np.log(3.0), rtol=1e-6)
    np.testing.assert_allclose(got, [[1.0, -1.0, 0.0], [1 / 3, 1 / 3, -2 / 3]], rtol=1e-6, atol=1e-7)


# --- What gets no gradient ------------------------------------------------------------------------

def test_stop_gradient_blocks_its_path_only():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1], stop_gradient=False)
        frozen = rg.stop_gradient(x * 3.0)
        assert frozen.stop_gradient
        only_frozen, = rg.gradients(rg.sum(frozen * frozen), [x])
        both, = rg.gradients(rg.sum(frozen * x), [x])
    assert only_frozen is None
    xv = np.array([1.0, -2.0], "float32")
    got, = rg.Executor().run(main, feed={"x": xv}, fetch_list=[both])
    np.testing.assert_allclose(got, 3.0 * xv)           # d/dx (c * x) with c = 3x held constant


def test_labels_and_integer_casts_get_no_gradient():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, 3], stop_gradient=False)
        labels = rg.data("labels", [-1], "int64", stop_gradient=False)
        loss = rg.sum(rg.softmax_cross_entropy(x, labels)) + rg.sum(rg.cast(rg.cast(x, "int64"), "float32"))
        g_labels, = rg.gradients(loss, [labels])
        g_x, = rg.gradients(rg.sum(rg.cast(rg.cast(x, "int64"), "float32")), [x])
    assert g_labels is None and g_x is None


def test_dropout_gradient_uses_the_forward_mask():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, 50], stop_gradient=False)
        y = rg.dropout(x, 0.3)
        mask = main.global_block().ops[-1].outputs[1]
        dx, = rg.gradients(rg.sum(y * 2.0), [x])
    exe = rg.Executor()
    for n in (4, 7):
        out, m, g = exe.run(main, feed={"x": np.ones((n, 50), "float32")}, fetch_list=[y, mask, dx])
        np.testing.assert_array_equal(out, m)
        np.testing.assert_allclose(g, 2.0 * m)


# --- Against PyTorch --------------------------------------------------------------------------------

def test_embedding_fc_cross_entropy_gradients_match_torch():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, -1], "int64")
        labels = rg.data("labels", [-1, -1], "int64")
        h = rg.layers.fc(rg.layers.embedding(ids, 6, 4, name="emb"), 5, act="tanh", name="hid")
        logits = rg.layers.fc(rg.concat([h, rg.log_softmax(h)], axis=-1), 3, name="out")
        loss = rg.mean(rg.softmax_cross_entropy(logits, labels))
        params_grads = rg.append_backward(loss)
    exe = rg.Executor()
    exe.run(startup)
    ids_v, labels_v = RNG.integers(0, 6, (3, 2)), RNG.integers(0, 3, (3, 2))
    got = exe.run(main, feed={"ids": ids_v, "labels": labels_v}, fetch_list=[loss] + [g for _, g in params_grads])

    t = {p.name: torch.tensor(np.asarray(exe.scope.get(p.name)), requires_grad=True) for p, _ in params_grads}
    th = torch.tanh(t["emb.w"][torch.tensor(ids_v)] @ t["hid.w"] + t["hid.b"])
    tlogits = torch.cat([th, torch.log_softmax(th, -1)], -1) @ t["out.w"] + t["out.b"]
    tloss = torch.nn.functional.cross_entropy(tlogits.reshape(-1, 3), torch.tensor(labels_v).reshape(-1))
    tloss.backward()
    np.testing.assert_allclose(got[0], tloss.item(), rtol=1e-5)
    for (p, _), g in zip(params_grads, got[1:]):
        np.testing.assert_allclose(g, t[p.name].grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=p.name)


def test_dropout_recomputed_from_a_checkpoint_gives_identical_gradients():
    def build(checkpoints):
        main, startup = rg.Program(random_seed=1), rg.Program(random_seed=1)
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 8])
            kept = rg.dropout(rg.layers.fc(x, 16, act="tanh", name="a"), 0.5)
            h = rg.layers.fc(rg.dropout(rg.tanh(kept), 0.3), 16, act="tanh", name="b")
            loss = rg.mean(h * h)
            params_grads = rg.append_backward(loss, checkpoints=[kept] if checkpoints else None)
        exe = rg.Executor()
        exe.run(startup)
        return main, exe, [loss] + [g for _, g in params_grads]

    xb = RNG.standard_normal((4, 8)).astype("float32")
    plain_main, plain_exe, plain_fetch = build(False)
    ck_main, ck_exe, ck_fetch = build(True)
    assert sum(op.type == "Dropout" for op in ck_main.global_block().ops) == 3   # one replayed
    for _ in range(2):      # and again in a second run, with new masks
        want = plain_exe.run(plain_main, feed={"x": xb}, fetch_list=plain_fetch)
        got = ck_exe.run(ck_main, feed={"x": xb}, fetch_list=ck_fetch)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(w, g)
