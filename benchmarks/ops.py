"""Single ops forward + backward on every CPU backend beside PyTorch eager on the same inputs (issue 19).

The cases (float32; each loss is ``sum(out * r)`` with a fixed random ``r`` of
the output's shape, and the gradients of every float input are fetched):

* ``conv2d``: a ResNet-ish 3x3 layer, ``x [32, 64, 32, 32]``, ``w [64, 64, 3, 3]``,
  padding 1 (the inputs of ``benchmarks/conv.py``); gradients of x and w.
* ``attention``: ``rg.scaled_dot_product_attention`` over q, k, v ``[8, 8, 256, 64]``
  (batch, heads, length, features); gradients of q, k, v.
* ``layer_norm``: ``rg.layer_norm(x, w, b)`` over the last axis of ``[4096, 1024]``;
  gradients of x, w, b.
* ``gelu``: ``rg.gelu(x)`` (exact, erf form) over ``[4096, 1024]``; gradient of x.

Each case runs as one retrograd program per backend (``rg.Executor(backend=...)``
for numpy, torch (CPU) and onnxruntime; fetched with ``return_numpy=False``)
and as ``torch.nn.functional`` + ``torch.autograd.grad`` (PyTorch eager). All
are checked against PyTorch's results first, then alternate run by run for
``--repeats`` rounds; times are medians, ratios the median of per-round ratios
to PyTorch eager. One thread everywhere (OpenBLAS/OMP 1, ``torch.set_num_threads(1)``,
onnxruntime's ``intra_op_num_threads=1``). A case whose op this retrograd lacks
is skipped with a note; a backend that cannot run it, likewise.

Targets (issue 19): the torch backend within 1.2x PyTorch eager, NumPy within 3x.

Run::

    python benchmarks/ops.py                     # every case, 5 rounds
    python benchmarks/ops.py --case gelu --repeats 3
    python benchmarks/ops.py --quick             # small shapes (smoke run)
    python benchmarks/ops.py --write             # also (re)write the "Ops (issue 19)" section of RESULTS.md
    python benchmarks/ops.py --profile conv2d:numpy   # cProfile of one row's runs (top 15 by own time)
    python benchmarks/ops.py --case gelu --clock cpu  # timed by the process's CPU time, not wall time
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")             # before NumPy loads its BLAS
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import retrograd as rg  # noqa: E402
from conv import inputs as conv_inputs  # noqa: E402  (benchmarks/conv.py's layer)
from rnn import CLOCK, CLOCKS, machine, write_section  # noqa: E402

BACKENDS = ("numpy", "torch", "onnxruntime")
EAGER = "torch eager"
SECTION = "Ops (issue 19)"
TARGETS = {"torch": 1.2, "numpy": 3.0}


@dataclass
class Case:
    """One op: its inputs (name -> array; ``grad`` names the differentiated ones), the retrograd
    builder ``build(vars) -> out`` and the PyTorch one ``eager(tensors) -> out``."""
    name: str
    op: str                      # the rg attribute it needs
    describe: str
    inputs: dict
    grad: tuple
    build: Callable
    eager: Callable


def _rng():
    return np.random.default_rng(0)


def conv_case(quick: bool) -> Case:
    n, c, size = (4, 8, 8) if quick else (32, 64, 32)
    x, w = conv_inputs(n, c, size)
    return Case("conv2d", "conv2d", f"x [{n}, {c}, {size}, {size}], w [{c}, {c}, 3, 3], padding 1",
                {"x": x, "w": w}, ("x", "w"),
                lambda v: rg.conv2d(v["x"], v["w"], padding=1),
                lambda t, F: F.conv2d(t["x"], t["w"], padding=1))


def attention_case(quick: bool) -> Case:
    shape = (2, 2, 16, 8) if quick else (8, 8, 256, 64)
    r = _rng()
    return Case("attention", "scaled_dot_product_attention", f"q, k, v {list(shape)}",
                {n: r.standard_normal(shape).astype(np.float32) for n in "qkv"}, ("q", "k", "v"),
                lambda v: rg.scaled_dot_product_attention(v["q"], v["k"], v["v"]),
                lambda t, F: F.scaled_dot_product_attention(t["q"], t["k"], t["v"]))


def layer_norm_case(quick: bool) -> Case:
    rows, cols = (64, 32) if quick else (4096, 1024)
    r = _rng()
    return Case("layer_norm", "layer_norm", f"x [{rows}, {cols}], weight and bias [{cols}]",
                {"x": r.standard_normal((rows, cols)).astype(np.float32),
                 "w": (1 + 0.1 * r.standard_normal(cols)).astype(np.float32),
                 "b": (0.1 * r.standard_normal(cols)).astype(np.float32)}, ("x", "w", "b"),
                lambda v: rg.layer_norm(v["x"], v["w"], v["b"]),
                lambda t, F: F.layer_norm(t["x"], (t["x"].shape[-1],), t["w"], t["b"]))


def gelu_case(quick: bool) -> Case:
    rows, cols = (64, 32) if quick else (4096, 1024)
    return Case("gelu", "gelu", f"x [{rows}, {cols}] (exact)",
                {"x": _rng().standard_normal((rows, cols)).astype(np.float32)}, ("x",),
                lambda v: rg.gelu(v["x"]),
                lambda t, F: F.gelu(t["x"]))


CASES = {"conv2d": conv_case, "attention": attention_case, "layer_norm": layer_norm_case,
         "gelu": gelu_case}


# --- the runners -----------------------------------------------------------------------------

def retrograd_runner(case: Case, backend: str, r: np.ndarray):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        vs = {n: rg.data(n, list(a.shape), stop_gradient=n not in case.grad) for n, a in case.inputs.items()}
        weights = rg.data("r", list(r.shape))
        out = case.build(vs)
        grads = rg.gradients(rg.sum(out * weights), [vs[n] for n in case.grad])
    exe = rg.Executor(backend=backend)
    exe.run(startup)
    feed = {**case.inputs, "r": r}
    return lambda: exe.run(main, feed=feed, fetch_list=grads, return_numpy=False)


def eager_runner(case: Case, r: np.ndarray):
    import torch
    F = torch.nn.functional
    tensors = {n: torch.tensor(a, requires_grad=n in case.grad) for n, a in case.inputs.items()}
    weights = torch.tensor(r)
    wrt = [tensors[n] for n in case.grad]
    return lambda: torch.autograd.grad((case.eager(tensors, F) * weights).sum(), wrt)


def output_shape(case: Case) -> tuple:
    import torch
    tensors = {n: torch.tensor(a) for n, a in case.inputs.items()}
    with torch.no_grad():
        return tuple(case.eager(tensors, torch.nn.functional).shape)


def check(runners: dict, case: Case) -> None:
    """Every row's gradients match PyTorch eager's (float32 tolerances, relative to the largest entry)."""
    want = [g.numpy() for g in runners[EAGER]()]
    for name, run in runners.items():
        for grad_name, got, ref in zip(case.grad, run(), want):
            got = rg.backends.to_numpy(got)
            err = float(np.abs(got - ref).max()) / (float(np.abs(ref).max()) or 1.0)
            if err > 2e-3:
                raise SystemExit(f"{case.name} on {name}: gradient of {grad_name} differs from "
                                 f"PyTorch's (max error {err:.1e} of the largest entry)")


def rows_of(case: Case, repeats: int, notes: list[str]) -> list[dict]:
    if not hasattr(rg, case.op):
        notes.append(f"{case.name}: skipped, this retrograd has no `rg.{case.op}` yet")
        return []
    r = _rng().standard_normal(output_shape(case)).astype(np.float32)
    runners = {EAGER: eager_runner(case, r)}
    for backend in BACKENDS:
        try:
            run = retrograd_runner(case, backend, r)
            run()
        except rg.BackendError as exc:
            notes.append(f"{case.name} on {backend}: skipped ({str(exc).splitlines()[0]})")
            continue
        runners[backend] = run
    check(runners, case)
    times = {name: [] for name in runners}
    clock = CLOCKS[CLOCK[0]]
    for round_ in range(repeats):
        order = list(runners.items())
        for name, run in (order[::-1] if round_ % 2 else order):     # no row always after the same one
            started = clock()
            run()
            times[name].append(clock() - started)
    base = times[EAGER]
    return [{"case": case.name, "describe": case.describe, "impl": name,
             "ms": statistics.median(ts) * 1e3,
             "ratio": statistics.median(t / b for t, b in zip(ts, base))} for name, ts in times.items()]


def profile(case: Case, backend: str, repeats: int) -> str:
    """cProfile of ``repeats`` runs of one row: the top functions by their own time."""
    r = _rng().standard_normal(output_shape(case)).astype(np.float32)
    run = retrograd_runner(case, backend, r) if backend != EAGER else eager_runner(case, r)
    run()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(repeats):
        run()
    prof.disable()
    import io
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
    return out.getvalue()


# --- reporting -------------------------------------------------------------------------------

def table(rows: list[dict]) -> str:
    lines = ["| op (fwd+bwd) | shapes | implementation | median ms | x torch eager |",
             "|---|---|---|--:|--:|"]
    for row in rows:
        impl = row["impl"] if row["impl"] == EAGER else f"retrograd ({row['impl']})"
        lines.append(f"| {row['case']} | {row['describe']} | {impl} | {row['ms']:.1f} | {row['ratio']:.2f} |")
    return "\n".join(lines)


def target_notes(rows: list[dict]) -> list[str]:
    notes = []
    for backend, target in TARGETS.items():
        mine = [r for r in rows if r["impl"] == backend]
        if not mine:
            continue
        missed = [f"{r['case']} {r['ratio']:.2f}x" for r in mine if r["ratio"] > target]
        notes.append(f"**Target** {backend} backend within {target}x PyTorch eager: "
                     + (f"missed on {', '.join(missed)}" if missed else "met on every case measured")
                     + " (" + ", ".join(f"{r['case']} {r['ratio']:.2f}x" for r in mine) + ").")
    return notes


def markdown(rows, notes, command: str, repeats: int, load: tuple[float, float]) -> str:
    info = machine()
    return "\n".join([
        f"## {SECTION}", "",
        "Single ops forward + backward, float32, CPU: each retrograd row is one program "
        "(the op, the loss `sum(out * r)` and its gradient ops) run by `rg.Executor(backend=...)`; "
        "`torch eager` is `torch.nn.functional` + `torch.autograd.grad` on the same inputs. "
        f"All rows are checked against PyTorch's gradients, then alternate run by run for {repeats} "
        "rounds (in reverse order every other round); median "
        f"{'CPU times of the process' if CLOCK[0] == 'cpu' else 'wall times'}, `x torch eager` the median "
        "per-round ratio. One thread everywhere.", "",
        f"Command: `{command}`", "",
        f"Machine: {info['cpu']}, {info['cores']} cores, shared with other jobs (load average "
        f"{load[0]:.1f} before, {load[1]:.1f} after the run); NumPy {info['numpy']}, PyTorch {info['torch']}.",
        "", table(rows), "", *[f"* {n}" for n in target_notes(rows) + notes], ""])


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--case", action="append", choices=tuple(CASES), help="only this case (repeatable)")
    parser.add_argument("--quick", action="store_true", help="small shapes (smoke run)")
    parser.add_argument("--write", action="store_true", help=f"rewrite the '{SECTION}' section of RESULTS.md")
    parser.add_argument("--profile", metavar="CASE:BACKEND",
                        help="profile one row (backend numpy, torch, onnxruntime or 'torch eager') instead")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="what a run's time is: wall time (default) or the process's CPU time")
    args = parser.parse_args(argv)
    CLOCK[0] = args.clock
    import torch
    torch.set_num_threads(1)
    if args.profile:
        name, backend = args.profile.split(":", 1)
        print(profile(CASES[name](args.quick), backend, args.repeats))
        return []
    load_before = os.getloadavg()[0]
    rows, notes = [], []
    for name in args.case or CASES:
        rows += rows_of(CASES[name](args.quick), args.repeats, notes)
        print(f"done {name}", flush=True)
    load = (load_before, os.getloadavg()[0])
    print(table(rows))
    for note in target_notes(rows) + notes:
        print(f"* {note}")
    if args.write:
        command = " ".join(["python benchmarks/ops.py", *(argv if argv is not None else sys.argv[1:])])
        write_section(markdown(rows, notes, command, args.repeats, load), SECTION)
        print(f"wrote the '{SECTION}' section of RESULTS.md")
    return rows


if __name__ == "__main__":
    main()
