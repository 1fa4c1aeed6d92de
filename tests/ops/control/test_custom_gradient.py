"""custom_gradient (ops/custom_gradient.py) against torch.autograd.Function (float64): the user's
gradient, first and second order, in while_loop, recurrent steps, scan and under recompute, on
NumPy, torch-CPU and onnxruntime; shapes of what grad_fn returns are checked."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.testing import build_program as build

torch = pytest.importorskip("torch", reason="the references are torch.autograd.Functions")

pytestmark = pytest.mark.engine

R = np.random.RandomState(11)
X = R.randn(2, 3) * 0.7
W = R.randn(3, 3) * 0.5


def _run(backend, model, feed):
    main, startup, fetch = build(model)
    exe = backend.executor()
    exe.run(startup)
    return exe.run(main, feed=feed, fetch_list=fetch)


def _close(got, want):
    assert len(got) == len(want)
    for ours, ref in zip(got, want):
        np.testing.assert_allclose(ours, ref.detach().numpy(), rtol=1e-10, atol=1e-12)


def _inputs():
    return (rg.data("x", [2, 3], dtype="float64", stop_gradient=False),
            rg.data("w", [3, 3], dtype="float64", stop_gradient=False))


def _with_grads(loss, inputs):
    firsts = rg.gradients(loss, inputs)
    return [loss] + list(firsts) + rg.gradients(rg.add_n([rg.sum(g * g) for g in firsts]), inputs)


def _torch_with_grads(loss, inputs):
    firsts = torch.autograd.grad(loss, inputs, create_graph=True)
    return [loss] + list(firsts) + list(torch.autograd.grad(sum((g * g).sum() for g in firsts), inputs))


# --- a tanh layer whose gradient is not the forward's own ---------------------------------------

def _layer_forward(x, w):
    return rg.tanh(x @ w), rg.sin(x)


def _layer_backward(xs, ys, dys):
    (x, w), (t, _), (dt, ds) = xs, ys, dys
    dpre = dt * (1.0 - t * t) * rg.cos(t)            # not the true gradient
    return [dpre @ rg.transpose(w, [1, 0]) + ds * rg.cos(x) * 0.5, rg.transpose(x, [1, 0]) @ dpre]


class TorchLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        t = torch.tanh(x @ w)
        ctx.save_for_backward(x, w, t)
        return t, torch.sin(x)

    @staticmethod
    def backward(ctx, dt, ds):
        x, w, t = ctx.saved_tensors
        dpre = dt * (1.0 - t * t) * torch.cos(t)
        return dpre @ w.T + ds * torch.cos(x) * 0.5, x.T @ dpre


def _torch_inputs():
    return torch.tensor(X, requires_grad=True), torch.tensor(W, requires_grad=True)


def test_the_users_gradient_and_its_second_order_match_torch_autograd_function(backend):
    layer = rg.custom_gradient(_layer_forward, _layer_backward)

    def model():
        x, w = _inputs()
        t, s = layer(x, w)
        return _with_grads(rg.sum(t * t * t) + rg.sum(s * x), [x, w])
    x, w = _torch_inputs()
    t, s = TorchLayer.apply(x, w)
    _close(_run(backend, model, {"x": X, "w": W}), _torch_with_grads((t ** 3).sum() + (s * x).sum(), [x, w]))


def test_an_output_without_gradient_gets_zeros_and_an_input_may_get_none(backend):
    seen = []

    def backward(xs, ys, dys):
        seen.append([d.shape for d in dys])
        return [dys[0] * 3.0, None]
    f = rg.custom_gradient(lambda x, w: (x * 2.0, rg.sum(w)), backward)

    def model():
        x, w = _inputs()
        y, _ = f(x, w)
        return rg.gradients(rg.sum(y * y), [x, w], unconnected="zero")
    dx, dw = _run(backend, model, {"x": X, "w": W})
    np.testing.assert_allclose(dx, 2 * (2 * X) * 3.0, rtol=1e-12)
    assert not dw.any() and seen == [[(2, 3), ()]]


# --- in loops, with run-time trip counts and recompute -----------------------------------------

def _counting_layer():
    calls = []

    def backward(xs, ys, dys):
        calls.append(1)
        return _layer_backward(xs, ys, dys)
    return rg.custom_gradient(_layer_forward, backward), calls


def _torch_steps(n):
    x, w = _torch_inputs()
    h = x
    for _ in range(n):
        t, s = TorchLayer.apply(h, w)
        h = t + s * 0.25
    return _torch_with_grads((h * h).sum(), [x, w])


@pytest.mark.parametrize("recompute", [None, 400])
@pytest.mark.parametrize("n", [0, 3])
def test_in_a_while_loop_with_a_run_time_trip_count(backend, n, recompute):
    """recompute=<bytes> keeps only checkpoints and replays the forward (its gradient op is first
    order only, so second order is checked without it)."""
    layer, calls = _counting_layer()
    second = recompute is None

    def model():
        x, w = _inputs()
        count = rg.data("n", [], dtype="int64")

        def body(i, h):
            t, s = layer(h, w)
            return i + 1, t + s * 0.25
        _, h = rg.while_loop(lambda i, h: i < count, body, [rg.constant(0), x], recompute=recompute)
        loss = rg.sum(h * h)
        return _with_grads(loss, [x, w]) if second else [loss] + rg.gradients(loss, [x, w], unconnected="zero")
    got = _run(backend, model, {"x": X, "w": W, "n": np.array(n)})
    if n == 0:                        # the loop does not run: h = x, no gradient reaches w
        np.testing.assert_allclose(got[1], 2 * X)
        return
    want = _torch_steps(n)
    _close(got, want if second else want[:3])
    assert len(calls) == (2 if second else 1)   # once per backward build, not once per step


@pytest.mark.parametrize("recompute", [None, "steps"])
def test_in_recurrent_steps_and_under_recompute(backend, recompute):
    layer, calls = _counting_layer()

    def model():
        x, w = _inputs()
        seq = rg.reshape(rg.concat([x, x * 0.5, -x], 0), [3, 2, 3])

        def step(xs, hs):
            t, s = layer(hs[0] + xs[0], w)
            return [t + s * 0.25]
        (h_all,), _ = rg.recurrent(step, [seq], [x], recompute=recompute)
        return _with_grads(rg.sum(h_all * h_all), [x, w])

    x, w = _torch_inputs()
    h, outs = x, []
    for xt in (x, x * 0.5, -x):
        t, s = TorchLayer.apply(h + xt, w)
        h = t + s * 0.25
        outs.append(h)
    h_all = torch.stack(outs)
    _close(_run(backend, model, {"x": X, "w": W}), _torch_with_grads((h_all * h_all).sum(), [x, w]))
    assert len(calls) == 3    # per backward build (the second order rebuilds the step's backward), not per step


def test_in_a_scan_step(backend):
    layer, _ = _counting_layer()

    def model():
        x, w = _inputs()
        xs = rg.reshape(rg.concat([x, rg.cos(x)], 0), [2, 2, 3])
        h, _ = rg.scan(lambda h, row: (rg.add_n(list(layer(h * row, w))), None), x, xs)
        return _with_grads(rg.sum(h * h), [x, w])

    x, w = _torch_inputs()
    h = x
    for row in (x, torch.cos(x)):
        t, s = TorchLayer.apply(h * row, w)
        h = t + s
    _close(_run(backend, model, {"x": X, "w": W}), _torch_with_grads((h * h).sum(), [x, w]))


# --- a gradient that is not linear in the output gradient (clipping) -----------------------------

def _clip_backward(xs, ys, dys):
    return [rg.tanh(dys[0]) * rg.cos(xs[0])]


class TorchClip(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, dy):
        x, = ctx.saved_tensors
        return torch.tanh(dy) * torch.cos(x)


@pytest.mark.parametrize("n", [1, 3])
def test_a_squashed_gradient_in_a_while_loop_matches_torch_to_second_order(backend, n):
    clip = rg.custom_gradient(lambda x: rg.sin(x), _clip_backward)

    def model():
        x, w = _inputs()
        count = rg.data("n", [], dtype="int64")
        _, h = rg.while_loop(lambda i, h: i < count, lambda i, h: (i + 1, clip(h @ w) * 2.0),
                             [rg.constant(0), x])
        return _with_grads(rg.sum(h * h * h), [x, w])
    x, w = _torch_inputs()
    h = x
    for _ in range(n):
        h = TorchClip.apply(h @ w) * 2.0
    _close(_run(backend, model, {"x": X, "w": W, "n": np.array(n)}), _torch_with_grads((h ** 3).sum(), [x, w]))


# --- errors ------------------------------------------------------------------------------------

def test_a_gradient_of_the_wrong_shape_is_a_shape_error_naming_the_op_and_line():
    f = rg.custom_gradient(lambda x: x * 2.0, lambda xs, ys, dys: [rg.sum(dys[0], axis=0)])

    def model():
        x, _ = _inputs()
        y = f(x)                                         # the line the error names
        return rg.gradients(rg.sum(y), [x])
    with pytest.raises(rg.ShapeError, match=r"test_custom_gradient\.py:\d+: .*CustomGradient.*\[3\].*\[2, 3\]"):
        build(model)


def test_a_wrong_number_of_gradients_is_a_program_error():
    f = rg.custom_gradient(lambda x, w: x @ w, lambda xs, ys, dys: [dys[0]])

    def model():
        x, w = _inputs()
        return rg.gradients(rg.sum(f(x, w)), [x])
    with pytest.raises(rg.ProgramError, match="one gradient .* per input"):
        build(model)


def test_clone_keeps_the_custom_gradient(backend):
    f = rg.custom_gradient(lambda x: rg.exp(x), lambda xs, ys, dys: [dys[0] * 2.0])

    def model():
        x, _ = _inputs()
        return [f(x)]
    main, startup, (y,) = build(model)
    copy = main.clone()
    with rg.program_guard(copy, rg.Program()):
        block = copy.global_block()
        dx, = rg.gradients(rg.sum(block.var(y.name)), [block.var("x")])
    exe = backend.executor()
    got, = exe.run(copy, feed={"x": X}, fetch_list=[dx])
    np.testing.assert_allclose(got, np.full((2, 3), 2.0))
