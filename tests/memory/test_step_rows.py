"""memory/step_rows.py: a budgeted recurrence runs the ops of its step that read no state over
chunks of steps (the input projection; its input and bias gradients once per segment), and
re-runs a segment's steps at once from kept states tensors. Gradients against store-all's
(itself checked against PyTorch in test_rnn_budget.py) and against PyTorch float64 here; the
number of ops run and the peak against the budget."""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd.memory.loops.schedules import make_plan
from retrograd.memory.loops.step_rows import (ROWS_MAX, row_bytes, rows_batchable, rows_chunk)

T, N, V, E, H = 400, 8, 16, 8, 32


def lstm_lm(budget=None, dtype="float64"):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, -1], dtype="int64")
        labels = rg.data("labels", [-1, -1], dtype="int64")
        emb = rg.layers.embedding(ids, V, E, name="emb", dtype=dtype)
        h_all, _, _, _ = rg.layers.lstm(emb, H, name="lstm")
        loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(h_all, V, name="out"), labels))
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes={"ids": (T, N), "labels": (T, N)})
    return main, startup, [loss] + [g for _, g in pairs], [p.name for p, _ in pairs]


def _feed():
    rng = np.random.RandomState(3)
    return {"ids": rng.randint(0, V, (T, N)), "labels": rng.randint(0, V, (T, N))}


def _run(budget, params=None):
    main, startup, fetch, names = lstm_lm(budget)
    exe = rg.Executor()
    exe.run(startup)
    for name, value in (params or {}).items():
        exe.scope.set(name, value)
    out = exe.run(main, feed=_feed(), fetch_list=fetch)
    return main, exe, out, names


@pytest.fixture(scope="module")
def store_all():
    main, exe, out, names = _run(None)
    return {n: exe.scope.get(n) for n in names}, out, exe.last_stats.peak_bytes, exe.last_stats.ops_run, names


def _torch_grads(params: dict):
    """The same model in PyTorch float64: embedding, LSTM (gates i, f, g, o), linear, cross-entropy."""
    p = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    feed = _feed()
    x = p["emb.w"][torch.tensor(feed["ids"])]
    h = torch.zeros(N, H, dtype=torch.float64)
    c = torch.zeros(N, H, dtype=torch.float64)
    w_ih, w_hh, b = p["lstm.w_ih"], p["lstm.w_hh"], p["lstm.b"]
    hs = []
    for t in range(T):
        gates = x[t] @ w_ih + h @ w_hh + b
        i, f, g, o = gates.split(H, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        hs.append(h)
    logits = torch.stack(hs) @ p["out.w"] + p["out.b"]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), torch.tensor(feed["labels"]).reshape(-1))
    loss.backward()
    return loss.item(), {k: v.grad.numpy() for k, v in p.items()}


def _recurrent(main, type_="RecurrentNetwork"):
    return next(op for op in main.global_block().ops if op.type == type_)


@pytest.mark.parametrize("share", [0.6, 0.25])    # the states tensors kept; checkpoints
def test_budgeted_lstm_lm_gradients_equal_store_all_and_pytorch(store_all, share):
    params, expected, peak, _, names = store_all
    if set(params) != {"emb.w", "lstm.w_ih", "lstm.w_hh", "lstm.b", "out.w", "out.b"}:
        pytest.skip(f"parameter names changed: {sorted(params)}")
    budget = int(share * peak)
    main, exe, out, _ = _run(budget, params)
    assert exe.last_stats.peak_bytes <= budget
    for got, want in zip(out, expected):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-13)
    loss, grads = _torch_grads(params)
    np.testing.assert_allclose(out[0], loss, rtol=1e-10)
    for name, got in zip(names, out[1:]):
        np.testing.assert_allclose(got, grads[name], rtol=1e-8, atol=1e-12, err_msg=name)


def test_input_projection_runs_per_chunk_and_its_gradients_per_segment(store_all):
    """At 25% the LSTM checkpoints (no states tensor kept); each step run (the forward sweep, the
    re-runs of its schedule) runs the recurrence's two ops, each backward step two: not the
    projection, input gradient and bias gradient step by step (3 and 4 ops)."""
    params, _, peak, _, _ = store_all
    main, exe, out, _ = _run(int(0.25 * peak), params)
    rnn = _recurrent(main)
    assert not rnn.attrs.get("budget_keep_states") and not all(rnn.attrs["budget_all"])
    ops_run = exe.last_stats.ops_run
    total, segment, slots, _ = exe.run(main, feed=_feed(), fetch_list=[rnn.outputs[-1]])[0][:4]
    plan = make_plan(int(total), int(segment), int(slots), align_end=True)
    # sweep, tape, advances; the last segment's tape the forward kept (memory/policies.py, keep_tail)
    assert rnn.attrs["budget_tail"]
    step_runs = 2 * T + plan.advances - min(int(segment), T)
    chunk = rows_chunk(T, main.memory_plan.activation_budget, N * 4 * H * 8)
    segments = -(-T // int(segment))
    batched = 2 * (-(-T // chunk) + segments) + 2 * segments    # projection chunks; dx, db per segment
    outside = 25
    assert 2 * step_runs + 2 * T < ops_run <= 2 * step_runs + 2 * T + batched + outside, (ops_run, step_runs)


def test_a_larger_budget_keeps_the_states_and_reruns_segments_at_once(store_all):
    """At 60% every states tensor fits (at 40% not with segments of KEPT_SEGMENT steps): the
    backward re-runs each segment's steps as one block run per chunk, so only the forward sweep
    and the backward run step by step (4 T ops)."""
    params, _, peak, _, _ = store_all
    budget = int(0.6 * peak)
    main, exe, _, _ = _run(budget, params)
    rnn = _recurrent(main)
    assert rnn.attrs.get("budget_keep_states") and all(rnn.attrs["budget_all"])
    measured, planned, ops_run = exe.last_stats.peak_bytes, main.memory_plan.planned_peak, exe.last_stats.ops_run
    assert measured <= budget
    assert abs(planned - measured) <= 0.1 * measured, (planned, measured)
    step = rnn.attrs["step"]
    chunk = rows_chunk(T, main.memory_plan.activation_budget, row_bytes(step, step.ops, N))
    _, segment, _, from_alls = exe.run(main, feed=_feed(), fetch_list=[rnn.outputs[-1]])[0][:4]
    segments = -(-T // int(segment))
    at_once = 3 * (-(-T // chunk) + segments)       # a chunk's projection, MatMul and LSTMUnit
    at_once += -(-T // rows_chunk(T, main.memory_plan.activation_budget, N * 4 * H * 8))   # the sweep's projection
    assert chunk > 1 and from_alls == 1
    assert 4 * T < ops_run <= 4 * T + at_once + 2 * segments + 25, (ops_run, chunk, segments)


def test_lstm_step_is_row_wise_and_a_timestep_reading_step_is_not():
    main, _, _, _ = lstm_lm(1 << 40)        # stores everything: the plain step block
    rnn = _recurrent(main)
    outer = rnn.inputs[len(rnn.attrs["inputs_t"]) + len(rnn.attrs["states"]):]
    assert rows_batchable(rnn.attrs["step"], rnn.attrs, outer)
    assert not rows_batchable(rnn.attrs["step"], {**rnn.attrs, "has_lengths": True}, outer)
    assert not rows_batchable(rnn.attrs["step"], rnn.attrs, [])        # weights no longer outer values


def test_rows_chunk_takes_a_sixteenth_of_the_budget_within_one_and_rows_max_steps():
    assert rows_chunk(400, 16 * 1000 * 10, 1000) == 10
    assert rows_chunk(400, 1, 1000) == 1
    assert rows_chunk(400, 1 << 40, 1000) == ROWS_MAX
    assert rows_chunk(5, 1 << 40, 1000) == 5


def test_a_recurrence_whose_states_nothing_reads_keeps_checkpoints_at_any_budget():
    """Keeping every states tensor would put T-long tensors outside the loop's budget that the
    program did not hold before (at a longer run-time length they outgrow it): not done."""
    shapes = {"x": (T, N, E)}

    def build(budget):
        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, -1, E], dtype="float64")
            _, h_last, _, _ = rg.layers.lstm(x, H, name="lstm")
            loss = rg.mean(h_last * h_last)
            pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes=shapes)
        return main, [loss] + [g for _, g in pairs]

    main, fetch = build(None)
    store = rg.memory.report(main, shapes, fetch_list=fetch).planned_peak
    for share in (0.6, 0.3):
        main, _ = build(int(share * store))
        rnn = _recurrent(main)
        assert main.memory_plan.activation_budget is not None           # the budget binds
        assert not rnn.attrs.get("budget_keep_states") and not any(rnn.attrs["budget_all"])


def test_gru_step_is_row_wise():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        rg.layers.gru(rg.data("x", [-1, -1, E]), H, name="gru")
    rnn = _recurrent(main)
    outer = rnn.inputs[len(rnn.attrs["inputs_t"]) + len(rnn.attrs["states"]):]
    assert rows_batchable(rnn.attrs["step"], rnn.attrs, outer)


@pytest.mark.parametrize("share", [0.6, 0.25])    # the states tensors kept; checkpoints
def test_tape_first_keeps_a_long_tail_reruns_less_and_matches_pytorch(store_all, share):
    """memory/policies.py, "tape_first": the forward keeps the tape of as many last steps as the
    budget holds (more than one segment), the backward re-runs only the steps before them, and the
    gradients are store-all's and PyTorch's, within the budget."""
    params, expected, peak, _, names = store_all
    budget = int(share * peak)
    runs = {}
    for policy in ("tape_first", "cheap_first"):
        with rg.memory.policies.policy(policy):
            main, exe, out, _ = _run(budget, params)
        runs[policy] = (exe.last_stats.ops_run, exe.last_stats.peak_bytes)
        rnn = _recurrent(main)
        assert rnn.attrs["budget_long_tail"] == (policy == "tape_first")
        schedule = [int(v) for v in exe.run(main, feed=_feed(), fetch_list=[rnn.outputs[-1]])[0]]
        assert exe.last_stats.peak_bytes <= budget, (policy, exe.last_stats.peak_bytes, budget)
        for got, want in zip(out, expected):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-13, err_msg=policy)
        if policy == "tape_first":
            total, segment, _, from_alls, tail, _ = schedule
            assert total == T and tail >= segment and tail > T // 5 and from_alls == (share > 0.5), schedule
            loss, grads = _torch_grads(params)
            np.testing.assert_allclose(out[0], loss, rtol=1e-10)
            for name, got in zip(names, out[1:]):
                np.testing.assert_allclose(got, grads[name], rtol=1e-8, atol=1e-12, err_msg=name)
    assert runs["tape_first"][0] < runs["cheap_first"][0], runs       # fewer steps re-run
