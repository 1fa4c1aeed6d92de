"""Quickstart: a two-layer network fitted to a smooth function, by hand-written SGD.

Run it with ``python examples/quickstart.py`` (under a second). It shows the
whole define-then-run cycle (``retrograd train`` is the full training job):

1. define: data, parameters and ops go into ``main``; initialisers go into
   ``startup``; ``append_backward`` adds the gradient ops to ``main``;
2. run: the executor runs ``startup`` once, then ``main`` per step;
3. update: parameters live in ``exe.scope``; each step sets ``w - lr * dw``
   (the optimizers in ``rg.optim`` do this as ops inside the program).
"""
from __future__ import annotations

import numpy as np

import retrograd as rg


def build(hidden: int = 16):
    """The model and its loss, in fresh main/startup programs."""
    main, startup = rg.Program(random_seed=1), rg.Program(random_seed=1)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 2])
        y = rg.data("y", [-1, 1])
        w1 = rg.create_parameter("fc1.w", [2, hidden])
        b1 = rg.create_parameter("fc1.b", [hidden])
        w2 = rg.create_parameter("fc2.w", [hidden, 1])
        b2 = rg.create_parameter("fc2.b", [1])
        h = rg.tanh(rg.matmul(x, w1) + b1)
        pred = rg.matmul(h, w2) + b2
        loss = rg.mean(rg.square(pred - y))
        params_grads = rg.append_backward(loss)
    return main, startup, loss, params_grads


def make_data(n: int = 256, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, size=(n, 2)).astype("float32")
    y = (np.sin(2.0 * x[:, :1]) * x[:, 1:]).astype("float32")
    return x, y


def main(steps: int = 200, lr: float = 0.3) -> float:
    main_prog, startup, loss, params_grads = build()
    x, y = make_data()
    exe = rg.Executor()
    exe.run(startup)
    fetch = [loss] + [grad for _, grad in params_grads]
    for step in range(steps + 1):
        loss_v, *grads = exe.run(main_prog, feed={"x": x, "y": y}, fetch_list=fetch)
        if step % 50 == 0:
            print(f"step {step:4d}  loss {float(loss_v):.5f}")
        for (param, _), grad in zip(params_grads, grads):
            exe.scope.set(param.name, exe.scope.get(param.name) - lr * grad)
    print(f"peak bytes per step: {exe.last_stats.peak_bytes}, ops run: {exe.last_stats.ops_run}")
    return float(loss_v)


if __name__ == "__main__":
    main()
