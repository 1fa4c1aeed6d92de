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


def _run(built, params=None, feed=None):
    main, startup, fetch, names = built
    exe = rg.Executor()
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
