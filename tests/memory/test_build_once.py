"""A budgeted ``append_backward`` of a program no policy step before the build applies to (no loop,
no ``SoftmaxCrossEntropy``, no attention, no callbacks) builds its backward once, in place, and
plans there (``budget._fit_built``), where other programs build a store-all copy first. The
reference is that copy path, forced: both must build the same program and plan, refuse the same
budgets with the same least budget, and leave the program as it was when its sizes are unknown."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd import Program
from retrograd.memory import budget
from retrograd.memory.peak import planned_peak

WIDTH, ROWS = 16, 32
SHAPES = {"x": (ROWS, WIDTH)}


def _program(kinds, budget_bytes=None, feed_shapes=SHAPES):
    main, startup = Program(random_seed=0), Program(random_seed=0)
    with rg.program_guard(main, startup):
        h = rg.data("x", [-1, WIDTH])
        for i, kind in enumerate(kinds):
            if kind == "cond":          # an op with sub-blocks
                h = rg.cond(rg.mean(h) > 0.0, lambda h=h: rg.tanh(h), lambda h=h: h * 2.0)
            else:
                h = rg.layers.fc(h, WIDTH, act=kind, name=f"l{i}")
        loss = rg.mean(h * h)
        pairs = rg.append_backward(loss, memory_budget=budget_bytes,
                                   feed_shapes=feed_shapes if budget_bytes is not None else None)
    return main, [loss.name] + [g.name for _, g in pairs]


def _outcome(kinds, budget_bytes):
    try:
        main, _ = _program(kinds, budget_bytes)
    except rg.ProgramError as exc:
        return "refused", str(exc), exc.least_budget
    return main.to_json(), main.memory_plan


@pytest.mark.parametrize("kinds", [["tanh"] * 12, ["relu", "sigmoid", "cond", "tanh"] * 3])
def test_building_the_backward_once_plans_what_the_store_all_copy_path_plans(kinds, monkeypatch):
    main, keep = _program(kinds)
    store_all = planned_peak(main.global_block(), keep, SHAPES)
    budgets = [store_all + 1000, store_all] + np.linspace(store_all - 1, store_all // 4, 8).astype(int).tolist()
    once = {b: _outcome(kinds, b) for b in budgets}
    assert any(o[0] == "refused" for o in once.values()) and any(o[0] != "refused" for o in once.values())
    assert once[store_all][1].activation_budget is None          # storing everything fits exactly
    monkeypatch.setattr(budget, "_builds_once", lambda program, build: False)     # the copy path
    for b in budgets:
        assert _outcome(kinds, b) == once[b], b


def test_building_once_leaves_the_program_unbuilt_when_a_size_is_unknown():
    with pytest.raises(rg.ProgramError, match="x"):
        _program(["tanh"] * 3, budget_bytes=10_000, feed_shapes={})
    main, startup = Program(), Program()
    with rg.program_guard(main, startup):
        h = rg.layers.fc(rg.data("x", [-1, WIDTH]), WIDTH, act="tanh", name="l0")
        loss = rg.mean(h * h)
        n_ops = len(main.global_block().ops)
        with pytest.raises(rg.ProgramError):
            rg.append_backward(loss, memory_budget=10_000, feed_shapes={})
    assert len(main.global_block().ops) == n_ops


def test_a_program_with_a_loss_the_policy_fuses_is_not_built_once():
    main, startup = Program(), Program()
    with rg.program_guard(main, startup):
        logits = rg.layers.fc(rg.data("x", [-1, WIDTH]), 8, name="head")
        loss = rg.mean(rg.softmax_cross_entropy(logits, rg.data("y", [-1], dtype="int64")))
    build = lambda: None      # noqa: E731
    assert not budget._builds_once(main, build)
    plain, _ = _program(["tanh"])
    assert budget._builds_once(plain, build)
    build.callbacks = [lambda block, context: None]
    assert not budget._builds_once(plain, build)
