"""A sweep of memory budgets from store-all down to the least that fits (issue 35): at every
budget the measured peak (``last_stats.peak_bytes``) is within it, it never rises as the budget
falls, and the gradients stay store-all's (the reference: the same model run storing everything,
itself checked against PyTorch in test_budget.py).

PyTorch's min-cut partitioner with ``activation_memory_budget`` is known not to keep its peak
monotonic in the budget (pytorch/pytorch#197838); these tests pin that retrograd's does."""
from __future__ import annotations

import re

import numpy as np
import pytest

import retrograd as rg
from retrograd import Program

POINTS = 8


def _least(build) -> int:
    with pytest.raises(rg.ProgramError, match="the least budget that fits is") as info:
        build(1)
    return int(re.search(r"the least budget that fits is (\d+) bytes", str(info.value)).group(1))


def _sweep(build, feed, params=None):
    """Run store-all and ``POINTS`` budgets from store-all's measured peak down to the least that
    fits; return ``[(budget, peak, outputs)]`` (budget None: store-all), highest budget first."""
    runs = []
    for budget in [None]:
        runs.append(_run(build(budget), feed, params, budget))
    store_all = runs[0][1]
    least = _least(build)
    assert least < store_all
    for budget in np.linspace(store_all, least, POINTS).astype(int).tolist():
        runs.append(_run(build(budget), feed, params, budget))
    return runs


def _run(built, feed, params, budget):
    main, startup, fetch = built
    exe = rg.Executor()
    exe.run(startup)
    for name, value in (params or {}).items():
        exe.scope.set(name, value)
    out = exe.run(main, feed=feed, fetch_list=fetch)
    return budget, exe.last_stats.peak_bytes, out


def _check(runs, rtol, monotonic=True):
    _, _, ref = runs[0]
    scale = max(float(np.max(np.abs(b))) for b in ref)     # an attention key bias's gradient is ~0
    peaks = [peak for _, peak, _ in runs[1:]]
    for budget, peak, out in runs[1:]:
        assert peak <= budget, f"peak {peak} above the budget {budget}"
        for a, b in zip(out, ref):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale)
    rises = [(runs[i + 1][0], peaks[i], peaks[i + 1]) for i in range(len(peaks) - 1) if peaks[i + 1] > peaks[i]]
    assert not rises or not monotonic, f"the measured peak rose as the budget fell: (budget, peak before, peak) {rises}"


def _program(body, shapes, budget):
    main, startup = Program(random_seed=0), Program(random_seed=0)
    with rg.program_guard(main, startup):
        loss = body()
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes=shapes if budget is not None else None)
    return main, startup, [loss] + [g for _, g in pairs]


def test_mlp_peak_within_every_budget_and_never_rising_as_it_falls():
    rows, width, layers = 256, 32, 16

    def body():
        h = rg.data("x", [-1, width], dtype="float64")
        for i in range(layers):
            h = rg.layers.fc(h, width, act="tanh", name=f"fc{i}")
        return rg.mean(h * h)

    feed = {"x": np.random.RandomState(0).randn(rows, width)}
    runs = _sweep(lambda b: _program(body, {"x": (rows, width)}, b), feed)
    _check(runs, rtol=0)         # float64, the same ops on the same values: bit-identical


@pytest.mark.parametrize("policy", ["cheap_first", "tape_first"])     # rg.memory.policies
def test_lstm_language_model_peak_within_every_budget_and_never_rising_as_it_falls(policy):
    """Under ``tape_first`` the peak stays within every budget but is not monotonic: at 76% of
    store-all's peak the recurrence keeps every states tensor (its long tail then holds only the
    gate activations), at 64% the feed-forward part needs that room and the tail copies the
    states, ``h`` as well, which the output layer keeps anyway (+1.5%)."""
    steps, batch, vocab = 48, 8, 24

    def body():
        ids = rg.data("ids", [-1, -1], dtype="int64")
        labels = rg.data("labels", [-1, -1], dtype="int64")
        h_all, _, _, _ = rg.layers.lstm(rg.layers.embedding(ids, vocab, 16, name="emb"), 32, name="lstm")
        return rg.mean(rg.softmax_cross_entropy(rg.layers.fc(h_all, vocab, name="out"), labels))

    rng = np.random.RandomState(1)
    feed = {"ids": rng.randint(0, vocab, (steps, batch)), "labels": rng.randint(0, vocab, (steps, batch))}
    shapes = {"ids": (steps, batch), "labels": (steps, batch)}
    with rg.memory.policies.policy(policy):
        runs = _sweep(lambda b: _program(body, shapes, b), feed)
    _check(runs, rtol=2e-5, monotonic=policy != "tape_first")      # float32; sums regrouped per segment


def test_transformer_language_model_peak_within_every_budget_and_never_rising_as_it_falls():
    batch, length, width, vocab = 4, 16, 32, 24

    def body():
        ids = rg.data("ids", [-1, length], dtype="int64")
        labels = rg.data("labels", [-1, length], dtype="int64")
        x = rg.layers.embedding(ids, vocab, width, name="emb")
        for i in range(2):
            x = rg.layers.transformer_block(x, num_heads=2, name=f"blk{i}")
        return rg.mean(rg.softmax_cross_entropy(rg.layers.fc(x, vocab, name="head"), labels))

    rng = np.random.RandomState(2)
    feed = {"ids": rng.randint(0, vocab, (batch, length)), "labels": rng.randint(0, vocab, (batch, length))}
    shapes = {"ids": (batch, length), "labels": (batch, length)}
    runs = _sweep(lambda b: _program(body, shapes, b), feed)
    _check(runs, rtol=2e-5)      # float32; micro-batches sum the gradients in another order


def test_time_major_transformer_language_model_peak_within_every_budget_and_never_rising_as_it_falls():
    """``retrograd train --model transformer``'s model, fed time-major windows (micro-batches split
    them along axis 1)."""
    from retrograd.models.charlm import ModelConfig, build_net
    length, batch = 16, 4
    cfg = ModelConfig(model="transformer", hidden=32, layers=2, embed=16, heads=2)

    def body():
        net = build_net(cfg, length, with_states=False)
        targets = rg.data("next_chars", [length, -1], dtype="int64")
        return rg.mean(rg.softmax_cross_entropy(net.logits, rg.reshape(targets, [-1])))

    rng = np.random.RandomState(4)
    vocab = len(cfg.vocab)
    feed = {"chars": rng.randint(0, vocab, (length, batch)), "next_chars": rng.randint(0, vocab, (length, batch))}
    shapes = {name: (length, batch) for name in feed}
    runs = _sweep(lambda b: _program(body, shapes, b), feed)
    _check(runs, rtol=2e-5)      # float32; micro-batches sum the gradients in another order
