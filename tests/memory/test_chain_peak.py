"""The chain model (``memory/chain_peak.py``) gives the budget search the planned peak of a binomial
schedule without rewriting the program. The reference is the way the search planned before: copy
the program, rewrite the copy's backward with ``apply_binomial`` and run ``planned_peak`` on it.
They must agree exactly, on random feed-forward programs and random schedules; the budgeted
``append_backward`` must build the same program with the model as without it; and when the model
is wrong, the search must notice and fall back to copies."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import retrograd as rg
from retrograd import Program
from retrograd.memory import budget
from retrograd.memory.auto import build_model
from retrograd.memory.binomial import Units, apply_binomial
from retrograd.memory.chain_peak import ChainPeak
from retrograd.memory.lifetimes import ForwardValues, backward_start
from retrograd.memory.loops.schedules import make_plan
from retrograd.memory.peak import planned_peak
from retrograd.memory.sizes import estimated_bytes, resolve_shapes

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KINDS = ["tanh", "relu", "sigmoid", "linear", "residual", "norm", "square", "dropout", "softmax", "cond"]
WIDTH = 8


def _layer(h, kind: str, width: int, i: int):
    if kind in ("tanh", "relu", "sigmoid", "linear"):
        return rg.layers.fc(h, width, act=None if kind == "linear" else kind, name=f"l{i}")
    if kind == "residual":                 # a cut only after the sum: a unit of several ops
        return h + rg.tanh(rg.layers.fc(h, h.shape[-1], name=f"l{i}"))
    if kind == "norm":
        return rg.layer_norm(h)
    if kind == "square":
        return h * h
    if kind == "dropout":                  # random: a copy replays the forward's draws
        return rg.dropout(h, p=0.25)
    if kind == "softmax":
        return rg.softmax(h)
    return rg.cond(rg.mean(h) > 0.0, lambda: rg.tanh(h), lambda: h * 2.0)     # an op with sub-blocks


def _program(kinds, widths, budget_bytes=None, rows=16):
    """The chain ``kinds`` (fc widths ``widths``) with its backward: (program, loss, keep)."""
    main, startup = Program(random_seed=0), Program(random_seed=0)
    with rg.program_guard(main, startup):
        h = rg.layers.fc(rg.data("x", [-1, WIDTH]), WIDTH, name="in")     # a parameter whatever follows
        for i, (kind, width) in enumerate(zip(kinds, widths)):
            h = _layer(h, kind, width, i)
        loss = rg.mean(h * h)
        pairs = rg.append_backward(loss, memory_budget=budget_bytes,
                                   feed_shapes={"x": (rows, WIDTH)} if budget_bytes is not None else None)
    return main, loss, [loss.name] + [g.name for _, g in pairs]


def _units(block, loss, shapes):
    n_forward = backward_start(block, loss)
    info = ForwardValues.of(block, n_forward)
    sizes = {n: estimated_bytes(block.var(n), shapes) for n in info.writers}
    return info, Units.of(build_model(info, loss.name, sizes), n_forward)


def _exact(program, info, units, plan, keep, feeds) -> int:
    """The old way: rewrite a copy, plan the copy."""
    scratch = program.clone()
    block = scratch.global_block()
    if plan is not None:
        apply_binomial(block, ForwardValues.of(block, info.n_forward), units, plan)
    return planned_peak(block, keep, feeds)


chains = st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from([4, 8, 16])), min_size=2, max_size=12)


@SETTINGS
@given(chain=chains, rows=st.sampled_from([1, 3, 16]), data=st.data())
def test_chain_model_peak_equals_the_rewritten_programs_planned_peak(chain, rows, data):
    kinds, widths = zip(*chain)
    main, loss, keep = _program(kinds, widths)
    block, feeds = main.global_block(), {"x": (rows, WIDTH)}
    shapes = resolve_shapes(block, feeds)
    info, units = _units(block, loss, shapes)
    model = ChainPeak.of(block, info, units, keep, shapes)
    assert model is not None
    assert model.peak(None) == planned_peak(block, keep, feeds)
    for _ in range(3):
        segment = data.draw(st.integers(1, units.count), label="segment")
        slots = data.draw(st.integers(0, units.count), label="slots")
        plan = make_plan(units.count, segment, slots)
        assert model.peak(plan) == _exact(main, info, units, plan, keep, feeds), (segment, slots)


def test_chain_model_of_a_deep_mlp_equals_the_rewritten_program_at_every_budget_plan():
    """Many units and the plans the search itself asks for (budget_plan), including one
    recomputing every unit from the start (no checkpoint slot)."""
    main, loss, keep = _program(["tanh"] * 40, [WIDTH] * 40)
    block, feeds = main.global_block(), {"x": (32, WIDTH)}
    shapes = resolve_shapes(block, feeds)
    info, units = _units(block, loss, shapes)
    model = ChainPeak.of(block, info, units, keep, shapes)
    peaks = []
    for segment, slots in [(1, 0), (1, 3), (4, 2), (7, 5), (40, 0), (2, 39)]:
        plan = make_plan(units.count, segment, slots)
        peaks.append(model.peak(plan))
        assert peaks[-1] == _exact(main, info, units, plan, keep, feeds)
    assert len(set(peaks)) > 3          # the schedules differ in what they hold


def test_chain_model_declines_ops_whose_held_bytes_depend_on_the_schedule():
    main, startup = Program(), Program()
    with rg.program_guard(main, startup):
        h = rg.tanh(rg.layers.fc(rg.data("x", [-1, WIDTH]), 2 * WIDTH))
        a, b = rg.split(h, 2, axis=1)                    # Split has a rule in peak.HOLDS
        loss = rg.mean(rg.tanh(a) * b)
        pairs = rg.append_backward(loss)
    block, feeds = main.global_block(), {"x": (4, WIDTH)}
    shapes = resolve_shapes(block, feeds)
    info, units = _units(block, loss, shapes)
    assert ChainPeak.of(block, info, units, [loss.name] + [g.name for _, g in pairs], shapes) is None


def _least(kinds, widths) -> int:
    with pytest.raises(rg.ProgramError) as info:
        _program(kinds, widths, budget_bytes=1)
    return info.value.least_budget


def _store_all(kinds, widths) -> int:
    main, _, keep = _program(kinds, widths)
    return planned_peak(main.global_block(), keep, {"x": (16, WIDTH)})


def _budgets(kinds, widths, count=5) -> list[int]:
    return np.linspace(_store_all(kinds, widths), _least(kinds, widths), count).astype(int).tolist()


@pytest.mark.parametrize("kinds", [["tanh"] * 24, ["residual", "relu", "norm", "sigmoid"] * 4,
                                   ["tanh", "dropout", "cond", "square", "relu", "softmax"] * 3])
def test_budgeted_append_backward_builds_the_same_program_with_the_chain_model_as_with_copies(kinds, monkeypatch):
    widths = [WIDTH] * len(kinds)
    built = {}
    for budget_bytes in _budgets(kinds, widths):
        main, _, _ = _program(kinds, widths, budget_bytes)
        built[budget_bytes] = (main.to_json(), main.memory_plan)
        assert main.memory_plan.planned_peak <= budget_bytes
    monkeypatch.setattr(ChainPeak, "of", staticmethod(lambda *args: None))     # every trial on a copy
    for budget_bytes, (text, plan) in built.items():
        main, _, _ = _program(kinds, widths, budget_bytes)
        assert (main.to_json(), main.memory_plan) == (text, plan)


def test_a_wrong_chain_model_is_caught_and_the_search_falls_back_to_copies(monkeypatch):
    """(Under the "checkpoints" policy: the binomial search itself, no single values freed first.)"""
    with rg.memory.policies.policy("checkpoints"):
        kinds, widths = ["tanh"] * 20, [WIDTH] * 20
        budget_bytes = _budgets(kinds, widths)[2]
        monkeypatch.setattr(ChainPeak, "of", staticmethod(lambda *args: None))
        reference, _, _ = _program(kinds, widths, budget_bytes)
        monkeypatch.undo()
        true_peak = ChainPeak.peak
        monkeypatch.setattr(ChainPeak, "peak", lambda self, plan: true_peak(self, plan) // 2)   # too optimistic
        forgotten = []
        forget = budget._Search.forget_model
        monkeypatch.setattr(budget._Search, "forget_model", lambda self: forgotten.append(1) or forget(self))
        main, _, _ = _program(kinds, widths, budget_bytes)
        assert forgotten                                    # the disagreement was seen
        assert main.to_json() == reference.to_json() and main.memory_plan == reference.memory_plan
        assert main.memory_plan.planned_peak <= budget_bytes
