"""Wall time of a short default ``retrograd train`` per backend, idle and beside busy processes.

The run a new user starts (``retrograd train``, here with ``--steps 50``) with the default
thread count, against the same run with ``OMP_NUM_THREADS=1`` (and the other libraries' thread
variables) set by hand; "loaded" starts ``--busy`` processes spinning ``while True: pass``
beside it (killed afterwards). Results: benchmarks/results/threads.md.

Example::

    PYTHONPATH=$PWD python benchmarks/threads.py --steps 50 --backends torch numpy --busy 2
    PYTHONPATH=/tmp/old python benchmarks/threads.py ...      # the code before, for comparison
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


TIMEOUT_S = 900


def run_once(backend: str, steps: int, extra_env: dict, threads: str | None) -> float:
    """Seconds of one ``retrograd train`` process from start to exit (inf past ``TIMEOUT_S``)."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "retrograd", "train", "--steps", str(steps), "--backend", backend,
                   "--sample-len", "20", "--no-plot", "--save", os.path.join(tmp, "m.npz")]
        if threads is not None:
            command += ["--threads", threads]
        env = {**os.environ, **extra_env}
        started = time.perf_counter()
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return float("inf")
        seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return seconds


def busy(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--backends", nargs="+", default=["torch", "onnxruntime", "numpy"])
    parser.add_argument("--busy", type=int, default=2, help="busy processes of the loaded runs")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--threads", default=None, help="--threads to pass (default: none, the default)")
    parser.add_argument("--loads", nargs="+", default=["idle", "loaded"])
    args = parser.parse_args()
    print(f"load average before: {open('/proc/loadavg').read().split()[:3]}", flush=True)
    print("| backend | machine | default s | OMP_NUM_THREADS=1 s | ratio |")
    print("|---|---|---|---|---|")
    for load in args.loads:
        for backend in args.backends:
            spinners = busy(args.busy) if load == "loaded" else []
            try:
                time.sleep(0.5 if spinners else 0)
                defaults, pinned_runs = [], []
                for _ in range(args.repeat):        # alternated: a change of the machine's load hits both
                    defaults.append(run_once(backend, args.steps, {}, args.threads))
                    pinned_runs.append(run_once(backend, args.steps, ONE_THREAD, args.threads))
                default, pinned = min(defaults), min(pinned_runs)
            finally:
                for process in spinners:
                    process.kill()
                    process.wait()
            print(f"| {backend} | {load} | {_seconds(default)} | {_seconds(pinned)} | "
                  f"{default / pinned:.2f}x |", flush=True)
    print(f"load average after: {open('/proc/loadavg').read().split()[:3]}")


def _seconds(value: float) -> str:
    return f">{TIMEOUT_S} (stopped)" if value == float("inf") else f"{value:.1f}"


if __name__ == "__main__":
    main()
