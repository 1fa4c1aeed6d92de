"""RecurrentNetworkGrad: regression tests for issue #10 bugs 3 and 4, against PyTorch loops (float64)."""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd.testing import build_program as build, check_gradients, started_executor as executor

F64 = "float64"
RNG = np.random.default_rng(3)
X0 = RNG.standard_normal((4, 2, 3))
H0 = RNG.standard_normal((2, 3)) * 0.5
V0 = RNG.standard_normal((3, 3)) * 0.7


def _t(a):
    return torch.tensor(np.asarray(a), dtype=torch.float64, requires_grad=True)


def _close(ours, ref, tol=1e-10):
    np.testing.assert_allclose(np.asarray(ours), ref.detach().numpy(), rtol=tol, atol=tol)


# --- Bug 4: a weight gradient batched over time with a transposed weight --------------------------

def test_weight_gradient_batching_with_transposed_weight():
    """step tanh(matmul(x_t + h, V, transpose_y=True)): dV = sum_t d_t^T (x_t + h) had the forward
    value in the gradient's place and failed with KeyError 'add_0'."""
    def model():
        x = rg.data("x", [4, 2, 3], dtype=F64, stop_gradient=False)
        h0 = rg.data("h0", [2, 3], dtype=F64, stop_gradient=False)
        v = rg.create_parameter("V", [3, 3], dtype=F64, init=V0)
        (hs,), _ = rg.recurrent(lambda xs, hs: [rg.tanh(rg.matmul(xs[0] + hs[0], v, transpose_y=True))],
                                [x], [h0])
        loss = rg.sum(hs * hs)
        return [loss] + rg.gradients(loss, [x, h0, v])
    main, startup, fetch = build(model)
    got = executor(startup).run(main, feed={"x": X0, "h0": H0}, fetch_list=fetch)
    x, h0, v = _t(X0), _t(H0), _t(V0)
    h, hs = h0, []
    for t in range(4):
        h = torch.tanh((x[t] + h) @ v.T)
        hs.append(h)
    loss = (torch.stack(hs) ** 2).sum()
    for ours, ref in zip(got, [loss, *torch.autograd.grad(loss, [x, h0, v])]):
        _close(ours, ref)


# --- Bug 3: second derivatives through rg.recurrent / layers.lstm -----------------------------------

W0 = RNG.standard_normal((3, 3)) * 0.6
U0 = RNG.standard_normal((3, 3)) * 0.5


def _rnn_second_order():
    """loss over a tanh RNN; s = |d loss/d (x, h0, w, u)|^2; d s / d (x, h0, w, u) and a third-order term."""
    x = rg.data("x", [4, 2, 3], dtype=F64, stop_gradient=False)
    h0 = rg.data("h0", [2, 3], dtype=F64, stop_gradient=False)
    w = rg.create_parameter("w", [3, 3], dtype=F64, init=W0)
    u = rg.create_parameter("u", [3, 3], dtype=F64, init=U0)
    (hs,), (hl,) = rg.recurrent(lambda xs, hs: [rg.tanh(xs[0] @ w + hs[0] @ u)], [x], [h0])
    loss = rg.sum(hs * hs) + rg.sum(rg.sin(hl))
    first = rg.gradients(loss, [x, h0, w, u])
    s = rg.add_n([rg.sum(d * d) for d in first])
    second = rg.gradients(s, [x, h0, w, u])
    third, = rg.gradients(rg.sum(second[3] * second[3]), [w])
    return [loss, *first, *second, third]


def _torch_rnn_second_order():
    x, h0, w, u = _t(X0), _t(H0), _t(W0), _t(U0)
    h, hs = h0, []
    for t in range(4):
        h = torch.tanh(x[t] @ w + h @ u)
        hs.append(h)
    loss = (torch.stack(hs) ** 2).sum() + torch.sin(h).sum()
    first = torch.autograd.grad(loss, [x, h0, w, u], create_graph=True)
    second = torch.autograd.grad(sum((d * d).sum() for d in first), [x, h0, w, u], create_graph=True)
    third, = torch.autograd.grad((second[3] * second[3]).sum(), [w])
    return [loss, *first, *second, third]


def test_second_and_third_derivative_through_recurrent_match_torch():
    main, startup, fetch = build(_rnn_second_order)
    got = executor(startup).run(main, feed={"x": X0, "h0": H0}, fetch_list=fetch)
    for ours, ref in zip(got, _torch_rnn_second_order()):
        _close(ours, ref, tol=1e-9)
    # The gradient of the recurrent gradient is a recurrent op again: a Scan, differentiated as one.
    types = [op.type for op in main.global_block().ops]
    assert types.count("RecurrentNetworkGrad") >= 1 and types.count("Scan") >= 2


@pytest.mark.parametrize("recompute", [None, "steps"])
def test_second_derivative_through_lstm_with_lengths_finite_differences(recompute):
    """d/d(x, h0, c0) of |d loss / d (x, w_hh)|^2 through layers.lstm with seq_lengths (rows stop)."""
    rng = np.random.default_rng(5)

    def fn(x, h0, c0, lengths):
        h_all, _, _, c_last = rg.layers.lstm(x, 2, h0=h0, c0=c0, seq_lengths=lengths, name="enc",
                                             recompute=recompute)
        loss = rg.sum(h_all * h_all) + rg.sum(c_last * 0.5)
        w_hh = rg.default_main_program().global_block().var("enc.w_hh")
        dx, dw = rg.gradients(loss, [x, w_hh])
        return rg.sum(dx * dx) + rg.sum(dw * dw)

    inputs = {"x": rng.standard_normal((3, 2, 2)), "h0": rng.standard_normal((2, 2)) * 0.5,
              "c0": rng.standard_normal((2, 2)) * 0.5, "lengths": np.array([3, 1], dtype=np.int64)}
    errors = check_gradients(fn, inputs, wrt=["x", "h0", "c0"], rtol=1e-5, atol=1e-7)
    assert max(errors.values()) < 1e-5


def test_second_derivative_of_bidirectional_lstm_exports_to_onnx():
    """The second-order Scan (with Dim, ReverseSequence and step outputs around it) runs in onnxruntime."""
    ort = pytest.importorskip("onnxruntime", reason="runs the exported model")
    pytest.importorskip("onnx", reason="ONNX export needs onnx")

    def model():
        x = rg.data("x", [-1, -1, 3], dtype=F64, stop_gradient=False)
        lengths = rg.data("lengths", [-1], dtype="int64")
        both, _, _, _ = rg.layers.lstm(x, 2, seq_lengths=lengths, name="bi", bidirectional=True)
        _, _, (y,) = rg.recurrent(lambda xs, hs: ([rg.tanh(xs[0] + hs[0])], [hs[0] * 2.0]), [x],
                                  [rg.sum(x, axis=0) * 0.0], reverse=True)
        dx, = rg.gradients(rg.sum(both * both) + rg.sum(y * y), [x])
        return [both, y, dx] + rg.gradients(rg.sum(dx * dx), [x])
    main, startup, fetch = build(model)
    exe = executor(startup)
    feed = {"x": RNG.standard_normal((4, 2, 3)), "lengths": np.array([4, 2])}
    want = exe.run(main, feed=feed, fetch_list=fetch)
    sess = ort.InferenceSession(rg.onnx.export(main, None, fetch, scope=exe.scope).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    for got, ref in zip(sess.run([v.name for v in fetch], feed), want):
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)
