"""Memory as a dial: peak bytes and step time of forward + backward across recompute settings.

Two models:

* an LSTM (``layers.lstm``, N=16, D=64, H=256, float32) with the loss on its
  last hidden state, over T in {100, 1000, 10000} time steps, with
  ``recompute`` = None (store all), ``"steps"`` (store the states, recompute
  each step's intermediates) and byte budgets of 50%, 20% and 5% of what
  store-all keeps for the backward (its (T+1) states and saved step values);
* a 32-layer tanh MLP (width 256, float32) over batches of {100, 1000, 10000}
  rows, storing all activations, with ``checkpoints="auto"`` and with
  ``rg.memory.auto_checkpoints`` budgets of 50%, 20% and 5% of the
  activations store-all keeps.

Times are CPU seconds of the process (best of interleaved rounds; BLAS on one thread)
because wall time on a shared machine measures the other tenants; wall time
is printed too. ``ratio`` is CPU time over store-all's. ``grad err`` is the
largest relative difference of any gradient from store-all's.

    OPENBLAS_NUM_THREADS=1 python benchmarks/memory.py            # full table (several minutes)
    OPENBLAS_NUM_THREADS=1 python benchmarks/memory.py --quick    # sizes up to 1000
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

import retrograd as rg

N, D, H = 16, 64, 256
LAYERS, WIDTH = 32, 256


# --- the LSTM ------------------------------------------------------------------------------------

def lstm_program(recompute):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D])
        _, h_last, _, _ = rg.layers.lstm(x, H, name="lstm", recompute=recompute)
        loss = rg.mean(h_last * h_last)
        params_grads = rg.append_backward(loss)
    return main, startup, [loss] + [g for _, g in params_grads]


def lstm_store_all_bytes(main: rg.Program, steps: int) -> int:
    """What store-all keeps for the backward: the (T+1) states and the full saved step values."""
    op = next(o for o in main.global_block().ops if o.type == "RecurrentNetwork")
    step = op.attrs["step"]

    def size(name):
        return int(np.prod([N if d < 0 else d for d in step.var(name).shape])) * 4

    saved = sum(size(n) for n, full in zip(op.attrs["saved"], op.attrs["saved_full"]) if full)
    return steps * saved + (steps + 1) * sum(size(n) for n in op.attrs["states"])


# --- the MLP -----------------------------------------------------------------------------------

def mlp_forward():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, WIDTH])
        h = x
        for i in range(LAYERS):
            h = rg.layers.fc(h, WIDTH, act="tanh", name=f"fc{i}")
        loss = rg.mean(h * h)
    return main, startup, loss


def mlp_program(setting, rows: int):
    main, startup, loss = mlp_forward()
    checkpoints, budget = None, None
    if setting == "auto":
        checkpoints = "auto"
    elif isinstance(setting, float):
        scratch, _, scratch_loss = mlp_forward()
        with rg.program_guard(scratch, rg.Program()):
            rg.append_backward(scratch_loss)
        store_all = rg.memory.report(scratch, {"x": (rows, WIDTH)}).kept_bytes
        budget = int(setting * store_all)
        checkpoints = rg.memory.auto_checkpoints(loss, budget, {"x": (rows, WIDTH)})
    with rg.program_guard(main, startup):
        params_grads = rg.append_backward(loss, checkpoints=checkpoints)
    return main, startup, [loss] + [g for _, g in params_grads], budget


# --- measuring ---------------------------------------------------------------------------------

class Setting:
    """One program of one model at one size, with its executor and its best times so far."""

    def __init__(self, label, built, feed, budget=None):
        self.label, self.budget, self.feed = label, budget, feed
        self.main, startup, self.fetch = built
        self.exe = rg.Executor()
        self.exe.run(startup)
        self.cpu = self.wall = float("inf")
        self.out, self.peak = None, 0

    def run(self) -> None:
        c, w = time.process_time(), time.perf_counter()
        self.out = self.exe.run(self.main, feed=self.feed, fetch_list=self.fetch)
        self.cpu = min(self.cpu, time.process_time() - c)
        self.wall = min(self.wall, time.perf_counter() - w)
        self.peak = self.exe.last_stats.peak_bytes


def measure(model: str, size: str, settings: list, rounds: int) -> list[str]:
    """Run every setting once per round (interleaved, so load drift hits all alike); one table row each."""
    for _ in range(rounds):
        for setting in settings:
            if isinstance(setting, Setting):
                setting.run()
    base = next(s for s in settings if isinstance(s, Setting))
    rows = []
    for s in settings:
        if not isinstance(s, Setting):
            rows.append(f"| {model} | {size} | {s[0]} | | does not fit: {s[1]} | | | | |")
        else:
            err = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30))
                      for a, b in zip(s.out[1:], base.out[1:]))
            budget = "" if s.budget is None else f"{s.budget / 1e6:.1f}"
            rows.append(f"| {model} | {size} | {s.label} | {budget} | {s.peak / 1e6:.1f} | {s.cpu:.2f} | "
                        f"{s.wall:.2f} | {s.cpu / base.cpu:.2f} | {err:.0e} |")
        print(rows[-1], flush=True)
    return rows


def run_lstm(steps: int, rounds: int) -> list[str]:
    feed = {"x": np.random.RandomState(0).randn(steps, N, D).astype("float32")}
    store = Setting("store all", lstm_program(None), feed)
    store_all = lstm_store_all_bytes(store.main, steps)
    store.label = f"store all (keeps {store_all / 1e6:.1f} MB)"
    settings = [store, Setting("per-step recompute", lstm_program("steps"), feed)]
    for fraction in (0.5, 0.2, 0.05):
        budget = int(fraction * store_all)
        settings.append(Setting(f"budget {fraction:.0%}", lstm_program(budget), feed, budget))
    return measure("LSTM", f"T={steps}", settings, rounds)


def run_mlp(rows_n: int, rounds: int) -> list[str]:
    feed = {"x": np.random.RandomState(0).randn(rows_n, WIDTH).astype("float32")}
    settings = []
    for label, setting in [("store all", None), ('checkpoints="auto"', "auto"),
                           ("budget 50%", 0.5), ("budget 20%", 0.2), ("budget 5%", 0.05)]:
        try:
            main, startup, fetch, budget = mlp_program(setting, rows_n)
        except rg.ProgramError as exc:
            settings.append((label, str(exc).split(";")[1].strip()))
            continue
        settings.append(Setting(label, (main, startup, fetch), feed, budget))
    return measure("MLP-32", f"batch={rows_n}", settings, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="sizes up to 1000 only")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best is kept")
    args = parser.parse_args()
    sizes = [100, 1000] if args.quick else [100, 1000, 10000]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"python {platform.python_version()}, numpy {np.__version__}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    print("| model | size | setting | budget MB | peak MB | CPU s | wall s | ratio | grad err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for steps in sizes:
        run_lstm(steps, args.rounds if steps < 10000 else 1)
    for rows_n in sizes:
        run_mlp(rows_n, args.rounds)


if __name__ == "__main__":
    main()
