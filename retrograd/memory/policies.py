"""Recompute policies of the memory budget: which memory a budget frees first, and what a
budgeted recurrence keeps beyond its checkpoints.

Two measures, cheapest first (each measured on the LSTM LM of ``retrograd train``:
``benchmarks/memory_vs_torch.py``, ``benchmarks/results/memory_vs_torch.md``):

* **shape reads first** (``"shape_reads"``): before anything is recomputed, a budget that
  storing everything misses tries storing everything with the values the backward reads only
  for their shape freed at their last real use. The store-all backward of a recurrence
  (``RecurrentNetworkGrad``) reads its sequences for their shape alone when its step's
  backward reads the step inputs nowhere (an LSTM's hoisted input projection ``[T, N, 4H]``:
  the backward reads the gate activations it saved), yet the op declares no such input, so
  store-all keeps them to the end of the backward. Freed, they cost nothing (a one-element
  ``ShapeStandIn``, ``shape_reads.py``). Taken when the program then fits, before the output
  layer's chunked cross-entropy and before any recurrence is budgeted (both recompute).
  Store-all itself is left as it is: the torch backend's fused-LSTM rewrite
  (``passes/fuse_recurrent.py``) wants the projection read by the recurrence alone.
* **keep the tail** (``"tail"``): a budgeted ``RecurrentNetwork`` (``loops/rnn_budget.py``)
  reverses its steps in segments, each re-run *with tape* from a checkpoint before its
  backward. The forward sweep has just run the last segment when the backward starts with it,
  so with the tail kept the forward keeps that segment's tape (the step values the backward
  reads, and the states unless the states tensors are kept); the backward reverses it without
  re-running it and reuses its buffers for the other segments' tape. The segments are laid
  from the end (``make_plan(align_end=True)``: the short one is the first), so the tail is a
  whole segment. The op's bound is unchanged (checkpoints plus one segment's tape); the tail
  is live from the end of the sweep to the backward, which the planner (``peak.py``) counts.

Policies (``POLICIES``): ``"cheap_first"`` (the default: both), ``"keep_tail"`` (the tail
only), ``"checkpoints"`` (neither: what every budget did before). The policy is read when
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
    ```
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from ..errors import ProgramError
from ..ir.analysis import op_reads
from ..ir.program import Op, Var
from .shape_reads import bind_shape_stand_ins, shape_only_positions

POLICIES = {
    "checkpoints": frozenset(),
    "keep_tail": frozenset({"tail"}),
    "cheap_first": frozenset({"tail", "shape_reads"}),
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


def frees_shape_reads() -> bool:
    """True when the policy in force tries store-all with the shape-only reads freed first."""
    return "shape_reads" in POLICIES[current()]


# --- shape reads first -------------------------------------------------------------------------

def read_for_shape(op: Op) -> frozenset[int]:
    """Input positions ``op`` reads only for their shape: what it declares, and for a store-all
    recurrence's gradient the sequences whose step input its backward step reads nowhere (and
    no time-batched product takes)."""
    declared = shape_only_positions(op)
    if op.type != "RecurrentNetworkGrad":
        return declared
    attrs = op.attrs
    reads = {name for inner in attrs["backward"].ops for name in op_reads(inner)}
    batched = {ref for _, kind, ref, _ in attrs["batched"] if kind == "seq"}
    return declared | {i for i, name in enumerate(attrs["inputs_t"]) if name not in reads and i not in batched}


def store_all_freeing_shape_reads(loss: Var, feed_shapes, build, budget: int) -> tuple[list, int] | None:
    """Store everything, the shape-only reads freed at their last real use, when that fits
    ``budget`` (tried on a copy): ``(pairs, planned peak)`` built into the program, else None."""
    from .peak import planned_peak      # peak.py reads loops/rnn_budget.py, which reads this module
    if not frees_shape_reads() or not any(op.type == "RecurrentNetwork" for op in loss.block.ops):
        return None
    scratch = loss.block.program.clone()
    block = scratch.global_block()
    pairs, n_forward = build(block.var(loss.name), real=False)
    if not bind_shape_stand_ins(block, n_forward, read_for_shape):
        return None
    try:
        peak = planned_peak(block, [loss.name] + [g.name for _, g in pairs], feed_shapes)
    except ProgramError:        # a while loop's trip count decides what storing everything takes
        return None
    if peak > budget:
        return None
    pairs, n_forward = build()
    bind_shape_stand_ins(loss.block, n_forward, read_for_shape)
    return pairs, peak
