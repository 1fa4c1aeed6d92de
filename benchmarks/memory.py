"""One memory budget for the whole training step: peak bytes, time and gradient error of
``append_backward(loss, memory_budget=B, feed_shapes=...)`` against storing everything.

Models (float32 unless said):

* ``LSTM``: ``layers.lstm`` (N=16, D=64, H=256), loss on the last hidden
  state, at T = 1000 and 10000 time steps (``--t100k`` adds one budgeted run
  at T = 100,000: store-all would need ~23 GB there);
* ``MLP-32``: 32 tanh layers of width 256 over a batch of 4096 rows;
* ``ODE``: ``examples/neural_ode.py``'s solver (adaptive-step Runge-Kutta
  ``while_loop``, float64, batch 512, hidden 64; ``w2`` drawn with std 0.2,
  about the dynamics a trained model reaches: ~110 solver iterations).

Each budget is a fraction (50/25/10/5%) of store-all's *measured* peak
(``exe.last_stats.peak_bytes``: feeds, parameters, everything kept and
recomputed, gradients). A budget below what the program can fit in is a row
saying so with the least budget that fits (the ProgramError's number). For
the MLP, whose parameters and gradients alone are ~10% of its peak, one more
row asks for 5% of store-all's *activations* on top of what every plan holds
anyway. ``ratio`` is CPU time over store-all's (best of interleaved rounds,
BLAS on one thread); ``grad err`` the largest difference of any gradient from
store-all's relative to that gradient's largest entry.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/memory.py            # ~10 minutes
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/memory.py --quick    # T=1000 LSTM, small MLP, ODE
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/memory.py --t100k    # plus T=100,000
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import time
from pathlib import Path

import numpy as np

import retrograd as rg

N, D, H = 16, 64, 256
LAYERS, WIDTH = 32, 256
FRACTIONS = (0.5, 0.25, 0.1, 0.05)


def _ode_module():
    path = Path(__file__).resolve().parents[1] / "examples" / "neural_ode.py"
    spec = importlib.util.spec_from_file_location("neural_ode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the programs --------------------------------------------------------------------------------

def lstm_program(steps: int, budget: int | None):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D])
        _, h_last, _, _ = rg.layers.lstm(x, H, name="lstm")
        loss = rg.mean(h_last * h_last)
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes={"x": (steps, N, D)})
    return main, startup, [loss] + [g for _, g in pairs]


def mlp_program(rows: int, budget: int | None):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, WIDTH])
        h = x
        for i in range(LAYERS):
            h = rg.layers.fc(h, WIDTH, act="tanh", name=f"fc{i}")
        loss = rg.mean(h * h)
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes={"x": (rows, WIDTH)})
    return main, startup, [loss] + [g for _, g in pairs]


def ode_program(batch: int, budget: int | None, hidden: int = 64):
    ode = _ode_module()
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        y0 = rg.data("y0", [-1, 2], dtype="float64")
        target = rg.data("target", [-1, 2], dtype="float64")
        params = [rg.create_parameter("w1", [2, hidden], "float64", init=("normal", 0.0, 0.5)),
                  rg.create_parameter("b1", [hidden], "float64", init=0.0),
                  rg.create_parameter("w2", [hidden, 2], "float64", init=("normal", 0.0, 0.2))]
        loss = rg.mean(rg.square(ode.solve(y0, params) - target))
        if budget is None:        # store-all: the plain backward (a budget would checkpoint the loop)
            pairs = rg.append_backward(loss)
        else:
            pairs = rg.append_backward(loss, memory_budget=budget,
                                       feed_shapes={"y0": (batch, 2), "target": (batch, 2)})
    return main, startup, [loss] + [g for _, g in pairs]


# --- measuring ---------------------------------------------------------------------------------------

class Setting:
    """One built program with its executor and its best times so far."""

    def __init__(self, label, built, feed, budget=None, params=None):
        self.label, self.budget, self.feed = label, budget, feed
        self.main, startup, self.fetch = built
        self.exe = rg.Executor()
        self.exe.run(startup)
        for name, value in (params or {}).items():
            self.exe.scope.set(name, value)
        plan = getattr(self.main, "memory_plan", None)
        self.planned = None if plan is None else plan.planned_peak
        self.cpu = self.wall = float("inf")
        self.out, self.peak = None, 0

    def params(self) -> dict:
        return {v.name: self.exe.scope.get(v.name) for v in self.main.all_parameters()}

    def run(self) -> None:
        c, w = time.process_time(), time.perf_counter()
        self.out = self.exe.run(self.main, feed=self.feed, fetch_list=self.fetch)
        self.cpu = min(self.cpu, time.process_time() - c)
        self.wall = min(self.wall, time.perf_counter() - w)
        self.peak = self.exe.last_stats.peak_bytes


def _least(exc: Exception) -> str:
    found = re.search(r"the least budget that fits is (\d+) bytes", str(exc))
    return f"does not fit: least budget {int(found.group(1)) / 1e6:.1f} MB" if found else f"error: {exc}"


def _mb(n) -> str:
    return "" if n is None else f"{n / 1e6:.1f}"


def measure(model: str, size: str, settings: list, rounds: int) -> list[str]:
    """Run every setting once per round (interleaved); one table row each."""
    for _ in range(rounds):
        for s in settings:
            if isinstance(s, Setting):
                s.run()
    base = settings[0]
    rows = []
    for s in settings:
        if not isinstance(s, Setting):
            rows.append(f"| {model} | {size} | {s[0]} | {_mb(s[1])} | | {s[2]} | | | | |")
        else:
            err = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30))
                      for a, b in zip(s.out[1:], base.out[1:]))
            fits = "" if s.budget is None else ("yes" if s.peak <= s.budget else "**NO**")
            rows.append(f"| {model} | {size} | {s.label} | {_mb(s.budget)} | {_mb(s.planned)} | {_mb(s.peak)} | "
                        f"{fits} | {s.cpu:.2f} | {s.cpu / base.cpu:.2f} | {err:.0e} |")
        print(rows[-1], flush=True)
    return rows


def run_model(model: str, size: str, build, feed, rounds: int, extra_budgets=None) -> list[str]:
    store = Setting("store all", build(None), feed)
    store.run()
    params = store.params()
    settings: list = [store]
    budgets = [(f"budget {f:.0%}", int(f * store.peak)) for f in FRACTIONS]
    budgets += list(extra_budgets(store)) if extra_budgets is not None else []
    for label, budget in budgets:
        try:
            settings.append(Setting(label, build(budget), feed, budget, params))
        except rg.ProgramError as exc:
            settings.append((label, budget, _least(exc)))
    return measure(model, size, settings, rounds)


def mlp_activation_budget(rows: int):
    """5% of store-all's activations above what every plan holds (parameters, gradients, input, and the
    gradient ops' own values: three activations)."""
    def extra(store: Setting):
        kept = rg.memory.report(store.main, {"x": (rows, WIDTH)}).kept_bytes
        fixed = store.peak - kept
        yield "5% of activations", fixed + int(0.05 * kept) + 3 * rows * WIDTH * 4
    return extra


def run_t100k() -> None:
    steps = 100_000
    feed = {"x": np.random.RandomState(0).randn(steps, N, D).astype("float32")}
    budget = 2 << 30
    started = time.perf_counter()
    main, startup, fetch = lstm_program(steps, budget)
    built = time.perf_counter() - started
    exe = rg.Executor()
    exe.run(startup)
    started = time.perf_counter()
    out = exe.run(main, feed=feed, fetch_list=fetch)
    print(f"| LSTM | T=100000 | budget 2 GiB | {_mb(budget)} | {_mb(main.memory_plan.planned_peak)} | "
          f"{_mb(exe.last_stats.peak_bytes)} | {'yes' if exe.last_stats.peak_bytes <= budget else '**NO**'} | "
          f"wall {time.perf_counter() - started:.0f} s (plan {built:.1f} s) | | finite: "
          f"{all(np.isfinite(v).all() for v in out)} |", flush=True)
    print(f"(store-all would plan {main.memory_plan.store_all_peak / 1e9:.1f} GB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="T=1000 LSTM, a 1024-row MLP, the ODE")
    parser.add_argument("--t100k", action="store_true", help="also train the LSTM at T=100,000 under 2 GiB")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best is kept")
    parser.add_argument("--models", default="lstm,mlp,ode", help="comma-separated: lstm, mlp, ode")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"python {platform.python_version()}, numpy {np.__version__}, "
          f"OMP/OPENBLAS threads {os.environ.get('OMP_NUM_THREADS', 'unset')}/"
          f"{os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    print("| model | size | setting | budget MB | planned MB | peak MB | peak <= budget | CPU s | ratio | grad err |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rng = np.random.RandomState(0)
    models = set(args.models.split(","))
    for steps in ([1000] if args.quick else [1000, 10000]) if "lstm" in models else []:
        feed = {"x": rng.randn(steps, N, D).astype("float32")}
        run_model("LSTM", f"T={steps}", lambda b, s=steps: lstm_program(s, b), feed,
                  args.rounds if steps <= 1000 else 1)
    rows = 1024 if args.quick else 4096
    if "mlp" in models:
        feed = {"x": rng.randn(rows, WIDTH).astype("float32")}
        run_model("MLP-32", f"batch={rows}", lambda b: mlp_program(rows, b), feed, args.rounds,
                  mlp_activation_budget(rows))
    if "ode" in models:
        batch = 512
        y0, target = _ode_module().data(batch)
        run_model("ODE", f"batch={batch}", lambda b: ode_program(batch, b), {"y0": y0, "target": target},
                  args.rounds)
    if args.t100k:
        run_t100k()


if __name__ == "__main__":
    main()
