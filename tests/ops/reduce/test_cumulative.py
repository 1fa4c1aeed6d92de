"""cumsum and cumprod against PyTorch (float64) per backend: forward, reverse, first and second
derivatives, cumprod's gradients with zeros in x."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

torch = pytest.importorskip("torch", reason="the reference values come from PyTorch")

pytestmark = pytest.mark.engine


def torch_cumulative(name, t, axis, reverse):
    fn = torch.cumsum if name == "cumsum" else torch.cumprod
    if not reverse:
        return fn(t, axis)
    return torch.flip(fn(torch.flip(t, [axis]), axis), [axis])


def run(backend, fn, x0):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", list(x0.shape), "float64", stop_gradient=False)
        y = fn(x)
        w = rg.constant(np.linspace(-1.0, 2.0, x0.size).reshape(x0.shape), "float64")
        dx, = rg.gradients(rg.sum(y * w), x)
        ddx, = rg.gradients(rg.sum(dx * dx * x), x)
    return backend.executor().run(main, feed={"x": x0}, fetch_list=[y, dx, ddx])


def reference(fn, x0):
    t = torch.tensor(x0, requires_grad=True)
    y = fn(t)
    w = torch.tensor(np.linspace(-1.0, 2.0, x0.size).reshape(x0.shape))
    dx, = torch.autograd.grad((y * w).sum(), t, create_graph=True)
    ddx, = torch.autograd.grad((dx * dx * t).sum(), t)
    return [v.detach().numpy() for v in (y, dx, ddx)]


CASES = [(name, axis, reverse) for name in ("cumsum", "cumprod") for axis in (0, 1, -1) for reverse in (False, True)]


@pytest.mark.parametrize("name,axis,reverse", CASES)
def test_matches_torch_with_two_derivatives(name, axis, reverse, backend):
    x0 = np.random.default_rng(axis + 2).uniform(0.3, 1.5, (3, 4, 2)) * np.array([1.0, -1.0])
    ours = getattr(rg, name)
    got = run(backend, lambda x: ours(x, axis, reverse=reverse), x0)
    want = reference(lambda t: torch_cumulative(name, t, axis, reverse), x0)
    for what, g, w in zip(("value", "gradient", "second derivative"), got, want):
        np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-12, err_msg=f"{name} {what} on {backend}")


@pytest.mark.parametrize("reverse", [False, True])
def test_cumprod_gradients_with_zeros_match_torch(reverse, backend):
    # one zero, two zeros, a zero first and last: no division by zero anywhere
    x0 = np.array([[0.5, 0.0, 2.0, -1.5, 3.0], [1.5, 0.0, 2.0, 0.0, -0.5], [0.0, 2.0, 0.5, 1.5, 0.0]])
    got = run(backend, lambda x: rg.cumprod(x, 1, reverse=reverse), x0)
    want = reference(lambda t: torch_cumulative("cumprod", t, 1, reverse), x0)
    for what, g, w in zip(("value", "gradient", "second derivative"), got, want):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-13, err_msg=f"{what} on {backend}")


def test_cumprod_gradient_matches_finite_differences_with_zeros(backend):
    x0 = np.array([[0.5, 0.0, 2.0, -1.5], [0.0, 1.5, 0.0, 2.0]])
    rg.testing.check_gradients(lambda x: rg.cumprod(x, 1), {"x": x0}, **backend.kwargs)
    rg.testing.check_gradients(lambda x: rg.cumprod(x, 1, reverse=True), {"x": x0}, **backend.kwargs)


def test_integers_and_bools_accumulate_as_int64(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        i, b = rg.data("i", [-1, 3], "int64"), rg.data("b", [-1], "bool")
        outs = [rg.cumsum(i, 1), rg.cumprod(i, 0, reverse=True), rg.cumsum(b, 0)]
    i0, b0 = np.array([[1, -2, 3], [4, 0, 5]]), np.array([True, False, True, True])
    got = backend.executor().run(main, feed={"i": i0, "b": b0}, fetch_list=outs)
    assert all(g.dtype == np.int64 for g in got)
    np.testing.assert_array_equal(got[0], np.cumsum(i0, 1))
    np.testing.assert_array_equal(got[1], [[4, 0, 15], [4, 0, 5]])
    np.testing.assert_array_equal(got[2], [1, 1, 2, 3])


def test_empty_axes_and_bad_axes(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 2], "float64")
        outs = [rg.cumsum(x, 0), rg.cumprod(x, 0, reverse=True)]
    got = backend.executor().run(main, feed={"x": np.zeros((0, 2))}, fetch_list=outs)
    assert all(g.shape == (0, 2) for g in got)
    with rg.program_guard(rg.Program(), rg.Program()):
        with pytest.raises(rg.ShapeError, match="CumSum.*axis 2 is out of range for rank 2"):
            rg.cumsum(rg.data("y", [2, 3]), 2)
        with pytest.raises(rg.ShapeError, match="CumProd.*needs at least one axis"):
            rg.cumprod(rg.data("s", []), 0)
