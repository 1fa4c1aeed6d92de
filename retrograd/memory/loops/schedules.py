"""Checkpoint schedules over time steps: what a loop keeps in its forward sweep and how its
backward recomputes the rest (sqrt, binomial / revolve, and budgeted).

A schedule reverses ``T`` steps of a recurrence ``state[t+1] = step(state[t])``
in *segments* of ``L`` steps. Reversing one segment means running its steps
again *with tape* (keeping each step's state and the values its backward
reads) and then running their backward in reverse; that costs one forward
step per time step and ``L * tape_bytes`` of memory. The states at segment
starts are kept in at most ``slots`` checkpoints, placed by Griewank's
binomial rule (revolve): with ``s`` free slots (``c = s + 1`` checkpoints
counting the start), reversing ``n`` segments needs
``F(n, s) = r n - C(c + r, c + 1)`` advances, ``r`` being the least integer
with ``C(c + r, c) >= n``, and that is optimal. The forward sweep
runs every step once anyway, so checkpoints on its way cost nothing; only
the advances of the backward are extra.

Cost of a plan, in forward steps beyond the forward sweep::

    taped steps (T) + advances of the backward (``plan.advances``)

so with enough slots for one checkpoint per segment (``slots >= n - 1``)
the backward recomputes every step exactly once -- Chen et al.'s sqrt(T)
scheme at ``L = sqrt(T)`` -- and a smaller budget trades memory for advances.

``Plan.actions()`` lists what the backward does, in order::

    Restore(t)     the current state is the checkpoint of step t (0: the initial state)
    Advance(a, b)  run steps a..b-1 without tape (the current state becomes state b)
    Store(t)       keep the current state (state t) as a checkpoint
    Drop(t)        forget checkpoint t
    Reverse(a, b)  run steps a..b-1 with tape from the current state, then their backward

and ``Plan.sweep_stores`` the steps whose states the forward sweep keeps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

from ...errors import ProgramError


# --- binomial checkpointing arithmetic ---------------------------------------------------------

def beta(s: int, r: int) -> int:
    """The most steps reversible with ``s`` checkpoints advancing each step at most ``r`` times."""
    if r < 0 or s < 0:
        return 0
    return math.comb(s + r, s)


@lru_cache(maxsize=65536)
def revolve_cost(n: int, s: int) -> int:
    """Least advances needed to reverse ``n`` steps from a held start state with ``s`` free slots.

    Args:
        n: The number of steps.
        s: The free checkpoint slots.

    Returns:
        The number of forward steps the reversal runs.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        assert rg.memory.revolve_cost(10, 9) == 9    # a slot per step, each step advanced once
        assert rg.memory.revolve_cost(10, 2) == 15
        ```
    """
    if n <= 1:
        return 0
    if s == 0:
        return n * (n - 1) // 2
    c = s + 1                        # Griewank counts the start state's checkpoint too
    r = 0
    while beta(c, r) < n:
        r += 1
    return r * n - beta(c + 1, r - 1)


def revolve_split(n: int, s: int) -> int:
    """An optimal first checkpoint distance ``k`` (1 <= k < n) for reversing ``n`` steps with ``s >= 1`` slots.

    ``k + F(n - k, s - 1) + F(k, s)`` is convex in ``k`` (each term is), so a
    binary search on its forward difference finds a minimiser.
    """
    def cost(k: int) -> int:
        return k + revolve_cost(n - k, s - 1) + revolve_cost(k, s)

    lo, hi = 1, n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if cost(mid + 1) < cost(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


# --- actions -----------------------------------------------------------------------------------

class Restore(NamedTuple):
    step: int


class Advance(NamedTuple):
    start: int
    stop: int


class Store(NamedTuple):
    step: int


class Drop(NamedTuple):
    step: int


class Reverse(NamedTuple):
    start: int
    stop: int


Action = Restore | Advance | Store | Drop | Reverse


@dataclass
class Plan:
    """A checkpoint schedule for ``steps`` time steps in segments of ``segment`` steps.

    Attributes:
        steps: The number of time steps.
        segment: Steps per segment (taped together).
        slots: Free checkpoint slots (the initial state is extra).
        sweep_stores: States the forward sweep keeps.
        advances: Forward steps the backward runs without tape.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        plan = rg.memory.make_plan(10, 1, 3)
        assert plan.sweep_stores == [1, 4, 7] and plan.segments == 10
        ```
    """
    steps: int
    segment: int
    slots: int                                   # free checkpoint slots (the initial state is extra)
    sweep_stores: list[int] = field(default_factory=list)
    advances: int = 0                            # forward steps the backward runs without tape
    _actions: list = field(default_factory=list, repr=False)
    tail: int = 0                                # steps the forward keeps with tape (``long_tail_plan``)
    tail_segment: int = 0                        # ... reversed in segments of this many steps

    @property
    def segments(self) -> int:
        """The number of segments (``ceil(steps / segment)``)."""
        return -(-self.steps // self.segment) if self.steps else 0

    def actions(self) -> list:
        """The backward's actions in order (``Restore``, ``Advance``, ``Reverse``, ``Store``, ``Drop``).

        Returns:
            A new list of the actions.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            plan = rg.memory.make_plan(10, 1, 3)
            print(plan.actions()[:3])    # [Restore(step=7), Advance(start=7, stop=9), Reverse(start=9, stop=10)]
            ```
        """
        return list(self._actions)

    def peak_bytes(self, state_bytes: int, tape_bytes: int) -> int:
        """Checkpoints held at once plus one segment's tape (the working state not counted).

        Args:
            state_bytes: The bytes of one checkpoint (all recurrent states of one step).
            tape_bytes: What one taped step keeps for its backward.

        Returns:
            The bytes.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            plan = rg.memory.make_plan(10, 1, 3)
            assert plan.peak_bytes(state_bytes=100, tape_bytes=10) == 3 * 100 + 1 * 10
            ```
        """
        return self.max_stored() * state_bytes + min(self.segment, self.steps) * tape_bytes

    def max_stored(self) -> int:
        """The most checkpoints held at once during the backward.

        Returns:
            A count.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            assert rg.memory.make_plan(10, 1, 3).max_stored() == 3
            ```
        """
        held, peak = set(self.sweep_stores), len(self.sweep_stores)
        for action in self._actions:
            if isinstance(action, Store):
                held.add(action.step)
                peak = max(peak, len(held))
            elif isinstance(action, Drop):
                held.discard(action.step)
        return peak

    def own_states(self) -> int:
        """The most states the backward makes and holds at once, beside the sweep's checkpoints.

        The sweep's checkpoints are rows of the forward's checkpoint tensors, which live until the
        backward ends, so ``Drop`` of one frees nothing and a ``Store`` in its slot is new memory
        (``peak.py`` counts these states on top of those rows). Counted: the checkpoints an
        ``Advance`` made, the current state when an ``Advance`` made it and no checkpoint keeps it,
        and during an ``Advance`` of 2+ steps the previous step's state (the next one being made
        is the step's own value).

        Returns:
            A count of states (each all the recurrent states of one step).

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            plan = rg.memory.make_plan(40, 1, 8)
            assert plan.max_stored() == 8 and plan.own_states() == 7   # beside the 8 sweep rows
            ```
        """
        kept: dict = {}                 # step -> the advance that made its state (None: the sweep's)
        current, owned, made, peak = None, False, 0, 0

        def held() -> int:
            return len({m for m in kept.values() if m is not None} | ({current} if owned else set()))
        for action in self._actions:
            if isinstance(action, Restore):
                current, owned = kept.get(action.step), False
            elif isinstance(action, Advance):
                peak = max(peak, held() + (action.stop - action.start > 1))
                made += 1
                current, owned = made, True
            elif isinstance(action, Store):
                kept[action.step] = current
            elif isinstance(action, Drop):
                kept.pop(action.step, None)
            elif isinstance(action, Reverse):
                peak = max(peak, held())
                current, owned = None, False
        return peak

    def recomputed_steps(self) -> int:
        """Forward steps the backward runs (taped and not).

        Returns:
            ``advances + steps``.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            plan = rg.memory.make_plan(10, 1, 3)
            assert plan.recomputed_steps() == plan.advances + 10
            ```
        """
        return self.advances + self.steps


def make_plan(steps: int, segment: int, slots: int, align_end: bool = False) -> Plan:
    """The binomial schedule of ``steps`` steps in segments of ``segment`` with ``slots`` checkpoints.

    Args:
        steps: The number of time steps.
        segment: Steps per segment.
        slots: Free checkpoint slots.

    Returns:
        The ``Plan``.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        plan = rg.memory.make_plan(10, 1, 3)
        assert plan.sweep_stores == [1, 4, 7]                  # states the forward sweep keeps
        print(plan.actions()[:3])    # [Restore(step=7), Advance(start=7, stop=9), Reverse(start=9, stop=10)]
        ```
    """
    if steps < 0 or segment < 1 or slots < 0:
        raise ProgramError(f"bad schedule parameters: steps={steps}, segment={segment}, slots={slots}")
    plan = Plan(steps, segment, slots)
    n = plan.segments
    out: list = []
    current = [None]                             # the step whose state is the current state

    def goto(t: int) -> None:                    # make state t current, from its checkpoint
        if current[0] != t:
            out.append(Restore(t))
            current[0] = t

    def advance(a: int, b: int) -> None:
        goto(a)
        if b > a:
            out.append(Advance(a, b))
        current[0] = b

    def reverse(a: int, b: int) -> None:
        goto(a)
        out.append(Reverse(a, b))
        current[0] = None

    # Work items: ("rev", first segment, count, free slots, on the sweep) or ("act", action).
    work: list = [("rev", 0, n, min(slots, max(n - 1, 0)), True)] if n else []
    if align_end:       # the first segment is the short one, the last a whole one (policies.py: keep_tail)
        bound = lambda j: max(steps - (n - j) * segment, 0)  # noqa: E731
    else:
        bound = lambda j: min(j * segment, steps)  # noqa: E731  (segment index -> time step)
    while work:
        item = work.pop()
        if item[0] == "act":
            out.append(item[1])
            continue
        _, a, count, free, sweep = item
        if count == 1:
            reverse(bound(a), bound(a + 1))
        elif free == 0:
            for j in range(count - 1, -1, -1):
                advance(bound(a), bound(a + j))
                reverse(bound(a + j), bound(a + j + 1))
        else:
            k = revolve_split(count, free)
            if sweep:
                plan.sweep_stores.append(bound(a + k))
            else:
                advance(bound(a), bound(a + k))
                out.append(Store(bound(a + k)))
            # Pushed in reverse: the right part first, then drop its checkpoint, then the left part.
            work.append(("rev", a, k, free, False))
            work.append(("act", Drop(bound(a + k))))
            work.append(("rev", a + k, count - k, free - 1, sweep))
    plan._actions = out
    plan.advances = sum(a.stop - a.start for a in out if isinstance(a, Advance))
    return plan


# --- choosing a plan ---------------------------------------------------------------------------

def sqrt_plan(steps: int) -> Plan:
    """Chen et al.'s schedule: segments of about sqrt(T) steps, a checkpoint at each segment start.

    Args:
        steps: The number of time steps.

    Returns:
        The ``Plan``.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        plan = rg.memory.sqrt_plan(100)                       # checkpoints every ~10 steps
        assert plan.segment == 10
        ```
    """
    segment = max(1, math.isqrt(max(steps, 1)))
    return make_plan(steps, segment, -(-steps // segment))


def per_step_plan(steps: int) -> Plan:
    """Every state kept; each step recomputed once, with tape, just before its backward."""
    return make_plan(steps, 1, steps)


def minimum_budget(state_bytes: int, tape_bytes: int) -> int:
    """The least memory any plan needs: one step's tape (the state comes with it)."""
    return tape_bytes


def _backward_advances(n: int, slots: int) -> int:
    """Segment advances of the backward: revolve's, less those the forward sweep does anyway."""
    if slots >= n - 1:
        return 0
    free_on_sweep, count, free = 0, n, slots
    while count > 1 and free > 0:
        k = revolve_split(count, free)
        free_on_sweep += k
        count, free = count - k, free - 1
    return revolve_cost(n, slots) - free_on_sweep


@lru_cache(maxsize=256)
def budget_plan(steps: int, budget_bytes: int, state_bytes: int, tape_bytes: int) -> Plan:
    """The plan of least recomputation whose checkpoints and tape fit ``budget_bytes``.

    Searches every segment length; for each, the slots the rest of the budget
    holds decide the advances.

    Args:
        steps: The number of time steps.
        budget_bytes: The bound, in bytes.
        state_bytes: One checkpoint (all recurrent states of one step).
        tape_bytes: What one taped step keeps for its backward (its new state
            and the step values its backward reads).

    Returns:
        The ``Plan``.

    Raises:
        ProgramError: Even one step's tape does not fit.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        plan = rg.memory.budget_plan(1000, budget_bytes=200_000, state_bytes=1000, tape_bytes=4000)
        assert (plan.segment, plan.slots, plan.advances) == (44, 22, 0)    # each step recomputed once
        ```
    """
    least = minimum_budget(state_bytes, tape_bytes)
    if budget_bytes < least:
        error = ProgramError(f"a memory budget of {budget_bytes} bytes cannot hold one step of this loop: "
                             f"the minimum budget is {least} bytes "
                             f"({tape_bytes} per taped step, {state_bytes} per state checkpoint)")
        error.least_budget = least        # for callers that offer the least budget instead
        raise error
    if steps <= 1:
        return make_plan(steps, 1, 0)
    segments = range(1, min(steps, budget_bytes // tape_bytes if tape_bytes else steps) + 1)
    # A checkpoint at every segment start recomputes each step once. Among such plans take the
    # longest segments: fewer, larger batched products, and one segment (the store-all backward's
    # own grouping of sums) when everything fits.
    fits_all = [L for L in segments if (-(-steps // L) - 1) * state_bytes + L * tape_bytes <= budget_bytes]
    if fits_all:
        segment = max(fits_all)
        return make_plan(steps, segment, -(-steps // segment) - 1)
    best = None
    for segment in segments:
        n = -(-steps // segment)
        slots = min(n - 1, (budget_bytes - segment * tape_bytes) // state_bytes if state_bytes else n - 1)
        cost = (_backward_advances(n, slots) * segment, slots * state_bytes + segment * tape_bytes)
        if best is None or cost < best[0]:
            best = (cost, segment, slots)
    _, segment, slots = best
    return make_plan(steps, segment, slots)


# --- a long kept tail (policies.py, "tape_first") ------------------------------------------------

LONG_SEGMENT = 16        # steps per segment where each reversed segment adds time-batched rows


def make_long_plan(steps: int, segment: int, slots: int, tail: int, tail_segment: int | None = None) -> Plan:
    """A plan whose forward keeps the tape of the last ``tail`` steps: the backward reverses them in
    segments of ``tail_segment`` (default ``segment``) from the end without re-running them, then
    the first ``steps - tail`` steps by ``make_plan(steps - tail, segment, slots, align_end=True)``
    (its checkpoints, its advances, each segment re-run with tape).

    Example:
        ```python
        import numpy as np
        import retrograd as rg
        from retrograd.memory.loops.schedules import Reverse, make_long_plan

        plan = make_long_plan(10, 2, 1, tail=6)
        print(plan.actions())   # [Reverse(start=8, stop=10), Reverse(start=6, stop=8), Reverse(start=4, stop=6), Restore(step=2), Reverse(start=2, stop=4), Drop(step=2), Restore(step=0), Reverse(start=0, stop=2)]
        assert make_long_plan(10, 4, 1, tail=6, tail_segment=6).actions()[0] == Reverse(4, 10)
        ```
    """
    tail = max(0, min(int(tail), steps))
    by = max(1, int(tail_segment or segment))
    prefix = make_plan(steps - tail, segment, slots, align_end=True)
    reverses = [Reverse(max(stop - by, steps - tail), stop) for stop in range(steps, steps - tail, -by)]
    return Plan(steps, segment, slots, list(prefix.sweep_stores), prefix.advances, reverses + prefix.actions(),
                tail, by if tail else 0)


def long_tail_plan(steps: int, budget: int, state_bytes: int, kept_bytes: int, batched_bytes: int,
                   from_alls: bool) -> Plan | None:
    """The plan re-running the fewest steps when the forward keeps its last steps' tape (``kept_bytes``
    a step: the tape, and the new states unless ``from_alls``, one state more), as many as
    ``budget`` holds; the first steps under ``make_plan`` with the checkpoints that still fit (none
    ``from_alls``: the states tensors hold every segment's start), their segments re-run into the
    tail's buffers. ``batched_bytes``: the time-batched rows a reversed step adds beyond its tape
    (0 where they are written into the tape's rows as the backward consumes them,
    ``rnn_budget.into_tape``): with none the tail is one segment and the first steps' segments as
    long as it; else every segment has ``LONG_SEGMENT`` steps. None when not even one such segment
    fits (the one-segment tail of ``make_plan(align_end=True)`` then).

    Memory: ``tail * kept_bytes (+ state_bytes) + segment * batched_bytes + checkpoints * state_bytes``.

    Example:
        ```python
        import numpy as np
        import retrograd as rg
        from retrograd.memory.loops.schedules import long_tail_plan

        plan = long_tail_plan(128, 9_000_000, 32768, 65536, 131072, from_alls=True)
        assert (plan.segment, plan.tail, plan.advances) == (16, 105, 0)
        plan = long_tail_plan(128, 6_000_000, 32768, 65536, 0, from_alls=True)     # d rows into the tape's
        assert (plan.tail, plan.tail_segment, plan.segment) == (91, 91, 37)
        ```
    """
    if steps <= 0:
        return None
    whole = batched_bytes <= 0
    segment = max(1, min(steps, LONG_SEGMENT))
    extra = 0 if from_alls else state_bytes          # the state the tail starts from
    room = budget - (0 if whole else segment * batched_bytes) - extra
    most = min(steps, room // kept_bytes) if kept_bytes > 0 else steps
    if most < (1 if whole else segment):
        return None

    def plan_for(tail: int, slots: int | None) -> Plan:
        by = max(1, min(tail, steps - tail)) if whole else segment
        n = -(-(steps - tail) // by)
        return make_long_plan(steps, by, n if slots is None else min(max(n - 1, 0), slots), tail,
                              tail if whole else segment)

    if most == steps or from_alls:
        return plan_for(most, None)
    best = None
    for tail in range(most, 0 if whole else segment - 1, -1):     # the longest tail whose first steps re-run once
        left = room - tail * kept_bytes
        plan = plan_for(tail, left // state_bytes if state_bytes > 0 else steps)
        if plan.max_stored() * state_bytes > left:
            continue
        cost = steps - tail + plan.advances
        if best is None or cost < best[0]:
            best = (cost, plan)
        if plan.advances == 0:                    # a shorter tail only re-runs more
            break
    return None if best is None else best[1]


# --- running a plan ------------------------------------------------------------------------------

class StepRunner:
    """What a loop op gives ``run_backward``: how to move its state and reverse a stretch of steps.

    ``state`` is whatever the op carries (a list of arrays). Subclasses
    implement ``advance``, ``reverse``, ``keep`` (a copy that outlives the
    step, counted by the memory meter) and ``drop``.
    """

    def advance(self, state, start: int, stop: int):
        """Run steps ``start..stop-1`` without tape from ``state`` (state ``start``); return state ``stop``."""
        raise NotImplementedError

    def reverse(self, state, start: int, stop: int) -> None:
        """Run steps ``start..stop-1`` with tape from ``state``, then their backward in reverse."""
        raise NotImplementedError

    def keep(self, state):
        return state

    def drop(self, state) -> None:
        """A checkpoint the plan no longer needs."""
        return None

    def release(self, state) -> None:
        """A state ``advance`` returned, now replaced or consumed."""
        return None


def run_backward(plan: Plan, checkpoints: dict, runner: StepRunner, actions: list | None = None) -> None:
    """Carry out ``plan.actions()`` (or ``actions``, a part of them); ``checkpoints`` maps steps to
    kept states (0 and the sweep's stores).

    Checkpoints the plan drops are handed back to ``runner.drop``; the initial
    state (step 0) is the caller's.
    """
    current, owned = None, False          # owned: current came from runner.advance
    for action in plan.actions() if actions is None else actions:
        if isinstance(action, Restore):
            if owned:
                runner.release(current)
            current, owned = checkpoints[action.step], False
        elif isinstance(action, Advance):
            new = runner.advance(current, action.start, action.stop)
            if owned:
                runner.release(current)
            current, owned = new, True
        elif isinstance(action, Store):
            checkpoints[action.step] = runner.keep(current)
        elif isinstance(action, Drop):
            if action.step != 0:
                runner.drop(checkpoints.pop(action.step))
        else:
            runner.reverse(current, action.start, action.stop)
            if owned:
                runner.release(current)
            current, owned = None, False


def sweep(plan: Plan, state, runner: StepRunner) -> dict:
    """Advance from step 0 through ``plan.sweep_stores``, keeping those states (for a plan whose
    forward did not keep them itself); returns the checkpoints ``run_backward`` starts from."""
    checkpoints, at = {0: state}, 0
    for t in plan.sweep_stores:
        new = runner.advance(state, at, t)
        if at:
            runner.release(state)
        state, at = new, t
        checkpoints[t] = runner.keep(state)
    if at:
        runner.release(state)
    return checkpoints

