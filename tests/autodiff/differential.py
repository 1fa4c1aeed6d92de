"""One program on every backend: NumPy, torch-CPU, the onnxruntime engine, and ``rg.onnx.export``
run in a plain ``onnxruntime.InferenceSession`` (default options), compared with each other.

Shared by the regression tests of issue 25 (``tests/onnx/test_backends_agree.py``), the
hypothesis version (``tests/autodiff/test_differential.py``) and the long fuzz script
(``benchmarks/fuzz_differential.py``). ``run_everywhere`` gives one ``Outcome`` per runner;
``classify`` says what they add up to:

* ``agree``: every runner returned the NumPy executor's values (same shapes, dtypes, numbers
  within a tolerance, NaN where NumPy has NaN);
* ``same error``: every runner raised a ``rg.RetrogradError`` of NumPy's class (the export
  runner: at run time; a check inside onnxruntime counts when NumPy raised too);
* ``refused``: the others agree, and ``rg.onnx.export`` refused the program with a
  ``rg.BackendError`` naming the op (the engine refusing the same way is also a refusal); or
  the array backends refused a ``recompute=`` byte budget below the least that fits, which
  the ONNX runners do not keep (store-all);
* ``mismatch``: numbers, shapes or dtypes differ, or one runner raised where another did not;
* ``foreign``: an exception that is not a ``RetrogradError`` (an onnxruntime failure at session
  build or run time in the plain session, a KeyError in a kernel ...).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

import retrograd as rg

RUNNERS = ("numpy", "torch", "onnxruntime", "export")
TOLERANCE = {"float64": 1e-7, "float32": 2e-4}
BUDGET_REFUSALS = ("cannot hold", "least budget", "minimum budget")


@dataclass
class Outcome:
    """What one runner did: ``values`` (NumPy arrays, by fetch) or ``error`` (the exception) and
    ``stage`` ("export", "session" or "run": where the export runner's error came from)."""
    values: list | None = None
    error: BaseException | None = None
    stage: str = "run"

    @property
    def retrograd_error(self) -> bool:
        return isinstance(self.error, rg.RetrogradError)


@dataclass
class Verdict:
    kind: str                       # agree / same error / refused / mismatch / foreign
    detail: str = ""
    outcomes: dict = field(default_factory=dict)


def _names(fetch: Sequence) -> list[str]:
    return [f.name if isinstance(f, rg.Var) else f for f in fetch]


def run_backend(backend: str, main, startup, feed: dict, fetch: Sequence) -> Outcome:
    """``main`` run once on ``backend`` ("numpy", "torch" on the CPU, "onnxruntime") after
    ``startup`` (run on the same executor)."""
    try:
        exe = rg.Executor(backend=backend, device="cpu" if backend == "torch" else None)
        if startup is not None:
            exe.run(startup)
        got = exe.run(main, feed=dict(feed), fetch_list=list(fetch))
        return Outcome([np.asarray(v) for v in got])
    except Exception as exc:  # noqa: BLE001 -- any failure is an outcome to compare
        return Outcome(error=exc)


def run_export(main, startup, feed: dict, fetch: Sequence) -> Outcome:
    """``rg.onnx.export`` (parameters as initializers from a NumPy executor's scope after
    ``startup``) and a plain ``onnxruntime.InferenceSession`` with default options."""
    import onnxruntime as ort
    exe = rg.Executor()
    if startup is not None:
        exe.run(startup)
    try:
        model = rg.onnx.export(main, None, list(fetch), scope=exe.scope)
    except Exception as exc:  # noqa: BLE001
        return Outcome(error=exc, stage="export")
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001
        return Outcome(error=exc, stage="session")
    inputs = {i.name for i in session.get_inputs()}
    feeds = {k: np.asarray(v) for k, v in feed.items() if k in inputs}
    if "retrograd.run_id" in inputs:
        feeds["retrograd.run_id"] = np.array(1, dtype=np.int64)
    try:
        return Outcome([np.asarray(v) for v in session.run(_names(fetch), feeds)])
    except Exception as exc:  # noqa: BLE001
        return Outcome(error=exc, stage="run")


def run_everywhere(main, startup, feed: dict, fetch: Sequence, runners: Sequence[str] = RUNNERS) -> dict:
    """runner name -> ``Outcome`` for each of ``runners``."""
    return {name: run_export(main, startup, feed, fetch) if name == "export"
            else run_backend(name, main, startup, feed, fetch) for name in runners}


def differences(got: list, want: list, names: Sequence[str]) -> str | None:
    """Why ``got`` is not ``want`` (shapes, dtypes, numbers), or None when they agree."""
    for name, g, w in zip(names, got, want):
        if g.shape != w.shape:
            return f"{name}: shape {g.shape}, NumPy {w.shape}"
        if g.dtype != w.dtype:
            return f"{name}: dtype {g.dtype}, NumPy {w.dtype}"
        tol = TOLERANCE.get(w.dtype.name)
        if tol is None:
            if not np.array_equal(g, w):
                return f"{name}: {g!r}, NumPy {w!r}"
            continue
        scale = 1.0 + float(np.max(np.abs(np.nan_to_num(w, posinf=0, neginf=0)), initial=0.0))
        if not np.allclose(g, w, rtol=tol, atol=tol * scale, equal_nan=True):
            return f"{name}: {g!r}, NumPy {w!r}"
    return None


def _inside_onnxruntime(out: Outcome) -> bool:
    """Whether the failure came from onnxruntime itself (its own exception, or the engine's
    RetrogradError wrapping one), not from a check or a refusal of retrograd's."""
    error = out.error
    if error is None:
        return False
    if not isinstance(error, rg.RetrogradError):
        return True
    cause = error.__cause__
    return cause is not None and not isinstance(cause, rg.RetrogradError) and "retrograd.check." not in str(error)


def _refused(runner: str, out: Outcome) -> bool:
    """A refusal: ``rg.onnx.export`` (or the engine's export) raising a BackendError."""
    if not isinstance(out.error, rg.BackendError):
        return False
    if runner == "export":
        return out.stage == "export"
    return runner == "onnxruntime" and isinstance(out.error.__cause__, rg.BackendError)


def classify(outcomes: dict, fetch: Sequence) -> Verdict:
    """The verdict over ``outcomes`` (``run_everywhere``'s), with NumPy as the reference."""
    names = _names(fetch)
    ref = outcomes["numpy"]
    refused = [r for r, o in outcomes.items() if ref.error is None and _refused(r, o)]
    if ref.error is not None and any(text in str(ref.error) for text in BUDGET_REFUSALS):
        # a byte budget below the least that fits: ONNX keeps no budget (store-all), so only
        # the array backends refuse it
        refused += [r for r in ("onnxruntime", "export") if r in outcomes and outcomes[r].error is None]
    for runner, out in outcomes.items():
        if runner in refused or out.error is None:
            continue
        expected = ref.error is not None and (runner, out.stage) == ("export", "run")   # a failed check
        if out.stage == "session" or (ref.error is None and _inside_onnxruntime(out)) \
                or not (expected or isinstance(out.error, rg.RetrogradError)):
            return Verdict("foreign", f"{runner} ({out.stage}): {type(out.error).__name__}: {out.error}",
                           outcomes)
    for runner, out in outcomes.items():
        if runner == "numpy" or runner in refused:
            continue
        if ref.error is not None or out.error is not None:
            if ref.error is None or out.error is None:
                side, other = (runner, out) if out.error is not None else ("numpy", ref)
                return Verdict("mismatch", f"{side} raised {type(other.error).__name__}: {other.error}; "
                               f"{'numpy' if side != 'numpy' else runner} did not", outcomes)
            if runner != "export" and type(out.error) is not type(ref.error):
                return Verdict("mismatch", f"{runner} raised {type(out.error).__name__}: {out.error}; "
                               f"numpy {type(ref.error).__name__}: {ref.error}", outcomes)
            continue
        why = differences(out.values, ref.values, names)
        if why is not None:
            return Verdict("mismatch", f"{runner}: {why}", outcomes)
    if refused:
        return Verdict("refused", "; ".join(f"{r}: {outcomes[r].error or ref.error}" for r in refused), outcomes)
    if ref.error is not None:
        return Verdict("same error", f"{type(ref.error).__name__}: {ref.error}", outcomes)
    return Verdict("agree", "", outcomes)


def assert_backends_agree(main, startup, feed: dict, fetch: Sequence, runners: Sequence[str] = RUNNERS,
                          allow: Sequence[str] = ("agree",)) -> Verdict:
    """AssertionError (naming the runner and the difference) unless every runner agrees with the
    NumPy executor (or the verdict is one of ``allow``)."""
    verdict = classify(run_everywhere(main, startup, feed, fetch, runners), fetch)
    assert verdict.kind in allow, f"{verdict.kind}: {verdict.detail}"
    return verdict


def program(build, feed_shapes: dict | None = None) -> tuple[Any, Any, list]:
    """``build()`` (returning the fetch list) inside a new program guard: (main, startup, fetch)."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        fetch = build()
    return main, startup, list(fetch)
