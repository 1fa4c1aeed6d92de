"""The planner's peak (``rg.memory.report``, ``BudgetPlan.planned_peak``, the least budget a
refused ``memory_budget`` names) against ``exe.last_stats.peak_bytes`` of the same run: within
10% on an LSTM language model, an MLP and a transformer stack, stored whole and under budgets."""
from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import pytest

import retrograd as rg

T, N, V, E, H = 400, 16, 64, 32, 128          # the language model of issue 24
LM_SHAPES = {"ids": (T, N), "labels": (T, N)}
SHORT = 100          # the least budget runs its loop with one step's tape: quadratic in T


def lstm_lm(budget=None, steps=T):
    """embedding -> layers.lstm -> layers.fc over all steps -> softmax_cross_entropy."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, -1], dtype="int64")
        labels = rg.data("labels", [-1, -1], dtype="int64")
        h_all, _, _, _ = rg.layers.lstm(rg.layers.embedding(ids, V, E, name="emb"), H, name="lstm")
        loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(h_all, V, name="out"), labels))
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes={"ids": (steps, N), "labels": (steps, N)})
    return main, startup, [loss] + [g for _, g in pairs]


def lm_feed(steps=T):
    rng = np.random.RandomState(0)
    return {"ids": rng.randint(0, V, (steps, N)), "labels": rng.randint(0, V, (steps, N))}


def short_lm(budget=None):
    return lstm_lm(budget, SHORT)


def short_lm_feed():
    return lm_feed(SHORT)


ROWS, WIDTH, LAYERS = 512, 128, 6


def mlp(budget=None):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        h = rg.data("x", [-1, WIDTH])
        for i in range(LAYERS):
            h = rg.layers.fc(h, WIDTH, act="tanh", name=f"fc{i}")
        loss = rg.mean(h * h)
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes={"x": (ROWS, WIDTH)})
    return main, startup, [loss] + [g for _, g in pairs]


def mlp_feed():
    return {"x": np.random.RandomState(1).randn(ROWS, WIDTH).astype("float32")}


B, L, D, HEADS, BLOCKS = 4, 32, 32, 4, 3


def _attention(x, name):
    dh = D // HEADS

    def heads(t):            # [B, L, D] -> [B, HEADS, L, dh]
        return rg.transpose(rg.reshape(t, [B, L, HEADS, dh]), [0, 2, 1, 3])
    q, k, v = (heads(rg.layers.fc(x, D, name=f"{name}.{p}")) for p in "qkv")
    scores = rg.softmax(rg.matmul(q, rg.transpose(k, [0, 1, 3, 2])) * (1.0 / dh ** 0.5))
    out = rg.reshape(rg.transpose(rg.matmul(scores, v), [0, 2, 1, 3]), [B, L, D])
    return rg.layers.fc(out, D, name=f"{name}.o")


def _block(x, name):
    block = getattr(rg.layers, "transformer_block", None)
    if block is not None:
        return block(x, num_heads=HEADS, name=name)
    x = x + _attention(rg.layers.layer_norm(x, name=f"{name}.ln1"), f"{name}.att")
    h = rg.layers.layer_norm(x, name=f"{name}.ln2")
    return x + rg.layers.fc(rg.layers.fc(h, 4 * D, act="tanh", name=f"{name}.fc1"), D, name=f"{name}.fc2")


def transformer(budget=None):
    """A stack of pre-norm blocks (``layers.transformer_block`` where it exists) with an LM head."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [B, L], dtype="int64")
        labels = rg.data("labels", [B, L], dtype="int64")
        x = rg.layers.embedding(ids, V, D, name="emb")
        for i in range(BLOCKS):
            x = _block(x, f"blk{i}")
        loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(x, V, name="head"), labels))
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes={})
    return main, startup, [loss] + [g for _, g in pairs]


def transformer_feed():
    rng = np.random.RandomState(2)
    return {"ids": rng.randint(0, V, (B, L)), "labels": rng.randint(0, V, (B, L))}


MODELS = {"lstm_lm": (lstm_lm, lm_feed, LM_SHAPES), "mlp": (mlp, mlp_feed, {"x": (ROWS, WIDTH)}),
          "transformer": (transformer, transformer_feed, {})}


def _run(build, feed, budget=None, params=None):
    main, startup, fetch = build(budget)
    exe = rg.Executor()
    exe.run(startup)
    for name, value in (params or {}).items():
        exe.scope.set(name, value)
    out = exe.run(main, feed=feed, fetch_list=fetch)
    return main, exe, fetch, out


def _least_budget(build) -> int:
    with pytest.raises(rg.ProgramError, match="the least budget that fits is") as info:
        build(1)
    return int(re.search(r"the least budget that fits is (\d+) bytes", str(info.value)).group(1))


def _close(planned: int, measured: int) -> bool:
    return abs(planned - measured) <= 0.1 * measured


@pytest.mark.parametrize("model", sorted(MODELS))
def test_reported_store_all_peak_is_within_ten_percent_of_the_measured_one(model):
    build, feed, shapes = MODELS[model]
    main, exe, fetch, _ = _run(build, feed())
    planned = rg.memory.report(main, shapes, fetch_list=fetch).planned_peak
    assert _close(planned, exe.last_stats.peak_bytes), (planned, exe.last_stats.peak_bytes)


LEAST = {**MODELS, "lstm_lm": (short_lm, short_lm_feed, {})}


@pytest.mark.parametrize("model", sorted(LEAST))
def test_least_budget_named_is_within_ten_percent_of_the_peak_of_a_run_under_it(model):
    build, feed, _ = LEAST[model]
    least = _least_budget(build)
    main, exe, _, _ = _run(build, feed(), least)
    measured = exe.last_stats.peak_bytes
    assert measured <= least and _close(least, measured), (least, measured)
    assert main.memory_plan.planned_peak <= least


def test_store_all_peak_named_in_the_refusal_is_the_measured_one():
    """The refusal's "storing everything peaks at" number (63.9 MB planned against 51 MB measured
    before the time-batched gradient buffer that aliases the input gradient was counted once)."""
    with pytest.raises(rg.ProgramError) as info:
        lstm_lm(1)
    stored = int(re.search(r"storing everything peaks at (\d+) bytes", str(info.value)).group(1))
    _, exe, _, _ = _run(lstm_lm, lm_feed())
    assert _close(stored, exe.last_stats.peak_bytes), (stored, exe.last_stats.peak_bytes)


def test_budgeted_lstm_checkpoints_planned_as_the_kernel_schedules_them():
    """A budgeted recurrence keeps the checkpoints of the schedule it runs, not its whole budget:
    the planner asks the kernel's own schedule (``rnn_budget.checkpoint_plan``). The schedule
    reserves an LSTM's shared d(gates) rows once per weight they serve (54cfaed: the per-op budget
    needs that room), the report counts the one buffer they are: the planned peak was 29% above
    the measured one when it counted the reservation."""
    _, exe, _, _ = _run(lstm_lm, lm_feed())
    store = exe.last_stats.peak_bytes
    for budget in (store // 2, store // 4):
        main, exe, fetch, _ = _run(lstm_lm, lm_feed(), budget)
        measured = exe.last_stats.peak_bytes
        plan = main.memory_plan
        assert measured <= plan.reserved_peak <= budget
        assert plan.planned_peak <= plan.reserved_peak
        assert _close(plan.planned_peak, measured), (plan.planned_peak, measured)
        reported = rg.memory.report(main, LM_SHAPES, fetch_list=fetch).planned_peak
        assert _close(reported, measured), (reported, measured)


def test_a_split_piece_keeps_its_whole_input_alive_in_the_plan():
    """``Split``'s pieces are views: a piece living past the input's last reader (the Split) keeps
    the whole input's buffer (the micro-batches of a fed batch, memory/micro_batches.py). Counting
    the piece alone planned 135,168 bytes for this run's 163,840."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, 64], dtype="float64")                  # 32 KB fed
        piece = rg.split(x, 8)[7]                                      # a 4 KB view, read to the end
        big = rg.exp(rg.concat([piece] * 16, axis=0))                  # 64 KB, then 64 KB more
        out = rg.mean(big) + rg.mean(piece)
    exe = rg.Executor()
    exe.run(main, feed={"x": np.ones((64, 64))}, fetch_list=[out])
    planned = rg.memory.planned_peak(main.global_block(), [out.name], {"x": (64, 64)})
    assert exe.last_stats.peak_bytes <= planned and _close(planned, exe.last_stats.peak_bytes), \
        (planned, exe.last_stats.peak_bytes)


# --- a budgeted LSTM's backward holds the checkpoints it makes beside the sweep's -----------------

SMALL_T, SMALL_N, SMALL_V = 40, 4, 16
SMALL_SHAPES = {"ids": (SMALL_T, SMALL_N), "labels": (SMALL_T, SMALL_N)}
SHARES = [0.18, 0.21, 0.22, 0.27, 0.35]       # three that went over (0.21: under every policy), and around them


@lru_cache(maxsize=None)
def _small_lm(budget, policy):
    """tests/memory/test_policies.py's LM: embedding 8, one LSTM of 12, the output layer, float64."""
    main, startup = rg.Program(random_seed=0), rg.Program(random_seed=0)
    with rg.memory.policies.policy(policy), rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, -1], dtype="int64")
        labels = rg.data("labels", [-1, -1], dtype="int64")
        x = rg.layers.embedding(ids, SMALL_V, 8, name="emb", dtype="float64")
        h_all, _, _, _ = rg.layers.lstm(x, 12, name="lstm")
        loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(h_all, SMALL_V, name="out"), labels))
        try:
            pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes=SMALL_SHAPES if budget else None)
        except rg.ProgramError as error:
            return error
    return main, startup, [loss] + [g for _, g in pairs]


def _small_feed():
    rng = np.random.RandomState(3)
    return {"ids": rng.randint(0, SMALL_V, (SMALL_T, SMALL_N)), "labels": rng.randint(0, SMALL_V, (SMALL_T, SMALL_N))}


@lru_cache(maxsize=None)
def _small_store_all_peak() -> int:
    main, startup, fetch = _small_lm(None, rg.memory.policies.DEFAULT)
    exe = rg.Executor()
    exe.run(startup)
    exe.run(main, feed=_small_feed(), fetch_list=fetch)
    return exe.last_stats.peak_bytes


def test_budgeted_lstm_backward_checkpoints_in_dropped_sweep_slots_planned_within_budget(backend, mm):
    """At 22% of store-all's peak (57,307 bytes) this LM planned 55,448 bytes and measured 57,848
    (58,648 under cheap_first and keep_tail): the planner counted the backward's checkpoints as the
    schedule's slots less the sweep's, but the sweep's are rows of the forward's checkpoint tensor,
    live until the backward ends, so the states the backward stores in their slots (and the one it
    advanced to) are new memory (``Plan.own_states``: 7 states, 5,600 bytes, where 0 were counted).
    Every share and policy: within the budget, and the planned peak bounds the measured one."""
    store_all = _small_store_all_peak()
    refused = ran = 0
    for share in SHARES:
        budget = int(share * store_all)
        for policy in rg.memory.policies.POLICIES:
            built = _small_lm(budget, policy)
            if isinstance(built, rg.ProgramError):
                assert "the least budget that fits is" in str(built), str(built)
                refused += 1
                continue
            _, exe = mm.run_step(built, _small_feed(), backend)
            measured, plan = exe.last_stats.peak_bytes, built[0].memory_plan
            assert measured <= plan.reserved_peak <= budget, (share, policy, measured, plan)
            assert measured <= plan.planned_peak, (share, policy, measured, plan)
            ran += 1
    assert ran >= 3 * len(SHARES) and refused <= 2 * len(rg.memory.policies.POLICIES), (ran, refused)
