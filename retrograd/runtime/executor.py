"""The executor: runs compiled plans of a program's blocks on an array namespace."""
from __future__ import annotations

import time
import weakref
from types import ModuleType
from contextlib import contextmanager
from typing import Iterator, Mapping, Sequence

import numpy as np

from ..backends import Backend, backend_for_namespace, dtype_name, get_backend
from ..errors import (BackendError, ExecutionError, FeedDeviceError, FeedError, ProgramError, RetrogradError,
                      kernel_failure)
from ..ir.dtypes import FLOAT_DTYPES, is_low_float
from ..ir.program import Block, Program, Var
from ..passes.fuse_recurrent import fuse_recurrent_cells, has_recurrences
from .finite import first_non_finite, non_finite_error, unasked_non_finite
from .graphs import GraphRunner
from .malloc import keep_freed_memory
from .plan import Plan, compile_block
from .engines import engine_for
from .regions import RegionRunner
from .scope import Scope
from .threads import ThreadLimit
from .stats import MemoryMeter, MeterRecord, RunStats

MAX_METER_RECORDS = 16      # starts remembered per plan (a run from another start is metered op by op)
# Development check: meter every run op by op and compare with the record a replay would use
# (AssertionError on a difference). tests/runtime/test_meter_replay.py turns it on.
CHECK_METER_REPLAY = False


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
        self.meter = MemoryMeter(executor.backend.buffer_of)
        self.ops_run = 0
        self.scope: Scope | None = None
        self.rng_path: tuple[int, ...] = ()
        self.deferred_checks: list | None = None    # a list while a device graph is captured
        # (plan, start, MeterRecord or None) of the run starting: Executor.execute meters it by record
        self.metered_start: tuple | None = None
        self.replayed: MeterRecord | None = None    # the record the top-level plan was replayed from
        self.recorded: MeterRecord | None = None    # the record this run made

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
    """Runs programs: ``exe.scope`` holds parameters, ``exe.last_stats`` reports the last run.

    Each block is compiled once into a plan (kernels and slots resolved,
    liveness known) and cached; values are freed after their last use.
    ``exe.backend`` is the Backend; the scope holds its arrays.

    Args:
        scope: The Scope for persistable values; a new one by default.
        xp: An array namespace (numpy, torch, array_api_strict, ...): the
            older spelling of ``backend``.
        backend: ``"numpy"`` (default), ``"torch"``, ``"cupy"`` or
            ``"onnxruntime"``, or a ``retrograd.backends.Backend``.
        device: e.g. ``"cpu"``, ``"cuda"``, ``"cuda:1"``.
        threads: The one thread count of every library a run uses: BLAS, OpenMP,
            torch's intra-op (and, once per process, inter-op) pools, onnxruntime's
            sessions (None: 1; the small per-step products gain little from more,
            and more collapse when other processes share the cores; see
            ``runtime/threads.py``).
        graphs: Replay runs as CUDA graphs (torch on CUDA only); ``"auto"``
            replays where the backend has graphs and a run's feed shapes repeat,
            and runs eagerly elsewhere (``runtime/graphs.py``).
        compile: (backend "torch") run each straight-line region of a plan (the
            ops between two control-flow ops) as one ``torch.compile``d function
            (``runtime/regions.py``); the program is not changed, and results
            equal the eager run's within float rounding.
        check_finite: Stop a run at the first op that makes a NaN, or an Inf from
            finite inputs that its attributes do not ask for (``-inf`` masks
            pass), with an ``ExecutionError`` naming the op, its inputs and the
            user's line (one reduction per output; ``runtime/finite.py``). Such
            runs are not replayed as device graphs but run op by op.

    Raises:
        BackendError: An unknown backend or device, a missing library, or
            ``graphs=True`` where the backend cannot capture graphs.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 3])
            loss = rg.mean(rg.layers.fc(x, 2, name="fc"))
        exe = rg.Executor()                            # or Executor(backend="torch", device="cpu")
        exe.run(startup)
        (loss_v,) = exe.run(main, feed={"x": np.ones((4, 3), "float32")}, fetch_list=[loss])
        print(exe.last_stats.peak_bytes, exe.last_stats.time_s, exe.last_stats.ops_run)
        ```
    """

    def __init__(self, scope: Scope | None = None, xp=None, backend=None, device: str | None = None,
                 threads: int | None = None, graphs: bool | str = False, check_finite: bool = False,
                 compile: bool = False):
        keep_freed_memory()                # once per process: no page faults per step (runtime/malloc.py)
        limit = ThreadLimit(threads)       # checked before anything is built
        self.backend = _resolve_backend(xp, backend, device)
        self.threads = limit.threads
        self.backend.fix_threads(self.threads)
        # every library's threads during each run (runtime/threads.py)
        self.thread_limit = ThreadLimit(self.threads, self.backend.thread_pools())
        self.xp = self.backend.xp
        self.graphs = self._graph_runner(graphs)
        self.check_finite = bool(check_finite)
        if scope is None:
            scope = Scope(backend=self.backend)
        elif scope.backend is None:
            scope.backend = self.backend
        self.scope = scope
        self._engine = engine_for(self)
        self.regions = self._region_runner(compile)
        self.last_stats = RunStats()
        self._run = RunContext(self)
        self._plans: dict[tuple, Plan] = {}
        self._verified: dict[int, int] = {}
        self._rewrites: dict[tuple, tuple[int, Block]] = {}   # (serial, keep) -> (version, block run)
        # name -> (weak reference to the value, block, program version): values this executor
        # wrote back to a scope with the dtype and shape that block declares (_trust)
        self._trusted: dict[str, tuple] = {}

    def _graph_runner(self, graphs) -> GraphRunner | None:
        if graphs not in (True, False, "auto"):
            raise BackendError(f'Executor(graphs=...) takes True, False or "auto", not {graphs!r}')
        if graphs == "auto":
            return GraphRunner(self.backend, auto=True) if self.backend.has_graphs else None
        if graphs and not self.backend.has_graphs:
            raise BackendError(f"Executor(graphs=True) needs a CUDA device of backend \"torch\" (CuPy cannot "
                               f"capture cuBLAS calls), not {self._backend_str()}")
        return GraphRunner(self.backend) if graphs else None

    def _region_runner(self, compile) -> RegionRunner | None:
        if not compile:
            return None
        compiler = self.backend.region_compiler() if self._engine is None else None
        if compiler is None:
            raise BackendError(f'Executor(compile=True) needs backend "torch" (torch.compile), not '
                               f"{self._backend_str()}")
        return RegionRunner(self, compiler)

    def __repr__(self) -> str:
        return (f'Executor(backend="{self.backend.name}", device="{self.backend.device}", '
                f"threads={self.threads}, check_finite={self.check_finite})")

    @property
    def run_context(self) -> RunContext:
        """The state of the run in progress (the ``RunContext`` every kernel sees as ``k.run``).

        ``run_context.run_id`` counts the runs; random ops key on it (an engine
        re-running a program on NumPy sets it to draw the same numbers).
        """
        return self._run

    # -- compiling -------------------------------------------------------------
    def plan_for(self, block: Block, keep: frozenset[str]) -> Plan:
        """The compiled plan of ``block`` that keeps ``keep`` computed, compiled once and cached.

        The program is verified before its first compile; the cache key includes
        the program's version, so an edited program is compiled again.

        Args:
            block: The block to compile (the global block, or a sub-block).
            keep: The names that must stay computed (the fetches).

        Returns:
            The ``Plan`` (its ``steps``, ``free_reads``...).

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                y = rg.exp(rg.data("x", [2]))
            exe = rg.Executor()
            plan = exe.plan_for(main.global_block(), frozenset([y.name]))
            assert plan is exe.plan_for(main.global_block(), frozenset([y.name]))   # cached
            assert [s.op.type for s in plan.steps] == ["Exp"]
            ```
        """
        program = block.program
        key = (program.serial, program.version, block.idx, keep)
        plan = self._plans.get(key)
        if plan is None:
            self._verify(program)
            plan = compile_block(self._rewritten(block, keep), keep, self.backend, self._run)
            self._plans[key] = plan
        return plan

    def _rewritten(self, block: Block, keep: frozenset[str]) -> Block:
        """The global block as this backend runs it, rewritten in a clone (the user's program stays
        as it is) where that changes something: LSTM and GRU recurrences as one vendor-kernel op where
        the backend has one (``Backend.fused_lstm_dtypes``, ``fused_gru_dtypes``:
        ``passes.fuse_recurrent_cells``), then the
        backend's ``program_passes``. Same values under the same names (``keep``, the fetches,
        stay computed): plans, feeds and fetches do not notice."""
        rewrites = self._backend_rewrites(block.program)
        program = block.program
        if not rewrites or block.idx != 0:
            return block
        cached = self._rewrites.get((program.serial, keep))
        if cached is None or cached[0] != program.version:
            try:
                clone = program.clone()
            except ProgramError:          # a program the JSON form cannot hold runs as it is
                clone, changed = None, 0
            else:
                changed = sum(rewrite(clone, keep=keep) for rewrite in rewrites)
            if changed:
                self._verify(clone)
            cached = (program.version, clone.global_block() if changed else block)
            self._rewrites[(program.serial, keep)] = cached
        return cached[1]

    def _backend_rewrites(self, program: Program) -> list:
        """The passes this backend runs on a program (callables taking ``(program, keep=)``)."""
        from .. import passes      # (passes build on the op library, which imports the runtime)
        rewrites = []
        dtypes, gru_dtypes = self.backend.fused_lstm_dtypes, self.backend.fused_gru_dtypes
        if (dtypes or gru_dtypes) and has_recurrences(program):
            rewrites.append(lambda clone, keep: fuse_recurrent_cells(clone, keep, dtypes, gru_dtypes))
        return rewrites + [getattr(passes, name) for name in self.backend.program_passes]

    def _verify(self, program: Program) -> None:
        if self._verified.get(program.serial) != program.version:
            from ..ir.verify import verify_program
            verify_program(program)
            self._verified[program.serial] = program.version

    # -- running -----------------------------------------------------------------
    def run(self, program: Program, feed: dict | None = None, fetch_list: Sequence | None = None,
            scope: Scope | None = None, return_numpy: bool = True) -> list:
        """Run the global block of ``program``; return the values of ``fetch_list``.

        Run statistics (time, ops run, peak bytes) land in ``exe.last_stats``;
        persistable values the program writes go back to the scope.

        Args:
            program: The Program.
            feed: Name (or Var) -> array for its data Vars: NumPy arrays (moved to
                the device once) or arrays of the backend on its device.
            fetch_list: The Vars (or names) whose values to return; one Var or name
                alone still returns a list of one.
            scope: The Scope to read and write persistable values in (``exe.scope``
                by default).
            return_numpy: Return NumPy arrays (default), else the backend's arrays.

        Returns:
            A list with one value per fetch.

        Raises:
            FeedError: A feed is missing, unknown, of the wrong shape or dtype, or a
                fetch has no value; the message names the op that reads it.
            ExecutionError: A kernel failed (or, with ``check_finite``, made NaN/Inf).
            ProgramError: ``program`` is not a Program or fails verification.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [-1, 2])
                y = rg.sum(x * x, axis=1)
            exe = rg.Executor()
            (out,) = exe.run(main, feed={"x": np.array([[1.0, 2.0]], "float32")}, fetch_list=[y])
            assert list(out) == [5.0] and exe.last_stats.ops_run == 2
            ```
        """
        if self._engine is not None:
            return self._engine.run(program, feed, fetch_list, scope, return_numpy)
        started = time.perf_counter()
        block, fetch = self.checked_run_args(program, feed, fetch_list)
        scope = scope if scope is not None else self.scope
        plan = self.plan_for(block, frozenset(fetch))
        run = self._run
        run.run_id += 1
        run.meter = MemoryMeter(self.backend.buffer_of)
        run.ops_run = 0
        run.scope = scope
        run.rng_path = ()
        run.replayed = run.recorded = None
        env = self._initial_env(plan, block, feed or {}, scope)
        start = self._meter_start(plan, env)
        record = None if start is None or CHECK_METER_REPLAY else plan.meter_records.get(start)
        if record is None:
            for value in env.values():
                run.meter.hold(value)
        run.metered_start = None if start is None else (plan, start, record)    # for execute()
        with self.thread_limit.limit(), self.backend.on_device():
            fed = frozenset(k.name if isinstance(k, Var) else k for k in (feed or {}))
            env = self._execute_run(plan, env, fed, scope, fetch)
        self._write_back(plan, block, env, scope)
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
        if return_numpy:
            results = [self.backend.to_numpy(r) if self.backend.owns(r) else r for r in results]
        self.last_stats = RunStats(time.perf_counter() - started, run.ops_run, run.meter.peak)
        return results

    # -- the memory meter, counted once per start of a straight-line plan (stats.MeterRecord) -----
    def _meter_start(self, plan: Plan, env: dict):
        """The key of this run's ``MeterRecord`` (the starting values' names and ``Backend.layouts``),
        or None where the run is metered op by op: a plan with control flow or whose kernels use
        the meter, device graphs, compiled regions, ``check_finite``."""
        if (not plan.straight_line or plan.meter_records is None or self.graphs is not None
                or self.regions is not None or self.check_finite):
            return None
        try:
            return tuple(env), self.backend.layouts(env.values())
        except (AttributeError, TypeError):      # a value the backend cannot describe
            return None

    def _record_steps(self, plan: Plan, start: tuple, env: dict) -> None:
        """Run ``plan`` metered op by op, and keep what the meter counted for runs from ``start``."""
        meter = self._run.meter
        record = MeterRecord(meter.peak)
        holds = meter.holds
        self._metered_steps(plan.steps, env, record)
        if CHECK_METER_REPLAY and start in plan.meter_records:
            _check_replay(plan.meter_records[start], record)
        if meter.holds - holds != sum(len(s.outputs) for s in plan.steps) or None in record.shapes:
            plan.meter_records = None            # kernels hold values themselves: always metered
        elif len(plan.meter_records) < MAX_METER_RECORDS:
            plan.meter_records[start] = record
            self._run.recorded = record          # its trusted writes are filled in after the run

    def _write_back(self, plan: Plan, block: Block, env: dict, scope: Scope) -> None:
        """The persistable values the run wrote go back to ``scope``, trusted for the next run (``_trust``).

        After a run replayed from a record (``_replay_steps``) the values its recorded run proved
        (backend arrays of the declared shape and dtype: the replay's outputs have the record's
        shapes, and a kernel's dtypes follow its inputs') are stored and trusted unchecked."""
        run = self._run
        proven = run.replayed.trusted_writes if run.replayed is not None else ()
        plain = type(scope).set is Scope.set
        trusted, version = self._trusted, block.program.version
        checked = []
        for name in plan.persistable_writes:
            if name not in env:
                continue
            value = env[name]
            if plain and name in proven:
                scope.vars[name] = value        # what Scope.set does with the backend's array
                trusted[name] = (weakref.ref(value), block, version)
                continue
            scope.set(name, value)
            if self._trust(block, name, value):
                checked += [name]
        if run.recorded is not None:
            run.recorded.trusted_writes = frozenset(checked)

    def _replay_steps(self, plan: Plan, record: MeterRecord, env: dict) -> None:
        """Run ``plan`` over ``env`` as ``execute_steps`` does, its memory count taken from
        ``record``; at the first step whose output shapes differ from the record's, the meter
        counts op by op from there on."""
        shapes = record.shapes
        for i, step in enumerate(plan.steps):
            args, result = self._call(step, env)
            same = True
            for value, shape in zip(result, shapes[i]):
                if value is None:
                    same = same and shape is None
                else:
                    try:
                        same = same and value.shape == shape
                    except AttributeError:
                        same = False
            if not same:
                self._meter_from(plan, record, i, env, result)
                return
            for name, value in zip(step.outputs, result):
                env[name] = value
            for name in step.dead:
                if name in env:
                    del env[name]
        run = self._run
        run.ops_run += len(plan.steps)
        run.meter.peak = record.peak
        run.replayed = record

    def _meter_from(self, plan: Plan, record: MeterRecord, index: int, env: dict, result) -> None:
        """Count the rest of a replayed run op by op from step ``index`` (whose ``result`` is in):
        the meter holds what ``env`` holds, and the peak before is the record's."""
        run = self._run
        meter = run.meter = MemoryMeter(self.backend.buffer_of)
        for value in env.values():
            meter.hold(value)
        meter.peak = max(meter.peak, record.peak_before(index))
        self._store(plan.steps[index], result, env, meter)
        run.ops_run += index + 1
        self._metered_steps(plan.steps[index + 1:], env, None)

    def _execute_run(self, plan: Plan, env: dict, fed: frozenset, scope: Scope, fetch: list[str]) -> dict:
        """Run a top-level plan: eagerly, or replaying its device graph (``graphs=True``)."""
        if self.graphs is not None and not self.check_finite:
            replayed = self.graphs.run(self, self._run, plan, env, fed, scope, fetch)
            if replayed is not None:
                return replayed
            self._run.meter = MemoryMeter(self.backend.buffer_of)   # not what a failed capture counted
            self._run.ops_run = 0
            for value in env.values():
                self._run.meter.hold(value)
        self.execute(plan, env)
        return env

    def execute(self, plan: Plan, env: dict) -> None:
        """Run a plan's steps over ``env`` (name -> array) in place, freeing dead values.

        With ``compile=True`` the plan's straight-line regions run compiled, except while
        ``check_finite`` looks at every op.

        Control-flow kernels and engines call it; users call ``run``.

        Args:
            plan: A plan from ``plan_for``.
            env: The values the plan starts from (its ``free_reads``); outputs are
                added to it.

        Raises:
            ExecutionError: A step reads a value that is missing, or its kernel fails.
            BackendError: The backend cannot run a step's op.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                y = rg.exp(rg.data("x", [2]))
            exe = rg.Executor()
            env = {"x": np.zeros(2, "float32")}
            exe.execute(exe.plan_for(main.global_block(), frozenset([y.name])), env)
            assert list(env[y.name]) == [1.0, 1.0]
            ```
        """
        top = self._run.metered_start
        if top is not None and top[0] is plan:      # the top-level plan of a run, once: metered by record
            self._run.metered_start = None
            if top[2] is not None:
                self._replay_steps(plan, top[2], env)
            else:
                self._record_steps(plan, top[1], env)
        elif self.regions is not None and not self.check_finite:
            self.regions.execute(plan, env)
        else:
            self.execute_steps(plan.steps, env)

    def execute_steps(self, steps: Sequence, env: dict) -> None:
        """Run ``steps`` (of a plan) one by one over ``env``, freeing dead values.

        ``execute`` calls it for a plan's ops outside compiled regions; engines and regions
        call it for theirs.

        Args:
            steps: Steps of a plan from ``plan_for``, in order.
            env: The values the steps read; their outputs are added to it.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                y = rg.exp(rg.data("x", [2]))
            exe = rg.Executor()
            env = {"x": np.zeros(2, "float32")}
            exe.execute_steps(exe.plan_for(main.global_block(), frozenset([y.name])).steps, env)
            assert list(env[y.name]) == [1.0, 1.0]
            ```
        """
        self._metered_steps(steps, env, None)

    def _metered_steps(self, steps: Sequence, env: dict, record: MeterRecord | None) -> None:
        """``execute_steps``, each value held on the meter; ``record`` (if given) takes each step's
        output shapes and the peak after it."""
        meter = self._run.meter
        for step in steps:
            args, result = self._call(step, env)
            if self.check_finite:
                self._check_finite(step, args, result)
            self._store(step, result, env, meter)
            if record is not None:
                record.shapes.append(_shapes(result))
                record.peaks.append(meter.peak)
        self._run.ops_run += len(steps)

    @staticmethod
    def _store(step, result, env: dict, meter: MemoryMeter) -> None:
        """Put ``step``'s outputs into ``env`` and drop its dead values, holding and releasing on ``meter``."""
        hold, release = meter.hold, meter.release
        for name, value in zip(step.outputs, result):
            old = env.get(name)
            env[name] = value
            hold(value)            # before releasing the old value: both lived while the op ran
            if old is not None:
                release(old)
        for name in step.dead:
            value = env.pop(name, None)
            if value is not None:
                release(value)

    def _call(self, step, env: dict) -> tuple[tuple, tuple]:
        """Run ``step``'s kernel on its inputs from ``env``: (its arguments, its outputs as a tuple);
        a failure is raised as the error naming the op (``_kernel_error``)."""
        try:
            args = tuple(map(env.__getitem__, step.inputs))
        except KeyError as exc:
            raise _missing_input(step, exc) from None
        try:
            result = step.kernel(step.k, *args)
        except Exception as exc:
            error = self._kernel_error(step, exc, args)
            if error is None:
                raise
            raise error from exc
        return args, (result,) if step.single else result

    def _kernel_error(self, step, exc: Exception, args: Sequence) -> Exception | None:
        """The error to raise for ``exc`` from ``step``'s kernel (None: ``exc`` itself)."""
        if isinstance(exc, BackendError):
            return BackendError(f"{step.op.where()} cannot run on {self._backend_str()}: {exc}")
        if isinstance(exc, RetrogradError):
            return None
        if isinstance(exc, (AttributeError, NotImplementedError)):
            if isinstance(exc, AttributeError) and not _is_namespace(getattr(exc, "obj", None), self.xp):
                return kernel_failure(step.op.where(), exc)
            # The namespace lacks a function the kernel calls: the op does not run here.
            return BackendError(f"{step.op.where()} cannot run on {self._backend_str()}: "
                                f"{type(exc).__name__}: {exc}")
        return kernel_failure(step.op.where(), exc, zip(step.inputs, args))

    def _check_finite(self, step, args: list, result) -> None:
        """ExecutionError when an output of ``step`` that the plan keeps holds a NaN, or an Inf
        the op was not asked for (the rule: ``runtime/finite.py``)."""
        live = step.k.live_outputs          # the others may be stand-ins nobody reads
        kept = [(name, value) for i, (name, value) in enumerate(zip(step.outputs, result)) if i in live]
        names, values = [n for n, _ in kept], [v for _, v in kept]
        if first_non_finite(self.xp, names, values) is None:
            return                          # the common case: one reduction per output
        bad = unasked_non_finite(self.xp, step.op, names, values, args)
        if bad is not None:
            raise non_finite_error(step.op.where(), bad, dict(kept)[bad], zip(step.inputs, args))

    # -- checks shared with engines (backend="onnxruntime" runs programs its own way) -----
    def checked_run_args(self, program: Program, feed, fetch_list) -> tuple[Block, list[str]]:
        """The global block and the fetch names of a ``run`` call, or the error a bad argument gets.

        Engines that run programs their own way call it to refuse what ``run`` refuses.

        Args:
            program: What was passed as the program.
            feed: What was passed as the feed.
            fetch_list: What was passed as the fetch list (a Var or a name alone is a list of one).

        Returns:
            ``(global block, [fetch names])``.

        Raises:
            ProgramError: ``program`` is not a Program.
            FeedError: ``feed`` is not a dict, or a fetch is unknown or of another program.

        Example:
            ```python
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                y = rg.exp(rg.data("x", [2]))
            block, names = rg.Executor().checked_run_args(main, None, y)
            assert block is main.global_block() and names == [y.name]
            ```
        """
        if not isinstance(program, Program):
            raise ProgramError(f"Executor.run needs a Program, got {type(program).__name__}")
        if feed is not None and not isinstance(feed, Mapping):
            raise FeedError(f"feed must be a dict of name (or Var) -> array, got {type(feed).__name__}")
        if isinstance(fetch_list, (Var, str)):
            fetch_list = [fetch_list]                 # one item: still returns a list of one value
        block = program.global_block()
        return block, [_fetch_name(f, block) for f in (fetch_list or [])]

    def checked_feeds(self, block: Block, feed: dict, plan: Plan | None = None) -> dict:
        """Each feed as a backend array of its Var's declared dtype and shape.

        Args:
            block: The global block the feeds are for.
            feed: Name (or Var) -> array.
            plan: When given, an error names the first op that reads the feed (and
                so the user's line).

        Returns:
            Name -> backend array.

        Raises:
            FeedError: A feed is not a variable of block 0, or has the wrong shape or dtype.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [-1, 2])
            env = rg.Executor().checked_feeds(main.global_block(), {x: np.ones((3, 2), "float32")})
            assert env["x"].shape == (3, 2)
            ```
        """
        env = {}
        for name, value in feed.items():
            if isinstance(name, Var) and not block.program.owns(name):
                raise foreign_var_error(name, "feed")
            name = name.name if isinstance(name, Var) else name
            var = block.vars.get(name)
            if var is None:
                raise FeedError(f"feed '{name}' is not a variable of block 0")
            try:
                env[name] = _check_feed(var, value, self.backend)
            except FeedError as exc:
                if plan is None:
                    raise
                raise type(exc)(f"{exc} (it is read by {_first_reader(plan, name)})") from None
        return env

    def checked_persistable(self, block: Block, name: str, scope: Scope, reader=lambda: "the program"):
        """The scope value of persistable ``name``, moved to the device and cast once (and stored back).

        Args:
            block: The block that declares ``name``.
            name: The persistable variable's name.
            scope: The Scope to read.
            reader: A callable naming who reads it, for the error.

        Returns:
            The backend array.

        Raises:
            FeedError: It has no value (run the startup program first) or is not persistable.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main, startup = rg.Program(), rg.Program()
            with rg.program_guard(main, startup):
                rg.create_parameter("w", [2], init=1.0)
            exe = rg.Executor()
            exe.run(startup)
            w = exe.checked_persistable(main.global_block(), "w", exe.scope)
            assert np.all(w == 1.0)
            ```
        """
        value = scope.find(name)
        trusted = self._trusted.get(name)
        if (trusted is not None and value is not None and trusted[0]() is value and trusted[1] is block
                and trusted[2] == block.program.version):
            return value
        var = block.find_var(name)
        if value is None or var is None or not var.persistable:
            hint = "run the startup program first" if var is not None and var.persistable else "feed it"
            raise FeedError(f"'{name}' is read by {reader()} but has no value: {hint}")
        checked = _check_persistable(var, value, self.backend)
        if checked is not value:
            scope.set(name, checked)   # moved and cast once, not on every run
        return checked

    def _trust(self, block: Block, name: str, value) -> bool:
        """Remember that ``value``, just written back under ``name``, has the dtype and shape
        ``block`` declares (on this backend's device: a kernel's output): the next run reading
        the very same array from a scope needs no ``checked_persistable`` checks."""
        var = block.vars.get(name)
        if (var is None or not self.backend.owns(value) or tuple(value.shape) != var.shape
                or dtype_name(value.dtype) != var.dtype):
            self._trusted.pop(name, None)
            return False
        try:
            self._trusted[name] = (weakref.ref(value), block, block.program.version)
        except TypeError:           # an array type without weak references: checked every run
            self._trusted.pop(name, None)
            return False
        return True

    def check_run_values(self, block: Block, feed: dict, fetch: Sequence[str], scope: Scope) -> dict:
        """The values a run of ``fetch`` starts from (feeds and persistables read), checked as ``run`` checks them.

        The FeedError names the op that reads a missing value, or the op that
        overwrites a fed one. Engines call it to word their refusals as this
        executor does.

        Args:
            block: The global block.
            feed: Name -> array.
            fetch: The fetch names.
            scope: The Scope with the persistable values.

        Returns:
            Name -> backend array.

        Raises:
            FeedError: A value is missing, or a feed would be overwritten before it is read.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                y = rg.exp(rg.data("x", [2]))
            exe = rg.Executor()
            env = exe.check_run_values(main.global_block(), {"x": np.zeros(2, "float32")}, [y.name], exe.scope)
            assert set(env) == {"x"}
            ```
        """
        return self._initial_env(self.plan_for(block, frozenset(fetch)), block, feed, scope)

    def _initial_env(self, plan: Plan, block: Block, feed: dict, scope: Scope) -> dict:
        env = self.checked_feeds(block, feed, plan)
        _refuse_overwritten_feeds(plan, env)
        trusted, version = self._trusted, block.program.version
        held = scope.vars if type(scope).find is Scope.find else {}
        for name in plan.free_reads:
            if name in env:
                continue
            if name in held and name in trusted:        # checked_persistable's first case, inline
                value, (ref, trusted_block, trusted_version) = held[name], trusted[name]
                if ref() is value and trusted_block is block and trusted_version == version:
                    env[name] = value
                    continue
            env[name] = self.checked_persistable(block, name, scope, lambda: _first_reader(plan, name))
        return env

    def _backend_str(self) -> str:
        return f'backend "{self.backend.name}" (device {self.backend.device})'


def _resolve_backend(xp, backend, device) -> Backend:
    if isinstance(backend, Backend):
        if xp is not None or device is not None:
            raise BackendError("give Executor a Backend object alone, without xp= or device=")
        return backend
    if xp is not None and backend is not None:
        raise BackendError("give Executor either backend= or xp=, not both")
    if xp is not None:
        return backend_for_namespace(xp, device)
    return get_backend("numpy" if backend is None else backend, device)


def _refuse_overwritten_feeds(plan: Plan, fed: dict) -> None:
    """A feed that an op writes before anything reads it would be ignored: refuse it.

    (A fed value the plan reads first, such as a parameter an optimizer then
    updates, is honoured: the update starts from it.)
    """
    for name in fed:
        if name in plan.free_reads:
            continue
        writers = [s.op.where() for s in plan.steps if name in s.outputs]
        if writers:
            raise FeedError(f"feed '{name}' would be ignored: {writers[0]} computes it before anything "
                            "reads it; feed that op's inputs instead, or fetch it")


def _check_replay(replayed: MeterRecord, counted: MeterRecord) -> None:
    """AssertionError where a replay of ``replayed`` would report another count than ``counted``
    (op by op): up to the first step whose output shapes differ, from where a replay counts op by op."""
    same = 0
    while (same < len(counted.shapes) and same < len(replayed.shapes)
           and counted.shapes[same] == replayed.shapes[same]):
        same += 1
    if (replayed.start_peak, replayed.peaks[:same]) != (counted.start_peak, counted.peaks[:same]):
        raise AssertionError(f"memory meter replay differs from the count: {replayed} != {counted}")


def _missing_input(step, exc: KeyError) -> ExecutionError:
    return ExecutionError(f"{step.op.where()} reads '{exc.args[0]}', which has no value "
                          "(not fed, not initialised, or freed)")


def _shapes(result) -> tuple | None:
    """The shapes of a step's outputs (None for an uncomputed one), or None if one is not an array."""
    shapes = []
    for value in result:
        shape = None if value is None else getattr(value, "shape", _NO_SHAPE)
        if shape is _NO_SHAPE:
            return None
        shapes.append(shape)
    return tuple(shapes)


_NO_SHAPE = object()


def _first_reader(plan: Plan, name: str) -> str:
    readers = [s.op.where() for s in plan.steps if name in s.inputs]
    return readers[0] if readers else "the program"


def _is_namespace(obj, xp) -> bool:
    """Whether ``obj`` (what an AttributeError was raised on) is an array namespace."""
    return obj is xp or isinstance(obj, ModuleType)


def foreign_var_error(var: Var, what: str) -> FeedError:
    """The error for a fetch or feed key that is a Var of a program unrelated to the one run:
    binding it by name would silently give another variable of the same name."""
    return FeedError(f"{what} Var '{var.name}' belongs to another program, not to the one run (nor to "
                     "a program it was cloned from or a clone of it); use the run program's Var or "
                     "its name")


def _fetch_name(item, block: Block) -> str:
    if isinstance(item, Var) and not block.program.owns(item):
        raise foreign_var_error(item, "fetch")
    name = item.name if isinstance(item, Var) else item
    if not isinstance(name, str) or block.find_var(name) is None:
        raise FeedError(f"fetch {item!r} is not a variable of block 0")
    return name


# The one rule for a fed (or scope) value whose dtype is not the declared one: it is cast when
# the cast keeps its kind and cannot change an integer -- float64 <-> float32 (rounded to the
# declared precision), int32 -> int64 -- and refused with a FeedError naming both dtypes
# otherwise (float -> int, int -> float, anything <-> bool, int64 -> int32). Mixed precision adds
# float to and from bfloat16 / float16 (LOW_FLOAT_CASTS).
FEED_CASTS = frozenset({("float64", "float32"), ("float32", "float64"), ("int32", "int64")})
LOW_FLOAT_CASTS = frozenset({(a, b) for a in FLOAT_DTYPES for b in FLOAT_DTYPES
                             if a != b and (is_low_float(a) or is_low_float(b))})


def check_cast(what: str, name: str, dtype: str, declared: str) -> None:
    """FeedError unless a ``dtype`` value may stand for a ``declared`` one (``FEED_CASTS``).

    Example::

        check_cast("feed", "labels", "float32", "int64")   # FeedError: ... has dtype float32 ...
    """
    if dtype != declared and (dtype, declared) not in FEED_CASTS | LOW_FLOAT_CASTS:
        raise FeedError(f"{what} '{name}' has dtype {dtype}, the program declares {declared}; only "
                        "float64 <-> float32 and int32 -> int64 are cast (and floats to and from "
                        "bfloat16 / float16), so convert it first "
                        f"(.astype('{declared}')) if that is what you mean")


def _check_feed(var: Var, value, backend: Backend):
    """The feed as an array of the backend, of the declared dtype and shape.

    A NumPy array (or anything ``np.asarray`` takes) is checked and cast on the
    host, then moved to the device once; an array of the backend must be on its
    device already. Casts follow ``FEED_CASTS`` (float64 -> float32, ...).
    """
    if backend.owns(value):
        return _check_device_array(var, value, backend, "feed")
    if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, (np.ndarray, np.generic)):
        raise FeedDeviceError(f"feed '{var.name}' is a {type(value).__module__}.{type(value).__name__}; "
                              f'backend "{backend.name}" (device {backend.device}) takes NumPy arrays '
                              "or its own arrays")
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise FeedError(f"feed '{var.name}' is not an array: {exc}") from None
    if array.dtype != np.dtype(var.dtype):
        check_cast("feed", var.name, dtype_name(array.dtype), var.dtype)
        array = array.astype(var.dtype)
    _check_shape(var, array.shape, "feed")
    return backend.from_numpy(array)


def _check_shape(var: Var, shape, what: str) -> None:
    shape = tuple(shape)
    if len(shape) != len(var.shape) or any(d >= 0 and d != a for d, a in zip(var.shape, shape)):
        raise FeedError(f"{what} '{var.name}' has shape {list(shape)}, "
                        f"the program declares {var.type_str()} (? = any size)")


def _check_device_array(var: Var, value, backend: Backend, what: str):
    """An array of the backend: on the executor's device, declared shape, a dtype ``FEED_CASTS``
    allows (cast here)."""
    device = backend.device_of(value)
    if device != backend.device:
        raise FeedDeviceError(f"{what} '{var.name}' is on device {device}, the executor runs on "
                              f"{backend.device}: move it there first (or pass a NumPy array)")
    _check_shape(var, value.shape, what)
    dtype = dtype_name(value.dtype)
    if dtype != var.dtype:
        check_cast(what, var.name, dtype, var.dtype)
        return backend.xp.astype(value, backend.dtype_of(var.dtype))
    return value


def _check_persistable(var: Var, value, backend: Backend):
    """The scope value as an array of the backend of the declared dtype (moved and cast once)."""
    if backend.owns(value):
        return _check_device_array(var, value, backend, "scope value")
    if not isinstance(value, (np.ndarray, np.generic)):
        raise FeedDeviceError(f"scope value '{var.name}' is a {type(value).__module__}."
                              f"{type(value).__name__}; backend \"{backend.name}\" (device "
                              f"{backend.device}) takes NumPy arrays or its own arrays")
    array = np.asarray(value)
    _check_shape(var, array.shape, "scope value")
    if array.dtype != np.dtype(var.dtype):
        check_cast("scope value", var.name, dtype_name(array.dtype), var.dtype)
        array = array.astype(var.dtype)
    return backend.from_numpy(array)
