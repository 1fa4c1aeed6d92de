"""append_backward / minimize(memory_budget=, feed_shapes=): one byte budget for the whole training
step. Every budgeted run peaks within its budget and gives store-all's gradients (float64: exactly,
the recomputed ops are the same ops on the same values)."""
from __future__ import annotations

import re

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd import Program

ROWS, WIDTH = 256, 32


def _mlp(layers: int = 12, memory_budget=None, optimizer=None, rows: int = ROWS):
    main, startup = Program(), Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, WIDTH], dtype="float64")
        h = x
        for i in range(layers):
            h = rg.layers.fc(h, WIDTH, act="tanh", name=f"fc{i}")
        loss = rg.mean(h * h)
        shapes = {"x": (rows, WIDTH)}
        if optimizer is None:
            pairs = rg.append_backward(loss, memory_budget=memory_budget, feed_shapes=shapes)
        else:
            pairs = optimizer.minimize(loss, memory_budget=memory_budget, feed_shapes=shapes)
    return main, startup, [loss] + [g for _, g in pairs]


def _params(layers: int = 12) -> dict:
    rng = np.random.RandomState(0)
    out = {}
    for i in range(layers):
        out[f"fc{i}.w"] = rng.randn(WIDTH, WIDTH) * 0.3
        out[f"fc{i}.b"] = rng.randn(WIDTH) * 0.1
    return out


def _run(built, params, xb, steps: int = 1):
    main, startup, fetch = built
    exe = rg.Executor()
    if startup is not None:
        exe.run(startup)          # optimizer state
    for name, value in params.items():
        exe.scope.set(name, value.copy())
    for _ in range(steps):
        out = exe.run(main, feed={"x": xb}, fetch_list=fetch)
    return out, exe.last_stats.peak_bytes, exe


XB = np.random.RandomState(1).randn(ROWS, WIDTH)


def test_memory_budget_bounds_the_peak_and_keeps_store_all_gradients():
    params = _params()
    ref, store_all, _ = _run(_mlp(), params, XB)
    for fraction in (0.7, 0.5):
        budget = int(fraction * store_all)
        main, startup, fetch = built = _mlp(memory_budget=budget)
        out, peak, _ = _run(built, params, XB)
        assert peak <= budget
        assert main.memory_plan.planned_peak <= budget
        assert main.memory_plan.planned_peak >= peak          # the plan bounds the run from above
        for a, b in zip(out, ref):
            np.testing.assert_array_equal(a, b)
    # and against torch
    x = torch.tensor(XB)
    ws = [torch.tensor(params[f"fc{i}.w"], requires_grad=True) for i in range(12)]
    bs = [torch.tensor(params[f"fc{i}.b"], requires_grad=True) for i in range(12)]
    h = x
    for w, b in zip(ws, bs):
        h = torch.tanh(h @ w + b)
    (h * h).mean().backward()
    np.testing.assert_allclose(out[1], ws[0].grad.numpy(), rtol=1e-10, atol=1e-15)


def test_memory_budget_that_fits_everything_changes_nothing():
    params = _params()
    ref, store_all, _ = _run(_mlp(), params, XB)
    main, _, fetch = built = _mlp(memory_budget=store_all + 1000)
    out, peak, _ = _run(built, params, XB)
    assert peak == store_all
    assert not any("recompute_of" in op.attrs for op in main.global_block().ops)


def test_memory_budget_too_small_names_the_least_budget_that_then_works():
    params = _params()
    _, store_all, _ = _run(_mlp(), params, XB)
    with pytest.raises(rg.ProgramError, match="the least budget that fits is") as info:
        _mlp(memory_budget=store_all // 10)
    least = int(re.search(r"the least budget that fits is (\d+) bytes", str(info.value)).group(1))
    assert store_all // 10 < least < store_all
    ref, _, _ = _run(_mlp(), params, XB)
    out, peak, _ = _run(_mlp(memory_budget=least), params, XB)
    assert peak <= least
    for a, b in zip(out, ref):
        np.testing.assert_array_equal(a, b)


def test_binomial_recompute_fits_32_layers_in_five_percent_of_their_activations():
    """Multi-level recompute: the budget above what every plan holds anyway (parameters, their
    gradients, the input, the gradient ops' own values) is 5% of what store-all keeps."""
    rows, layers = 1024, 32
    xb = np.random.RandomState(2).randn(rows, WIDTH)
    params = _params(layers)
    main, _, fetch = _mlp(layers, rows=rows)
    kept = rg.memory.report(main, {"x": (rows, WIDTH)}).kept_bytes
    ref, store_all, _ = _run((main, None, fetch), params, xb)
    fixed = store_all - kept
    budget = fixed + int(0.05 * kept) + 3 * rows * WIDTH * 8     # + the gradient ops' values (dh, dz)
    built = _mlp(layers, memory_budget=budget, rows=rows)
    out, peak, _ = _run(built, params, xb)
    assert peak <= budget
    for a, b in zip(out, ref):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("make", [lambda: rg.optim.SGD(0.1), lambda: rg.optim.Adam(1e-2),
                                  lambda: rg.optim.Momentum(0.1, 0.9)])
def test_minimize_with_memory_budget_trains_like_store_all_within_the_budget(make):
    params = _params()
    ref, store_all, ref_exe = _run(_mlp(optimizer=make()), params, XB, steps=2)
    budget = int(0.7 * store_all)
    out, peak, exe = _run(_mlp(memory_budget=budget, optimizer=make()), params, XB, steps=2)
    assert peak <= budget
    for name in params:
        np.testing.assert_array_equal(exe.scope.get(name), ref_exe.scope.get(name))


def test_memory_budget_must_be_bytes():
    with pytest.raises(rg.ProgramError, match="memory_budget must be"):
        _mlp(memory_budget=-5)
    with pytest.raises(rg.ProgramError, match="not both"):
        main, startup = Program(), Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [4, 3])
            loss = rg.mean(rg.layers.fc(x, 2))
            rg.append_backward(loss, checkpoints="auto", memory_budget=1 << 20)


def test_report_shows_the_planned_peak_against_the_budget():
    params = _params()
    _, store_all, _ = _run(_mlp(), params, XB)
    budget = int(0.6 * store_all)
    main, _, fetch = built = _mlp(memory_budget=budget)
    r = rg.memory.report(main, {"x": (ROWS, WIDTH)})
    assert r.budget == budget and r.planned_peak <= budget
    assert f"against a budget of {budget:,} B" in str(r)
    _, peak, _ = _run(built, params, XB)
    assert peak <= r.planned_peak
    plain, _, plain_fetch = _mlp()
    assert rg.memory.report(plain, {"x": (ROWS, WIDTH)}, fetch_list=plain_fetch).planned_peak == store_all


def _mixed(memory_budget=None, steps: int = 60, batch: int = 4):
    """Feed-forward layers around an LSTM and a while_loop: one budget covers them together."""
    main, startup = Program(), Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, 6], dtype="float64")
        h = rg.layers.fc(x, 8, act="tanh", name="pre")
        _, last, _, _ = rg.layers.lstm(h, 8, name="rnn")
        w = rg.create_parameter("loop.w", [8, 8], "float64")
        _, z = rg.while_loop(lambda i, z: i < 5, lambda i, z: (i + 1, rg.tanh(z @ w)), [rg.constant(0), last])
        out = rg.layers.fc(z, 8, act="tanh", name="post")
        loss = rg.mean(out * out)
        pairs = rg.append_backward(loss, memory_budget=memory_budget,
                                   feed_shapes={"x": (steps, batch, 6)})
    return main, startup, [loss] + [g for _, g in pairs]


def test_one_budget_covers_feed_forward_recurrent_and_loop_ops_together():
    xb = np.random.RandomState(5).randn(60, 4, 6)
    main, startup, fetch = _mixed()
    exe = rg.Executor()
    exe.run(startup)
    params = {v.name: np.array(exe.scope.get(v.name)) for v in main.all_parameters()}
    ref = exe.run(main, feed={"x": xb}, fetch_list=fetch)
    store_all = exe.last_stats.peak_bytes
    with pytest.raises(rg.ProgramError, match="the least budget that fits is") as info:
        _mixed(store_all // 4)
    least = int(re.search(r"the least budget that fits is (\d+) bytes", str(info.value)).group(1))
    # (at 0.9x store-all the cheap_first policy fits by freeing shape-only reads: nothing recomputed)
    for budget in (int(0.7 * store_all), least):
        built = _mixed(budget)
        assert any(op.attrs.get("recompute") is not None for op in built[0].global_block().ops
                   if op.type in ("RecurrentNetwork", "While"))
        out, peak, _ = _run_feed(built, params, {"x": xb})
        assert peak <= budget
        for a, b in zip(out, ref):      # the recurrent weights' sums are regrouped per segment
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13 * max(1.0, float(np.abs(b).max())))


def _run_feed(built, params, feed):
    main, startup, fetch = built
    exe = rg.Executor()
    exe.run(startup)
    for name, value in params.items():
        exe.scope.set(name, value.copy())
    out = exe.run(main, feed=feed, fetch_list=fetch)
    return out, exe.last_stats.peak_bytes, exe
