"""Executor overhead (issue 34 item 3): Python calls per training step and steps/s, eager runs.

Two steps, each against the same model in PyTorch eager, one thread:

* the default ``retrograd train`` step (char-LSTM LM: embedding 64 -> LSTM 128 -> 96
  characters, batch 32 x 64, Adam + clipping at 5) on the torch backend (``benchmarks/train.py``);
* the GPT-style char transformer step of ``examples/gpt_chars.py`` (width 64, 4 heads, 2 blocks,
  batch 32 x 64, AdamW + clipping at 1) on the torch backend (``benchmarks/train_transformer.py``).

Beside the default executor, "every op metered" is the same executor with the memory meter
counting every value of every run op by op (no ``MeterRecord`` replay), as before issue 34 item 3.

Python calls per step: cProfile's total calls (primitive and recursive, as
``pstats`` counts them) over ``--profile-steps`` steps after warm-up, divided by
the steps (the fewer of two such counts). Steps/s: alternating rounds of ``--round`` steps after
warm-up, the median round, in wall time and in this process's CPU time. ``--executor-only`` also
reports the executor's own CPU time per step with every kernel replaced by its cached result (what
the kernels compute is taken out: what is left is dispatch, memory metering, write-back, and the
step's batch, feed conversion and fetch).

    python benchmarks/executor_overhead.py                 # both steps, 8 rounds of 5 steps
    python benchmarks/executor_overhead.py --rounds 3 --only lstm
    python benchmarks/executor_overhead.py --code=/tmp/before     # the package of another checkout
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
# --code DIR: time the retrograd package under DIR (an older checkout) with these benchmarks
CODE = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--code=")), None)
if CODE:
    sys.path.insert(0, CODE)

import retrograd as rg  # noqa: E402
from retrograd.cli import train  # noqa: E402


def lstm_steppers(args) -> dict:
    import train as bench       # benchmarks/train.py
    from retrograd.models import charlm
    corpus, _ = charlm.load_corpus()
    opts = argparse.Namespace(model="lstm", hidden=128, layers=1, embed=64, seq_len=64, batch=32, lr=3e-3,
                              clip_norm=5.0)
    steppers = {}
    for name in (RETROGRAD, METERED):
        step, exe = bench.retrograd_stepper(opts, corpus, backend="torch")
        step.executor = exe
        steppers[name] = step
    return with_metered({**steppers, "PyTorch eager": bench.torch_stepper(opts, corpus)})


def transformer_steppers(args) -> dict:
    import train_transformer as tt
    from retrograd.models import charlm
    g = tt.gpt_module()
    corpus, _ = charlm.load_corpus()
    return with_metered({RETROGRAD: tt.retrograd_stepper(g, corpus, "torch", 32, 3e-3, 1000),
                         METERED: tt.retrograd_stepper(g, corpus, "torch", 32, 3e-3, 1000),
                         "PyTorch eager": tt.torch_stepper(g, corpus, 32, 3e-3, 1)})


RETROGRAD = "retrograd (torch backend)"
METERED = "retrograd, every op metered"


def with_metered(steppers: dict) -> dict:
    """``steppers`` with the METERED one's plans metered op by op after its first run, as before
    issue 34 item 3 (no ``MeterRecord``: the meter's hold/release per value, write-back checked);
    dropped where this retrograd has no records (an older checkout: --code)."""
    step = steppers[METERED]
    if not hasattr(step.executor.run_context, "metered_start"):
        del steppers[METERED]
        return steppers

    def metered(i: int) -> float:
        loss = step(i)
        for plan in step.executor._plans.values():
            plan.meter_records = None
        return loss
    metered.executor = step.executor
    steppers[METERED] = metered
    return steppers


def calls_per_step(step, steps: int) -> float:
    """The fewer of two profiled runs of ``steps`` steps (the first may include one-time work:
    threadpoolctl looks for the libraries the other framework's steps loaded)."""
    counts = []
    for _ in range(2):
        profile = cProfile.Profile()
        profile.enable()
        for i in range(steps):
            step(i)
        profile.disable()
        counts.append(pstats.Stats(profile).total_calls / steps)
    return min(counts)


def step_times(steppers: dict, rounds: int, per_round: int) -> dict:
    """Name -> (median wall seconds, median CPU seconds of this process) per step over the rounds.

    CPU time is what the step itself used: on a shared machine it moves less with other
    processes' load than wall time (one thread each)."""
    wall = {k: [] for k in steppers}
    cpu = {k: [] for k in steppers}
    for _ in range(rounds):
        for name, step in steppers.items():
            started, started_cpu = time.perf_counter(), time.process_time()
            for i in range(per_round):
                step(i)
            wall[name].append((time.perf_counter() - started) / per_round)
            cpu[name].append((time.process_time() - started_cpu) / per_round)
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in steppers}


def executor_only(step) -> float:
    """CPU seconds per step of the executor alone: each plan step's kernel replaced by its cached
    result (the step still makes its batch, converts the feeds and fetches the loss)."""
    exe = step.executor
    plans = list(exe._plans.values())
    saved = []
    for plan in plans:
        for s in plan.steps:
            result = {}

            def cached(k, *args, _kernel=s.kernel, _result=result):
                if "v" not in _result:
                    _result["v"] = _kernel(k, *args)
                return _result["v"]
            saved.append((s, s.kernel))
            s.kernel = cached
    try:
        step(0)
        step(0)
        started = time.process_time()
        for _ in range(40):
            step(0)
        return (time.process_time() - started) / 40
    finally:
        for s, kernel in saved:
            s.kernel = kernel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("lstm", "transformer"))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--round", type=int, default=5)
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--executor-only", action="store_true")
    parser.add_argument("--code", help="DIR holding the retrograd package to time (--code=DIR)")
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    workloads = {"char-LSTM LM (`retrograd train` default)": lstm_steppers,
                 "GPT-style char transformer": transformer_steppers}
    if args.only:
        workloads = {k: v for k, v in workloads.items() if args.only in k.lower()}
    print(f"retrograd from {Path(rg.__file__).parent}")
    print("| step | framework | Python calls / step | ms / step (wall) | steps/s | x PyTorch eager "
          "| CPU ms / step | x PyTorch eager (CPU) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for title, build in workloads.items():
        steppers = build(args)
        for step in steppers.values():
            for i in range(3):
                step(i)
        calls = {k: calls_per_step(s, args.profile_steps) for k, s in steppers.items()}
        times = step_times(steppers, args.rounds, args.round)
        wall0, cpu0 = times["PyTorch eager"]
        for name in steppers:
            wall, cpu = times[name]
            print(f"| {title} | {name} | {calls[name]:,.0f} | {wall * 1e3:.1f} | {1 / wall:.1f} | {wall0 / wall:.2f} "
                  f"| {cpu * 1e3:.1f} | {cpu0 / cpu:.2f} |", flush=True)
        if args.executor_only:
            for name in (RETROGRAD, METERED):
                if name in steppers:
                    own = executor_only(steppers[name])
                    print(f"  {name}, executor alone (kernels cached): {own * 1e3:.3f} CPU ms/step", flush=True)
    with open("/proc/loadavg") as f:
        print("load average:", " ".join(f.read().split()[:3]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
