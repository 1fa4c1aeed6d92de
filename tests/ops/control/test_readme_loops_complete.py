"""The README's TensorArray/scan/fori_loop/map and gradients/custom_gradient examples run as printed;
their numbers against PyTorch Python loops."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the references are PyTorch Python loops")

README = (Path(__file__).resolve().parents[3] / "README.md").read_text()


def _block(marker: str) -> dict:
    block = next(b for b in re.findall(r"```python\n(.*?)```", README, re.S) if marker in b)
    env: dict = {"__name__": "readme"}
    exec(compile(block, "README.md", "exec"), env)
    return env


def test_readme_tensor_array_scan_fori_loop_map():
    env = _block("rg.TensorArray(dtype=\"float64\", element_shape=[3])")
    xs_np = env["feed"]["xs"]
    w = torch.tensor(env["exe"].scope.get("w"), requires_grad=True)
    xs = torch.tensor(xs_np, requires_grad=True)
    h, states = torch.full((3,), 0.5, dtype=torch.float64), []
    for _ in range(5):
        h = torch.tanh(h @ w)
        states.append(h * h)
    states = torch.stack(states)
    running = torch.cumsum(xs, 0)
    back, c = [], torch.zeros(3, dtype=torch.float64)
    for t in reversed(range(4)):
        c = c * 0.5 + xs[t]
    norms = torch.sqrt((xs * xs).sum(1))
    loss = states.sum() + (running * running).sum() + norms.sum() + c.sum()
    dw, dxs = torch.autograd.grad(loss, [w, xs])
    got = [env["states_v"], env["running_v"], env["norms_v"], env["dw_v"], env["dxs_v"]]
    for ours, ref in zip(got, [states, running, norms, dw, dxs]):
        np.testing.assert_allclose(ours, ref.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(env["powers_v"], [120.0])


def test_readme_gradients_options_and_custom_gradient():
    env = _block("rg.custom_gradient(forward, clipped)")
    x = np.array([0.1, 0.5, 2.0])
    dx = np.tanh(10 * np.exp(x)) * np.cos(x)
    np.testing.assert_allclose(env["dx_v"], dx, rtol=1e-12)
    assert env["dz_v"].tolist() == [0.0, 0.0]
    xt = torch.tensor(x, requires_grad=True)
    ddx, = torch.autograd.grad((torch.tanh(10 * torch.exp(xt)) * torch.cos(xt)).sum(), [xt])   # s not stopped here
    np.testing.assert_allclose(env["ddx_v"], ddx.numpy(), rtol=1e-12)
