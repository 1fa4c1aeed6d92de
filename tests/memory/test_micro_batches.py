"""memory/micro_batches.py: a transformer stack under a whole-step memory budget runs in
micro-batches, each one's backward right after its forward. The budgeted run peaks within its
budget, the plan bounds it from above, and its gradients are store-all's and PyTorch's (float64)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import retrograd as rg
from retrograd.memory.micro_batches import loss_over_rows, micro_batch_counts, separable_region
from retrograd.memory.sizes import resolve_shapes

torch = pytest.importorskip("torch", reason="the reference gradients come from PyTorch (pip install torch)")
F = torch.nn.functional

B, L, D, HEADS, V, BLOCKS = 8, 16, 16, 2, 13, 2
SHAPES = {"ids": (B, L), "labels": (B, L)}


def _stack(budget=None, dropout=0.0, scale=None, backward=True):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, L], dtype="int64")
        labels = rg.data("labels", [-1, L], dtype="int64")
        x = rg.layers.embedding(ids, V, D, name="emb", dtype="float64")
        for i in range(BLOCKS):
            x = rg.layers.transformer_block(x, num_heads=HEADS, dropout=dropout, name=f"blk{i}")
        loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(x, V, name="head"), labels))
        if scale is not None:
            loss = loss * scale
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes=SHAPES) if backward else []
    return main, startup, [loss] + [g for _, g in pairs], [p.name for p, _ in pairs]


def _feed(rows=B):
    rng = np.random.RandomState(0)
    return {"ids": rng.randint(0, V, (rows, L)), "labels": rng.randint(0, V, (rows, L))}


def _run(built, params=None, feed=None, backend=None):
    main, startup, fetch, names = built
    exe = rg.Executor() if backend is None else backend.executor()
    exe.run(startup)
    for name, value in (params or {}).items():
        exe.scope.set(name, value)
    out = exe.run(main, feed=feed or _feed(), fetch_list=fetch)
    params = {n: exe.scope.get(n) for n in names}
    return out, exe.last_stats.peak_bytes, params


def _torch_loss_and_grads(params: dict, feed: dict, names: list[str]):
    """The same model written with torch.nn.functional, float64."""
    t = {n: torch.tensor(v, requires_grad=True) for n, v in params.items()}
    x = t["emb.w"][torch.tensor(feed["ids"])]
    heads = lambda h: h.reshape(B, L, HEADS, D // HEADS).transpose(1, 2)  # noqa: E731
    for i in range(BLOCKS):
        p = lambda s: t[f"blk{i}.{s}"]  # noqa: E731, B023
        h = F.layer_norm(x, (D,), p("ln1.w"), p("ln1.b"), eps=1e-5)
        q, k, v = (heads(h @ p(f"att.w_{c}") + p(f"att.b_{c}")) for c in "qkv")
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, L, D)
        x = x + att @ p("att.w_o") + p("att.b_o")
        h = F.layer_norm(x, (D,), p("ln2.w"), p("ln2.b"), eps=1e-5)
        x = x + F.gelu(h @ p("fc1.w") + p("fc1.b")) @ p("fc2.w") + p("fc2.b")
    logits = x @ t["head.w"] + t["head.b"]
    loss = F.cross_entropy(logits.reshape(-1, V), torch.tensor(feed["labels"]).reshape(-1))
    grads = torch.autograd.grad(loss, [t[n] for n in names])
    return loss.item(), [g.numpy() for g in grads]


def test_a_transformer_stack_runs_in_micro_batches_within_40_percent_with_store_alls_gradients():
    ref, store_peak, params = _run(_stack())
    budget = int(0.4 * store_peak)
    built = _stack(budget)
    plan = built[0].memory_plan
    out, peak, _ = _run(built, params)
    assert plan.micro_batches > 1 and plan.units == 0          # nothing is recomputed
    assert not any("recompute_of" in op.attrs for op in built[0].global_block().ops)
    assert peak <= budget
    assert peak <= plan.planned_peak <= 1.1 * peak            # the plan bounds the run, within 10%
    assert built[3] == _stack()[3]
    report = rg.memory.report(built[0], SHAPES, fetch_list=built[2])
    assert report.planned_peak == plan.planned_peak
    assert f"the batch in {plan.micro_batches} micro-batches" in str(report)
    for got, want in zip(out, ref):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-14)
    loss, grads = _torch_loss_and_grads(params, _feed(), built[3])
    np.testing.assert_allclose(out[0], loss, rtol=1e-12)
    for name, got, want in zip(built[3], out[1:], grads):
        np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-12, err_msg=f"gradient of {name}")


def test_too_small_a_budget_names_the_least_budget_that_then_works():
    _, store_peak, params = _run(_stack())
    with pytest.raises(rg.ProgramError, match="the least budget that fits is") as info:
        _stack(store_peak // 20)
    least = int(re.search(r"the least budget that fits is (\d+) bytes", str(info.value)).group(1))
    assert store_peak // 20 < least < store_peak // 2
    built = _stack(least)
    out, peak, _ = _run(built, params)
    assert peak <= least
    ref, _, _ = _run(_stack(), params)
    for got, want in zip(out, ref):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-14)


def test_micro_batches_need_the_batch_to_divide_at_run_time():
    built = _stack(int(0.4 * _run(_stack())[1]))
    assert B % built[0].memory_plan.micro_batches == 0
    with pytest.raises(rg.ExecutionError, match="equal pieces"):
        _run(built, feed=_feed(rows=B + 1))


def test_the_region_and_its_loss():
    main, _, fetch, _ = _stack(backward=False)
    block = main.global_block()
    region = separable_region(block, resolve_shapes(block, SHAPES))
    assert region is not None and region.attends and region.rows == B
    assert region.feeds == ["ids", "labels"]
    assert [block.ops[i].type for i in (region.ops[0], region.ops[-1])] == ["Gather", "SoftmaxCrossEntropy"]
    assert loss_over_rows(block, region, fetch[0].name) == "Mean"
    assert micro_batch_counts(8) == [2, 4, 8] and micro_batch_counts(12) == [2, 3, 4, 6, 12]
    assert micro_batch_counts(64)[-1] == 16 and micro_batch_counts(7) == [7]


def test_an_lstm_language_model_is_no_region():
    """Time-major ids [T, N] feed a recurrence: axis 0 is time, and the embedding's rows joined
    would be larger than the ids."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        ids = rg.data("ids", [-1, -1], dtype="int64")
        h_all, _, _, _ = rg.layers.lstm(rg.layers.embedding(ids, V, 8, name="emb"), 8, name="lstm")
        rg.mean(h_all)
    block = main.global_block()
    assert separable_region(block, resolve_shapes(block, {"ids": (20, 4)})) is None


@pytest.mark.parametrize("change", ["dropout", "scaled loss"])
def test_stacks_that_cannot_run_in_micro_batches_keep_the_recompute_schedule(change):
    """Dropout draws per micro-batch would differ from the whole batch's; a loss that is not the
    rows' plain mean has no per-micro-batch gradient here: both keep a recompute schedule (single
    values freed, ``cheap_first``, or the binomial one)."""
    kwargs = {"dropout": 0.1} if change == "dropout" else {"scale": 0.5}
    _, store_peak, _ = _run(_stack(**kwargs))
    plan = _stack(int(0.6 * store_peak), **kwargs)[0].memory_plan
    assert plan.micro_batches == 1 and (plan.units > 1 or plan.recomputed > 0)
    with rg.memory.policies.policy("checkpoints"):
        plan = _stack(int(0.6 * store_peak), **kwargs)[0].memory_plan
    assert plan.micro_batches == 1 and plan.units > 1


def _time_major(budget=None, backward=True):
    """The stack fed time-major windows ``[L, N]`` as ``retrograd train --model transformer`` feeds
    them: transposed to batch-major for the blocks, the logits back to time-major rows for the loss."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [L, -1], dtype="int64")
        labels = rg.data("labels", [L, -1], dtype="int64")
        x = rg.layers.embedding(rg.transpose(ids, [1, 0]), V, D, name="emb", dtype="float64")
        for i in range(BLOCKS):
            x = rg.layers.transformer_block(x, num_heads=HEADS, name=f"blk{i}")
        logits = rg.reshape(rg.transpose(rg.layers.fc(x, V, name="head"), [1, 0, 2]), [-1, V])
        xent = rg.softmax_cross_entropy(logits, rg.reshape(labels, [-1]))
        loss = rg.mean(xent)
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes=TIME_MAJOR) if backward else []
    return main, startup, [loss, xent] + [g for _, g in pairs], [p.name for p, _ in pairs]


TIME_MAJOR = {"ids": (L, B), "labels": (L, B)}


@pytest.mark.engine
def test_time_major_windows_run_in_micro_batches_with_store_alls_gradients_and_rows(backend):
    """The batch on axis 1: the fed windows split along it, the transposes carry it, and the loss's
    rows (time step, batch element) come back in their order; gradients are PyTorch's."""
    feed = {name: value.T.copy() for name, value in _feed().items()}
    ref, store_peak, params = _run(_time_major(), feed=feed)
    budget = int(0.4 * store_peak)
    built = _time_major(budget)
    plan = built[0].memory_plan
    out, peak, _ = _run(built, params, feed=feed, backend=backend)
    assert plan.micro_batches > 1 and plan.units == 0 and plan.recomputed == 0
    assert peak <= budget
    splits = [op for op in built[0].global_block().ops if op.type == "Split"]
    assert splits and all(op.attrs["axis"] == 1 for op in splits)
    np.testing.assert_allclose(out[1], ref[1], rtol=1e-12)           # the rows, in their order
    for got, want in zip(out, ref):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-14)
    loss, grads = _torch_loss_and_grads(params, _feed(), built[3])  # the batch-major model
    np.testing.assert_allclose(out[0], loss, rtol=1e-12)
    for name, got, want in zip(built[3], out[2:], grads):
        np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-12, err_msg=f"gradient of {name}")


def test_where_layout_ops_move_the_batch_axis():
    """The declarations micro-batches read (defop(batch_axis=)): a transpose moves the axis; a reshape
    folding fixed axes before it into the rows groups them; one mixing the batch with later axes
    (or folding a size left open) does not keep the batch elements apart."""
    from retrograd.ops.core.registry import get_op_def
    transpose = get_op_def("Transpose").extra["batch_axis"]
    reshape = get_op_def("Reshape").extra["batch_axis"]
    assert transpose(1, (16, 8), (16, -1), {"perm": [1, 0]}) == (0, 1)
    assert transpose(0, (8, 16, 13), (-1, 16, 13), {"perm": [1, 0, 2]}) == (1, 1)
    assert reshape(1, (16, 8, 13), (16, -1, 13), {"shape": [-1, 13]}) == (0, 16)
    assert reshape(1, (16, 8), (16, -1), {"shape": [-1]}) == (0, 16)
    assert reshape(0, (8, 16, 13), (-1, 16, 13), {"shape": [-1, 13]}) is None       # rows (element, step)
    assert reshape(1, (16, 8, 13), (-1, -1, 13), {"shape": [-1, 13]}) is None      # T open: no fixed groups
    assert reshape(0, (8, 16), (-1, 16), {"shape": [-1, 16]}) == (0, 1)


def test_learned_positions_get_their_gradient_in_micro_batches():
    """Regression: a parameter the stack reads through an op outside the batch (a learned position
    embedding, ``Gather(pos.w, arange)``) got no gradient in micro-batches: each one's backward
    stopped at that op's value. The op now runs in every micro-batch."""
    def positional(budget=None):
        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            ids = rg.data("ids", [-1, L], dtype="int64")
            labels = rg.data("labels", [-1, L], dtype="int64")
            x = rg.layers.embedding(ids, V, D, name="emb", dtype="float64")
            x = x + rg.layers.embedding(rg.arange(L), L, D, name="pos", dtype="float64")
            x = rg.layers.transformer_block(x, num_heads=HEADS, name="blk0")
            loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(x, V, name="head"), labels))
            pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes=SHAPES)
        return main, startup, [loss] + [g for _, g in pairs], [p.name for p, _ in pairs]

    ref, store_peak, params = _run(positional())
    built = positional(int(0.5 * store_peak))
    assert built[0].memory_plan.micro_batches > 1
    assert built[3] == positional()[3] and "pos.w" in built[3]
    out, peak, _ = _run(built, params)
    assert peak <= int(0.5 * store_peak)
    for name, got, want in zip(["loss"] + built[3], out, ref):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-14, err_msg=name)


@pytest.fixture
def broken_axis_op():
    """A layout op whose batch_axis declaration fails, registered for one test."""
    from retrograd.ops.core.registry import OPS

    def batch_axis(axis, shape, declared, attrs):
        raise KeyError("perm")

    rg.defop("TestBrokenAxis", infer=lambda ins, attrs: [(ins[0].shape, ins[0].dtype)], nondiff=(0,),
             batch_axis=batch_axis)(lambda k, x: x)
    yield
    del OPS["TestBrokenAxis"]


def test_a_batch_axis_declaration_that_fails_is_a_program_error_naming_the_op(broken_axis_op):
    def build(budget):
        main = rg.Program()
        with rg.program_guard(main, rg.Program()):
            ids = rg.data("ids", [-1, L], dtype="int64")
            labels = rg.data("labels", [-1, L], dtype="int64")
            moved, = rg.append_op("TestBrokenAxis", [ids])
            x = rg.layers.embedding(moved, V, D, name="emb", dtype="float64")
            x = rg.layers.transformer_block(x, num_heads=HEADS, name="blk0")
            loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(x, V, name="head"), labels))
            rg.append_backward(loss, memory_budget=budget, feed_shapes=SHAPES)
        return main

    store_all = build(1 << 40).memory_plan.planned_peak
    with pytest.raises(rg.ProgramError, match=r"TestBrokenAxis.*defop\(batch_axis=\) declaration failed on 'ids'"):
        build(int(0.4 * store_all))
