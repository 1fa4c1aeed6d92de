"""while_loop with loop vars that change shape (shape_invariants): a growing concat (TensorFlow's
testWhileGrad_Concat), decoding outputs of data-dependent length, gradients and second derivatives
against PyTorch; ONNX refuses what a Loop cannot stack."""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd.testing import build_program as build, started_executor as executor


def test_while_grad_concat_tensorflow():
    """x = [[1, 2]]; h grows by concat([x, h]) twice; one SGD step (lr 0.01) on sum(h): x = [[0.98, 1.98]]."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.create_parameter("x", [1, 2], dtype="float64", init=np.array([[1.0, 2.0]]))
        h0 = rg.fill([0, 2], 0.0, dtype="float64")
        _, h = rg.while_loop(lambda i, h: i < 2, lambda i, h: (i + 1, rg.concat([x, h], 0)),
                             [rg.constant(0), h0], shape_invariants=[None, [-1, 2]])
        rg.optim.SGD(0.01).minimize(rg.sum(h))
    exe = executor(startup)
    exe.run(main)
    np.testing.assert_allclose(exe.scope.get("x"), [[0.98, 1.98]], rtol=1e-12)


W0 = np.array([[0.6, -0.4, 0.2], [0.3, 0.9, -0.5], [-0.2, 0.4, 0.7]])
H0 = np.array([0.5, -1.0, 0.25])


def _decoder():
    """Decode until the step's score passes a threshold (at most 6 steps), appending each output
    row to a growing [t, 3] matrix; loss mixes every row, so d loss / d (w, h0) runs over the ragged loop."""
    w = rg.create_parameter("w", [3, 3], dtype="float64", init=W0)
    h0 = rg.data("h0", [3], dtype="float64", stop_gradient=False)
    limit = rg.data("limit", [], dtype="float64")
    outs0 = rg.fill([0, 3], 0.0, dtype="float64")

    def body(i, h, outs):
        h = rg.tanh(rg.reshape(rg.reshape(h, [1, 3]) @ w, [3]) + 0.1)
        return i + 1, h, rg.concat([outs, rg.reshape(h * h + h, [1, 3])], 0)
    _, h, outs = rg.while_loop(lambda i, h, outs: rg.logical_and(i < 6, rg.sum(h) < limit), body,
                               [rg.constant(0), h0, outs0], shape_invariants=[None, None, [-1, 3]])
    rows = rg.sum(outs, axis=1)
    loss = rg.sum(rg.sin(rows) * rows) + rg.sum(h)
    dw, dh0 = rg.gradients(loss, [w, h0])
    ddh0, = rg.gradients(rg.sum(dw * dw) + rg.sum(dh0 * dh0), [h0])
    return [outs, loss, dw, dh0, ddh0]


def _torch_decoder(limit):
    w, h = torch.tensor(W0, requires_grad=True), torch.tensor(H0, requires_grad=True)
    h0, rows, i = h, [], 0
    while i < 6 and float(h.detach().sum()) < limit:
        h = torch.tanh(h @ w + 0.1)
        rows.append(h * h + h)
        i += 1
    outs = torch.stack(rows) if rows else torch.zeros(0, 3, dtype=torch.float64)
    r = outs.sum(1)
    loss = (torch.sin(r) * r).sum() + h.sum()
    dw, dh0 = torch.autograd.grad(loss, [w, h0], create_graph=True, allow_unused=True, materialize_grads=True)
    ddh0, = torch.autograd.grad((dw * dw).sum() + (dh0 * dh0).sum(), [h0], allow_unused=True,
                                materialize_grads=True)
    return [outs, loss, dw, dh0, ddh0]


@pytest.mark.parametrize("limit", [-5.0, 0.0, 0.9, 10.0])
def test_growing_loop_var_gradients_and_second_derivatives_match_torch(limit):
    main, startup, fetch = build(_decoder)
    got = executor(startup).run(main, feed={"h0": H0, "limit": np.array(limit)}, fetch_list=fetch)
    ref = _torch_decoder(limit)
    assert got[0].shape == tuple(ref[0].shape)
    for ours, want in zip(got, ref):
        np.testing.assert_allclose(ours, want.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_shape_change_without_invariants_is_refused_when_differentiating():
    def model():
        x = rg.data("x", [-1], dtype="float64", stop_gradient=False)
        _, y = rg.while_loop(lambda i, y: i < 2, lambda i, y: (i + 1, rg.concat([y, y], 0)), [rg.constant(0), x])
        return rg.gradients(rg.sum(y), [x])
    main, startup, fetch = build(model)
    with pytest.raises(rg.ExecutionError, match="shape_invariants"):
        executor(startup).run(main, feed={"x": np.ones(2)}, fetch_list=fetch)


@pytest.mark.parametrize("bad", [[[-1, 2]], [None, [3]], [None, [-1, 2.5]], [None, [5, 2]], "x"])
def test_bad_shape_invariants_are_program_errors(bad):
    def model():
        h0 = rg.fill([0, 2], 0.0, dtype="float64")
        rg.while_loop(lambda i, h: i < 2, lambda i, h: (i + 1, h), [rg.constant(0), h0], shape_invariants=bad)
    with pytest.raises(rg.ProgramError, match="shape"):
        build(model)


@pytest.mark.parametrize("limit", [-5.0, 0.9, 10.0])
def test_onnx_engine_runs_a_ragged_backward_and_second_derivatives(limit):
    """The loop keeps the growing matrix only for its shape: the ONNX Loop carries the largest
    shape and the backward cuts each iteration's row to its saved shape."""
    pytest.importorskip("onnxruntime", reason="runs the exported model")
    pytest.importorskip("onnx", reason="ONNX export needs onnx")
    main, startup, fetch = build(_decoder)
    exe = rg.Executor(backend="onnxruntime")
    exe.run(startup)
    got = exe.run(main, feed={"h0": H0, "limit": np.array(limit)}, fetch_list=fetch)
    for ours, want in zip(got, _torch_decoder(limit)):
        np.testing.assert_allclose(ours, want.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_onnx_engine_runs_a_ragged_backward_reading_a_growing_value():
    """The backward reads the grown matrix itself (not only its shape): the ONNX Loop keeps it as a
    sequence, padded after the loop (loop_stacks.RaggedStacks), and the engine gives NumPy's numbers."""
    pytest.importorskip("onnxruntime", reason="runs the exported model")
    pytest.importorskip("onnx", reason="ONNX export needs onnx")

    def model():
        x = rg.data("x", [2], dtype="float64", stop_gradient=False)
        outs0 = rg.fill([0, 2], 0.0, dtype="float64")

        def body(i, h, outs):
            outs = rg.concat([outs, rg.reshape(h, [1, 2])], 0)
            return i + 1, h + rg.sum(outs * outs), outs       # the product's backward reads outs itself
        _, h, _ = rg.while_loop(lambda i, h, outs: i < 3, body, [rg.constant(0), x, outs0],
                                shape_invariants=[None, None, [-1, 2]])
        return rg.gradients(rg.sum(h), [x])
    main, startup, fetch = build(model)
    feed = {"x": np.array([0.3, -0.2])}
    want = executor(startup).run(main, feed=feed, fetch_list=fetch)
    engine = rg.Executor(backend="onnxruntime")
    engine.run(startup)
    for got, ref in zip(engine.run(main, feed=feed, fetch_list=fetch), want):
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)


def test_onnx_export_of_a_growing_loop_runs_in_onnxruntime():
    ort = pytest.importorskip("onnxruntime", reason="runs the exported model")
    pytest.importorskip("onnx", reason="ONNX export needs onnx")

    def model():
        x = rg.data("x", [1, 2], dtype="float64")
        n = rg.data("n", [], dtype="int64")
        step = lambda i, h: (i + 1, rg.concat([rg.sin(x) * rg.cast(i, "float64"), h], 0))  # noqa: E731
        return rg.while_loop(lambda i, h: i < n, step, [rg.constant(0), rg.fill([0, 2], 0.0, dtype="float64")],
                             shape_invariants=[None, [-1, 2]])[1]
    main, startup, h = build(model)
    exe = executor(startup)
    sess = ort.InferenceSession(rg.onnx.export(main, None, [h]).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    for n in (0, 3):
        feed = {"x": np.array([[0.5, 1.0]]), "n": np.array(n)}
        want, = exe.run(main, feed=feed, fetch_list=[h])
        got, = sess.run([h.name], feed)
        assert got.shape == want.shape == (n, 2)
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_scalar_feed_as_a_loop_var_keeps_its_shape_on_the_engine():
    """onnxruntime (with the engine's I/O binding) handed a scalar graph input bound straight to a
    Loop carry back as [1]: the final counter came out [4], not 4."""
    pytest.importorskip("onnxruntime", reason="runs the onnxruntime engine")
    pytest.importorskip("onnx", reason="ONNX export needs onnx")

    def model():
        lo = rg.data("lo", [], dtype="int64")
        x = rg.data("x", [2], dtype="float64", stop_gradient=False)
        i, v = rg.while_loop(lambda i, v: i < 4, lambda i, v: (i + 1, v * rg.cast(i, "float64")), [lo, x])
        return [i, v] + rg.gradients(rg.sum(v), [x])
    main, _, fetch = build(model)
    i, v, dx = rg.Executor(backend="onnxruntime").run(main, feed={"lo": np.array(1), "x": np.ones(2)},
                                                      fetch_list=fetch)
    assert i.shape == () and int(i) == 4
    np.testing.assert_allclose(v, [6.0, 6.0])
    np.testing.assert_allclose(dx, [6.0, 6.0])


def test_second_order_of_a_cond_in_a_loop_on_the_engine_does_not_stack_empty_stand_ins():
    """The If saves, for the branch that did not run, an empty stand-in of what the other branch's
    backward reads; a Loop stacking it per iteration got rows [2, 3] and [0, 0] and onnxruntime
    failed ('Inconsistent shape in loop output'). It is now zeros of the known shape."""
    pytest.importorskip("onnxruntime", reason="runs the onnxruntime engine")
    pytest.importorskip("onnx", reason="ONNX export needs onnx")
    x0 = np.array([[0.5, -0.3, 0.8], [-0.6, 0.2, 0.1]])

    def model():
        x = rg.data("x", [2, 3], dtype="float64", stop_gradient=False)
        step = lambda i, v: (i + 1, rg.cond(rg.equal(i % 2, 0), lambda: rg.tanh(v * x),  # noqa: E731
                                            lambda: rg.sin(v) * 0.5))      # the branches alternate
        _, v = rg.while_loop(lambda i, v: i < 5, step, [rg.constant(0), x])
        dx, = rg.gradients(rg.sum(v * v), [x])
        return [dx] + rg.gradients(rg.sum(dx * dx), [x])
    main, _, fetch = build(model)
    want = rg.Executor().run(main, feed={"x": x0}, fetch_list=fetch)
    got = rg.Executor(backend="onnxruntime").run(main, feed={"x": x0}, fetch_list=fetch)
    for ours, ref in zip(got, want):
        np.testing.assert_allclose(ours, ref, rtol=1e-10)
