"""Attention forward + backward: ``rg.scaled_dot_product_attention`` per backend vs PyTorch eager.

The same float32 q, k, v ``[8, 8, 256, 64]`` (batch, heads, length, features;
issue 19's size), the loss ``sum(out * w)`` and the gradients of q, k and v:

* ``retrograd (numpy|torch|onnxruntime)``: one program (the op, its fused
  gradient op) run by ``rg.Executor(backend=...)``; torch runs ATen's flash
  attention forward and backward.
* ``torch eager``: ``F.scaled_dot_product_attention`` + ``backward()`` (flash
  attention on CPU as well).

Each is checked against torch's gradients first, then timed alternately, the
median of ``--repeats`` runs. BLAS and torch use one thread each unless
``OPENBLAS_NUM_THREADS`` is set (a machine shared with other jobs).

Run::

    python benchmarks/attention.py                 # plain and causal
    python benchmarks/attention.py --repeats 3 --length 128
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import retrograd as rg  # noqa: E402

BACKENDS = ("numpy", "torch", "onnxruntime")


def build(shape, causal: bool):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        q, k, v = (rg.data(n, list(shape), stop_gradient=False) for n in "qkv")
        w = rg.data("w", list(shape))
        out = rg.scaled_dot_product_attention(q, k, v, causal=causal)
        grads = rg.gradients(rg.sum(out * w), [q, k, v])
    return main, grads


def retrograd_runner(backend: str, shape, causal: bool, feed: dict):
    main, grads = build(shape, causal)
    exe = rg.Executor(backend=backend)
    return lambda: exe.run(main, feed=feed, fetch_list=grads)


def torch_runner(causal: bool, feed: dict):
    q, k, v = (torch.tensor(feed[n], requires_grad=True) for n in "qkv")
    w = torch.tensor(feed["w"])

    def run():
        for t in (q, k, v):
            t.grad = None
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        (out * w).sum().backward()
        return [q.grad.numpy(), k.grad.numpy(), v.grad.numpy()]
    return run


def main(batch=8, heads=8, length=256, features=64, repeats=5):
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    shape = (batch, heads, length, features)
    r = np.random.default_rng(0)
    feed = {n: r.standard_normal(shape).astype(np.float32) for n in "qkvw"}
    print(f"attention fwd+bwd, float32 {list(shape)}, {torch.get_num_threads()} thread(s); "
          f"median of {repeats} runs (ms)")
    for causal in (False, True):
        runners = {"torch eager": torch_runner(causal, feed)}
        runners.update({f"retrograd ({b})": retrograd_runner(b, shape, causal, feed) for b in BACKENDS})
        want = runners["torch eager"]()
        for name, run in runners.items():
            for got, ref in zip(run(), want):             # also the warm-up run
                np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-4, err_msg=name)
        times = {name: [] for name in runners}
        for _ in range(repeats):
            for name, run in runners.items():
                started = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - started)
        base = statistics.median(times["torch eager"])
        print(f"\ncausal={causal}")
        for name, samples in times.items():
            median = statistics.median(samples)
            print(f"  {name:26s} {median * 1e3:8.1f}   {median / base:5.2f}x torch eager")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    main(args.batch, args.heads, args.length, args.features, args.repeats)
