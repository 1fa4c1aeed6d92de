"""The executor: runs compiled plans of a program's blocks on an array namespace."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Mapping, Sequence

import numpy as np

from ..errors import ExecutionError, FeedError, ProgramError, RetrogradError
from ..ir.program import Block, Program, Var
from .plan import Plan, compile_block
from .scope import Scope
from .stats import MemoryMeter, RunStats


class RunContext:
    """State of the run in progress, shared by every kernel (``k.run``).

    ``rng_path`` says which iteration of which enclosing loops is running:
    ``(loop key, iteration, inner loop key, iteration, ...)``, empty at the
    top level. Random kernels draw from ``(seed, run_id, *rng_path)``, so a
    loop body draws new numbers at every iteration, and running the same
    iteration again (a recompute in the backward) draws the same ones. Ops
    that run a block repeatedly extend it with ``random_stream``.
    """

    def __init__(self, executor: "Executor"):
        self.executor = executor
        self.run_id = 0
        self.meter = MemoryMeter()
        self.ops_run = 0
        self.scope: Scope | None = None
        self.rng_path: tuple[int, ...] = ()

    @contextmanager
    def random_stream(self, stream: tuple[int, int] | None) -> Iterator[None]:
        """Inside, ``rng_path`` ends with ``stream`` = (loop key, iteration); None leaves it as it is."""
        outer = self.rng_path
        if stream is not None:
            self.rng_path = outer + tuple(stream)
        try:
            yield
        finally:
            self.rng_path = outer

    def run_block(self, block: Block, bindings: dict, fetch: Sequence[str],
                  stream: tuple[int, int] | None = None) -> list:
        """Run a sub-block with ``bindings`` for its free reads; return the ``fetch`` values.

        Control-flow kernels call this; the sub-block's plan is compiled once.
        A loop passes ``stream`` = (its key, the iteration) (see ``random_stream``).
        """
        executor = self.executor
        plan = executor.plan_for(block, frozenset(fetch))
        missing = [n for n in plan.free_reads if n not in bindings]
        if missing:
            raise ExecutionError(f"block {block.idx} reads {', '.join(missing)} but its op did not bind them")
        env = dict(bindings)
        for value in env.values():
            self.meter.hold(value)
        if stream is None:
            executor.execute(plan, env)
        else:
            with self.random_stream(stream):
                executor.execute(plan, env)
        try:
            results = [env[n] for n in fetch]
        except KeyError as exc:
            raise ExecutionError(f"block {block.idx} did not produce '{exc.args[0]}'") from None
        for value in env.values():
            self.meter.release(value)
        return results


class Executor:
    """Runs programs. ``exe.scope`` holds parameters; ``exe.last_stats`` reports the last run.

    Example::

        exe = rg.Executor()
        exe.run(startup)
        loss_v, = exe.run(main, feed={"x": xb}, fetch_list=[loss])
        print(exe.last_stats.peak_bytes, exe.last_stats.time_s)
    """

    def __init__(self, scope: Scope | None = None, xp=None):
        self.scope = scope if scope is not None else Scope()
        self.xp = xp if xp is not None else np
        self.last_stats = RunStats()
        self._run = RunContext(self)
        self._plans: dict[tuple, Plan] = {}
        self._verified: dict[int, int] = {}

    # -- compiling -------------------------------------------------------------
    def plan_for(self, block: Block, keep: frozenset[str]) -> Plan:
        program = block.program
        key = (program.serial, program.version, block.idx, keep)
        plan = self._plans.get(key)
        if plan is None:
            self._verify(program)
            plan = compile_block(block, keep, self.xp, self._run)
            self._plans[key] = plan
        return plan

    def _verify(self, program: Program) -> None:
        if self._verified.get(program.serial) != program.version:
            from ..ir.verify import verify_program
            verify_program(program)
            self._verified[program.serial] = program.version

    # -- running -----------------------------------------------------------------
    def run(self, program: Program, feed: dict | None = None, fetch_list: Sequence | None = None,
            scope: Scope | None = None) -> list:
        """Run the global block; return the values of ``fetch_list`` (Vars or names)."""
        started = time.perf_counter()
        if not isinstance(program, Program):
            raise ProgramError(f"Executor.run needs a Program, got {type(program).__name__}")
        if feed is not None and not isinstance(feed, Mapping):
            raise FeedError(f"feed must be a dict of name (or Var) -> array, got {type(feed).__name__}")
        if isinstance(fetch_list, (Var, str)):
            fetch_list = [fetch_list]                 # one item: still returns a list of one value
        scope = scope if scope is not None else self.scope
        block = program.global_block()
        fetch = [_fetch_name(f, block) for f in (fetch_list or [])]
        plan = self.plan_for(block, frozenset(fetch))
        run = self._run
        run.run_id += 1
        run.meter = MemoryMeter()
        run.ops_run = 0
        run.scope = scope
        run.rng_path = ()
        env = self._initial_env(plan, block, feed or {}, scope)
        for value in env.values():
            run.meter.hold(value)
        self.execute(plan, env)
        for name in plan.persistable_writes:
            if name in env:
                scope.set(name, env[name])
        results = []
        for name in fetch:
            if name not in env:
                var, value = block.find_var(name), scope.find(name)
                if var is not None and var.persistable and value is not None:
                    results.append(value)      # a parameter no op of this run reads: its scope value
                    continue
                raise FeedError(f"fetch '{name}' has no value after the run: nothing in block 0 "
                                "writes it and it was not fed")
            results.append(env[name])
        self.last_stats = RunStats(time.perf_counter() - started, run.ops_run, run.meter.peak)
        return results

    def execute(self, plan: Plan, env: dict) -> None:
        """Run a plan's steps over ``env`` (name -> array), freeing dead values."""
        meter = self._run.meter
        hold, release = meter.hold, meter.release
        for step in plan.steps:
            try:
                args = [env[n] for n in step.inputs]
            except KeyError as exc:
                raise ExecutionError(f"{step.op.where()} reads '{exc.args[0]}', which has no value "
                                     "(not fed, not initialised, or freed)") from None
            try:
                result = step.kernel(step.k, *args)
            except RetrogradError:
                raise
            except Exception as exc:
                shapes = ", ".join(f"{n}: {_shape_of(a)}" for n, a in zip(step.inputs, args))
                raise ExecutionError(f"{step.op.where()} failed: {type(exc).__name__}: {exc} "
                                     f"(inputs: {shapes or 'none'})") from exc
            outputs = step.outputs
            if len(outputs) == 1:
                result = (result,)
            for name, value in zip(outputs, result):
                old = env.get(name)
                env[name] = value
                hold(value)            # before releasing the old value: both lived while the op ran
                if old is not None:
                    release(old)
            for name in step.dead:
                value = env.pop(name, None)
                if value is not None:
                    release(value)
        self._run.ops_run += len(plan.steps)

    def _initial_env(self, plan: Plan, block: Block, feed: dict, scope: Scope) -> dict:
        env = {}
        for name, value in feed.items():
            name = name.name if isinstance(name, Var) else name
            var = block.vars.get(name)
            if var is None:
                raise FeedError(f"feed '{name}' is not a variable of block 0")
            env[name] = _check_feed(var, value, self.xp)
        for name in plan.free_reads:
            if name in env:
                continue
            var = block.find_var(name)
            value = scope.find(name)
            if value is None or var is None or not var.persistable:
                readers = [s.op.where() for s in plan.steps if name in s.inputs][:1]
                hint = "run the startup program first" if var is not None and var.persistable else "feed it"
                raise FeedError(f"'{name}' is read by {readers[0] if readers else 'the program'} "
                                f"but has no value: {hint}")
            checked = _check_persistable(var, value, self.xp)
            if checked is not value:
                scope.set(name, checked)   # cast once, not on every run
            env[name] = checked
        return env


def _fetch_name(item, block: Block) -> str:
    name = item.name if isinstance(item, Var) else item
    if not isinstance(name, str) or block.find_var(name) is None:
        raise FeedError(f"fetch {item!r} is not a variable of block 0")
    return name


def _shape_of(array) -> str:
    shape = getattr(array, "shape", None)
    dtype = getattr(array, "dtype", None)
    return f"{dtype}{list(shape)}" if shape is not None else type(array).__name__


def _check_feed(var: Var, value, xp):
    """The feed as an array of the declared dtype; same-kind casts only (float64 -> float32)."""
    from ..backend import from_numpy, to_numpy
    try:
        array = to_numpy(value) if hasattr(value, "shape") and hasattr(value, "dtype") else np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise FeedError(f"feed '{var.name}' is not an array: {exc}") from None
    if array.dtype != np.dtype(var.dtype):
        if not np.can_cast(array.dtype, var.dtype, casting="same_kind"):
            raise FeedError(f"feed '{var.name}' has dtype {array.dtype}, the program declares {var.dtype}")
        array = array.astype(var.dtype)
    if array.ndim != len(var.shape) or any(d >= 0 and d != a for d, a in zip(var.shape, array.shape)):
        raise FeedError(f"feed '{var.name}' has shape {list(array.shape)}, "
                        f"the program declares {var.type_str()} (? = any size)")
    return from_numpy(xp, array)


def _check_persistable(var: Var, value, xp):
    """The scope value, cast to the declared dtype when the cast is same-kind (float64 -> float32)."""
    shape = tuple(getattr(value, "shape", ()))
    if len(shape) != len(var.shape) or any(d >= 0 and d != a for d, a in zip(var.shape, shape)):
        raise FeedError(f"scope value '{var.name}' has shape {list(shape)}, "
                        f"the program declares {var.type_str()}")
    dtype = np.dtype(str(value.dtype)) if xp is np else None
    if dtype is not None and dtype != np.dtype(var.dtype):
        if not np.can_cast(dtype, var.dtype, casting="same_kind"):
            raise FeedError(f"scope value '{var.name}' has dtype {dtype}, the program declares {var.dtype}")
        return value.astype(var.dtype)
    return value
