"""rg.memory.auto_checkpoints: the checkpoint set that fits a budget with the least recompute."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd import Program

L, W, N = 32, 64, 256
ACT = N * W * 8                      # bytes of one float64 activation


def _forward(layers=L):
    main, startup = Program(), Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, W], dtype="float64")
        h = x
        for i in range(layers):
            h = rg.tanh(rg.matmul(h, rg.create_parameter(f"w{i}", [W, W], dtype="float64")))
        loss = rg.mean(h * h)
    return main, loss


def _train(main, loss, checkpoints, seed=0):
    with rg.program_guard(main, Program()):
        params_grads = rg.append_backward(loss, checkpoints=checkpoints)
    exe = rg.Executor()
    rng = np.random.RandomState(seed)
    for p in main.all_parameters():
        exe.scope.set(p.name, rng.randn(*p.shape) * 0.3)
    xb = np.random.RandomState(seed + 1).randn(N, W)
    grads = exe.run(main, feed={"x": xb}, fetch_list=[g for _, g in params_grads])
    return grads, exe.last_stats.peak_bytes


def _recomputed(main):
    return [op for op in main.global_block().ops if "recompute_of" in op.attrs]


@pytest.mark.parametrize("budget_acts", [16, 10])
def test_budget_bounds_the_peak_and_gradients_match(budget_acts):
    main, loss = _forward()
    ref, peak_all = _train(main, loss, None)
    main, loss = _forward()
    ckpts = rg.memory.auto_checkpoints(loss, budget_acts * ACT, {"x": (N, W)})
    assert ckpts and all(isinstance(c, rg.Var) and c.block.program is main for c in ckpts)
    grads, peak = _train(main, loss, ckpts)
    for a, b in zip(grads, ref):
        np.testing.assert_array_equal(a, b)
    fixed = ACT + 2 * L * W * W * 8               # the input, the parameters and their gradients
    assert peak <= budget_acts * ACT + fixed
    assert peak_all > 32 * ACT                    # store-all holds every activation at the turn
    assert peak_all - peak > 8 * ACT


def test_smaller_budget_recomputes_more():
    counts = []
    for acts in (24, 16, 10):
        main, loss = _forward()
        _train(main, loss, rg.memory.auto_checkpoints(loss, acts * ACT, {"x": (N, W)}))
        counts.append(len(_recomputed(main)))
    assert counts[0] < counts[1] < counts[2]


def test_budget_that_holds_everything_needs_no_checkpoints():
    main, loss = _forward(4)
    assert rg.memory.auto_checkpoints(loss, 100 * ACT, {"x": (N, W)}) == []


def test_too_small_budget_names_the_least_that_fits():
    main, loss = _forward()
    with pytest.raises(rg.ProgramError, match=r"least that fits is \d+ bytes"):
        rg.memory.auto_checkpoints(loss, 2 * ACT, {"x": (N, W)})


def test_run_time_sizes_need_feed_shapes():
    main, loss = _forward(4)
    with pytest.raises(rg.ProgramError, match="feed_shapes"):
        rg.memory.auto_checkpoints(loss, 4 * ACT, None)


def test_auto_checkpoints_leave_the_program_unchanged():
    main, loss = _forward(6)
    before = main.to_json()
    assert rg.memory.auto_checkpoints(loss, 5 * ACT, {"x": (N, W)})
    assert main.to_json() == before
