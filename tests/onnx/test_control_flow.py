"""Control flow and recurrent nets exported to ONNX (If, Loop), with their gradients, at several
trip counts including 0 and batch sizes, one export each, against the NumPy executor."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg


def _loop_program(nested: bool):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4], dtype="float64")
        n = rg.data("n", [], dtype="int64")
        w = rg.create_parameter("w", [4, 4], dtype="float64")

        def inner(h):
            _, h = rg.while_loop(lambda j, h: j < 2, lambda j, h: (j + 1, rg.tanh(h @ w)),
                                 [rg.constant(0), h])
            return h

        def step(i, h):
            h = rg.tanh(h @ w)
            if nested:
                h = inner(h)
            h = rg.cond(rg.sum(h) > 0.0, lambda: h * 2.0, lambda: -h)
            h = rg.do(lambda a: a + rg.sin(a), h)
            return i + 1, h

        _, h = rg.while_loop(lambda i, h: i < n, step, [rg.constant(0), x], max_iters=100)
        loss = rg.sum(h * h)
        dx, dw = rg.gradients(loss, [x, w])
        ddw, = rg.gradients(rg.sum(dw * dw), [w])
    return main, startup, [loss, h, dx, dw, ddw]


@pytest.mark.parametrize("nested", [False, True], ids=["while", "while-in-while"])
def test_while_cond_do_and_gradients_at_any_trip_count_and_batch(nested, ort_check):
    main, startup, fetch = _loop_program(nested)
    exe = rg.Executor()
    exe.run(startup)
    model = rg.onnx.export(main, None, fetch, scope=exe.scope)
    ops = {node.op_type for node in model.graph.node}
    assert "Loop" in ops and "Scan" not in ops
    sess = ort_check.session(model)
    r = np.random.default_rng(0)
    for trips, batch in ((0, 3), (1, 1), (4, 5), (7, 2)):
        feed = {"x": r.standard_normal((batch, 4)), "n": np.array(trips)}
        got = sess.run([f.name for f in fetch], feed)
        want = exe.run(main, feed=feed, fetch_list=fetch)
        for f, g, w in zip(fetch, got, want):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10, err_msg=f"{f.name} at {trips} trips")


def _rnn_program(kind: str, lengths_on: bool, recompute=None):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, 6])
        lengths = rg.data("lengths", [-1], dtype="int64") if lengths_on else None
        h0 = rg.data("h0", [-1, 5])
        if kind == "recurrent":
            w, u = rg.create_parameter("w", [6, 5]), rg.create_parameter("u", [5, 5])
            (h_all,), (h_last,) = rg.recurrent(lambda xs, hs: [rg.tanh(xs[0] @ w + hs[0] @ u)], [x], [h0],
                                               seq_lengths=lengths, recompute=recompute)
        elif kind == "lstm":
            h_all, h_last, _, _ = rg.layers.lstm(x, 5, h0=h0, seq_lengths=lengths, forget_bias=1.0,
                                                 name="lstm", recompute=recompute)
        elif kind == "gru":
            h_all, h_last = rg.layers.gru(x, 5, h0=h0, seq_lengths=lengths, name="gru")
        else:
            h_all, h_last, _, _ = rg.layers.milstm(x, 5, h0=h0, seq_lengths=lengths, name="milstm")
        loss = rg.sum(h_last * h_last) + rg.sum(h_all * 0.5)
        params_grads = rg.append_backward(loss)
        dx, dh0 = rg.gradients(loss, [x, h0])
    return main, startup, [loss, h_all, h_last, dx, dh0] + [g for _, g in params_grads]


@pytest.mark.parametrize("lengths_on", [False, True], ids=["full", "seq_lengths"])
@pytest.mark.parametrize("kind,recompute", [("recurrent", None), ("recurrent", "steps"), ("lstm", None),
                                            ("lstm", "steps"), ("gru", None), ("milstm", None)])
def test_recurrent_nets_and_gradients_at_any_length_and_batch(kind, recompute, lengths_on, ort_check):
    main, startup, fetch = _rnn_program(kind, lengths_on, recompute)
    exe = rg.Executor()
    exe.run(startup)
    model = rg.onnx.export(main, None, fetch, scope=exe.scope)
    assert "Scan" not in {node.op_type for node in model.graph.node}
    sess = ort_check.session(model)
    inputs = {i.name for i in sess.get_inputs()}
    r = np.random.default_rng(1)
    for steps, batch in ((0, 2), (1, 3), (6, 4), (3, 1)):
        feed = {"x": r.standard_normal((steps, batch, 6)).astype("float32"),
                "h0": r.standard_normal((batch, 5)).astype("float32"),
                "lengths": r.integers(0, steps + 1, batch)}
        feed = {k: v for k, v in feed.items() if k in inputs}
        got = sess.run([f.name for f in fetch], feed)
        want = exe.run(main, feed=feed, fetch_list=fetch)
        for f, g, w in zip(fetch, got, want):
            assert g.shape == w.shape, f"{f.name}: {g.shape} vs {w.shape} at T={steps}"
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, equal_nan=True,
                                       err_msg=f"{f.name} T={steps}")


def test_dropout_in_a_recurrent_step_draws_the_executors_masks(ort_check):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, 6])
        h0 = rg.data("h0", [-1, 5])
        w, u = rg.create_parameter("w", [6, 5]), rg.create_parameter("u", [5, 5])
        step = lambda xs, hs: [rg.dropout(rg.tanh(xs[0] @ w + hs[0] @ u), 0.3)]  # noqa: E731
        (h_all,), _ = rg.recurrent(step, [rg.dropout(x, 0.5)], [h0])
        loss = rg.sum(h_all * h_all)
        params_grads = rg.append_backward(loss)
    exe = rg.Executor()
    exe.run(startup)
    feed = {"x": np.ones((4, 3, 6), "float32"), "h0": np.ones((3, 5), "float32")}
    _, got = ort_check(main, exe, feed, [loss, h_all] + [g for _, g in params_grads])
    assert 0 < np.count_nonzero(got[1]) < got[1].size      # some, not all, units dropped


@pytest.mark.parametrize("kind", ["lstm", "while"])
def test_budgeted_loops_export_store_all_with_the_same_gradients(kind, ort_check):
    """recompute=<bytes> loops export as store-all: the backward re-runs every step, no budget."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        if kind == "lstm":
            x = rg.data("x", [-1, -1, 6])
            lengths = rg.data("lengths", [-1], dtype="int64")
            h_all, h_last, _, _ = rg.layers.lstm(x, 5, seq_lengths=lengths, name="lstm", recompute=3000)
            loss = rg.sum(h_last * h_last) + rg.sum(h_all)
        else:
            x = rg.data("x", [-1, 4], dtype="float64")
            n = rg.data("n", [], dtype="int64")
            w = rg.create_parameter("w", [4, 4], dtype="float64")
            body = lambda i, h: (i + 1, rg.tanh(h @ w) + rg.dropout(h, 0.3))  # noqa: E731
            _, h = rg.while_loop(lambda i, h: i < n, body, [rg.constant(0), x], recompute=2000)
            loss = rg.sum(h * h)
        params_grads = rg.append_backward(loss)
        dx, = rg.gradients(loss, [x])
    budget_ops = {"RecurrentNetworkBudgetGrad", "WhileBudgetGrad"}
    assert budget_ops & {op.type for op in main.global_block().ops}
    exe = rg.Executor()
    exe.run(startup)
    fetch = [loss, dx] + [g for _, g in params_grads]
    r = np.random.default_rng(5)
    for steps in (0, 1, 12):
        if kind == "lstm":
            feed = {"x": r.standard_normal((steps, 3, 6)).astype("float32"),
                    "lengths": r.integers(0, steps + 1, 3)}
        else:
            feed = {"x": r.standard_normal((3, 4)), "n": np.array(steps)}
        ort_check(main, exe, feed, fetch)
