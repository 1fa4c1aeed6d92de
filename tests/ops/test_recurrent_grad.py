"""RecurrentNetworkGrad: regression tests for issue #10 bugs 3 and 4, against PyTorch loops (float64)."""
from __future__ import annotations

import numpy as np
import torch

import retrograd as rg
from retrograd.testing import build_program as build, started_executor as executor

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
