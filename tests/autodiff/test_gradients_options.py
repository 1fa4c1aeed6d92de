"""rg.gradients' tf.gradients options: stop_gradients, unconnected="zero", and target gradients
that must have their target's shape (checked against PyTorch float64)."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.testing import build_program as build

torch = pytest.importorskip("torch", reason="the references are PyTorch's gradients")

pytestmark = pytest.mark.engine

X = np.array([[0.5, -1.0], [0.25, 2.0]])


def _run(backend, model, feed=None):
    main, startup, fetch = build(model)
    exe = backend.executor()
    exe.run(startup)
    return exe.run(main, feed={"x": X, **(feed or {})}, fetch_list=fetch)


def _x():
    return rg.data("x", [2, 2], dtype="float64", stop_gradient=False)


def test_stop_gradients_hold_variables_constant_as_tensorflow(backend):
    """tf.gradients' example: a = 0; b = 2a; d(a + b)/d(a, b) with stop_gradients=[a, b] is (1, 1)."""
    def model():
        x = _x()
        a = rg.tanh(x)
        b = a * 2.0
        c = rg.sin(b) * x
        return rg.gradients(rg.sum(a + b + c), [a, b, x], stop_gradients=[a, b])
    da, db, dx = _run(backend, model)
    t = torch.tensor(X, requires_grad=True)
    a = torch.tanh(t).detach().requires_grad_()
    b = (a * 2.0).detach().requires_grad_()
    ref = torch.autograd.grad((a + b + torch.sin(b) * t).sum(), [a, b, t])
    for ours, want in zip([da, db, dx], ref):
        np.testing.assert_allclose(ours, want.numpy(), rtol=1e-12)


def test_stop_gradients_and_second_order(backend):
    def model():
        x = _x()
        s = rg.exp(x)
        dx, = rg.gradients(rg.sum(s * x * x), [x], stop_gradients=[s])
        return [dx] + rg.gradients(rg.sum(dx * dx), [x], stop_gradients=[s])
    dx, ddx = _run(backend, model)
    t = torch.tensor(X, requires_grad=True)
    s = torch.exp(t).detach()
    g, = torch.autograd.grad((s * t * t).sum(), [t], create_graph=True)
    gg, = torch.autograd.grad((g * g).sum(), [t])
    np.testing.assert_allclose(dx, g.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(ddx, gg.numpy(), rtol=1e-12)


def test_unconnected_zero_gives_zeros_shaped_like_the_input(backend):
    def model():
        x = _x()
        z = rg.data("z", [-1, 3], dtype="float64", stop_gradient=False)
        none = rg.gradients(rg.sum(x * x), [x, z])
        assert none[1] is None
        return rg.gradients(rg.sum(x * x), [x, z], unconnected="zero")
    dx, dz = _run(backend, model, {"z": np.ones((4, 3))})
    np.testing.assert_allclose(dx, 2 * X)
    assert dz.shape == (4, 3) and not dz.any()


def test_unconnected_must_be_none_or_zero():
    with pytest.raises(rg.ProgramError, match="unconnected"):
        build(lambda: rg.gradients(rg.sum(_x()), [rg.data("y", [2])], unconnected="zeros"))


def test_target_gradient_of_a_larger_shape_is_a_shape_error_not_a_tripled_gradient():
    """The bug: a [3, 2, 2] target gradient for a [2, 2] target tripled the gradient silently."""
    def model():
        x = _x()
        return rg.gradients([x * x], [x], target_gradients=[rg.fill([3, 2, 2], 1.0, "float64")])
    with pytest.raises(rg.ShapeError, match=r"target gradient .*\[3, 2, 2\].*\[2, 2\]"):
        build(model)


@pytest.mark.parametrize("shape", [[2], [1, 2], [2, 2, 1], []])
def test_target_gradient_that_would_broadcast_is_a_shape_error(shape):
    def model():
        x = _x()
        return rg.gradients([rg.tanh(x)], [x], target_gradients=[rg.fill(shape, 1.0, "float64")])
    with pytest.raises(rg.ShapeError, match="target gradient"):
        build(model)


def test_target_gradients_of_the_right_shape_still_seed_vector_jacobian_products(backend):
    def model():
        x = _x()
        seed = rg.constant(np.array([[1.0, 2.0], [3.0, 4.0]]), dtype="float64")
        return rg.gradients([rg.tanh(x)], [x], target_gradients=[seed]) + \
            rg.gradients([rg.tanh(x)], [x], target_gradients=[2.0])
    vjp, twice = _run(backend, model)
    np.testing.assert_allclose(vjp, (1 - np.tanh(X) ** 2) * [[1.0, 2.0], [3.0, 4.0]], rtol=1e-12)
    np.testing.assert_allclose(twice, 2 * (1 - np.tanh(X) ** 2), rtol=1e-12)
