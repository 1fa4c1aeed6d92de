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


def test_onnx_export_of_a_ragged_backward_is_refused_by_name():
    pytest.importorskip("onnx", reason="ONNX export needs onnx")
    main, startup, fetch = build(_decoder)
    with pytest.raises(rg.BackendError, match="While"):
        rg.onnx.export(main, None, fetch[2:4], scope=executor(startup).scope)


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
