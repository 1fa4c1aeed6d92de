"""Recompute policies of the memory budget: what a budgeted recurrence keeps beyond its checkpoints.

A budgeted ``RecurrentNetwork`` (``loops/rnn_budget.py``) reverses its steps in
segments: each segment's steps run again *with tape* from a checkpoint, then
their backward. The forward sweep has just run the last segment's steps when
the backward starts with that same segment, so re-running it is pure waste
whenever its tape fits in the op's budget anyway (the schedule reserves one
segment's tape for the backward):

* ``"checkpoints"``: the forward keeps only the schedule's checkpoints; the
  backward re-runs every segment (what every budgeted recurrence did before).
* ``"keep_tail"`` (the default): the forward also keeps the tape (the step
  values the backward reads, and the states unless the states tensors are
  kept) of the steps of the schedule's *last* segment; the backward reverses
  that segment from it without re-running it, and reuses its buffers for the
  other segments' tape. The budget bound is unchanged (checkpoints plus one
  segment's tape); what changes is that the tail is live from the end of the
  forward sweep to the backward, which the planner (``peak.py``) counts, so
  the budget search picks the largest activation budget for which that fits.

Measured on the LSTM LM of ``retrograd train`` (``benchmarks/memory_vs_torch.py``,
results in ``benchmarks/results/memory_vs_torch.md``): the re-run of the last
segment is ``segment / T`` of the recurrence's recomputation.

The policy is read when a budgeted recurrence's gradient is built
(``append_backward(..., memory_budget=)``, or ``recurrent(..., recompute=<bytes>)``)
and recorded on the op (``budget_tail``), so a built program runs the same
whatever the policy is later.

Example:
    ```python
    import retrograd as rg

    assert rg.memory.policies.current() == "keep_tail"
    with rg.memory.policies.policy("checkpoints"):
        assert not rg.memory.policies.keeps_tail()
    assert rg.memory.policies.keeps_tail()
    ```
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from ..errors import ProgramError

POLICIES = {
    "checkpoints": "keep only the schedule's checkpoints; the backward re-runs every segment",
    "keep_tail": "also keep the last segment's tape from the forward sweep; the backward re-runs the others",
}
DEFAULT = "keep_tail"

_current = [DEFAULT]


def current() -> str:
    """The name of the policy in force (``DEFAULT`` unless inside ``policy(...)``)."""
    return _current[-1]


@contextmanager
def policy(name: str) -> Iterator[None]:
    """Build budgeted backwards with the policy ``name`` (one of ``POLICIES``) inside the block."""
    if name not in POLICIES:
        raise ProgramError(f"unknown memory policy {name!r}; known: {sorted(POLICIES)}")
    _current.append(name)
    try:
        yield
    finally:
        _current.pop()


def keeps_tail() -> bool:
    """True when the policy in force keeps the last segment's tape from the forward sweep."""
    return current() == "keep_tail"
