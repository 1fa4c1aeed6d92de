"""conv2d forward + backward on every CPU backend beside PyTorch eager on the same inputs.

A ResNet-ish 3x3 layer: ``x [32, 64, 32, 32]``, ``w [64, 64, 3, 3]``,
padding 1, float32; the program computes ``y = conv2d(x, w)``, the loss
``sum(y * y)`` and the gradients of ``x`` and ``w``; the peer is
``torch.nn.functional.conv2d`` with autograd. Results are checked against
torch's before timing. The implementations alternate within each round (so
the machine's load hits them alike); times are medians over rounds, ratios the
medians of per-round ratios to torch eager. One thread for BLAS, PyTorch and
onnxruntime's executor is left at its default.

Run::

    python benchmarks/conv.py                 # 7 rounds
    python benchmarks/conv.py --quick         # a small layer, 5 rounds (smoke run)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")     # before NumPy loads its BLAS
os.environ.setdefault("OMP_NUM_THREADS", os.environ["OPENBLAS_NUM_THREADS"])
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import retrograd as rg  # noqa: E402

BACKENDS = ["numpy", "torch", "onnxruntime"]


def inputs(n: int, c: int, size: int):
    r = np.random.default_rng(0)
    x = r.standard_normal((n, c, size, size)).astype("float32")
    w = (r.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype("float32")
    return x, w


def retrograd_step(backend: str, x, w):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        xv = rg.data("x", x.shape, stop_gradient=False)
        wv = rg.data("w", w.shape, stop_gradient=False)
        y = rg.conv2d(xv, wv, padding=1)
        fetch = rg.gradients(rg.sum(y * y), [xv, wv])
    exe = rg.Executor(backend=backend)
    return lambda: exe.run(main, feed={"x": x, "w": w}, fetch_list=fetch, return_numpy=False)


def torch_step(x, w):
    import torch
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)

    def step():
        y = torch.nn.functional.conv2d(xt, wt, padding=1)
        return torch.autograd.grad((y * y).sum(), [xt, wt])
    return step


def check(steps: dict, reference) -> None:
    expected = [t.numpy() for t in reference()]
    for name, step in steps.items():
        got = [rg.backends.to_numpy(v) for v in step()]
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3 * np.abs(b).max(), err_msg=name)


def main(rounds: int, n: int, c: int, size: int) -> None:
    import torch
    torch.set_num_threads(1)
    x, w = inputs(n, c, size)
    eager = torch_step(x, w)
    steps = {}
    for backend in BACKENDS:
        try:
            steps[backend] = retrograd_step(backend, x, w)
        except rg.BackendError as exc:
            print(f"skipping {backend}: {exc}")
    check(steps, eager)
    times: dict[str, list[float]] = {name: [] for name in ["torch eager", *steps]}
    for _ in range(rounds):
        for name, step in [("torch eager", eager), *steps.items()]:
            started = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - started)
    print(f"conv2d fwd+bwd, x [{n}, {c}, {size}, {size}], w [{c}, {c}, 3, 3], padding 1, float32, "
          f"{rounds} rounds")
    print("| implementation | median ms | x torch eager |\n|---|---:|---:|")
    base = times["torch eager"]
    for name, values in times.items():
        ratio = statistics.median(v / b for v, b in zip(values, base))
        print(f"| {name} | {statistics.median(values) * 1e3:.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="a small layer, 5 rounds")
    args = parser.parse_args()
    if args.quick:
        main(5, 4, 8, 8)
    else:
        main(args.rounds, 32, 64, 32)
