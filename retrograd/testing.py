"""Numeric gradient checks, for our own tests and for users who write ops.

``check_gradients`` builds ``fn`` over float64 inputs, projects its outputs
onto fixed random directions (so every element of the Jacobian matters),
computes the analytic gradient with ``rg.gradients`` and compares it with
central finite differences.
"""
from __future__ import annotations

import inspect
from typing import Callable, Mapping, Sequence

import numpy as np

from .autodiff import gradients
from .errors import RetrogradError
from .ir.builder import program_guard
from .ir.dtypes import is_float
from .ir.program import Program, Var
from .ops.array import creation
from .ops.math import elementwise as ops_math
from .ops.reduce import reductions as ops_reduce
from .runtime import Executor

__all__ = ["build_program", "check_gradients", "GradientCheckError", "started_executor"]


def build_program(fn: Callable[[], object], seed: int = 0) -> tuple[Program, Program, object]:
    """Build ``fn()`` into a fresh (main, startup) pair and verify it; return (main, startup, fn's result).

    Example::

        main, startup, y = rg.testing.build_program(lambda: rg.tanh(rg.data("x", [-1, 3])))
    """
    from .ir.verify import verify_program
    main, startup = Program(random_seed=seed), Program()
    with program_guard(main, startup):
        out = fn()
    verify_program(main)
    return main, startup, out


def started_executor(startup: Program) -> Executor:
    """A new Executor that has run ``startup`` (parameters initialised).

    Example::

        exe = rg.testing.started_executor(startup)
        y, = exe.run(main, feed={"x": xb}, fetch_list=[out])
    """
    exe = Executor()
    exe.run(startup)
    return exe


class GradientCheckError(RetrogradError):
    """Analytic and numeric gradients disagree beyond the tolerance."""


def check_gradients(fn: Callable[..., Var | list[Var]],
                    inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray], *,
                    wrt: list[str] | None = None, eps: float = 1e-6, rtol: float = 1e-4,
                    atol: float = 1e-6, seed: int = 0, raise_on_failure: bool = True,
                    feeds: Mapping[str, np.ndarray] | None = None, backend: str = "numpy",
                    device: str | None = None) -> dict[str, float]:
    """Compare analytic and numeric gradients of ``fn``; return the worst relative error per input.

    ``fn`` receives one Var per entry of ``inputs`` (a dict of name -> array,
    or a list of arrays named after ``fn``'s parameters; float inputs become
    float64 Vars; integer inputs keep their dtype and are not differentiated)
    and returns a Var or a list of Vars. The error reported per input is the
    worst elementwise relative error ``|analytic - numeric| / max(|analytic|,
    |numeric|, floor)`` (the floor, ``max(1e-3 * max|numeric|, atol)``, keeps
    near-zero entries from dominating); right gradients report about 1e-8.
    The check fails where ``|analytic - numeric| > atol + rtol * |numeric|``,
    and the exception names the element. Random ops
    (dropout) draw the same values in every run of the check. ``feeds`` are
    extra values for data Vars that ``fn`` declares itself. ``backend`` and
    ``device`` choose where the program runs (``rg.Executor(backend=, device=)``).

    Example::

        report = rg.testing.check_gradients(
            lambda x, w: rg.tanh(x @ w),
            {"x": np.random.randn(3, 4), "w": np.random.randn(4, 2)})
        # {'x': 2.1e-10, 'w': 8.7e-11}
    """
    if isinstance(inputs, np.ndarray):
        inputs = [inputs]
    if not isinstance(inputs, Mapping):           # a list of arrays: named after fn's parameters
        inputs = dict(zip(_input_names(fn, len(inputs)), inputs))
    arrays = {name: _as_input(value) for name, value in inputs.items()}
    wrt = list(wrt) if wrt is not None else [n for n, a in arrays.items() if a.dtype.kind == "f"]
    feed = {**arrays, **(feeds or {})}
    exe = Executor(backend=backend, device=device)
    main, startup = Program(), Program()
    with program_guard(main, startup):
        vars_ = {name: creation.data(name, a.shape, str(a.dtype), stop_gradient=False)
                 for name, a in arrays.items()}
        outs = fn(*vars_.values())
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        outs = [o for o in outs if is_float(o.dtype)]        # bool/int outputs carry no gradient
        if not outs:
            raise RetrogradError("check_gradients: fn returned no float output to differentiate")
    exe.run(startup)
    # Project onto random directions of the outputs' run-time shapes (declared ones may hold -1).
    values = _run(exe, main, feed, outs)
    rng = np.random.default_rng(seed)
    with program_guard(main, startup):
        terms = [ops_reduce.sum(ops_math.mul(o, creation.constant(rng.standard_normal(np.shape(v)), o.dtype)))
                 for o, v in zip(outs, values)]
        objective = terms[0] if len(terms) == 1 else ops_math.add_n(terms)
        grads = gradients(objective, [vars_[n] for n in wrt])
    analytic = iter(_run(exe, main, feed, [g for g in grads if g is not None]))
    analytic_by_name = {name: np.zeros_like(arrays[name]) if g is None else np.asarray(next(analytic))
                        for name, g in zip(wrt, grads)}
    report, ratios, details = {}, {}, {}
    for name in wrt:
        numeric = _numeric_gradient(exe, main, objective, feed, name, eps)
        ratios[name], details[name] = _error(analytic_by_name[name], numeric, rtol, atol)
        report[name] = _relative_error(analytic_by_name[name], numeric, atol)
    failed = [f"{n}: {details[n]}" for n, e in ratios.items() if not e <= 1.0]
    if failed and raise_on_failure:
        raise GradientCheckError("gradients disagree with finite differences beyond "
                                 f"atol={atol} + rtol={rtol} * |numeric| (worst relative error per "
                                 f"input: {report}); " + "; ".join(failed))
    return report


def _input_names(fn: Callable, count: int) -> list[str]:
    """``fn``'s positional parameter names when it has ``count`` of them, else input0, input1, ..."""
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params]
    if len(names) == count and len(set(names)) == count:
        return names
    return [f"input{i}" for i in range(count)]


def _run(exe: Executor, program: Program, feed: dict, fetch: list) -> list:
    """One run with the random draws of the first: dropout masks depend on the run id,
    and the numeric gradient must see the same function the analytic one differentiates."""
    exe._run.run_id = 0
    if exe._engine is not None:           # the onnxruntime engine counts its runs itself
        exe._engine.run_id = 0
    return exe.run(program, feed=feed, fetch_list=fetch)


def _as_input(value) -> np.ndarray:
    array = np.asarray(value)
    return array.astype(np.float64) if array.dtype.kind == "f" else array


def _numeric_gradient(exe: Executor, program: Program, objective: Var, feed: dict, name: str,
                      eps: float) -> np.ndarray:
    base = feed[name]
    grad = np.zeros_like(base, dtype=np.float64)
    flat = grad.reshape(-1)
    for i in range(base.size):
        values = []
        for step in (eps, -eps):
            moved = base.copy().reshape(-1)
            moved[i] += step
            out, = _run(exe, program, {**feed, name: moved.reshape(base.shape)}, [objective])
            values.append(float(np.asarray(out)))
        flat[i] = (values[0] - values[1]) / (2 * eps)
    return grad


def _relative_error(analytic: np.ndarray, numeric: np.ndarray, atol: float) -> float:
    """Worst elementwise |a - n| / max(|a|, |n|, floor), floor = max(1e-3 * max|n|, atol)."""
    if analytic.shape != numeric.shape or not np.all(np.isfinite(analytic)):
        return float("inf")
    if analytic.size == 0:
        return 0.0
    floor = max(1e-3 * float(np.max(np.abs(numeric))), atol)
    denom = np.maximum(np.maximum(np.abs(analytic), np.abs(numeric)), floor)
    return float(np.max(np.abs(analytic - numeric) / denom))


def _error(analytic: np.ndarray, numeric: np.ndarray, rtol: float, atol: float) -> tuple[float, str]:
    """Worst elementwise |a - n| / (atol + rtol * |n|) (<= 1 passes) and where it occurs."""
    if analytic.shape != numeric.shape:
        return float("inf"), f"analytic gradient has shape {list(analytic.shape)}, expected {list(numeric.shape)}"
    if not np.all(np.isfinite(analytic)):
        return float("inf"), "analytic gradient is not finite"
    if analytic.size == 0:
        return 0.0, "empty"
    ratio = np.abs(analytic - numeric) / (atol + rtol * np.abs(numeric))
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    return float(ratio[worst]), (f"worst at index {list(int(i) for i in worst)}: analytic "
                                 f"{analytic[worst]:.6g}, numeric {numeric[worst]:.6g}")
