"""The onnxruntime engine: ``rg.Executor(backend="onnxruntime")`` runs whole programs in onnxruntime.

``Executor.run`` hands each run to ``OnnxRuntimeEngine.run`` (the backend's
``engine``). For every (program version, fetch set, fed names) the engine

1. applies the whole-program rewrites of ``retrograd.passes`` to a clone of
   the program (the user's program is never changed),
2. exports the clone to ONNX (``retrograd.onnx.export``): the feeds and the
   persistables it reads are graph inputs, the fetches and the persistables
   it writes are graph outputs,
3. builds one ``onnxruntime.InferenceSession`` (``threads`` threads, all graph
   optimisations) and keeps it until the program changes
   (``program.serial`` / ``program.version`` are part of the key).

A run binds the feeds and the scope's parameters and optimizer state as
inputs without copying them (I/O binding over the NumPy arrays' memory),
lets onnxruntime allocate the outputs, and stores each written persistable
back into ``exe.scope`` as the NumPy view of onnxruntime's output buffer (no
copy either). Earlier values are never overwritten in place, so an array a
user fetched before keeps its numbers.

Bad input gets the NumPy executor's errors: feeds are checked by the same
code (``Executor.checked_feeds``), so a wrong shape or dtype is the same
``FeedError``; an op the exporter cannot lower is a ``BackendError`` naming
the op at the first ``run`` -- never a silent fallback to NumPy.

``exe.last_stats`` after a run: ``time_s`` is the wall time of the whole
``run`` call (export and session build included on a first run),
``ops_run`` the number of nodes of the exported top-level ONNX graph (a
loop counts once, whatever its trip count), ``peak_bytes`` the bytes of the
distinct arrays bound to the session at once: inputs (feeds, parameters,
optimizer state) plus outputs. onnxruntime's own intermediates are not
visible to Python, so this is a lower bound of the run's memory.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..errors import BackendError, ExecutionError, FeedError
from ..ir.program import Program
from ..runtime.engines import register_engine
from ..runtime.stats import RunStats


@dataclass
class CompiledSession:
    """One exported program and its onnxruntime session."""
    session: object                 # onnxruntime.InferenceSession
    feeds: list[str]                # graph inputs taken from the feed (graph name == program name)
    params: list[str]               # graph inputs taken from the scope (parameters, optimizer state)
    outputs: list[str]              # every graph output, in the session's order
    fetched: dict[str, str]         # fetch name -> graph output
    written: dict[str, str]         # persistable written -> graph output holding its new value
    n_nodes: int                    # nodes of the top-level graph
    build_s: float                  # seconds spent rewriting, exporting and building the session
    run_id_input: str | None = None  # the int64 input random ops key on (the run's number), if any
    model: object = None            # the exported onnx.ModelProto (a failed check's values are read from it)
    checks: list = field(default_factory=list)   # the model's run-time checks (onnx/graph.py ``Check``)
    names: object = None            # the model's ``onnx.graph.Names``: which op a failed node lowers
    all_nodes: list = field(default_factory=list)   # every node lowered: a failed check's values need some


def session_options(threads: int = 1):
    """onnxruntime options the engine uses: ``threads`` intra- and inter-op threads (the
    executor's ``threads``), every graph optimisation."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = threads
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 4            # warnings about unused initializers are noise here, and
    # a failed run is an exception already (a failed check's, say): its log lines only repeat it
    return options


def providers_for(device: str | None) -> list[str]:
    """onnxruntime execution providers for a retrograd device ("cpu", "cuda", "cuda:1")."""
    import onnxruntime as ort
    if device in (None, "cpu"):
        return ["CPUExecutionProvider"]
    if device == "cuda" or (isinstance(device, str) and device.startswith("cuda:")):
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise BackendError(f'backend "onnxruntime" on device {device!r} needs onnxruntime-gpu '
                               '(pip install onnxruntime-gpu); this onnxruntime has only '
                               f"{', '.join(ort.get_available_providers())}")
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
    raise BackendError(f'backend "onnxruntime" runs on "cpu" or "cuda[:N]", not {device!r}')


class OnnxRuntimeEngine:
    """Runs programs for an ``Executor`` in onnxruntime; see the module docstring.

    Example::

        exe = rg.Executor(backend="onnxruntime")
        exe.run(startup)
        loss_v, = exe.run(main, feed={"x": xb}, fetch_list=[loss])   # exported once, then cached
    """

    def __init__(self, executor):
        self.executor = executor
        self.device = self.check_device(executor.backend.engine_device)
        self.providers = providers_for(self.device)
        self.threads = executor.threads     # the executor's one thread count (runtime/threads.py)
        self.sessions_built = 0          # how many sessions this engine has built (cache misses)
        self.run_id = 0                  # runs so far (random ops draw from (seed, run id, ...))
        self._sessions: dict[tuple, CompiledSession] = {}

    @staticmethod
    def check_device(device: str | None) -> str:
        """The device the engine computes on ("cpu", "cuda", "cuda:N"); BackendError if unavailable."""
        providers_for(device)
        return "cpu" if device is None else device

    # -- running -------------------------------------------------------------------------------
    def run(self, program: Program, feed: Mapping | None = None, fetch_list: Sequence | None = None,
            scope=None, return_numpy: bool = True) -> list:
        started = time.perf_counter()
        exe = self.executor
        scope = scope if scope is not None else exe.scope
        block, fetch = exe.checked_run_args(program, feed, fetch_list)
        try:
            feeds = exe.checked_feeds(block, feed or {})
        except FeedError:                   # again with the executor's plan: the error names the reader
            exe.checked_feeds(block, feed or {}, exe.plan_for(block, frozenset(fetch)))
            raise
        try:
            compiled = self.compiled(program, fetch, sorted(feeds))
            if len(compiled.feeds) < len(feeds):    # a feed the graph does not read: one an op overwrites?
                exe.check_run_values(block, feed or {}, fetch, scope)
            params = {name: exe.checked_persistable(block, name, scope) for name in compiled.params}
        except FeedError:                   # a value missing: the NumPy executor's words, naming the reader
            exe.check_run_values(block, feed or {}, fetch, scope)
            raise
        self.run_id += 1             # counted as the NumPy executor counts: random ops key on it
        inputs = {name: feeds[name] for name in compiled.feeds}
        if compiled.run_id_input is not None:
            inputs[compiled.run_id_input] = np.array(self.run_id, dtype=np.int64)
        inputs.update(params)
        outputs = self._execute(compiled, inputs)
        if exe.check_finite:
            self._check_finite(program, compiled, outputs, feed, fetch, params)
        for name, graph_name in compiled.written.items():
            scope.set(name, outputs[graph_name])
        results = [self._fetched(name, compiled, outputs, feeds, block, scope) for name in fetch]
        peak = _distinct_bytes(list(inputs.values()) + list(outputs.values()))
        exe.last_stats = RunStats(time.perf_counter() - started, compiled.n_nodes, peak)
        return results

    def _execute(self, compiled: CompiledSession, inputs: dict) -> dict:
        """One session run with I/O binding: inputs bound in place, outputs allocated by onnxruntime
        and returned as NumPy views of its buffers (graph output name -> array)."""
        session = compiled.session
        if session is None:
            return {}
        binding = session.io_binding()
        for name, array in inputs.items():
            array = _contiguous(array)
            inputs[name] = array            # kept alive until the run is over
            binding.bind_cpu_input(name, array)
        for name in compiled.outputs:
            binding.bind_output(name)
        try:
            session.run_with_iobinding(binding)
        except Exception as exc:            # onnxruntime raises its own Fail/RuntimeException types
            raise self._failed_check(compiled, inputs, exc) or _failed_op(compiled, exc) from exc
        starts = np.array([a.__array_interface__["data"][0] for a in inputs.values()], dtype=np.int64)
        ends = starts + np.array([max(a.nbytes, 1) for a in inputs.values()], dtype=np.int64)
        return {name: _unaliased(value.numpy(), starts, ends)
                for name, value in zip(compiled.outputs, binding.get_outputs())}

    @staticmethod
    def _fetched(name: str, compiled: CompiledSession, outputs: dict, feeds: dict, block, scope):
        if name in compiled.fetched:
            return outputs[compiled.fetched[name]]
        if name in feeds:
            return feeds[name]
        var, value = block.find_var(name), scope.find(name)
        if var is not None and var.persistable and value is not None:
            return value                     # a parameter the program does not read: its scope value
        raise FeedError(f"fetch '{name}' has no value after the run: nothing in block 0 writes it "
                        "and it was not fed")

    def _check_finite(self, program: Program, compiled: CompiledSession, outputs: dict, feed,
                      fetch: list[str], params: dict) -> None:
        """``check_finite``: one reduction per graph output; when one holds NaN or Inf, the program
        runs again on the NumPy executor (checking every op by the rule of ``runtime/finite.py``)
        from the same feeds, scope values and random numbers, so the error names the first op that
        made one. A value NumPy also makes without an error (a ``-inf`` mask fetched) passes."""
        from ..runtime import Executor, Scope
        from ..runtime.finite import first_non_finite, non_finite_error
        bad = first_non_finite(np, list(outputs), list(outputs.values()))
        if bad is None:
            return
        names = {graph: name for name, graph in {**compiled.fetched, **compiled.written}.items()}
        held = f"onnxruntime's result '{names.get(bad, bad)}' held NaN or Inf"
        reference = Executor(Scope(), backend="numpy", check_finite=True)
        for name, value in params.items():
            reference.scope.set(name, value)
        reference.run_context.run_id = self.run_id - 1      # the same random numbers
        try:
            with np.errstate(all="ignore"):
                fetched = reference.run(program, feed=feed, fetch_list=fetch)
        except ExecutionError as exc:
            raise ExecutionError(f"{exc} [{held}; the op was found by re-running the program on "
                                 "NumPy]") from None
        name = names.get(bad, bad)
        numpy_value = fetched[fetch.index(name)] if name in fetch else reference.scope.find(name)
        if numpy_value is not None and first_non_finite(np, [name], [numpy_value]) is not None:
            return                  # NumPy made it too, and its ops asked for it: deliberate
        raise non_finite_error("onnxruntime", names.get(bad, bad), outputs[bad], [],
                               note="; re-run on NumPy, the program made no NaN or Inf: "
                                    "onnxruntime's arithmetic differs there")

    # -- compiling -----------------------------------------------------------------------------
    def compiled(self, program: Program, fetch: list[str], feed_names: list[str]) -> CompiledSession:
        """The cached session for this program version, fetch set and fed names (built once)."""
        key = (program.serial, program.version, tuple(fetch), tuple(feed_names))
        compiled = self._sessions.get(key)
        if compiled is None:
            stale = [k for k in self._sessions if k[0] == program.serial and k[1] != program.version]
            for k in stale:                 # the program changed: its old sessions are useless
                del self._sessions[k]
            compiled = self._sessions[key] = self._build(program, fetch, feed_names)
            self.sessions_built += 1
        return compiled

    def _build(self, program: Program, fetch: list[str], feed_names: list[str]) -> CompiledSession:
        import onnxruntime as ort
        from ..passes import optimize_for_engine
        from .graph import RUN_ID
        from .model import build_model, refusal
        started = time.perf_counter()
        rewritten = optimize_for_engine(program, fetch)
        try:
            built = build_model(rewritten, fetch, param_inputs=True, feed_names=feed_names, scan_loops=True)
        except BackendError as exc:         # an op without an ONNX form: name the backend too
            raise BackendError(f'backend "onnxruntime" cannot run this program: {exc}') from exc
        if not built.model.graph.output:    # nothing fetched, nothing written: nothing to run
            return CompiledSession(None, [], [], [], {}, {}, 0, time.perf_counter() - started)
        try:
            session = ort.InferenceSession(built.model.SerializeToString(), session_options(self.threads),
                                           providers=self.providers)
        except Exception as exc:            # a graph onnxruntime refuses: say what it said
            raise BackendError(f'backend "onnxruntime" cannot run this program: '
                               f'{refusal(exc, built.model)}') from exc
        params = list(built.param_inputs)
        run_id = RUN_ID if RUN_ID in built.inputs else None
        feeds = [n for n in built.inputs if n not in set(params) and n != run_id]
        outputs = [o.name for o in session.get_outputs()]
        return CompiledSession(session, feeds, params, outputs, dict(built.outputs), dict(built.written),
                               len(built.model.graph.node), time.perf_counter() - started, run_id,
                               built.model, list(built.checks), built.names, built.all_nodes)

    # -- run-time checks -----------------------------------------------------------------------
    def _failed_check(self, compiled: CompiledSession, inputs: dict, exc: Exception) -> ExecutionError | None:
        """The kernel's ExecutionError for a run that failed in a check's guard node (``exc`` names
        ``retrograd.check.<n>``), or None when the failure is not a check's."""
        from .graph import CHECK_PREFIX
        match = re.search(re.escape(CHECK_PREFIX) + r"(\d+)", str(exc))
        if match is None or int(match.group(1)) >= len(compiled.checks):
            return None
        check = compiled.checks[int(match.group(1))]
        if check.verify is not None:
            try:
                check.verify(*(self._payload(compiled, check.payload, inputs) if check.payload else []))
            except ExecutionError as error:
                return error
        inside = "" if check.verify else " in a loop or branch body, whose values cannot be read back"
        return ExecutionError(f"{check.op.where()}: {check.what} (the check failed inside onnxruntime{inside})")

    def _payload(self, compiled: CompiledSession, payload: list[str], inputs: dict) -> list:
        """The values ``payload`` of the main graph on ``inputs``, from a session computing only them
        (built when a check fails, which ends the run: never on the fast path)."""
        import onnxruntime as ort
        from .model import checks_model
        small = checks_model(compiled.model, compiled.all_nodes, payload)
        session = ort.InferenceSession(small.SerializeToString(), session_options(self.threads),
                                       providers=self.providers)
        return session.run(list(payload), inputs)


def _failed_op(compiled: CompiledSession, exc: Exception) -> ExecutionError:
    """The error of a run onnxruntime failed (no check's): naming the op whose node failed, as the
    NumPy executor names a failed kernel's op, with onnxruntime's own words."""
    message = str(exc)
    op = compiled.names.op_of_failure(message) if compiled.names is not None else None
    if op is None:
        return ExecutionError(f"onnxruntime failed running the program: {message}")
    return ExecutionError(f"{op.where()} failed in onnxruntime: {message.rsplit('Status Message: ', 1)[-1]}")


def _contiguous(array) -> np.ndarray:
    """``array`` as a C-contiguous NumPy array of its own shape: ``np.ascontiguousarray`` makes a
    0-d array 1-d, which onnxruntime then computes with as shape (1,)."""
    array = np.asarray(array)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array).reshape(array.shape)


def _unaliased(array: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``array``, or a copy of it when onnxruntime handed back memory of a bound input (``starts``
    .. ``ends``: an input passed through, or reshaped in place): those are our arrays, which the
    caller may drop or the scope replace."""
    start = array.__array_interface__["data"][0]
    if np.any((starts <= start) & (start < ends)):
        return array.copy()
    return array


def _distinct_bytes(arrays: list) -> int:
    """Bytes of the distinct buffers among ``arrays`` (a view counts with its base, once)."""
    seen: dict[int, int] = {}
    for array in arrays:
        base = array
        while isinstance(getattr(base, "base", None), np.ndarray):
            base = base.base
        seen[id(base)] = int(getattr(base, "nbytes", 0))
    return sum(seen.values())


register_engine("onnxruntime", OnnxRuntimeEngine)
