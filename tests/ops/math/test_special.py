"""erf, log1p, expm1, rsqrt against PyTorch (float64) with two derivatives, per backend; the
Array API form of erf against math.erf; logical_or and not_equal against NumPy."""
from __future__ import annotations

import math

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends import special

torch = pytest.importorskip("torch", reason="the reference values come from PyTorch")

pytestmark = pytest.mark.engine

WIDE = np.concatenate([np.linspace(-7.0, 7.0, 57), [-1e-9, 3e-12, 2.9999, 3.0001, -25.0]])
SMALL_AND_LARGE = np.concatenate([np.geomspace(1e-12, 50.0, 30), -np.geomspace(1e-12, 0.9, 20)])

FUNCTIONS = {
    "erf": (rg.erf, torch.erf, WIDE),
    "log1p": (rg.log1p, torch.log1p, SMALL_AND_LARGE),
    "expm1": (rg.expm1, torch.expm1, np.concatenate([SMALL_AND_LARGE, -SMALL_AND_LARGE * 10])),
    "rsqrt": (rg.rsqrt, torch.rsqrt, np.geomspace(1e-6, 1e6, 25)),
}


def run(backend, fn, x0):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", list(x0.shape), "float64", stop_gradient=False)
        y = fn(x)
        dx, = rg.gradients(rg.sum(y), x)
        ddx, = rg.gradients(rg.sum(dx), x)
    return backend.executor().run(main, feed={"x": x0}, fetch_list=[y, dx, ddx])


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_matches_torch_with_two_derivatives(name, backend):
    ours, theirs, x0 = FUNCTIONS[name]
    t = torch.tensor(x0, requires_grad=True)
    y = theirs(t)
    dx, = torch.autograd.grad(y.sum(), t, create_graph=True)
    ddx, = torch.autograd.grad(dx.sum(), t)
    for what, got, want in zip(("value", "gradient", "second derivative"), run(backend, ours, x0), (y, dx, ddx)):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-12, atol=1e-14,
                                   err_msg=f"{name} {what} on {backend}")


def test_array_api_erf_matches_math_erf_to_rounding():
    x = np.concatenate([np.linspace(-8.0, 8.0, 4001), [0.0, -0.0, 1e-300, 2.9999999, 3.0, 1e300, -np.inf]])
    want = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(special.erf(np, x), want, rtol=0, atol=2e-15)
    assert special.erf(np, x[:4001].astype("float32")).dtype == np.float32


@pytest.mark.parametrize("fn", [rg.erf, rg.log1p, rg.expm1, rg.rsqrt])
def test_integer_inputs_are_refused_when_built(fn):
    with pytest.raises(rg.ShapeError, match="float32 or float64"):
        with rg.program_guard(rg.Program(), rg.Program()):
            fn(rg.data("i", [2], "int64"))


def test_logical_or_and_not_equal_broadcast(backend):
    a0 = np.array([[True], [False]])
    b0 = np.array([False, True, False])
    x0 = np.array([[1.0, 2.0, 3.0], [2.0, 2.0, 0.0]])
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        a, b = rg.data("a", [-1, 1], "bool"), rg.data("b", [3], "bool")
        x = rg.data("x", [-1, 3], "float64")
        outs = [rg.logical_or(a, b), rg.not_equal(x, 2.0), rg.not_equal(x, rg.data("y", [3], "float64"))]
    y0 = np.array([1.0, 2.0, 0.5])
    got = backend.executor().run(main, feed={"a": a0, "b": b0, "x": x0, "y": y0}, fetch_list=outs)
    for g, want in zip(got, [np.logical_or(a0, b0), x0 != 2.0, x0 != y0]):
        assert g.dtype == np.bool_
        np.testing.assert_array_equal(g, want)


def test_logical_or_refuses_non_bool_operands():
    with pytest.raises(rg.ShapeError, match="must be bool"):
        with rg.program_guard(rg.Program(), rg.Program()):
            rg.logical_or(rg.data("a", [2], "bool"), rg.data("b", [2], "float32"))
