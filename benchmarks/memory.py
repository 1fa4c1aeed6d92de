"""One memory budget for the whole training step: peak bytes, time and gradient error of
``append_backward(loss, memory_budget=B, feed_shapes=...)`` against storing everything.

Models (float32 unless said):

* ``LSTM``: ``layers.lstm`` (N=16, D=64, H=256), loss on the last hidden
  state, at T = 1000 and 10000 time steps (``--t100k`` adds one budgeted run
  at T = 100,000: store-all would need ~23 GB there);
* ``MLP-32``: 32 tanh layers of width 256 over a batch of 4096 rows;
* ``ODE``: ``examples/neural_ode.py``'s solver (adaptive-step Runge-Kutta
  ``while_loop``, float64, batch 512, hidden 64; ``w2`` drawn with std 0.2,
  about the dynamics a trained model reaches: ~110 solver iterations);
* ``LSTM-LM``: embedding -> ``layers.lstm`` -> ``layers.fc`` over all steps ->
  ``softmax_cross_entropy`` (T=400, N=16, V=64, E=32, H=128, float32), with one
  more row at the least budget the planner names;
* ``TFM-4``: 4 ``layers.transformer_block`` (D=128, 4 heads, batch 8, context
  256, V=256) with an ``fc`` head and ``softmax_cross_entropy``, with one more
  row at the least budget the planner names (under a budget it runs in
  micro-batches, each one's backward right after its forward);
* ``lce``: ``rg.linear_cross_entropy`` against the materialised
  ``softmax_cross_entropy(h @ w + b)`` (V=32768, 8192 rows, H=512, float32;
  loss and the gradients of h, w, b) on the NumPy and torch backends: the
  executor's peak, NumPy's own allocation peak (``tracemalloc``: kernel
  temporaries included) and time (``--models lce``; ~4 GB for the
  materialised version).

Each budget is a fraction (50/25/10/5%) of store-all's *measured* peak
(``exe.last_stats.peak_bytes``: feeds, parameters, everything kept and
recomputed, gradients). A budget below what the program can fit in is a row
saying so with the least budget that fits (the ProgramError's number). For
the MLP, whose parameters and gradients alone are ~10% of its peak, one more
row asks for 5% of store-all's *activations* on top of what every plan holds
anyway. ``ratio`` is CPU time over store-all's (best of interleaved rounds,
BLAS on one thread); ``grad err`` the largest difference of any gradient from
store-all's relative to that gradient's largest entry. ``page faults`` and
``sys s`` are the minor page faults and the system CPU time of that best
round (``getrusage``): what first touching freshly mapped memory costs.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/memory.py            # ~10 minutes
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/memory.py --quick    # T=1000 LSTM, small MLP, ODE
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/memory.py --t100k    # plus T=100,000
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/memory.py --models lm,lce
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/memory.py --quick --rounds 2 \
        --rows lstm-t1000,ode,lstm-lm --out memory-rows.md          # ~2 minutes: the cross-machine rows

``--rows`` picks rows by name (``lstm-t1000``, ``lstm-t10000``, ``mlp``,
``ode``, ``lstm-lm``, ``tfm``, ``lce``) instead of ``--models``; ``--out``
also writes the table as markdown (machine, command, load averages) to a file.
A setting whose first round takes over ``SLOW`` times store-all's is not run
again (the least budget of the LSTM-LM: ~150x).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's retrograd
import retrograd as rg  # noqa: E402

N, D, H = 16, 64, 256
LAYERS, WIDTH = 32, 256
FRACTIONS = (0.5, 0.25, 0.1, 0.05)
SLOW = 20
ROWS = {"lstm-t1000": "lstm", "lstm-t10000": "lstm", "mlp": "mlp", "ode": "ode", "lstm-lm": "lm", "tfm": "tfm",
        "lce": "lce"}


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


LM_T, LM_N, LM_V, LM_E, LM_H = 400, 16, 64, 32, 128


def lm_program(budget: int | None):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, -1], dtype="int64")
        labels = rg.data("labels", [-1, -1], dtype="int64")
        h_all, _, _, _ = rg.layers.lstm(rg.layers.embedding(ids, LM_V, LM_E, name="emb"), LM_H, name="lstm")
        loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(h_all, LM_V, name="out"), labels))
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes={"ids": (LM_T, LM_N), "labels": (LM_T, LM_N)})
    return main, startup, [loss] + [g for _, g in pairs]


TFM_B, TFM_L, TFM_D, TFM_HEADS, TFM_V, TFM_BLOCKS = 8, 256, 128, 4, 256, 4


def transformer_program(budget: int | None):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, TFM_L], dtype="int64")
        labels = rg.data("labels", [-1, TFM_L], dtype="int64")
        x = rg.layers.embedding(ids, TFM_V, TFM_D, name="emb")
        for i in range(TFM_BLOCKS):
            x = rg.layers.transformer_block(x, num_heads=TFM_HEADS, name=f"blk{i}")
        loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(x, TFM_V, name="head"), labels))
        pairs = rg.append_backward(loss, memory_budget=budget,
                                   feed_shapes={"ids": (TFM_B, TFM_L), "labels": (TFM_B, TFM_L)})
    return main, startup, [loss] + [g for _, g in pairs]


LCE_ROWS, LCE_H, LCE_V = 8192, 512, 32768


def lce_program(fused: bool, rows: int):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        h = rg.data("h", [rows, LCE_H])
        labels = rg.data("labels", [rows], dtype="int64")
        w = rg.create_parameter("head.w", [LCE_H, LCE_V], init=("normal", 0.0, 0.02))
        b = rg.create_parameter("head.b", [LCE_V], init="zeros")
        xent = rg.linear_cross_entropy(h, w, b, labels) if fused else \
            rg.softmax_cross_entropy(rg.matmul(h, w) + b, labels)
        loss = rg.mean(xent)
        grads = rg.gradients([loss], [h, w, b])
    return main, startup, [loss] + grads


def run_lce(rows: int, rounds: int) -> list[str]:
    """linear_cross_entropy against the materialised loss, per backend: peaks and best time."""
    rng = np.random.RandomState(0)
    feed = {"h": rng.randn(rows, LCE_H).astype("float32"), "labels": rng.randint(0, LCE_V, rows)}
    lines = []
    for backend in ("numpy", "torch"):
        built, results = {}, {}
        for fused in (False, True):
            main, startup, fetch = lce_program(fused, rows)
            exe = rg.Executor(backend=backend)
            exe.run(startup)
            if fused:
                for name in ("head.w", "head.b"):
                    exe.scope.set(name, built[False][1].scope.get(name))
            built[fused] = (main, exe, fetch)
        for fused, (main, exe, fetch) in built.items():     # NumPy's own peak, temporaries included
            tracemalloc.start()
            tracemalloc.reset_peak()
            exe.run(main, feed=feed, fetch_list=fetch)
            traced = tracemalloc.get_traced_memory()[1] if backend == "numpy" else None
            tracemalloc.stop()
            results[fused] = [exe.last_stats.peak_bytes, traced, float("inf"), None]
        for _ in range(rounds):
            for fused, (main, exe, fetch) in built.items():
                started = time.process_time()
                out = exe.run(main, feed=feed, fetch_list=fetch)
                results[fused][2] = min(results[fused][2], time.process_time() - started)
                results[fused][3] = out
        base = results[False]
        for fused, (peak, traced, cpu, out) in results.items():
            err = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30)) for a, b in zip(out, base[3]))
            label = "linear_cross_entropy" if fused else "materialised"
            ratio = "" if traced is None else f"{traced / base[1]:.3f}"
            lines.append(f"| {backend} | {label} | {_mb(peak)} | {peak / base[0]:.3f} | {_mb(traced)} | {ratio} | "
                         f"{cpu:.2f} | {cpu / base[2]:.2f} | {err:.0e} |")
            print(lines[-1], flush=True)
    return lines


def least_budget_setting(build):
    """The least budget the planner names for ``build`` (its error at a 1-byte budget) as an extra
    setting for ``run_model``; None when even that fits."""
    try:
        build(1)
        return None
    except rg.ProgramError as exc:
        least = int(re.search(r"the least budget that fits is (\d+) bytes", str(exc)).group(1))

    def extra(store: Setting):
        yield f"least ({least / store.peak:.1%})", least
    return extra


def run_lm(rounds: int) -> list[str]:
    """The LSTM language model at fractions of store-all's peak and at the least budget named."""
    rng = np.random.RandomState(0)
    feed = {"ids": rng.randint(0, LM_V, (LM_T, LM_N)), "labels": rng.randint(0, LM_V, (LM_T, LM_N))}
    return run_model("LSTM-LM", f"T={LM_T}", lm_program, feed, rounds, least_budget_setting(lm_program))


def run_tfm(rng, rounds: int) -> list[str]:
    """The transformer stack at fractions of store-all's peak and at the least budget named."""
    feed = {"ids": rng.randint(0, TFM_V, (TFM_B, TFM_L)), "labels": rng.randint(0, TFM_V, (TFM_B, TFM_L))}
    return run_model("TFM-4", f"B={TFM_B},L={TFM_L}", transformer_program, feed, rounds,
                     least_budget_setting(transformer_program))


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
        self.faults, self.sys = 0, 0.0

    def params(self) -> dict:
        return {v.name: self.exe.scope.get(v.name) for v in self.main.all_parameters()}

    def run(self) -> None:
        before = resource.getrusage(resource.RUSAGE_SELF)
        c, w = time.process_time(), time.perf_counter()
        self.out = self.exe.run(self.main, feed=self.feed, fetch_list=self.fetch)
        cpu = time.process_time() - c
        after = resource.getrusage(resource.RUSAGE_SELF)
        if cpu < self.cpu:       # the best round's page faults and system time
            self.faults, self.sys = after.ru_minflt - before.ru_minflt, after.ru_stime - before.ru_stime
        self.cpu = min(self.cpu, cpu)
        self.wall = min(self.wall, time.perf_counter() - w)
        self.peak = self.exe.last_stats.peak_bytes


def _grad_err(got, expected) -> float:
    """The largest difference of a gradient from store-all's relative to that gradient's largest
    entry, or to 1e-3 of the largest entry of any gradient for one that is zero up to rounding
    (an attention key bias's: softmax does not see a shift of every score of a row)."""
    floor = 1e-3 * max(float(np.max(np.abs(b))) for b in expected)
    return max(float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), floor, 1e-30))
               for a, b in zip(got, expected))


def _least(exc: Exception) -> str:
    found = re.search(r"the least budget that fits is (\d+) bytes", str(exc))
    return f"does not fit: least budget {int(found.group(1)) / 1e6:.1f} MB" if found else f"error: {exc}"


def _mb(n) -> str:
    return "" if n is None else f"{n / 1e6:.1f}"


def measure(model: str, size: str, settings: list, rounds: int) -> list[str]:
    """Run every setting once per round (interleaved); one table row each. A setting whose first
    round took over ``SLOW`` times store-all's is not run again."""
    base = settings[0]
    for r in range(rounds):
        for s in settings:
            if isinstance(s, Setting) and (r == 0 or s.cpu <= SLOW * base.cpu):
                s.run()
    rows = []
    for s in settings:
        if not isinstance(s, Setting):
            rows.append(f"| {model} | {size} | {s[0]} | {_mb(s[1])} | | {s[2]} | | | | | | |")
        else:
            err = _grad_err(s.out[1:], base.out[1:])
            fits = "" if s.budget is None else ("yes" if s.peak <= s.budget else "**NO**")
            rows.append(f"| {model} | {size} | {s.label} | {_mb(s.budget)} | {_mb(s.planned)} | {_mb(s.peak)} | "
                        f"{fits} | {s.cpu:.2f} | {s.cpu / base.cpu:.2f} | {err:.0e} | {s.faults} | {s.sys:.2f} |")
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
    parser.add_argument("--models", default="lstm,mlp,ode,lm,tfm", help="comma-separated: lstm, mlp, ode, lm, tfm, lce")
    parser.add_argument("--rows", default=None,
                        help=f"comma-separated row names instead of --models: {', '.join(ROWS)}")
    parser.add_argument("--out", default=None, help="also write the table as markdown to this file")
    parser.add_argument("--lce-rows", type=int, default=LCE_ROWS, help="rows of the lce comparison")
    args = parser.parse_args()
    head = [f"machine: {_machine()}, {os.cpu_count()} cpus, python {platform.python_version()}, "
            f"numpy {np.__version__}, OMP/OPENBLAS threads {os.environ.get('OMP_NUM_THREADS', 'unset')}/"
            f"{os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}",
            f"command: python benchmarks/memory.py {' '.join(sys.argv[1:])}",
            f"load average at the start: {_load()}", "",
            "| model | size | setting | budget MB | planned MB | peak MB | peak <= budget | CPU s | ratio | grad err "
            "| page faults | sys s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(head), flush=True)
    lines = head + _run_rows(args)
    lines.append(f"\nload average at the end: {_load()}")
    print(lines[-1].strip())
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


def _machine() -> str:
    """The CPU's model name where /proc/cpuinfo says it (platform.processor() says only x86_64)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load() -> str:
    try:
        return ", ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def _run_rows(args) -> list[str]:
    """Every row asked for (``--rows`` or ``--models``), as markdown lines."""
    lines: list[str] = []
    rng = np.random.RandomState(0)
    rows = None if args.rows is None else args.rows.split(",")
    unknown = [r for r in rows or () if r not in ROWS]
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    models = set(args.models.split(",")) if rows is None else {ROWS[r] for r in rows}
    lengths = [1000] if args.quick else [1000, 10000]
    if rows is not None:
        lengths = [t for t in (1000, 10000) if f"lstm-t{t}" in rows]
    for steps in lengths if "lstm" in models else []:
        feed = {"x": rng.randn(steps, N, D).astype("float32")}
        lines += run_model("LSTM", f"T={steps}", lambda b, s=steps: lstm_program(s, b), feed,
                           args.rounds if steps <= 1000 else 1)
    batch = 1024 if args.quick else 4096
    if "mlp" in models:
        feed = {"x": rng.randn(batch, WIDTH).astype("float32")}
        lines += run_model("MLP-32", f"batch={batch}", lambda b: mlp_program(batch, b), feed, args.rounds,
                           mlp_activation_budget(batch))
    if "ode" in models:
        batch = 512
        y0, target = _ode_module().data(batch)
        lines += run_model("ODE", f"batch={batch}", lambda b: ode_program(batch, b), {"y0": y0, "target": target},
                           args.rounds)
    if "lm" in models:
        lines += run_lm(args.rounds)
    if "tfm" in models:
        lines += run_tfm(rng, args.rounds)
    if "lce" in models:
        lce_head = [f"\nlinear_cross_entropy: V={LCE_V}, {args.lce_rows} rows, H={LCE_H}, float32, "
                    "loss + grads of h, w, b",
                    "| backend | loss | peak MB | peak ratio | NumPy traced MB | traced ratio | CPU s | time ratio "
                    "| grad err |",
                    "|---|---|---|---|---|---|---|---|---|"]
        print("\n".join(lce_head), flush=True)
        lines += lce_head + run_lce(args.lce_rows, args.rounds)
    if args.t100k:
        run_t100k()
    return lines


if __name__ == "__main__":
    main()
