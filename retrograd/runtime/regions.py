"""Compiled regions (``Executor(backend="torch", compile=True)``): a plan's straight-line runs of
ops handed to the backend's compiler (``torch.compile``: Inductor's fused C++/OpenMP kernels on
the CPU, Triton on CUDA) as one function each.

A plan is cut into *regions*: maximal runs of consecutive steps whose ops have no sub-block
(control flow: ``While``, ``If``, ``RecurrentNetwork``... stay the executor's, and split
regions) and draw no random numbers (their key changes every run: a compiled function would
be specialised to one run); an op defined with ``defop(..., compile=False)`` also runs between
regions. (A vendor routine that beats generated code need not: the torch backend calls oneDNN's
LSTM, ATen's multi-tensor Adam and max pooling as opaque custom ops inside the compiled graph.)
A region becomes Python source, once, straight-line over its
kernels (torch.fx style; one code object per region, so each has its own compile cache)::

    def region_0(v0, v1, v2):                     # the names it reads from outside
        v3 = kernel_0(k_0, v0, v1)                # MatMul
        v4, v5 = kernel_1(k_1, v3, v2)            # ... one line per op
        return (v4, v5)                           # the names read after it, kept or persistable

and the backend compiles it on its first run: the compiler traces the kernels' library calls
(ATen), so the forward, the backward and the optimizer updates between two control-flow ops
become one fused program. Sizes that change between runs (a batch, a sequence length) make
it recompile once with those sizes symbolic (torch's automatic dynamic shapes), not once per
size. Compiled functions are cached on the plan, which the executor caches per program
version; the program itself is never changed (``print(program)`` is the same).

Updates of parameters stay correct: kernels return new arrays (written back to the scope as
in an eager run), and a kernel that changes an input in place is replayed by the compiler
(functionalisation copies the new value back into the input).

Never a wrong answer, never a worse error: when a compiled region raises, the region runs
again op by op; if that raises, it is the eager run's error (naming the op and the user's
line); if not, the compiler could not handle the region: it says so in one logged line and
the region stays eager from then on. Single-op regions run eagerly (nothing to fuse).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..ir.program import Block
from ..ops.core.registry import OPS
from ..ops.array.tensor import check_id_range

log = logging.getLogger("retrograd")

MIN_REGION_OPS = 2      # a lone op gains nothing from a compiler: it runs eagerly


@dataclass
class Region:
    """Consecutive steps run as one compiled function."""
    steps: list
    inputs: tuple[str, ...]       # names read from before the region
    outputs: tuple[str, ...]      # names it leaves in the environment
    dropped: tuple[str, ...]      # names from before the region that die inside it
    source: str = ""
    function: object = None       # the compiled function; None: runs op by op
    eager_reason: str | None = None
    calls: int = 0


@dataclass
class RegionPlan:
    """A plan as items run in order: a ``Region`` or an eager ``Step``."""
    items: list = field(default_factory=list)

    @property
    def regions(self) -> list[Region]:
        return [item for item in self.items if isinstance(item, Region)]


def compilable(step) -> bool:
    """Whether a step may join a region: no sub-block (control flow), no random draws, and not an
    op declared ``defop(..., compile=False)``."""
    op = step.op
    opdef = OPS.get(op.type)
    return (opdef is not None and not opdef.random and opdef.extra.get("compile", True)
            and not any(isinstance(v, Block) or (isinstance(v, (list, tuple)) and any(isinstance(b, Block)
                                                                                        for b in v))
                        for v in op.attrs.values()))


def split_plan(plan, compile_function) -> RegionPlan:
    """The plan's steps grouped into regions (``compile_function(python_function)`` compiles one)."""
    layout = RegionPlan()
    run: list = []

    def close():
        if len(run) >= MIN_REGION_OPS:
            layout.items.append(_region(run, plan, len(layout.regions), compile_function))
        else:
            layout.items.extend(run)
        run.clear()

    for step in plan.steps:
        if compilable(step):
            run.append(step)
        else:
            close()
            layout.items.append(step)
    close()
    return layout


def _region(steps: list, plan, index: int, compile_function) -> Region:
    """A region of ``steps``: what it reads and leaves, its source, its (lazily) compiled function."""
    written: set[str] = set()
    inputs: dict[str, None] = {}
    present: set[str] = set()          # the names touched, as the environment holds them after each step
    for step in steps:
        for name in step.inputs:
            if name not in written:
                inputs.setdefault(name)
                present.add(name)
        written.update(step.outputs)
        present.update(step.outputs)
        present.difference_update(step.dead)
    outputs = tuple(n for n in dict.fromkeys(n for s in steps for n in s.outputs) if n in present)
    dropped = tuple(n for n in inputs if n not in present)
    region = Region(list(steps), tuple(inputs), outputs, dropped)
    region.source, namespace = _source(region, f"region_{index}")
    exec(compile(region.source, f"<retrograd compiled region {index} of block {plan.block.idx}>", "exec"),
         namespace)
    region.function = _CompileOnSecondCall(compile_function, namespace[f"region_{index}"])
    return region


class _CompileOnSecondCall:
    """A region's function: the plain one on its first call (a startup program, which runs once,
    is never compiled), the compiled one from the second on."""

    def __init__(self, compile_function, function):
        self.compile_function, self.function, self.compiled = compile_function, function, None
        self.calls = 0

    def __call__(self, *args):
        if self.compiled is not None:
            return self.compiled(*args)
        self.calls += 1
        if self.calls == 1:
            return self.function(*args)
        self.compiled = self.compile_function(self.function)
        return self.compiled(*args)


def _source(region: Region, name: str) -> tuple[str, dict]:
    """Straight-line Python source of the region and the globals it runs with (kernels, contexts)."""
    local: dict[str, str] = {}

    def var(n: str) -> str:
        if n not in local:
            local[n] = f"v{len(local)}"
        return local[n]

    args = ", ".join(var(n) for n in region.inputs)
    lines = [f"def {name}({args}):"]
    namespace: dict = {}
    for i, step in enumerate(region.steps):
        namespace[f"kernel_{i}"], namespace[f"k_{i}"] = step.kernel, step.k
        call_args = ", ".join([f"k_{i}"] + [var(n) for n in step.inputs])
        targets = ", ".join(var(n) for n in step.outputs)
        if len(step.outputs) > 1:
            targets += ","
        lines.append(f"    {targets} = kernel_{i}({call_args})    # {step.op.type}")
    outs = "".join(f"{var(n)}, " for n in region.outputs)
    lines.append(f"    return ({outs})")
    return "\n".join(lines) + "\n", namespace


class RegionRunner:
    """Runs plans region by region for an executor (``Executor(compile=True)``)."""

    def __init__(self, executor, compile_function):
        self.executor = executor
        self.compile_function = compile_function
        self.layouts: dict[int, tuple] = {}        # id(plan) -> (plan, RegionPlan)
        # Id checks (Gather's ids, labels) inside a region: their [low, high] come back as arrays
        # and are checked after the region (``check_ids``), not read on the host between ops,
        # which would cut the compiled graph. One list, so the compiler sees the same object.
        self.checks: list = []

    def layout(self, plan) -> RegionPlan:
        cached = self.layouts.get(id(plan))
        if cached is None or cached[0] is not plan:
            cached = self.layouts[id(plan)] = (plan, split_plan(plan, self.compile_function))
        return cached[1]

    def execute(self, plan, env: dict) -> None:
        """Run ``plan`` over ``env`` as ``Executor.execute`` does, regions compiled."""
        executor = self.executor
        for item in self.layout(plan).items:
            if isinstance(item, Region):
                self._run_region(item, env)
            else:
                executor.execute_steps([item], env)

    def _call(self, region: Region, args: list):
        """The region's outputs from its compiled function; its deferred id checks raise IndexError."""
        run = self.executor.run_context
        if run.deferred_checks is not None:       # a device graph is being captured: its own checks
            return region.function(*args)
        run.deferred_checks = self.checks
        try:
            results = region.function(*args)
            self._raise_failed_checks()
        finally:
            run.deferred_checks = None
            self.checks.clear()
        return results

    def _raise_failed_checks(self) -> None:
        """IndexError (the eager kernel's) for the first deferred id check that failed."""
        if not self.checks:
            return
        torch = self.executor.backend.xp
        bounds = torch.stack([torch.astype(torch.stack([low, high]), torch.int64)
                              for _, low, high, *_ in self.checks])
        # (op, low, high, n, what) from check_ids; wrap_ids adds negative=True (ids from the end)
        for (_, _, _, n, what, *negative), (low, high) in zip(self.checks,
                                                              self.executor.backend.to_numpy(bounds).tolist()):
            check_id_range(low, high, n, what, *negative)

    def _run_region(self, region: Region, env: dict) -> None:
        executor = self.executor
        if region.function is None:
            executor.execute_steps(region.steps, env)
            return
        try:
            args = [env[n] for n in region.inputs]
        except KeyError:
            executor.execute_steps(region.steps, env)      # raises the eager run's error
            return
        try:
            results = self._call(region, args)
        except Exception as exc:  # noqa: BLE001 -- the eager run below says whether it was the compiler
            executor.execute_steps(region.steps, env)      # the eager run's error, if it has one
            region.eager_reason = _reason(exc)
            region.function = None
            log.warning("retrograd: compile=True: the region of %d ops from %s runs eagerly: the compiler "
                        "failed (%s)", len(region.steps), region.steps[0].op.where(), region.eager_reason)
            return
        region.calls += 1
        meter = executor.run_context.meter
        for name, value in zip(region.outputs, results):
            old = env.get(name)
            env[name] = value
            meter.hold(value)
            if old is not None:
                meter.release(old)
        for name in region.dropped:
            value = env.pop(name, None)
            if value is not None:
                meter.release(value)
        executor.run_context.ops_run += len(region.steps)


def _reason(exc: Exception) -> str:
    """One line saying why the compiler failed (torch wraps the cause: its first line says little)."""
    cause = exc
    while cause.__cause__ is not None:
        cause = cause.__cause__
    text = " ".join(str(cause).split())
    return f"{type(cause).__name__}: {text[:300]}"
