"""Contract: peak_bytes, recompute on recurrent layers and checkpoints lower memory, same gradients."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import retrograd as rg


def test_elementwise_chain_frees_dead_intermediates():
    n = 100_000                                   # 800 kB per float64 value
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [n], dtype="float64")
        h = x
        for _ in range(20):
            h = rg.tanh(h * 1.01 + 0.1)
        out = rg.sum(h)
    exe = rg.Executor()
    xv = np.linspace(-1, 1, n)
    v, = exe.run(main, feed={"x": xv}, fetch_list=[out])
    ref = xv
    for _ in range(20):
        ref = np.tanh(ref * 1.01 + 0.1)
    np.testing.assert_allclose(v, ref.sum(), rtol=1e-12)
    peak = exe.last_stats.peak_bytes
    assert 8 * n <= peak <= 4 * 8 * n, peak      # never all 40 intermediates
    assert exe.last_stats.ops_run >= 41


def _lstm_run(recompute, forward_only_loss=False, t=60):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, 16], dtype="float64")
        outs = rg.layers.lstm(x, 32, name="l", recompute=recompute)
        loss = rg.sum(outs[1] * outs[1])
        pg = rg.append_backward(loss)
    exe = rg.Executor()
    exe.run(startup)
    xv = np.random.default_rng(0).standard_normal((t, 8, 16))
    vals = exe.run(main, feed={"x": xv}, fetch_list=[loss] + [g for _, g in pg])
    return vals, exe.last_stats.peak_bytes


def test_lstm_recompute_steps_and_budget_same_gradients_less_memory():
    base, peak0 = _lstm_run(None)
    steps, peak1 = _lstm_run("steps")
    budget = 200_000
    budg, peak2 = _lstm_run(budget)
    for a, b, c in zip(base, steps, budg):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(c, a, rtol=1e-12, atol=1e-14)
    assert peak1 < peak0, (peak1, peak0)
    assert peak2 < peak1, (peak2, peak1)


def test_recurrent_forward_only_holds_less():
    def run(forward_only):
        main = rg.Program()
        with rg.program_guard(main, rg.Program()):
            x = rg.data("x", [-1, -1, 16], dtype="float64")
            h0 = rg.data("h0", [-1, 16], dtype="float64")
            w = rg.create_parameter("w", [16, 16], dtype="float64", init=np.eye(16) * 0.5)
            alls, lasts = rg.recurrent(lambda xs, hs: [rg.tanh(xs[0] + hs[0] @ w) * 0.9],
                                       [x], [h0], forward_only=forward_only)
        exe = rg.Executor()
        exe.scope.set("w", np.eye(16) * 0.5)
        v, = exe.run(main, feed={"x": np.ones((200, 8, 16)), "h0": np.zeros((8, 16))}, fetch_list=[lasts[0]])
        return v, exe.last_stats.peak_bytes
    a, pa = run(False)
    b, pb = run(True)
    np.testing.assert_allclose(a, b, rtol=1e-12)
    assert pb <= pa


def test_checkpoints_lower_peak_bytes_same_gradients():
    def run(ckpt):
        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 64], dtype="float64")
            h, hs = x, []
            for i in range(16):
                h = rg.layers.fc(h, 64, act="tanh", name=f"l{i}")
                hs.append(h)
            loss = rg.mean(h * h)
            pg = rg.append_backward(loss, checkpoints=hs[3::4] if ckpt else None)
        exe = rg.Executor()
        exe.run(startup)
        vals = exe.run(main, feed={"x": np.random.default_rng(1).standard_normal((256, 64))},
                       fetch_list=[g for _, g in pg])
        return vals, exe.last_stats.peak_bytes
    a, pa = run(False)
    b, pb = run(True)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert pb < 0.8 * pa, (pb, pa)


def test_checkpoint_not_on_loss_path_warns_and_is_ignored():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4], dtype="float64")
        h = rg.layers.fc(x, 4, act="tanh", name="a")
        stray = rg.layers.fc(x, 4, name="stray")
        loss = rg.mean(rg.layers.fc(h, 4, act="tanh", name="b"))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            pg = rg.append_backward(loss, checkpoints=[stray, h])
    assert any(stray.name in str(m.message) for m in w)
    exe = rg.Executor()
    exe.run(startup)
    vals = exe.run(main, feed={"x": np.ones((2, 4))}, fetch_list=[g for _, g in pg])
    assert len(vals) == 4


def test_budget_too_small_is_a_retrograd_error():
    with pytest.raises(rg.RetrogradError) as e:
        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [20, 4, 8], dtype="float64")
            outs = rg.layers.lstm(x, 8, name="l", recompute=16)
            rg.append_backward(rg.sum(outs[1]))
        exe = rg.Executor()
        exe.run(startup)
        exe.run(main, feed={"x": np.ones((20, 4, 8))})
    assert isinstance(e.value, (rg.ProgramError, rg.ExecutionError))


def test_while_loop_recompute_budget_same_gradients():
    def run(recompute):
        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 32], dtype="float64")
            n = rg.data("n", [], dtype="int64")
            w = rg.create_parameter("w", [32, 32], dtype="float64",
                                    init=np.random.default_rng(3).standard_normal((32, 32)) * 0.2)
            kw = {} if recompute is None else {"recompute": recompute}
            _, h = rg.while_loop(lambda i, h: i < n, lambda i, h: [i + 1, rg.tanh(h @ w) + x * 0.1],
                                 [rg.constant(0), x], **kw)
            loss = rg.sum(h * h)
            (_, gw), = rg.append_backward(loss)
            gx, = rg.gradients([loss], [x])
        exe = rg.Executor()
        exe.run(startup)
        vals = exe.run(main, feed={"x": np.random.default_rng(4).standard_normal((16, 32)), "n": np.array(40)},
                       fetch_list=[loss, gw, gx])
        return vals, exe.last_stats.peak_bytes
    a, pa = run(None)
    b, pb = run(60_000)
    for u, v in zip(a, b):
        np.testing.assert_allclose(v, u, rtol=1e-12, atol=1e-14)
    assert pb < pa, (pb, pa)


def test_recurrent_first_step_op_sums_outer_value_batch_grows_then_shrinks():
    """Seed regressions: the step's first op adds an outer value to the previous state;
    the same program runs with a larger, then smaller batch."""
    torch = pytest.importorskip("torch")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, 3], dtype="float64")
        h0 = rg.data("h0", [-1, 3], dtype="float64", stop_gradient=False)
        bias = rg.create_parameter("bias", [3], dtype="float64", init=np.array([0.1, -0.2, 0.3]))
        w = rg.create_parameter("w", [3, 3], dtype="float64", init=np.eye(3) * 0.7)
        alls, lasts = rg.recurrent(lambda xs, hs: [rg.tanh((hs[0] + bias) @ w + xs[0])], [x], [h0])
        loss = rg.sum(alls[0] * alls[0])
        pg = rg.append_backward(loss)
        gh0, = rg.gradients([loss], [h0])
    exe = rg.Executor()
    exe.run(startup)
    for t, n in ((3, 2), (5, 6), (2, 1)):
        r = np.random.default_rng(t * 10 + n)
        xv, hv = r.standard_normal((t, n, 3)), r.standard_normal((n, 3))
        vals = exe.run(main, feed={"x": xv, "h0": hv}, fetch_list=[loss] + [g for _, g in pg] + [gh0])
        bt = torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64, requires_grad=True)
        wt = torch.tensor(np.eye(3) * 0.7, requires_grad=True)
        ht0 = torch.tensor(hv, requires_grad=True)
        h, hs = ht0, []
        for s in range(t):
            h = torch.tanh((h + bt) @ wt + torch.tensor(xv[s]))
            hs.append(h)
        lt = (torch.stack(hs) ** 2).sum()
        lt.backward()
        np.testing.assert_allclose(vals[0], lt.item(), rtol=1e-12)
        for v, ref in zip(vals[1:], (bt, wt, ht0)):
            np.testing.assert_allclose(v, ref.grad.numpy(), rtol=1e-10, atol=1e-13)


def test_inference_while_loop_peak_independent_of_trip_count():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [1000], dtype="float64")
        n = rg.data("n", [], dtype="int64")
        _, h = rg.while_loop(lambda i, h: i < n, lambda i, h: [i + 1, h * 0.999 + 0.001], [rg.constant(0), x])
    exe = rg.Executor()
    peaks = {}
    for trips in (10, 10_000):
        v, = exe.run(main, feed={"x": np.ones(1000), "n": np.array(trips)}, fetch_list=[h])
        np.testing.assert_allclose(v, np.ones(1000), rtol=1e-9)
        peaks[trips] = exe.last_stats.peak_bytes
    assert peaks[10_000] == peaks[10]
    assert peaks[10] < 10 * 8000
