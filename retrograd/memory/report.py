"""``rg.memory.report``: what the backward of a program keeps from the forward, and at what size."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..ir.analysis import op_reads
from ..ir.program import Program, Var
from .lifetimes import ForwardValues, backward_start
from .peak import planned_peak
from .recompute import RECOMPUTE_ATTR
from .shape_reads import stand_in_names
from .sizes import resolve_shapes, value_bytes


@dataclass
class ValueInfo:
    """One forward value the backward needs: a row of a ``MemoryReport``.

    Attributes:
        name: The value's name.
        shape: Its shape, resolved from ``feed_shapes`` where possible (-1 unknown).
        dtype: Its dtype.
        nbytes: Its size, or None while unknown.
        status: ``"checkpoint"`` (kept, recomputation starts from it),
            ``"kept"``, ``"recomputed"``, ``"input"`` (fed / persistable) or
            ``"shape only"`` (a one-element stand-in for a value read for its shape).
        readers: Backward ops reading it (recompute copies included).
        recomputed_as: The names of its recomputed copies.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 64])
            h = x
            for i in range(6):
                h = rg.layers.fc(h, 64, act="tanh", name=f"l{i}")
            loss = rg.mean(h)
            rg.append_backward(loss, checkpoints=[main.global_block().var("l2")])
        row = rg.memory.report(main, feed_shapes={"x": (128, 64)}).value("l0.w")
        assert row.status == "input" and row.shape == (64, 64) and row.nbytes == 64 * 64 * 4
        ```
    """
    name: str
    shape: tuple[int, ...]        # resolved from feed_shapes where possible; -1 = unknown
    dtype: str
    nbytes: int | None            # None while a size is unknown
    status: str                   # "checkpoint" (kept, recomputation starts from it), "kept",
                                  # "recomputed", "input" (fed / persistable) or "shape only"
                                  # (a one-element stand-in for a value read for its shape)
    readers: int = 0              # backward ops reading it (recompute copies included)
    recomputed_as: list[str] = field(default_factory=list)


@dataclass
class MemoryReport:
    """Forward values held for the backward (``kept``), recomputed in it, and fixed inputs.

    Values the backward reads only for their shape are not kept: it reads a
    one-element stand-in instead (``stand_ins``, ``memory/shape_reads.py``).
    ``str(report)`` is a table with totals. Byte totals are None while a size
    depends on run-time shapes that ``feed_shapes`` did not give.

    Attributes:
        kept: ``ValueInfo`` rows of values kept from the forward until the backward reads them.
        recomputed: Rows of values recomputed in the backward instead.
        inputs: Rows of fed and persistable values.
        backward_start: The index of the backward's first op.
        peak_recompute_bytes: What the largest segment recomputes (its values are
            freed one by one as the backward moves on, so this bounds what that
            segment holds).
        stand_ins: Rows of values read for their shape only.
        planned_peak: The run's planned peak, when known.
        budget: The ``memory_budget`` the backward was built for, if any.
        plan: The ``BudgetPlan``, if any.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 64])
            h = x
            for i in range(6):
                h = rg.layers.fc(h, 64, act="tanh", name=f"l{i}")
            loss = rg.mean(h)
            rg.append_backward(loss, checkpoints=[main.global_block().var("l2")])
        r = rg.memory.report(main, feed_shapes={"x": (128, 64)})
        print(r)                                           # value, shape, bytes, kept / recomputed
        assert r.kept_bytes > 0 and r.recomputed_bytes > 0
        ```
    """
    kept: list[ValueInfo]
    recomputed: list[ValueInfo]
    inputs: list[ValueInfo]
    backward_start: int
    peak_recompute_bytes: int | None = 0
    stand_ins: list[ValueInfo] = field(default_factory=list)
    planned_peak: int | None = None     # the run's planned peak (memory/peak.py), when known
    budget: int | None = None           # the memory_budget the backward was built for, if any
    plan: object = None                 # memory/budget.py's BudgetPlan, if any

    @property
    def kept_bytes(self) -> int | None:
        """The bytes kept from the forward until the backward reads them (None while a size is unknown)."""
        return _total(self.kept)

    @property
    def recomputed_bytes(self) -> int | None:
        """The bytes recomputed in the backward instead of kept (None while a size is unknown)."""
        return _total(self.recomputed)

    @property
    def input_bytes(self) -> int | None:
        """The bytes of fed and persistable values the backward reads (None while a size is unknown)."""
        return _total(self.inputs)

    def value(self, name: str) -> ValueInfo | None:
        """The row of value ``name``, or None.

        Args:
            name: A value's name.

        Returns:
            Its ``ValueInfo``, or None.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main, startup = rg.Program(), rg.Program()
            with rg.program_guard(main, startup):
                x = rg.data("x", [-1, 64])
                h = x
                for i in range(6):
                    h = rg.layers.fc(h, 64, act="tanh", name=f"l{i}")
                loss = rg.mean(h)
                rg.append_backward(loss, checkpoints=[main.global_block().var("l2")])
            r = rg.memory.report(main, feed_shapes={"x": (128, 64)})
            assert r.value("l2").status == "kept" and r.value("l0").status == "recomputed"
            assert r.value("nope") is None
            ```
        """
        for row in self.kept + self.recomputed + self.inputs + self.stand_ins:
            if row.name == name:
                return row
        return None

    def __str__(self) -> str:
        rows = [("value", "shape", "dtype", "bytes", "status", "recomputed as")]
        for row in self.kept + self.recomputed + self.inputs + self.stand_ins:
            shape = "[" + ", ".join("?" if d < 0 else str(d) for d in row.shape) + "]"
            rows.append((row.name, shape, row.dtype, _fmt(row.nbytes), row.status,
                         ", ".join(row.recomputed_as)))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.append("")
        if self.planned_peak is not None:
            against = "" if self.budget is None else f" against a budget of {_fmt(self.budget)} B"
            lines.append(f"planned peak {_fmt(self.planned_peak)} B{against}" + _plan_note(self.plan))
        lines.append(f"kept {_fmt(self.kept_bytes)} B in {len(self.kept)} values; recomputed "
                     f"{_fmt(self.recomputed_bytes)} B in {len(self.recomputed)} values (largest segment "
                     f"{_fmt(self.peak_recompute_bytes)} B); inputs {_fmt(self.input_bytes)} B"
                     + (f"; {len(self.stand_ins)} read for their shape only" if self.stand_ins else ""))
        return "\n".join(lines)


def _plan_note(plan) -> str:
    if plan is None:
        return ""
    stored = "?" if plan.store_all_peak is None else _fmt(plan.store_all_peak)
    micro = getattr(plan, "micro_batches", 1)
    if plan.activation_budget is None and micro > 1:
        return f" (store-all {stored} B; the batch in {micro} micro-batches, each one's backward after its forward)"
    if plan.activation_budget is None:
        return f" (everything stored: {stored} B)"
    ff = f", feed-forward reversed over {plan.units} units" if plan.units else ""
    return f" (store-all {stored} B; loops and checkpoints keep <= {_fmt(plan.activation_budget)} B each{ff})"


def _total(rows: Sequence[ValueInfo]) -> int | None:
    if any(r.nbytes is None for r in rows):
        return None
    return sum(r.nbytes for r in rows)


def _fmt(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def report(program: Program, feed_shapes: Mapping[str, Sequence[int]] | None = None,
           loss: Var | str | None = None, fetch_list: Sequence | None = None) -> MemoryReport:
    """Which forward values the backward part of ``program`` keeps, recomputes, and their sizes.

    The backward part starts at the op seeding the loss gradient (or after the
    op writing ``loss`` when given). A program built with ``memory_budget=``
    reports its planned peak against the budget (``r.planned_peak``,
    ``r.budget``); with ``fetch_list`` the planned peak of a run fetching those
    is computed for any program.

    Args:
        program: A program with its backward appended.
        feed_shapes: ``{name: shape}`` so that sizes known only at run time
            (``-1``) become bytes.
        loss: The loss Var or name, to say where the backward starts.
        fetch_list: Fetches for a planned peak.

    Returns:
        A ``MemoryReport``.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 64])
            h = x
            for i in range(6):
                h = rg.layers.fc(h, 64, act="tanh", name=f"l{i}")
            loss = rg.mean(h)
            rg.append_backward(loss, checkpoints=[main.global_block().var("l2")])
        r = rg.memory.report(main, feed_shapes={"x": (128, 64)})
        print(r)
        print(r.kept_bytes, r.recomputed_bytes)
        ```
    """
    block = program.global_block()
    start = backward_start(block, loss)
    info = ForwardValues.of(block, start)
    shapes = resolve_shapes(block, feed_shapes)
    recomputed_as: dict[str, list[str]] = {}
    feeds_recompute: set[str] = set()
    groups: list[list[str]] = []
    previous_copy = False
    for op in block.ops[start:]:
        originals = op.attrs.get(RECOMPUTE_ATTR)
        if originals is None:
            previous_copy = False
            continue
        if not previous_copy:
            groups.append([])
        previous_copy = True
        feeds_recompute.update(op_reads(op))
        for orig, new in zip(originals, op.outputs):
            recomputed_as.setdefault(orig, []).append(new)
            groups[-1].append(new)

    def row(name: str, status: str) -> ValueInfo:
        var = block.var(name)
        return ValueInfo(name, shapes.get(name, var.shape), var.dtype, value_bytes(var, shapes), status,
                         info.backward_reads.get(name, 0), recomputed_as.get(name, []))

    kept, inputs, stand_ins = [], [], []
    shape_only = stand_in_names(block)
    for name in info.backward_reads:
        if name in shape_only:
            stand_ins.append(row(name, "shape only"))
            stand_ins[-1].nbytes = np.dtype(block.var(name).dtype).itemsize
        elif name in info.writers:
            kept.append(row(name, "checkpoint" if name in feeds_recompute else "kept"))
        else:
            inputs.append(row(name, "input"))
    recomputed = [row(name, "recomputed") for name in recomputed_as if name not in info.backward_reads]
    peak = 0
    for group in groups:
        sizes = [value_bytes(block.var(n), shapes) for n in group]
        if any(s is None for s in sizes):
            peak = None
            break
        peak = max(peak, sum(sizes))
    result = MemoryReport(kept, recomputed, inputs, start, peak, stand_ins)
    plan = getattr(program, "memory_plan", None)
    if fetch_list is not None:
        keep = [f.name if isinstance(f, Var) else f for f in fetch_list]
        result.planned_peak = planned_peak(block, keep, feed_shapes, exact=False, live=True)
    elif plan is not None:
        result.planned_peak = plan.planned_peak
    if plan is not None:
        result.budget, result.plan = plan.budget, plan
    return result
