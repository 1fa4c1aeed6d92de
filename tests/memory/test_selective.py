"""Selective recompute (``retrograd/memory/selective.py``), the ``cheap_first`` policy's rung between
storing everything and checkpointing: single kept values cheap to make again are freed, the cheapest
per byte first, and made again just before their gradient readers.

References: the ops' flop counts against the products written out here; the gradients against the
same program storing everything (itself checked against PyTorch in test_budget.py); the measured peak
against the budget."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd import Program
from retrograd.memory.lifetimes import ForwardValues
from retrograd.memory.peak import planned_peak
from retrograd.memory.selective import apply_selective, op_cost, price_values
from retrograd.memory.sizes import resolve_shapes
from retrograd.ops.core.registry import get_op_def

BATCH, LENGTH, WIDTH, VOCAB = 4, 16, 32, 24
SHAPES = {"ids": (BATCH, LENGTH), "labels": (BATCH, LENGTH)}
RNG = np.random.RandomState(5)
FEED = {"ids": RNG.randint(0, VOCAB, (BATCH, LENGTH)), "labels": RNG.randint(0, VOCAB, (BATCH, LENGTH))}


def _transformer(budget, policy=rg.memory.policies.DEFAULT):
    main, startup = Program(random_seed=0), Program(random_seed=0)
    with rg.memory.policies.policy(policy), rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, LENGTH], dtype="int64")
        labels = rg.data("labels", [-1, LENGTH], dtype="int64")
        x = rg.layers.embedding(ids, VOCAB, WIDTH, name="emb")
        for i in range(2):
            # dropout: micro-batches would draw other masks than the whole batch, so they do not apply
            x = rg.layers.transformer_block(x, num_heads=2, dropout=0.1, name=f"blk{i}")
        loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(x, VOCAB, name="head"), labels))
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes=SHAPES if budget else None)
    return main, startup, [loss] + [g for _, g in pairs]


def _store_all():
    main, _, fetch = _transformer(None)
    kept = rg.memory.report(main, feed_shapes=SHAPES).kept_bytes
    return planned_peak(main.global_block(), [v.name for v in fetch], SHAPES), kept


def test_flops_declarations_count_the_products():
    """Each contraction declares its multiply-adds: 2 flops per product of the loops it runs."""
    m, k, n = 5, 7, 3
    assert get_op_def("MatMul").extra["flops"]([(2, m, k), (k, n)], [(2, m, n)], {}) == 2 * 2 * m * n * k
    assert get_op_def("MatMul").extra["flops"]([(k, m), (k, n)], [(m, n)], {"transpose_x": True}) == 2 * m * n * k
    assert get_op_def("SeqLinear").extra["flops"]([(4, m, k), (k, n)], [(4, m, n)], {}) == 2 * 4 * m * n * k
    b, h, t, s, d = 2, 3, 5, 6, 4         # q [B,H,T,D] against k, v [B,H,S,D]: q k^T and p v
    assert get_op_def("ScaledDotProductAttention").extra["flops"](
        [(b, h, t, d), (b, h, s, d), (b, h, s, d)], [(b, h, t, d), (b, h, t)], {}) == 2 * 2 * b * h * t * s * d
    conv = get_op_def("Conv").extra["flops"]([(2, 6, 9, 9), (8, 3, 3, 3)], [(2, 8, 7, 7)], {"groups": 2})
    assert conv == 2 * (2 * 8 * 7 * 7) * (3 * 3 * 3)
    assert get_op_def("Einsum").extra["flops"]([(m, k), (k, n)], [(m, n)], {"equation": "ik,kj->ij"}) == 2 * m * k * n
    assert "flops" not in get_op_def("Tanh").extra      # memory-bound: priced by its bytes


def test_pointwise_values_are_freed_before_values_behind_a_contraction():
    main = Program()
    with rg.program_guard(main):
        x = rg.data("x", [256, 64])
        h = rg.layers.fc(x, 64, name="fc")          # MatMul + bias: its output re-made only by the GEMM
        g = rg.gelu(h)
        loss = rg.mean(rg.layers.fc(g, 64, name="fc2") * 2.0)
    n_forward = len(main.global_block().ops)
    with rg.program_guard(main):
        rg.append_backward(loss)
    block = main.global_block()
    info = ForwardValues.of(block, n_forward)
    shapes = resolve_shapes(block)
    order = price_values(info, shapes)
    names = [p.name for p in order]
    assert names.index(g.name) < names.index(h.name)
    gelu = next(op for op in block.ops if op.type == "Gelu")
    assert order[names.index(g.name)].cost == op_cost(gelu, info, shapes) == 16 * (2 * 256 * 64 * 4)
    assert all(a.total <= b.total for a, b in zip(order, order[1:]))


def test_a_freed_value_is_made_once_for_all_its_readers():
    """Two freed values of one chain (a pointwise op over a pointwise op) share the copies."""
    main = Program()
    with rg.program_guard(main):
        x = rg.data("x", [64, 32], stop_gradient=False)
        a = rg.exp(x * 0.1)
        b = rg.tanh(a)
        loss = rg.mean(b * a)
    n_forward = len(main.global_block().ops)
    with rg.program_guard(main):
        (dx,) = rg.gradients(loss, x)
    feed = {"x": np.random.RandomState(0).randn(64, 32).astype("float32")}
    (want,) = rg.Executor().run(main, feed=feed, fetch_list=[dx])
    block = main.global_block()
    inserted = apply_selective(ForwardValues.of(block, n_forward), {a.name, b.name})
    copies = [op for op in block.ops if "recompute_of" in op.attrs]
    assert inserted == len(copies) == 3 and sorted(op.type for op in copies) == ["Exp", "Mul", "Tanh"]
    (got,) = rg.Executor().run(main, feed=feed, fetch_list=[dx])
    np.testing.assert_array_equal(got, want)
    x64 = feed["x"].astype("float64")
    a64 = np.exp(0.1 * x64)                           # d/dx mean(tanh(a) a), a = exp(0.1 x)
    ref = (0.1 * a64) * ((1 - np.tanh(a64) ** 2) * a64 + np.tanh(a64)) / x64.size
    np.testing.assert_allclose(got, ref, rtol=1e-5)


@pytest.mark.engine
@pytest.mark.parametrize("share", [0.9, 0.7])
def test_selective_gradients_equal_store_all_within_the_budget(backend, share, mm):
    """A budget storing everything misses by a little frees single values, no checkpoint schedule:
    store-all's gradients, the measured peak within the budget."""
    ref, store_all_exe = mm.run_step(_transformer(None), FEED, backend)
    planned, kept = _store_all()
    budget = int(planned - (1 - share) * kept)
    built = _transformer(budget)
    plan = built[0].memory_plan
    assert plan.recomputed > 0 and plan.units == 0 and plan.planned_peak <= budget
    out, exe = mm.run_step(built, FEED, backend)
    if backend.name != "onnxruntime":   # the engine's arena is metered its own way: gradients only
        assert exe.last_stats.peak_bytes <= budget < store_all_exe.last_stats.peak_bytes + (1 - share) * kept
    scale = max(float(np.max(np.abs(v))) for v in ref)
    for got, want in zip(out, ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * scale)
    by_checkpoints = _transformer(budget, "checkpoints")[0].memory_plan     # the policy without the rung
    assert by_checkpoints.recomputed == 0 and (by_checkpoints.units or by_checkpoints.micro_batches > 1)


def _mlp(budget, rows=256, width=32, layers=16):
    main, startup = Program(random_seed=0), Program(random_seed=0)
    with rg.program_guard(main, startup):
        h = rg.data("x", [-1, width], dtype="float64")
        for i in range(layers):
            h = rg.layers.fc(h, width, act="tanh", name=f"fc{i}")
        loss = rg.mean(h * h)
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes={"x": (rows, width)} if budget else None)
    return main, startup, [loss] + [g for _, g in pairs]


def test_budgets_below_what_freeing_values_reaches_take_the_checkpoint_schedule(mm):
    """A tanh MLP: each kept value is made again only by its layer's GEMM, so freeing single values
    stops near half of store-all's activations; below, the binomial schedule over the layers."""
    feed = {"x": np.random.RandomState(1).randn(256, 32)}
    ref, exe = mm.run_step(_mlp(None), feed)
    store_all = exe.last_stats.peak_bytes
    with pytest.raises(rg.ProgramError, match="the least budget that fits is") as refused:
        _mlp(1)
    least = refused.value.least_budget
    for budget, selective in ((int(0.9 * store_all), True), (least, False)):
        built = _mlp(budget)
        plan = built[0].memory_plan
        assert (plan.recomputed > 0, plan.units > 0) == (selective, not selective), plan
        out, exe = mm.run_step(built, feed)
        assert exe.last_stats.peak_bytes <= budget
        for got, want in zip(out, ref):
            np.testing.assert_array_equal(got, want)        # float64, the same ops on the same values


def _built(body, shapes):
    main = Program(random_seed=0)
    with rg.program_guard(main, Program(random_seed=0)):
        loss = body()
        n_forward = len(main.global_block().ops)
        pairs = rg.append_backward(loss)
    return main, n_forward, [loss.name] + [g.name for _, g in pairs]


@pytest.mark.parametrize("model", ["transformer", "mlp"])
def test_the_freed_peak_model_is_the_rewritten_programs_planned_peak(model):
    """``FreedPeak`` replays the rewrite on records of the ops: its peak for every prefix of the
    order equals ``planned_peak`` of a copy rewritten by ``apply_selective``."""
    from retrograd.memory.selective import FreedPeak

    def transformer():
        ids = rg.data("ids", [-1, LENGTH], dtype="int64")
        labels = rg.data("labels", [-1, LENGTH], dtype="int64")
        x = rg.layers.embedding(ids, VOCAB, WIDTH, name="emb")
        for i in range(2):
            x = rg.layers.transformer_block(x, num_heads=2, dropout=0.1, name=f"blk{i}")
        return rg.mean(rg.softmax_cross_entropy(rg.layers.fc(x, VOCAB, name="head"), labels))

    def mlp():
        h = rg.data("x", [-1, 32])
        for i in range(8):
            h = rg.layers.fc(h, 32, act=["tanh", "relu", "sigmoid"][i % 3], name=f"fc{i}")
        return rg.mean(h * h)

    shapes = SHAPES if model == "transformer" else {"x": (64, 32)}
    main, n_forward, keep = _built(transformer if model == "transformer" else mlp, shapes)
    block = main.global_block()
    info = ForwardValues.of(block, n_forward)
    resolved = resolve_shapes(block, shapes)
    names = [p.name for p in price_values(info, resolved)]
    freed_peak = FreedPeak.of(block, info, keep, resolved)
    assert len(names) > 4 and freed_peak is not None
    for k in range(len(names) + 1):
        copy = main.clone()
        apply_selective(ForwardValues.of(copy.global_block(), n_forward), set(names[:k]))
        assert freed_peak.peak(set(names[:k])) == planned_peak(copy.global_block(), keep, shapes), k


def test_a_wrong_freed_peak_model_is_caught_and_the_search_plans_copies(monkeypatch, mm):
    """A model that plans too low is caught by the rewritten program's own planned peak: the program
    is put back and searched with a copy per trial, giving the plan the copies give."""
    from retrograd.memory.selective import FreedPeak
    planned, kept = _store_all()
    budget = int(planned - 0.2 * kept)
    monkeypatch.setattr(FreedPeak, "of", staticmethod(lambda *args: None))
    reference = _transformer(budget)[0]
    monkeypatch.undo()
    true_peak = FreedPeak.peak
    monkeypatch.setattr(FreedPeak, "peak", lambda self, freed: true_peak(self, freed) // 2)
    main = _transformer(budget)[0]
    assert main.memory_plan == reference.memory_plan and main.memory_plan.recomputed > 0
    assert main.to_json() == reference.to_json()


@pytest.fixture
def broken_flops_op():
    """An op whose flops declaration fails, registered for one test (registered at import, every
    other test's table of ops would see it)."""
    from retrograd.ops.core.registry import OPS

    def flops(ins, outs, attrs):
        raise ValueError("no such count")

    rg.defop("TestBrokenFlops", infer=lambda ins, attrs: [(ins[0].shape, ins[0].dtype)],
             grad=lambda g: [g.dy], flops=flops)(lambda k, x: x)
    yield
    del OPS["TestBrokenFlops"]


def test_a_flops_declaration_that_fails_is_a_program_error_naming_the_op(broken_flops_op):
    def build(budget):
        main = Program()
        with rg.program_guard(main, Program()):
            h = rg.layers.fc(rg.data("x", [-1, 32]), 32, act="tanh", name="fc0")
            h, = rg.append_op("TestBrokenFlops", [h])
            loss = rg.mean(rg.layers.fc(h, 32, name="fc1") * 2.0)
            rg.append_backward(loss, memory_budget=budget, feed_shapes={"x": (256, 32)})
        return main

    store_all = build(1 << 40).memory_plan.planned_peak
    with pytest.raises(rg.ProgramError, match=r"TestBrokenFlops.*defop\(flops=\) declaration failed.*no such count"):
        build(int(0.8 * store_all))
