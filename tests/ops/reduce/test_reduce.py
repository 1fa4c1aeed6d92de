"""logsumexp and prod against PyTorch (float64) per backend: values, first and second
derivatives (prod's with zeros in x), logsumexp's stability and empty axes."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

torch = pytest.importorskip("torch", reason="the reference values come from PyTorch")

pytestmark = pytest.mark.engine


def run(backend, fn, x0):
    """y = fn(x), dx = d sum(y * w)/dx, ddx = d sum(dx * dx)/dx."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", list(x0.shape), "float64", stop_gradient=False)
        y = fn(x)
        w = rg.constant(weights(y.shape), "float64")
        dx, = rg.gradients(rg.sum(y * w), x)
        ddx, = rg.gradients(rg.sum(dx * dx), x)
    return backend.executor().run(main, feed={"x": x0}, fetch_list=[y, dx, ddx])


def weights(shape):
    return np.linspace(-1.0, 2.0, int(np.prod(shape))).reshape(shape)


def reference(fn, x0):
    t = torch.tensor(x0, requires_grad=True)
    y = fn(t)
    dx, = torch.autograd.grad((y * torch.tensor(weights(tuple(y.shape)))).sum(), t, create_graph=True)
    ddx, = torch.autograd.grad((dx * dx).sum(), t)
    return [v.detach().numpy() for v in (y, dx, ddx)]


def check(backend, ours, theirs, x0, rtol=1e-11):
    for what, got, want in zip(("value", "gradient", "second derivative"), run(backend, ours, x0),
                               reference(theirs, x0)):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-12, err_msg=f"{what} on {backend}")


@pytest.mark.parametrize("axis,keepdims", [(None, False), (1, False), (-1, True), ([0, 2], False), ([0, 2], True)])
def test_logsumexp_matches_torch(axis, keepdims, backend):
    x0 = np.random.default_rng(0).standard_normal((2, 3, 4))
    dims = tuple(range(3)) if axis is None else axis
    check(backend, lambda x: rg.logsumexp(x, axis, keepdims), lambda t: torch.logsumexp(t, dims, keepdims), x0)


def test_logsumexp_is_stable_for_large_and_infinite_logits(backend):
    x0 = np.array([[1000.0, 999.0, -np.inf], [-1000.0, -1001.0, -1002.0], [-np.inf, -np.inf, -np.inf]])
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        y = rg.logsumexp(rg.data("x", [3, 3], "float64"), axis=1)
    got, = backend.executor().run(main, feed={"x": x0}, fetch_list=[y])
    np.testing.assert_allclose(got, torch.logsumexp(torch.tensor(x0), 1).numpy(), rtol=1e-14)
    assert got[2] == -np.inf


def test_logsumexp_over_an_empty_axis_is_minus_infinity(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        y = rg.logsumexp(rg.data("x", [-1, 2], "float64"), axis=0)
    got, = backend.executor().run(main, feed={"x": np.zeros((0, 2))}, fetch_list=[y])
    np.testing.assert_array_equal(got, torch.logsumexp(torch.zeros(0, 2, dtype=torch.float64), 0).numpy())


@pytest.mark.parametrize("axis,keepdims", [(None, False), (1, False), (-1, True), ([0, 2], False)])
def test_prod_matches_torch(axis, keepdims, backend):
    x0 = np.random.default_rng(1).uniform(0.5, 1.5, (2, 3, 4)) * np.random.default_rng(2).choice([-1, 1], (2, 3, 4))
    if axis is None:
        theirs = torch.prod
    elif isinstance(axis, int):
        def theirs(t):
            return torch.prod(t, axis, keepdims)
    else:
        def theirs(t):
            return torch.prod(torch.prod(t, 2), 0)
    check(backend, lambda x: rg.prod(x, axis, keepdims), theirs, x0)


def test_prod_gradients_with_zeros_match_torch(backend):
    # rows with no zero, one zero (first and second derivatives exact), two zeros (first only)
    x0 = np.array([[0.5, -2.0, 1.5, 3.0], [0.0, 2.0, -1.5, 0.7], [1.2, 0.0, 0.0, 2.0]])
    got = run(backend, lambda x: rg.prod(x, axis=1), x0)
    want = reference(lambda t: torch.prod(t, 1), x0)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-14)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-14, atol=0)
    np.testing.assert_allclose(got[2][:2], want[2][:2], rtol=1e-12, atol=1e-14)
    assert np.isfinite(got[2]).all()


def test_prod_of_integers_and_bools(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        i, b = rg.data("i", [2, 3], "int64"), rg.data("b", [3], "bool")
        outs = [rg.prod(i, axis=1), rg.prod(b)]
    i0, b0 = np.array([[1, -2, 3], [4, 0, 5]]), np.array([True, True, False])
    got = backend.executor().run(main, feed={"i": i0, "b": b0}, fetch_list=outs)
    assert got[0].dtype == np.int64 and got[1].dtype == np.int64
    np.testing.assert_array_equal(got[0], [-6, 0])
    assert int(got[1]) == 0


def test_logsumexp_refuses_integers_and_bad_axes():
    with rg.program_guard(rg.Program(), rg.Program()):
        with pytest.raises(rg.ShapeError, match="float32 or float64"):
            rg.logsumexp(rg.data("i", [2], "int64"))
        with pytest.raises(rg.ShapeError, match="LogSumExp.*axis 1 is out of range for rank 1"):
            rg.logsumexp(rg.data("x", [2]), axis=1)
        with pytest.raises(rg.ShapeError, match="Prod.*repeats an axis"):
            rg.prod(rg.data("y", [2, 2]), axis=[0, 0])
