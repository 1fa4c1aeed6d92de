"""``passes.fuse_linear_cross_entropy``: fc -> softmax_cross_entropy becomes one LinearCrossEntropy
op (the same losses and gradients), and the whole-program memory budget uses it when storing
everything does not fit."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.passes.fuse_linear_loss import fuse_linear_cross_entropy

H, V = 16, 24


def _head(shape, bias=True, fetch_logits=False, dtype="float64"):
    """x -> fc(V) (no bias: a bare MatMul / seq_linear) -> softmax_cross_entropy -> mean."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", list(shape) + [H], dtype=dtype)
        labels = rg.data("labels", list(shape), dtype="int64")
        if bias:
            logits = rg.layers.fc(x, V, name="head")
        else:
            w = rg.create_parameter("head.w", [H, V], dtype=dtype)
            logits = rg.matmul(x, w) if len(shape) == 1 else rg.seq_linear(x, w)
        loss = rg.mean(rg.softmax_cross_entropy(logits, labels))
    return main, startup, loss, logits


def _feed(shape, dtype="float64"):
    rng = np.random.RandomState(0)
    return {"x": rng.randn(*shape, H).astype(dtype), "labels": rng.randint(0, V, shape)}


def _losses_and_grads(main, startup, loss, feed, scope=None):
    with rg.program_guard(main, startup):
        pairs = rg.append_backward(loss)
    exe = rg.Executor()
    if scope is None:
        exe.run(startup)
    else:
        exe.scope = scope
    out = exe.run(main, feed=feed, fetch_list=[loss] + [g for _, g in pairs])
    return out, [p.name for p, _ in pairs], exe.scope


@pytest.mark.parametrize("shape,bias", [((12,), True), ((5, 3), True), ((12,), False), ((5, 3), False)])
def test_fused_head_gives_the_losses_and_gradients_of_fc_and_softmax_cross_entropy(shape, bias):
    main, startup, loss, _ = _head(shape, bias)
    expected, names, scope = _losses_and_grads(*_head(shape, bias)[:3], _feed(shape))
    assert fuse_linear_cross_entropy(main) == 1
    types = [op.type for op in main.global_block().ops]
    assert "LinearCrossEntropy" in types and "SoftmaxCrossEntropy" not in types
    got, got_names, _ = _losses_and_grads(main, startup, loss, _feed(shape), scope)
    assert got_names == names
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_logits_read_elsewhere_are_not_fused():
    main, _, loss, logits = _head((12,))
    with rg.program_guard(main):
        rg.mean(rg.softmax(logits))
    assert fuse_linear_cross_entropy(main) == 0
    assert "SoftmaxCrossEntropy" in [op.type for op in main.global_block().ops]


def test_chunk_bytes_sets_the_fused_ops_chunk_rows():
    main, _, _, _ = _head((12,))
    fuse_linear_cross_entropy(main, chunk_bytes=3 * V * 8)
    fused = [op for op in main.global_block().ops if op.type == "LinearCrossEntropy"]
    assert fused[0].attrs["chunk_rows"] == 3


T, N, E, HID, VOCAB = 40, 4, 8, 16, 96


def _lm(budget):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, -1], dtype="int64")
        labels = rg.data("labels", [-1, -1], dtype="int64")
        h = rg.tanh(rg.layers.fc(rg.layers.embedding(ids, VOCAB, E, name="emb"), HID, name="hid"))
        loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(h, VOCAB, name="out"), labels))
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes={"ids": (T, N), "labels": (T, N)})
    return main, startup, [loss] + [g for _, g in pairs], [p.name for p, _ in pairs]


def test_budget_that_store_all_misses_fuses_the_output_layer_with_gradients_equal_to_store_alls():
    rng = np.random.RandomState(3)
    feed = {"ids": rng.randint(0, VOCAB, (T, N)), "labels": rng.randint(0, VOCAB, (T, N))}
    main, startup, fetch, names = _lm(1 << 40)
    assert "LinearCrossEntropy" not in [op.type for op in main.global_block().ops]   # store-all fits
    exe = rg.Executor()
    exe.run(startup)
    expected = exe.run(main, feed=feed, fetch_list=fetch)
    store = exe.last_stats.peak_bytes
    budget = int(0.8 * store)
    main, _, fetch, got_names = _lm(budget)
    assert "LinearCrossEntropy" in [op.type for op in main.global_block().ops]
    got = exe.run(main, feed=feed, fetch_list=fetch)
    assert exe.last_stats.peak_bytes <= budget
    assert got_names == names
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * np.abs(b).max())
