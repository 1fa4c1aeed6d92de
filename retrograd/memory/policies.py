"""Recompute policies of the memory budget: which memory a budget frees first, and what a
budgeted recurrence keeps beyond its checkpoints.

Four measures, cheapest first (each measured on the language models of ``retrograd train``:
``benchmarks/memory_vs_torch.py``, ``benchmarks/results/memory_vs_torch.md``):

* **shape reads first** (``"shape_reads"``): before anything is recomputed, a budget that
  storing everything misses tries storing everything with the values the backward reads only
  for their shape freed at their last real use. The store-all backward of a recurrence
  (``RecurrentNetworkGrad``) reads its sequences for their shape alone when its step's
  backward reads the step inputs nowhere (an LSTM's hoisted input projection ``[T, N, 4H]``:
  the backward reads the gate activations it saved), yet the op declares no such input, so
  store-all keeps them to the end of the backward. Freed, they cost nothing (a one-element
  ``ShapeStandIn``, ``shape_reads.py``; the rung: ``shape_first.py``). Taken when the program then fits, before the output
  layer's chunked cross-entropy and before any recurrence is budgeted (both recompute).
  Store-all itself is left as it is: the torch backend's fused-LSTM rewrite
  (``passes/fuse_recurrent.py``) wants the projection read by the recurrence alone.
* **free single values** (``"selective"``): next (after micro-batches, where a transformer
  stack takes them), before any checkpoint schedule, the kept values cheapest to make again per
  byte are freed and made again just before their gradient readers (``selective.py``): a GELU's
  or a layer norm's output from its kept input, a layout copy, then a projection from its kept
  input - the fewest that fit, while they cost less than ``selective.MAX_SHARE`` of the forward
  (a checkpoint schedule re-runs all of it). The transformer LM at the issue's size (before
  micro-batches took its time-major layout): 77% of store-all's activations in the same time
  (the checkpoint schedule took 1.28x), 50% in 1.07-1.12x (1.20x).
* **keep the tail** (``"tail"``): a budgeted ``RecurrentNetwork`` (``loops/rnn_budget.py``)
  reverses its steps in segments, each re-run *with tape* from a checkpoint before its
  backward. The forward sweep has just run the last segment when the backward starts with it,
  so with the tail kept the forward keeps that segment's tape (the step values the backward
  reads, and the states unless the states tensors are kept); the backward reverses it without
  re-running it and reuses its buffers for the other segments' tape. The segments are laid
  from the end (``make_plan(align_end=True)``: the short one is the first), so the tail is a
  whole segment. The op's bound is unchanged (checkpoints plus one segment's tape); the tail
  is live from the end of the sweep to the backward, which the planner (``peak.py``) counts at
  the planned length: at a longer run-time length (where the values that grow with it are live
  beside the tail) and at the least budgets the recurrence keeps none (``budget.py``).
* **a long tail** (``"long_tail"``): the forward keeps the tape of as many *last* steps as the
  recurrence's budget holds, not one segment's (``schedules.long_tail_plan``); the backward
  reverses them without re-running them, then the steps before them in segments re-run into the
  tail's buffers. A reversed step's time-batched rows (an LSTM's gate gradients, the ``D`` of
  ``dW = h^T D``) are written into its tape rows once its backward has read them (the same row
  shape and dtype, the tape value no product's operand: ``rnn_budget.into_tape``), so the tail
  is one segment, its products one GEMM each, and it costs only its tape. Taken where it re-runs
  fewer steps (and advances) than the one-segment tail; not when another op (a second
  gradient) reads the tail. The LSTM LM at the issue's size: 1.26x -> 1.05x at 50% of store-all's
  activations, 1.32x -> 1.20x at 25% (``benchmarks/results/memory_vs_torch.md``, "LSTM LM:
  tape_first"). It spends the room a budget leaves, so its measured peak, always within the
  budget, is not always non-increasing as the budget falls (+1.5% once in the LSTM sweep of
  ``tests/memory/test_budget_sweep.py``: where the recurrence stops keeping its states tensors,
  the tail copies ``h``, which the output layer keeps anyway): not the default.

Policies (``POLICIES``): ``"cheap_first"`` (the default: shape reads first, single values, the
tail), ``"tape_first"`` (``cheap_first`` with the long tail), ``"keep_tail"`` (the tail only),
``"checkpoints"`` (none: what every budget did before). The policy is read when
``append_backward(..., memory_budget=)`` (or ``recurrent(..., recompute=<bytes>)``) builds the
backward, and what it chose is recorded on the ops, so a built program runs the same whatever
the policy is later.

Example:
    ```python
    import retrograd as rg

    assert rg.memory.policies.current() == "cheap_first"
    with rg.memory.policies.policy("checkpoints"):
        assert not rg.memory.policies.keeps_tail()
    assert rg.memory.policies.keeps_tail() and rg.memory.policies.frees_shape_reads()
    assert rg.memory.policies.recomputes_selectively()
    with rg.memory.policies.policy("tape_first"):
        assert rg.memory.policies.keeps_long_tail()
    ```
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from ..errors import ProgramError

POLICIES = {
    "checkpoints": frozenset(),
    "keep_tail": frozenset({"tail"}),
    "cheap_first": frozenset({"tail", "shape_reads", "selective"}),
    "tape_first": frozenset({"tail", "shape_reads", "selective", "long_tail"}),
}
DEFAULT = "cheap_first"

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
    return "tail" in POLICIES[current()]


def recomputes_selectively() -> bool:
    """True when the policy in force frees single values cheap to make again before checkpointing."""
    return "selective" in POLICIES[current()]


def frees_shape_reads() -> bool:
    """True when the policy in force tries store-all with the shape-only reads freed first."""
    return "shape_reads" in POLICIES[current()]


def keeps_long_tail() -> bool:
    """True when the policy in force keeps the tape of as many last steps as the budget holds."""
    return "long_tail" in POLICIES[current()]
