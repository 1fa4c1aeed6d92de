"""rg.recurrent: per-step outputs that are not states (step_fn returns (states, outputs)) and
reverse=True, against PyTorch loops (float64)."""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd.testing import build_program as build, started_executor as executor

RNG = np.random.default_rng(0)
X0, H0, W0 = RNG.standard_normal((4, 2, 3)), RNG.standard_normal((2, 3)), RNG.standard_normal((3, 3)) * 0.5
LENGTHS = np.array([4, 2], dtype=np.int64)


def _model(reverse, lengths):
    def model():
        x = rg.data("x", [-1, -1, 3], dtype="float64", stop_gradient=False)
        h0 = rg.data("h0", [-1, 3], dtype="float64", stop_gradient=False)
        w = rg.create_parameter("w", [3, 3], dtype="float64", init=W0)
        lv = rg.data("lengths", [-1], dtype="int64") if lengths else None

        def step(xs, hs):
            h = rg.tanh(xs[0] @ w + hs[0])
            return [h], [rg.sum(h * h, axis=1, keepdims=True), h * xs[0]]
        (hs,), (hl,), (y, z) = rg.recurrent(step, [x], [h0], seq_lengths=lv, reverse=reverse)
        loss = rg.sum(hs * 0.5) + rg.sum(y * y) + rg.sum(z * z) + rg.sum(hl)
        return [hs, hl, y, z] + rg.gradients(loss, [x, h0, w])
    return build(model)


def _torch(reverse, lengths):
    x, h0, w = (torch.tensor(a, requires_grad=True) for a in (X0, H0, W0))
    hs, ys, zs, lasts = [], [], [], []
    for n in range(2):          # one example at a time: its own length, its own direction
        steps = range(4) if lengths is None else range(int(lengths[n]))
        order = list(steps)[::-1] if reverse else list(steps)
        h = h0[n:n + 1]
        col_h, col_y, col_z = [None] * 4, [None] * 4, [None] * 4
        for t in order:
            h = torch.tanh(x[t, n:n + 1] @ w + h)
            col_h[t], col_y[t], col_z[t] = h, (h * h).sum(1, keepdim=True), h * x[t, n:n + 1]
        for t in range(4):      # past its length an example repeats its last values
            if col_h[t] is None:
                last = order[-1]
                col_h[t], col_y[t], col_z[t] = col_h[last], col_y[last], col_z[last]
        hs.append(torch.stack(col_h))
        ys.append(torch.stack(col_y))
        zs.append(torch.stack(col_z))
        lasts.append(h)
    hs, ys, zs = (torch.cat(v, dim=1) for v in (hs, ys, zs))
    hl = torch.cat(lasts, dim=0)
    loss = (hs * 0.5).sum() + (ys * ys).sum() + (zs * zs).sum() + hl.sum()
    return [hs, hl, ys, zs, *torch.autograd.grad(loss, [x, h0, w])]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("with_lengths", [False, True])
def test_step_outputs_and_reverse_match_torch(reverse, with_lengths):
    main, startup, fetch = _model(reverse, with_lengths)
    feed = {"x": X0, "h0": H0, **({"lengths": LENGTHS} if with_lengths else {})}
    got = executor(startup).run(main, feed=feed, fetch_list=fetch)
    for ours, ref in zip(got, _torch(reverse, LENGTHS if with_lengths else None)):
        np.testing.assert_allclose(ours, ref.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_step_outputs_on_an_empty_sequence_are_empty():
    main, startup, fetch = _model(False, False)
    got = executor(startup).run(main, feed={"x": np.zeros((0, 2, 3)), "h0": H0}, fetch_list=fetch[:4])
    assert [g.shape for g in got] == [(0, 2, 3), (2, 3), (0, 2, 1), (0, 2, 3)]
    np.testing.assert_array_equal(got[1], H0)


def test_step_output_sizes_after_the_batch_must_be_known():
    def model():
        x = rg.data("x", [-1, -1, 3], dtype="float64")
        y = rg.data("y", [-1, -1], dtype="float64")
        rg.recurrent(lambda xs, hs: ([hs[0] + 1.0], [y]), [x], [rg.data("h", [-1, 3], dtype="float64")])
    with pytest.raises(rg.ProgramError, match="per-step output"):
        build(model)
