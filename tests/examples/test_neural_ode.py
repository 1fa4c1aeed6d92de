"""examples/neural_ode.py: an adaptive-step Runge-Kutta while_loop trained by reverse mode within a
memory budget gives the store-all run's numbers, within the budget, and learns."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "neural_ode.py"


def _load():
    spec = importlib.util.spec_from_file_location("example_neural_ode", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_neural_ode_trains_within_a_memory_budget_like_store_all():
    ode = _load()
    losses, peak, _ = ode.train(batch=32, hidden=8, steps=4, log_every=0)
    assert losses[-1] < losses[0]
    budget = peak // 4
    b_losses, b_peak, _ = ode.train(batch=32, hidden=8, steps=4, log_every=0, memory_budget=budget)
    assert b_peak <= budget
    np.testing.assert_array_equal(b_losses, losses)     # same ops on the same values


def test_neural_ode_gradient_matches_torch_through_the_adaptive_loop():
    ode = _load()
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        y0 = rg.data("y0", [-1, 2], dtype="float64")
        target = rg.data("target", [-1, 2], dtype="float64")
        params = [rg.create_parameter(n, s, "float64") for n, s in
                  (("w1", [2, 8]), ("b1", [8]), ("w2", [8, 2]))]
        loss = rg.mean(rg.square(ode.solve(y0, params) - target))
        grads = [g for _, g in rg.append_backward(loss, memory_budget=1 << 30,
                                                  feed_shapes={"y0": (16, 2), "target": (16, 2)})]
    rng = np.random.RandomState(0)
    values = [rng.randn(2, 8) * 0.5, rng.randn(8) * 0.1, rng.randn(8, 2) * 0.3]
    yb, tb = ode.data(16)
    exe = rg.Executor()
    for p, v in zip(params, values):
        exe.scope.set(p.name, v)
    out = exe.run(main, feed={"y0": yb, "target": tb}, fetch_list=[loss] + grads)

    w1, b1, w2 = (torch.tensor(v, requires_grad=True) for v in values)
    f = lambda y: torch.tanh(y @ w1 + b1) @ w2  # noqa: E731
    t, dt, y = 0.0, 0.1, torch.tensor(yb)
    while t < 1.0:                     # the same solver, the same step decisions
        dt = min(dt, 1.0 - t)
        k1 = f(y)
        k2 = f(y + k1 * (dt * 0.5))
        k3 = f(y + k2 * (dt * 0.75))
        y3 = y + (k1 * (2 / 9) + k2 * (1 / 3) + k3 * (4 / 9)) * dt
        k4 = f(y3)
        y2 = y + (k1 * (7 / 24) + k2 * 0.25 + k3 * (1 / 3) + k4 * 0.125) * dt
        scale = y.detach().abs() * ode.RTOL + ode.ATOL
        err = float(torch.sqrt(torch.mean(((y3 - y2).detach() / scale) ** 2)))
        if err <= 1.0:
            t, y = t + dt, y3
        dt = dt * min(max(0.9 * (err + 1e-10) ** (-1 / 3), 0.2), 5.0)
    ref = torch.mean((y - torch.tensor(tb)) ** 2)
    ref.backward()
    np.testing.assert_allclose(out[0], ref.item(), rtol=1e-10)
    for g, r in zip(out[1:], (w1.grad, b1.grad, w2.grad)):
        np.testing.assert_allclose(g, r.numpy(), rtol=1e-8, atol=1e-12)
