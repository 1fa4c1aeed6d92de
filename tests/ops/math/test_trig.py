"""sin / cos against PyTorch: values, first and second derivatives; integers refused."""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd.testing import build_program as build, started_executor as executor


def test_sin_cos_and_their_second_derivatives_match_torch():
    x0 = np.linspace(-3.0, 3.0, 7)

    def model():
        x = rg.data("x", [7], dtype="float64", stop_gradient=False)
        y = rg.sum(rg.sin(x) * rg.cos(2.0 * x))
        dx, = rg.gradients(y, x)
        ddx, = rg.gradients(rg.sum(dx), x)
        return [y, dx, ddx]
    main, startup, outs = build(model)
    got = executor(startup).run(main, feed={"x": x0}, fetch_list=outs)
    x = torch.tensor(x0, requires_grad=True)
    y = (torch.sin(x) * torch.cos(2.0 * x)).sum()
    dx, = torch.autograd.grad(y, x, create_graph=True)
    ddx, = torch.autograd.grad(dx.sum(), x)
    for ours, want in zip(got, [y, dx, ddx]):
        np.testing.assert_allclose(ours, want.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_sin_refuses_integers():
    with pytest.raises(rg.ShapeError, match="float32 or float64"):
        build(lambda: rg.sin(rg.data("i", [2], dtype="int64")))
