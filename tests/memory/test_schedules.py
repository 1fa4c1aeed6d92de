"""Checkpoint schedules over time steps: optimal advance counts, valid plans, budgets respected."""
from __future__ import annotations

from functools import lru_cache

import pytest

import retrograd as rg
from retrograd.memory.loops import schedules as sc


@lru_cache(maxsize=None)
def _brute_cost(n: int, s: int) -> int:
    """Least advances to reverse n steps with s free slots, by exhaustive recursion (independent)."""
    if n <= 1:
        return 0
    if s == 0:
        return sum(range(n))                 # reach each step from the start, last to first
    return min(k + _brute_cost(n - k, s - 1) + _brute_cost(k, s) for k in range(1, n))


def test_closed_form_matches_exhaustive_search():
    for n in range(1, 45):
        for s in range(0, 7):
            assert sc.revolve_cost(n, s) == _brute_cost(n, s), (n, s)


def test_split_is_optimal():
    for n in range(2, 45):
        for s in range(1, 7):
            k = sc.revolve_split(n, s)
            assert 1 <= k < n
            assert k + _brute_cost(n - k, s - 1) + _brute_cost(k, s) == _brute_cost(n, s)


def test_known_values():
    assert sc.beta(2, 3) == 10
    assert sc.revolve_cost(10, 0) == 45
    assert sc.revolve_cost(10, 9) == 9         # a slot per step: one advance each


class _Toy(sc.StepRunner):
    """state[t+1] = f(state[t], t), integers; records every step run and checks each reversal."""

    def __init__(self, steps: int):
        self.truth = [7]
        for t in range(steps):
            self.truth.append(self.f(self.truth[-1], t))
        self.advanced = 0
        self.taped = 0
        self.reversed: list[int] = []
        self.kept = 0
        self.peak_kept = 0

    @staticmethod
    def f(x: int, t: int) -> int:
        return (x * 31 + t * 7 + 3) % 1000003

    def advance(self, state, start, stop):
        assert state == self.truth[start]
        for t in range(start, stop):
            state = self.f(state, t)
            self.advanced += 1
        return state

    def reverse(self, state, start, stop):
        assert state == self.truth[start], "a reversal started from the wrong state"
        tape = [state]
        for t in range(start, stop):
            tape.append(self.f(tape[-1], t))
            self.taped += 1
        for t in range(stop - 1, start - 1, -1):
            assert tape[t - start + 1] == self.truth[t + 1]
            self.reversed.append(t)

    def keep(self, state):
        self.kept += 1
        self.peak_kept = max(self.peak_kept, self.kept)
        return state

    def drop(self, state):
        self.kept -= 1


def _run(plan: sc.Plan, steps: int) -> _Toy:
    toy = _Toy(steps)
    checkpoints = {0: toy.truth[0]}
    for t in plan.sweep_stores:                   # the forward sweep keeps these on its way
        checkpoints[t] = toy.keep(toy.truth[t])
    sc.run_backward(plan, checkpoints, toy)
    return toy


@pytest.mark.parametrize("steps,segment,slots", [(1, 1, 0), (10, 1, 0), (10, 1, 3), (37, 1, 4), (37, 5, 2),
                                                 (100, 7, 20), (64, 8, 7), (50, 50, 0), (13, 4, 1)])
def test_plans_reverse_every_step_once_from_the_right_state(steps, segment, slots):
    plan = sc.make_plan(steps, segment, slots)
    toy = _run(plan, steps)
    assert toy.reversed == list(range(steps - 1, -1, -1))
    assert toy.taped == steps
    assert toy.advanced == plan.advances
    assert toy.peak_kept == plan.max_stored() <= slots
    assert toy.kept == 0                         # every checkpoint dropped at the end
    if segment == 1:
        # Along the forward sweep revolve's advances are free: the rest is all the backward does.
        free = sum(b - a for a, b in zip([0] + plan.sweep_stores, plan.sweep_stores))
        assert plan.advances == sc.revolve_cost(steps, min(slots, steps - 1)) - free


def test_sqrt_plan_recomputes_each_step_once():
    plan = sc.sqrt_plan(100)
    assert plan.segment == 10 and plan.advances == 0
    assert len(plan.sweep_stores) == 9
    assert _run(plan, 100).reversed == list(range(99, -1, -1))


@pytest.mark.parametrize("steps", [50, 1000, 10000])
@pytest.mark.parametrize("fraction", [0.5, 0.05, 0.005])
def test_budget_plan_fits_and_recomputes_least(steps, fraction):
    state, tape = 1000, 4000
    budget = int(fraction * steps * tape)
    if budget < tape:
        with pytest.raises(rg.ProgramError, match=r"minimum budget is 4000 bytes"):
            sc.budget_plan(steps, budget, state, tape)
        return
    plan = sc.budget_plan(steps, budget, state, tape)
    assert plan.peak_bytes(state, tape) <= budget
    if steps <= 50:
        # No plan that fits does fewer advances (every segment length, the most slots that fit).
        for segment in range(1, steps + 1):
            n = -(-steps // segment)
            room = budget - segment * tape
            if room < 0:
                break
            assert sc.make_plan(steps, segment, min(n - 1, room // state)).advances >= plan.advances
    if steps <= 1000:
        assert _run(plan, steps).reversed == list(range(steps - 1, -1, -1))


def test_budget_plan_at_t1000_five_percent_needs_no_advances():
    plan = sc.budget_plan(1000, int(0.05 * 1000 * 4 * 1000), 1000, 4 * 1000)
    assert plan.advances == 0 and plan.recomputed_steps() == 1000


# --- a long kept tail (policies.py, "tape_first") ------------------------------------------------

class _TailToy(_Toy):
    """The toy whose forward kept the tape of steps ``first..T-1``: a reversal in there starts from
    the kept state and runs nothing again."""

    def __init__(self, steps, first):
        super().__init__(steps)
        self.first = first

    def reverse(self, state, start, stop):
        if start >= self.first:
            assert state is None and stop <= len(self.truth) - 1
            self.reversed += list(range(stop - 1, start - 1, -1))
            return
        super().reverse(state, start, stop)


@pytest.mark.parametrize("steps,segment,slots,tail", [(10, 2, 1, 6), (40, 16, 0, 40), (37, 5, 2, 13),
                                                      (128, 16, 4, 62), (20, 3, 0, 7)])
def test_long_plans_reverse_every_step_once_and_rerun_only_the_first_steps(steps, segment, slots, tail):
    plan = sc.make_long_plan(steps, segment, slots, tail)
    toy = _TailToy(steps, steps - tail)
    checkpoints = {0: toy.truth[0]}
    for t in plan.sweep_stores:
        assert t < steps - tail                   # no checkpoint inside the kept tail
        checkpoints[t] = toy.keep(toy.truth[t])
    sc.run_backward(plan, checkpoints, toy)
    assert toy.reversed == list(range(steps - 1, -1, -1))
    assert toy.taped == steps - tail and toy.advanced == plan.advances
    assert toy.peak_kept == plan.max_stored() <= slots and toy.kept == 0
    assert all(b - a <= segment for a, b in (x for x in plan.actions() if isinstance(x, sc.Reverse)))


@pytest.mark.parametrize("steps,from_alls", [(128, True), (128, False), (300, False), (40, True)])
@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.9])
def test_long_tail_plan_fits_its_budget_and_keeps_the_longest_tail(steps, from_alls, fraction):
    state, kept, batched = 32768, 65536 + (0 if from_alls else 32768), 131072
    budget = int(fraction * steps * (kept + batched))
    plan = sc.long_tail_plan(steps, budget, state, kept, batched, from_alls)
    segment = min(steps, sc.LONG_SEGMENT)
    if plan is None:
        assert budget - segment * batched < segment * kept + (0 if from_alls else state)
        return
    memory = plan.tail * kept + (0 if from_alls else state) + plan.segment * batched
    memory += 0 if from_alls else plan.max_stored() * state
    assert memory <= budget and plan.segment == segment and segment <= plan.tail <= steps
    if from_alls:       # every segment start is in the states tensors: a tail as long as fits, no advances
        assert plan.advances == 0 and (plan.tail + 1) * kept + segment * batched > budget or plan.tail == steps
    if plan.tail < steps:       # one step more of tail: over the budget, or more advances
        longer = sc.make_long_plan(steps, segment, plan.slots, plan.tail + 1)
        more = (plan.tail + 1) * kept + segment * batched
        more += 0 if from_alls else state + longer.max_stored() * state
        assert more > budget or longer.advances > plan.advances


def test_long_tail_plan_is_none_where_one_segment_does_not_fit():
    assert sc.long_tail_plan(100, 16 * (100 + 200) - 1, 10, 100, 200, True) is None
    assert sc.long_tail_plan(100, 16 * (100 + 200), 10, 100, 200, True).tail == 16


# --- the states a backward makes (peak.py counts them beside the sweep's checkpoint rows) --------

class _OwnStates:
    """A runner that counts, as the executor's meter would, the distinct states the backward made
    and holds: the sweep's checkpoints (and the initial state) are the forward's rows, freed by
    nothing the backward does; a step's new state is counted from the next step on."""

    def __init__(self):
        self.refs: dict = {}
        self.peak = 0

    def _hold(self, state):
        if state is not None and not isinstance(state, int):     # ints: the forward's rows
            self.refs[id(state)] = self.refs.get(id(state), 0) + 1

    def _release(self, state):
        if state is not None and not isinstance(state, int):
            self.refs[id(state)] -= 1
            if not self.refs[id(state)]:
                del self.refs[id(state)]

    def _measure(self):
        self.peak = max(self.peak, len(self.refs))

    def advance(self, state, start, stop):
        for t in range(start, stop):
            self._measure()                  # state t (if made here) and the one it started from
            new = [t + 1]                    # a fresh object: the state the step made
            self._hold(new)
            if t > start:
                self._release(state)
            state = new
        return state

    def reverse(self, state, start, stop):
        self._measure()

    def keep(self, state):
        self._hold(state)
        return state

    def drop(self, state):
        self._release(state)

    release = drop


@pytest.mark.parametrize("steps,segment,slots", [(40, 1, 8), (37, 1, 4), (37, 5, 2), (100, 7, 20), (64, 8, 7),
                                                 (13, 4, 1), (10, 1, 0), (1000, 3, 12)])
def test_budgeted_backward_states_made_in_dropped_sweep_slots_are_counted(steps, segment, slots):
    """The LSTM LM at 22% of store-all's peak measured 57,848 bytes for its 57,307-byte budget: the
    planner counted the backward's checkpoints as ``max_stored() - len(sweep_stores)`` slots (0 at
    40 steps, 8 slots), but the sweep's checkpoints are rows of the forward's tensor, which lives
    until the backward ends, so a state stored in a dropped sweep slot is new memory (7 states at
    once there). ``own_states`` is what a run holds."""
    plan = sc.make_plan(steps, segment, slots)
    runner = _OwnStates()
    checkpoints = {0: 0, **{t: t for t in plan.sweep_stores}}
    sc.run_backward(plan, checkpoints, runner)
    assert runner.peak == plan.own_states()
    assert plan.own_states() >= plan.max_stored() - len(plan.sweep_stores)
    if (steps, segment, slots) == (40, 1, 8):
        assert plan.own_states() == 7 and plan.max_stored() == len(plan.sweep_stores) == 8


@pytest.mark.parametrize("steps,segment,slots,tail", [(10, 2, 1, 6), (37, 5, 2, 13), (128, 16, 4, 62)])
def test_long_plans_count_the_states_their_backward_makes(steps, segment, slots, tail):
    plan = sc.make_long_plan(steps, segment, slots, tail)
    runner = _OwnStates()
    sc.run_backward(plan, {0: 0, **{t: t for t in plan.sweep_stores}}, runner)
    assert runner.peak <= plan.own_states()
