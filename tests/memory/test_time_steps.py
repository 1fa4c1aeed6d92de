"""``memory/time_steps.py``: row-wise ops over a recurrence's states tensor moved into its step,
so a memory budget recomputes them with the steps: the same losses and gradients, and an LSTM
language model's least budget a few time steps' worth plus parameters."""
from __future__ import annotations

import re

import numpy as np
import pytest

import retrograd as rg
from retrograd.memory.sizes import resolve_shapes
from retrograd.memory.loops.time_steps import sink_time_step_ops

T, N, V, E, H = 12, 3, 10, 5, 6


def _rnn_head(fuse: bool = False, extra_reader: bool = False):
    """tanh RNN over embeddings -> fc(V) over all steps -> softmax_cross_entropy -> mean (float64)."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, -1], dtype="int64")
        labels = rg.data("labels", [-1, -1], dtype="int64")
        x = rg.layers.embedding(ids, V, E, name="emb", dtype="float64")
        h0 = rg.data("h0", [-1, H], dtype="float64")
        u = rg.create_parameter("u", [E + H, H], dtype="float64")
        (h_all,), _ = rg.recurrent(lambda xs, hs: [rg.tanh(rg.matmul(rg.concat([xs[0], hs[0]], -1), u))],
                                   [x], [h0])
        if fuse:
            w = rg.create_parameter("out.w", [H, V], dtype="float64")
            b = rg.create_parameter("out.b", [V], dtype="float64", init="zeros")
            xent = rg.linear_cross_entropy(h_all, w, b, labels)
        else:
            xent = rg.softmax_cross_entropy(rg.layers.fc(h_all, V, name="out"), labels)
        loss = rg.mean(xent)
        if extra_reader:
            loss = loss + rg.mean(h_all)
    return main, startup, loss


def _feed():
    rng = np.random.RandomState(0)
    return {"ids": rng.randint(0, V, (T, N)), "labels": rng.randint(0, V, (T, N)), "h0": rng.randn(N, H)}


SHAPES = {"ids": (T, N), "labels": (T, N), "h0": (N, H)}


def _run(main, startup, loss, scope=None):
    with rg.program_guard(main, startup):
        pairs = rg.append_backward(loss)
    exe = rg.Executor()
    if scope is None:
        exe.run(startup)
    else:
        exe.scope = scope
    return exe.run(main, feed=_feed(), fetch_list=[loss] + [g for _, g in pairs]), exe.scope


@pytest.mark.parametrize("fuse", [False, True])
def test_moved_output_layer_and_loss_give_the_same_loss_and_gradients(fuse):
    expected, scope = _run(*_rnn_head(fuse))
    main, startup, loss = _rnn_head(fuse)
    block = main.global_block()
    moved = sink_time_step_ops(main, block, resolve_shapes(block, SHAPES))
    assert moved == (1 if fuse else 3)
    rnn = next(op for op in block.ops if op.type == "RecurrentNetwork")
    step_types = [op.type for op in rnn.attrs["step"].ops]
    assert ("LinearCrossEntropy" if fuse else "SoftmaxCrossEntropy") in step_types
    assert not any(op.type in ("SoftmaxCrossEntropy", "LinearCrossEntropy", "SeqLinear") for op in block.ops)
    got, _ = _run(main, startup, loss, scope)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_states_tensor_read_elsewhere_stays_where_it_is():
    main, _, _ = _rnn_head(extra_reader=True)
    block = main.global_block()
    assert sink_time_step_ops(main, block, resolve_shapes(block, SHAPES)) == 0


LT, LN, LV, LE, LH = 400, 16, 64, 32, 128      # the language model of issue 24


def _lm(budget):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, -1], dtype="int64")
        labels = rg.data("labels", [-1, -1], dtype="int64")
        h_all, _, _, _ = rg.layers.lstm(rg.layers.embedding(ids, LV, LE, name="emb"), LH, name="lstm")
        loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(h_all, LV, name="out"), labels))
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes={"ids": (LT, LN), "labels": (LT, LN)})
    return main, startup, [loss] + [g for _, g in pairs], [p.name for p, _ in pairs]


def test_lstm_language_models_least_budget_is_under_a_tenth_of_store_alls_peak_with_equal_gradients():
    rng = np.random.RandomState(1)
    feed = {"ids": rng.randint(0, LV, (LT, LN)), "labels": rng.randint(0, LV, (LT, LN))}
    main, startup, fetch, names = _lm(None)
    exe = rg.Executor()
    exe.run(startup)
    expected = exe.run(main, feed=feed, fetch_list=fetch)
    store = exe.last_stats.peak_bytes
    with pytest.raises(rg.ProgramError) as info:
        _lm(1)
    least = int(re.search(r"the least budget that fits is (\d+) bytes", str(info.value)).group(1))
    assert least <= 0.1 * store, (least, store)
    budget = int(0.1 * store)
    main, _, fetch, got_names = _lm(budget)
    rnn = next(op for op in main.global_block().ops if op.type == "RecurrentNetwork")
    assert "LinearCrossEntropy" in [op.type for op in rnn.attrs["step"].ops]
    got = exe.run(main, feed=feed, fetch_list=fetch)
    assert exe.last_stats.peak_bytes <= budget
    assert got_names == names
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * np.abs(b).max())
