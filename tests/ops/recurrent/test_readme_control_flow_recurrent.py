"""The README's new Control flow and Recurrent examples run as printed; their numbers against NumPy/PyTorch."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

README = (Path(__file__).resolve().parents[3] / "README.md").read_text()


def _block(marker: str) -> dict:
    block = next(b for b in re.findall(r"```python\n(.*?)```", README, re.S) if marker in b)
    env: dict = {"__name__": "readme"}
    exec(compile(block, "README.md", "exec"), env)
    return env


def test_readme_growing_loop_and_switch_case():
    env = _block("shape_invariants=[None, [-1, 4]]")
    x = torch.tensor(np.linspace(-1, 1, 4), requires_grad=True)
    rows = torch.stack([torch.tanh(x * (i + 1)) for i in range(4)])
    y = torch.sin(rows)                                  # n = 4: 4 % 3 == 1
    dx, = torch.autograd.grad(y.sum(), x)
    for ours, ref in zip([env["rows_v"], env["y_v"], env["dx_v"]], [rows, y, dx]):
        np.testing.assert_allclose(ours, ref.detach().numpy(), rtol=1e-12)


def test_readme_step_outputs_reverse_and_bidirectional():
    env = _block("(energy,) = rg.recurrent")
    energy, both = env["energy_v"], env["both_v"]
    assert energy.shape == (20, 4, 1) and both.shape == (20, 4, 64)
    feed, scope = env["feed"], env["exe"].scope
    w, u = scope.get("rnn.w"), scope.get("rnn.u")
    for n, length in enumerate(feed["lengths"]):         # right to left over each example's own steps
        h = feed["h0"][n]
        for t in reversed(range(length)):
            h = np.tanh(feed["x"][t, n] @ w + h @ u)
            np.testing.assert_allclose(energy[t, n, 0], np.sum(h * h), rtol=1e-10)
