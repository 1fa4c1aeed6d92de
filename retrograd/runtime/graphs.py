"""Device graphs: capture a run once, replay it where the feeds' shapes repeat (``Executor(graphs=True)``).

On a GPU a plan of small ops is bound by launching them: Python dispatch and
one kernel launch per op, tens of thousands per step for a long recurrent
net. A device graph (CUDA graphs through torch or CuPy) records every launch
of one run and replays them with one call. What is captured is a run's
*work*, not its Python, so a replay must need none:

* the arrays a replay reads are the same buffers every time: feeds are
  copied into fixed device buffers, and the parameters and optimizer state it
  writes are copied back into the scope's own arrays after the replay, so the
  scope keeps its arrays and the next replay reads the new values;
* checks that read the device (ids in range for ``Gather``, labels for
  ``softmax_cross_entropy``) are deferred: their ranges are read back after
  the replay, in one transfer, and a failure raises the eager run's
  ``ExecutionError`` before anything is copied back into the scope;
* nothing may depend on the host between launches: a run that reads a device
  value on the host (a ``while_loop`` condition, a ``cond`` predicate, a
  budgeted loop's schedule) fails to capture and stays eager, as does a
  program with random ops (their keys change every run; a graph would replay
  one draw).

A plan is run eagerly ``warmup`` times per feed signature before it is
captured (libraries set up their handles and workspaces there), then it is
captured and replayed. Replacing a scope value it reads (``scope.set``,
``load_params``) makes the next run capture anew. The graph's buffers stay
allocated while the executor lives: memory for launch time.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import kernel_failure
from ..ir.program import Block
from ..ops.core.registry import OPS
from ..ops.array.tensor import check_id_range


@dataclass
class _Entry:
    eager_runs: int = 0
    uncapturable: str | None = None      # why this plan and signature stay eager
    failure: object = None               # the exception that stopped the capture
    graph: object = None
    inputs: dict = field(default_factory=dict)      # name -> the array the graph reads
    outputs: dict = field(default_factory=dict)     # name -> the array the graph leaves its value in
    ops_run: int = 0
    peak_bytes: int = 0
    copy_back: list = field(default_factory=list)   # (scope array, the graph's new value)
    checks: list = field(default_factory=list)      # (op, n, what) of each deferred id check
    check_ranges: object = None                      # their [low, high] rows, refreshed per replay


class GraphRunner:
    """Per executor: one captured graph per (plan, feed shapes and dtypes, scope)."""

    def __init__(self, backend, warmup: int = 2):
        self.backend = backend
        self.warmup = warmup
        self.entries: dict[tuple, _Entry] = {}
        self.last_replayed = False

    def run(self, executor, run, plan, env: dict, fed: frozenset, scope, fetch) -> dict | None:
        """The run's values after replaying its graph (capturing it first when due), or None:
        the caller runs this one eagerly (warming up, not capturable, or the capture failed).
        ``run``: the executor's RunContext (its meter and op count are set from the capture)."""
        self.last_replayed = False
        entry = self._entry(plan, env, fed, scope)
        if entry.uncapturable is not None:
            return None
        if entry.graph is not None and not self._same_inputs(entry, env, fed):
            entry.graph, entry.eager_runs = None, 0       # a scope value was replaced: capture anew
        if entry.graph is None and entry.eager_runs < self.warmup:
            entry.eager_runs += 1
            return None
        if entry.graph is None and not self._capture(entry, executor, run, plan, env, fed):
            return None
        for name in fed:
            entry.inputs[name][...] = env[name]
        entry.graph.replay()
        self.last_replayed = True
        _raise_failed_checks(entry, self.backend)
        for array, new in entry.copy_back:
            array[...] = new
        run.ops_run, run.meter.peak = entry.ops_run, entry.peak_bytes
        values = dict(entry.outputs)
        for name in fetch:            # the next replay overwrites the graph's buffers
            if name in values:
                values[name] = self.backend.xp.asarray(values[name], copy=True)
        return values

    # -- internals -----------------------------------------------------------------------
    def _entry(self, plan, env: dict, fed: frozenset, scope) -> _Entry:
        signature = tuple(sorted((n, tuple(env[n].shape), str(env[n].dtype)) for n in fed))
        key = (id(plan), signature, id(scope))
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = _Entry(uncapturable=_random_op(plan))
        return entry

    @staticmethod
    def _same_inputs(entry: _Entry, env: dict, fed: frozenset) -> bool:
        return entry.inputs.keys() == env.keys() and all(
            env[n] is entry.inputs[n] for n in env if n not in fed)

    def _capture(self, entry: _Entry, executor, run, plan, env: dict, fed: frozenset) -> bool:
        xp = self.backend.xp
        inputs = {n: (xp.asarray(v, copy=True) if n in fed else v) for n, v in env.items()}
        written = {n: inputs[n] for n in plan.persistable_writes if n in inputs and n not in fed}
        values = dict(inputs)
        checks: list = []
        ranges: list = []
        failures: list = []

        def work():
            try:
                executor.execute(plan, values)
            except Exception as exc:   # the capture's own error afterwards only says it was invalidated
                failures.append(exc)
                raise
            if checks:                                # one array of every check's [low, high]
                ranges.append(xp.stack([xp.astype(xp.stack([low, high]), xp.int64)
                                        for _, low, high, _, _ in checks]))

        run.deferred_checks = checks
        try:
            entry.graph = self.backend.capture_graph(work)
        except Exception as exc:  # noqa: BLE001 -- any failure to capture means: run eagerly
            first = failures[0] if failures else exc
            entry.uncapturable = f"not capturable: {type(first).__name__}: {first}"
            entry.failure = first
            entry.graph = None
            return False
        finally:
            run.deferred_checks = None
        # New values of the parameters and optimizer state are copied into the scope's own arrays
        # after each replay whose checks passed (a failed run leaves the scope as it was).
        entry.copy_back = [(array, values[name]) for name, array in written.items()
                           if values.get(name) is not None and values[name] is not array]
        for name, array in written.items():
            values[name] = array
        entry.checks = [(op, n, what) for op, _, _, n, what in checks]
        entry.check_ranges = ranges[0] if ranges else None
        entry.inputs, entry.outputs = inputs, values
        entry.ops_run, entry.peak_bytes = run.ops_run, run.meter.peak
        return True


def _raise_failed_checks(entry: _Entry, backend) -> None:
    """The ExecutionError an eager run gives, for the first id check the replay failed."""
    if entry.check_ranges is None:
        return
    for (op, n, what), (low, high) in zip(entry.checks, backend.to_numpy(entry.check_ranges).tolist()):
        try:
            check_id_range(low, high, n, what)
        except IndexError as exc:
            raise kernel_failure(op.where(), exc) from None


def _random_op(plan) -> str | None:
    """Why a plan with random ops stays eager: a graph would replay one draw every run."""
    blocks = [plan.block]
    while blocks:
        block = blocks.pop()
        for op in block.ops:
            opdef = OPS.get(op.type)
            if opdef is not None and opdef.random:
                return f"{op.where()} draws random numbers, which change every run"
            blocks.extend(v for v in op.attrs.values() if isinstance(v, Block))
    return None
