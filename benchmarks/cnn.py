"""A small CNN's training step: retrograd's backends beside PyTorch eager, same weights, one thread.

The model (issue 34's CNN): ``conv3x3 32 (padding 1) -> relu -> max_pool 2 ->
conv3x3 64 (padding 1) -> relu -> max_pool 2 -> fc 10``, softmax cross-entropy
averaged over a batch of 64 ``1x28x28`` images, SGD with momentum 0.9 (lr
0.01, PyTorch's convention). retrograd builds it with ``rg.layers.conv2d``,
``rg.max_pool2d``, ``rg.layers.fc`` and ``rg.optim.Momentum``; PyTorch eager
runs ``torch.nn.Conv2d``/``MaxPool2d``/``Linear`` and ``torch.optim.SGD``
(``foreach`` on its default). Every framework starts from the same weights and
its first step's loss is checked against PyTorch's. One thread each:
``torch.set_num_threads(1)``, ``rg.Executor(threads=1)``, onnxruntime's engine
with one intra-op thread. The implementations alternate within each round (so
the machine's load hits them alike); a round times ``--steps`` steps of each;
steps/s are medians over rounds, ratios the medians of per-round ratios to
PyTorch eager.

Run::

    python benchmarks/cnn.py                  # 9 rounds of 10 steps
    python benchmarks/cnn.py --quick          # 3 rounds of 3 steps (smoke run)
    python benchmarks/cnn.py --profile torch  # cProfile of retrograd's torch step
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")     # before NumPy loads its BLAS
os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import retrograd as rg  # noqa: E402

BATCH, CLASSES, LR, MOMENTUM = 64, 10, 0.01, 0.9
BACKENDS = ["torch", "onnxruntime", "numpy"]


def batches(count: int):
    r = np.random.default_rng(0)
    return [{"x": r.standard_normal((BATCH, 1, 28, 28)).astype("float32"),
             "y": r.integers(0, CLASSES, BATCH).astype("int64")} for _ in range(count)]


def build():
    """(main, startup, loss, parameter names in PyTorch's order)."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 1, 28, 28])
        y = rg.data("y", [-1], dtype="int64")
        h = rg.max_pool2d(rg.layers.conv2d(x, 32, 3, padding=1, act="relu", name="c1"), 2)
        h = rg.max_pool2d(rg.layers.conv2d(h, 64, 3, padding=1, act="relu", name="c2"), 2)
        logits = rg.layers.fc(rg.reshape(h, [-1, 64 * 7 * 7]), CLASSES, name="fc")
        loss = rg.mean(rg.softmax_cross_entropy(logits, y))
        rg.optim.Momentum(LR, momentum=MOMENTUM).minimize(loss)
    return main, startup, loss, ["c1.w", "c1.b", "c2.w", "c2.b", "fc.w", "fc.b"]


def torch_model():
    import torch
    from torch import nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, CLASSES))


def torch_weights(model) -> list[np.ndarray]:
    """The PyTorch model's parameters in retrograd's layouts (fc.w is [in, out])."""
    out = [p.detach().numpy().copy() for p in model.parameters()]
    out[4] = np.ascontiguousarray(out[4].T)
    return out


def torch_stepper(model, data):
    import torch
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    feeds = [(torch.from_numpy(d["x"]), torch.from_numpy(d["y"])) for d in data]

    def step(i: int):
        x, y = feeds[i % len(feeds)]
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def retrograd_stepper(backend: str, weights, data):
    main, startup, loss, names = build()
    exe = rg.Executor(backend=backend, threads=1)
    exe.run(startup)
    for name, value in zip(names, weights):
        exe.scope.set(name, value)

    def step(i: int):
        return exe.run(main, feed=data[i % len(data)], fetch_list=[loss], return_numpy=False)[0]
    step.executor, step.program = exe, main
    return step


def steppers(data) -> dict:
    import torch
    torch.set_num_threads(1)
    model = torch_model()
    weights = torch_weights(model)
    out = {"PyTorch eager": torch_stepper(model, data)}
    for backend in BACKENDS:
        try:
            out[f"retrograd ({backend})"] = retrograd_stepper(backend, weights, data)
        except rg.BackendError as exc:
            print(f"skipping {backend}: {exc}", flush=True)
    return out


def check(steps: dict) -> None:
    """The first two steps' losses (same weights, same batches; the second after one momentum
    update) agree across every implementation."""
    losses = {}
    for name, step in steps.items():
        losses[name] = [float(np.asarray(rg.backends.to_numpy(v) if not hasattr(v, "item") else v.item()))
                        for v in (step(0), step(1))]
    expected = losses["PyTorch eager"]
    for name, values in losses.items():
        for value, want in zip(values, expected):
            assert abs(value - want) <= 1e-4 * max(1.0, abs(want)), (name, values, expected)
    print("losses of steps 1, 2: " + ", ".join(f"{n} {v[0]:.6f} {v[1]:.6f}" for n, v in losses.items()),
          flush=True)


def run(rounds: int, steps_per_round: int) -> dict[str, list[float]]:
    data = batches(4)
    steps = steppers(data)
    check(steps)
    for step in steps.values():      # warm up (allocator, oneDNN primitives, onnxruntime session)
        for i in range(2):
            step(i)
    rates: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            started = time.perf_counter()
            for i in range(steps_per_round):
                step(i)
            rates[name].append(steps_per_round / (time.perf_counter() - started))
    return rates


def report(rates: dict[str, list[float]], rounds: int, steps_per_round: int) -> None:
    print(f"CNN training step (batch {BATCH} of 1x28x28, SGD momentum), one thread, {rounds} rounds "
          f"of {steps_per_round} steps, load average {open('/proc/loadavg').read().split()[0]}")
    print("| implementation | median steps/s | x PyTorch eager |\n|---|---:|---:|")
    base = rates["PyTorch eager"]
    for name, values in rates.items():
        ratio = statistics.median(v / b for v, b in zip(values, base))
        print(f"| {name} | {statistics.median(values):.1f} | {ratio:.2f}x |")


def profile(backend: str, count: int) -> None:
    import cProfile
    import pstats
    import torch
    torch.set_num_threads(1)
    data = batches(4)
    step = retrograd_stepper(backend, torch_weights(torch_model()), data)
    for i in range(3):
        step(i)
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(count):
        step(i)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=10, help="steps per round")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 3 steps")
    parser.add_argument("--profile", metavar="BACKEND", help="cProfile retrograd's step on BACKEND instead")
    args = parser.parse_args()
    if args.profile:
        profile(args.profile, args.steps)
    else:
        rounds, per = (3, 3) if args.quick else (args.rounds, args.steps)
        report(run(rounds, per), rounds, per)
