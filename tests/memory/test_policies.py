"""Recompute policies of the memory budget (``retrograd/memory/policies.py``): ``cheap_first`` (the
default) first frees what the backward reads only for its shape, then as ``keep_tail`` keeps the
last segment's tape of a budgeted recurrence from its forward sweep; ``checkpoints`` re-runs every
segment. All give store-all's gradients (the reference: the same
program storing everything, itself checked against PyTorch in test_step_rows.py / test_budget.py),
both stay within the budget, and keep_tail re-runs fewer steps."""
from __future__ import annotations

import re

import numpy as np
import pytest

import retrograd as rg
from retrograd import Program
from retrograd.memory.loops.schedules import Reverse, make_plan

STEPS, BATCH, VOCAB = 40, 4, 16
SHAPES = {"ids": (STEPS, BATCH), "labels": (STEPS, BATCH)}
RNG = np.random.RandomState(3)
FEED = {"ids": RNG.randint(0, VOCAB, (STEPS, BATCH)), "labels": RNG.randint(0, VOCAB, (STEPS, BATCH))}


def _lm(budget, policy=rg.memory.policies.DEFAULT, dtype="float64", second_gradient=False):
    """The LSTM LM of ``retrograd train`` in small: embedding, one LSTM, the output layer."""
    main, startup = Program(random_seed=0), Program(random_seed=0)
    with rg.memory.policies.policy(policy), rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, -1], dtype="int64")
        labels = rg.data("labels", [-1, -1], dtype="int64")
        x = rg.layers.embedding(ids, VOCAB, 8, name="emb", dtype=dtype)
        h_all, _, _, _ = rg.layers.lstm(x, 12, name="lstm")
        loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(h_all, VOCAB, name="out"), labels))
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes=SHAPES if budget else None)
        fetch = [loss] + [g for _, g in pairs]
        if second_gradient:                                    # a second backward of the same forward
            fetch += rg.gradients(loss, [x])
    return main, startup, fetch


def _run(built, backend=None):
    main, startup, fetch = built
    exe = rg.Executor() if backend is None else rg.Executor(backend=backend.name, device=backend.device)
    exe.run(startup)
    out = exe.run(main, feed=FEED, fetch_list=fetch)
    return [np.asarray(v) for v in out], exe


def _store_all_peak():
    _, exe = _run(_lm(None))
    return exe.last_stats.peak_bytes


def _recurrent(main):
    return next(op for op in main.global_block().ops if op.type == "RecurrentNetwork")


def test_the_default_policy_is_keep_tail_and_unknown_names_are_refused():
    assert rg.memory.policies.current() == rg.memory.policies.DEFAULT == "cheap_first"
    with pytest.raises(rg.ProgramError, match="unknown memory policy 'fastest'"):
        with rg.memory.policies.policy("fastest"):
            pass
    assert rg.memory.policies.current() == "cheap_first"


@pytest.mark.parametrize("share", [0.5, 0.3])
def test_keep_tail_gradients_equal_store_all_within_the_budget(backend, share):
    """float64 on every backend: keep_tail's and checkpoints' gradients are store-all's, and the
    measured peak is within the budget."""
    ref, _ = _run(_lm(None), backend)
    budget = int(share * _store_all_peak())
    for policy in ("cheap_first", "keep_tail", "checkpoints"):
        built = _lm(budget, policy)
        if policy != "cheap_first":
            assert bool(_recurrent(built[0]).attrs["budget_tail"]) == (policy == "keep_tail")
        out, exe = _run(built, backend)
        assert exe.last_stats.peak_bytes <= budget, (policy, exe.last_stats.peak_bytes, budget)
        for got, want in zip(out, ref):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-13, err_msg=policy)


@pytest.mark.parametrize("share", [0.5, 0.3])
def test_keep_tail_reruns_the_last_segment_no_more(share):
    """The forward keeps the last segment's tape: that segment's steps (a whole segment: the
    segments are laid from the end) are not run again, so a step runs fewer ops than under
    ``checkpoints``, by at least the recurrence's ops per step times the segment."""
    budget = int(share * _store_all_peak())
    runs = {}
    for policy in ("keep_tail", "checkpoints"):
        built = _lm(budget, policy)
        out, exe = _run(built)
        rnn = _recurrent(built[0])
        schedule = exe.run(built[0], feed=FEED, fetch_list=built[2] + [rnn.outputs[-1]])[-1]
        runs[policy] = (exe.last_stats.ops_run, [int(v) for v in schedule])
    (tail_ops, (steps, segment, slots, *_)), (ckpt_ops, ckpt_schedule) = runs["keep_tail"], runs["checkpoints"]
    assert ckpt_schedule[:3] == [steps, segment, slots] and segment < steps     # the same schedule
    step_ops = len(rnn.attrs["step"].ops) - 1      # the input projection runs per chunk of steps
    # (and with few checkpoints, the advance to the last segment's start is not run either)
    assert ckpt_ops - tail_ops >= segment * step_ops, (ckpt_ops, tail_ops, segment)


def test_bug_keep_tail_second_gradient_reads_an_unclobbered_tail():
    """``rg.gradients`` after ``append_backward`` builds a second gradient op reading the same
    tail: the first must not reuse the tail's buffers for its other segments (it did: the second
    op's input gradient was off by 4e-3)."""
    budget = int(0.3 * _store_all_peak())
    ref, _ = _run(_lm(None, second_gradient=True))
    out, _ = _run(_lm(budget, second_gradient=True))
    for got, want in zip(out, ref):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-13)


def test_aligned_plan_makes_the_last_segment_whole():
    plain, aligned = make_plan(64, 31, 2), make_plan(64, 31, 2, align_end=True)
    first = lambda plan: next(a for a in plan.actions() if isinstance(a, Reverse))  # noqa: E731
    assert first(plain) == Reverse(62, 64) and first(aligned) == Reverse(33, 64)
    assert len(plain.sweep_stores) == len(aligned.sweep_stores) and aligned.advances == plain.advances == 0
    reversed_steps = sorted((a.start, a.stop) for a in aligned.actions() if isinstance(a, Reverse))
    assert reversed_steps == [(0, 2), (2, 33), (33, 64)]


def test_cheap_first_stores_everything_but_what_the_backward_reads_for_its_shape(backend):
    """A budget a little under store-all's peak: cheap_first frees the LSTM's input projection
    ``[T, N, 4H]`` (its store-all backward reads it for its shape alone) and recomputes nothing,
    so the gradients are store-all's bit for bit; keep_tail budgets the recurrence instead."""
    ref, exe = _run(_lm(None), backend)
    projection = STEPS * BATCH * 4 * 12 * 8                  # float64 [T, N, 4H]
    budget = exe.last_stats.peak_bytes - projection // 2
    built = _lm(budget)
    main = built[0]
    assert main.memory_plan.activation_budget is None and main.memory_plan.planned_peak <= budget
    assert _recurrent(main).attrs.get("recompute") is None
    grad = next(op for op in main.global_block().ops if op.type == "RecurrentNetworkGrad")
    assert grad.inputs[0].endswith(".shape")                 # the projection read through a stand-in
    out, exe = _run(built, backend)
    assert exe.last_stats.peak_bytes <= budget
    for got, want in zip(out, ref):
        np.testing.assert_array_equal(got, want)
    other = _lm(budget, "keep_tail")[0]
    assert other.memory_plan.activation_budget is not None and _recurrent(other).attrs["recompute"] is not None


def test_keep_tail_never_raises_the_least_budget():
    """A kept tail is live between the forward and the backward: at the least budgets the
    recurrences keep none, so every policy names the same least budget, and that budget runs."""
    least = {}
    for policy in ("cheap_first", "keep_tail", "checkpoints", "tape_first"):
        with pytest.raises(rg.ProgramError, match="the least budget that fits is") as info:
            _lm(1000, policy)
        least[policy] = int(re.search(r"the least budget that fits is (\d+) bytes", str(info.value)).group(1))
    assert len(set(least.values())) == 1, least
    built = _lm(least["keep_tail"], "keep_tail")
    ref, _ = _run(_lm(None))
    out, exe = _run(built)
    assert exe.last_stats.peak_bytes <= least["keep_tail"]
    for got, want in zip(out, ref):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("share", [0.6, 0.3])
def test_tape_first_gradients_equal_store_all_within_the_budget(backend, share):
    """float64 on every backend: with a long kept tail (at 60% the forward keeps 37 of 40 steps'
    tape) and a short one (30%), the gradients are store-all's and the measured peak is within the
    budget."""
    ref, _ = _run(_lm(None), backend)
    budget = int(share * _store_all_peak())
    built = _lm(budget, "tape_first")
    rnn = _recurrent(built[0])
    assert rnn.attrs["budget_long_tail"]
    out, exe = _run(built, backend)
    assert exe.last_stats.peak_bytes <= budget, (exe.last_stats.peak_bytes, budget)
    for got, want in zip(out, ref):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-13)
    steps, segment, _, _, tail, _ = (int(v) for v in exe.run(built[0], feed=FEED, fetch_list=[rnn.outputs[-1]])[0])
    assert steps == STEPS and (tail > STEPS // 2 if share > 0.5 else tail >= 0), (segment, tail)


def test_tape_first_second_gradient_keeps_the_one_segment_tail():
    """A second gradient op reads the same tail: the backward may then neither write time-batched
    rows into the tail's rows nor re-run steps into its buffers, so the forward keeps the
    one-segment tail of keep_tail (schedule tail 0); the first gradient's long tail comes back
    without the second. Gradients are store-all's either way."""
    budget = int(0.6 * _store_all_peak())
    for second, long in ((True, False), (False, True)):
        ref, _ = _run(_lm(None, second_gradient=second))
        built = _lm(budget, "tape_first", second_gradient=second)
        out, exe = _run(built)
        rnn = _recurrent(built[0])
        assert (int(exe.run(built[0], feed=FEED, fetch_list=[rnn.outputs[-1]])[0][4]) > 0) == long
        assert exe.last_stats.peak_bytes <= budget
        for got, want in zip(out, ref):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("share", [0.7, 0.35])
def test_tape_first_gru_writes_each_gradient_row_into_a_tape_row(share):
    """A GRU step's backward batches two gradients over time (its input projection's and the
    recurrent half's); each is written into a tape row of its shape once the step's backward
    has read it (``rnn_budget.into_tape``): the gradients stay store-all's, within the budget,
    with a tail of most steps (70%) and of a few (35%; its one state, read by the output layer,
    is kept whole)."""
    def gru_lm(budget):
        main, startup = Program(random_seed=0), Program(random_seed=0)
        with rg.memory.policies.policy("tape_first"), rg.program_guard(main, startup):
            ids = rg.data("ids", [-1, -1], dtype="int64")
            labels = rg.data("labels", [-1, -1], dtype="int64")
            h_all, _ = rg.layers.gru(rg.layers.embedding(ids, VOCAB, 8, name="emb", dtype="float64"), 12, name="gru")
            loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(h_all, VOCAB, name="out"), labels))
            pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes=SHAPES if budget else None)
        return main, startup, [loss] + [g for _, g in pairs]

    ref, exe = _run(gru_lm(None))
    budget = int(share * exe.last_stats.peak_bytes)
    built = gru_lm(budget)
    rnn = _recurrent(built[0])
    assert len(rnn.attrs["budget_into_tape"]) == 2 and not rnn.attrs["budget_batched_unaliased"]
    out, exe = _run(built)
    assert exe.last_stats.peak_bytes <= budget
    schedule = [int(v) for v in exe.run(built[0], feed=FEED, fetch_list=[rnn.outputs[-1]])[0]]
    assert schedule[3] == 1 and 0 < schedule[4] and (schedule[4] > STEPS // 2) == (share > 0.5), schedule
    for got, want in zip(out, ref):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-13)
