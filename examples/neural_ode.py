"""A neural ODE trained by reverse mode through an adaptive-step Runge-Kutta solver, within a memory budget.

The model is ``dy/dt = f(y) = tanh(y @ w1 + b1) @ w2``, integrated from t=0 to
t=1 by the Bogacki-Shampine 3(2) pair with step-size control: each iteration
of a ``while_loop`` tries a step ``dt``, estimates its error from the
embedded 2nd-order solution, accepts the step when the error is below the
tolerance, and picks the next ``dt`` from the error. The number of iterations
is decided at run time by the error estimates, so the loop has no fixed trip
count; JAX's ``lax.while_loop`` cannot be reverse-differentiated for that
reason. Here ``append_backward`` differentiates the loop itself
("discretise, then optimise": exact gradients of the computed solution), and
``memory_budget=`` makes the backward keep loop states at checkpoints and
recompute the rest, within a byte budget for the whole training step.

The task: learn the flow that maps points on a circle to the same points
rotated by 90 degrees and scaled by 1.5.

    python examples/neural_ode.py                       # store-all vs a budget of 10% of its peak
    python examples/neural_ode.py --budget-fraction 0.05 --batch 4096
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import retrograd as rg

RTOL = 1e-7
ATOL = 1e-9


def dynamics(y, w1, b1, w2):
    return rg.tanh(y @ w1 + b1) @ w2


def solve(y0, params, t_end: float = 1.0, max_iters: int = 1000):
    """Integrate from 0 to ``t_end``; returns (y(t_end), iterations run)."""
    w1, b1, w2 = params
    f = lambda y: dynamics(y, w1, b1, w2)  # noqa: E731
    dtype = y0.dtype

    def cond(t, dt, y):
        return rg.sum(t) < t_end

    def body(t, dt, y):
        dt = rg.minimum(dt, t_end - t)               # do not step past the end
        k1 = f(y)
        k2 = f(y + k1 * (dt * 0.5))
        k3 = f(y + k2 * (dt * 0.75))
        y3 = y + (k1 * (2.0 / 9.0) + k2 * (1.0 / 3.0) + k3 * (4.0 / 9.0)) * dt
        k4 = f(y3)
        y2 = y + (k1 * (7.0 / 24.0) + k2 * 0.25 + k3 * (1.0 / 3.0) + k4 * 0.125) * dt
        scale = rg.abs(y) * RTOL + ATOL
        err = rg.sqrt(rg.mean(rg.square((y3 - y2) / scale)))
        err = rg.stop_gradient(err)                  # step-size control is not differentiated
        accept = err <= 1.0
        t_next = rg.where(accept, t + dt, t)
        y_next = rg.where(accept, y3, y)
        factor = rg.clip(0.9 * rg.pow(err + 1e-10, -1.0 / 3.0), 0.2, 5.0)
        return t_next, rg.stop_gradient(dt * factor), y_next

    t0 = rg.constant(np.zeros([1], dtype=dtype), dtype=dtype)
    dt0 = rg.constant(np.full([1], 0.1, dtype=dtype), dtype=dtype)
    _, _, y_end = rg.while_loop(cond, body, [t0, dt0, y0], max_iters=max_iters)
    return y_end


def build(batch: int, hidden: int, memory_budget: int | None = None, lr: float = 0.05,
          dtype: str = "float64"):
    """The training program: (main, startup, loss)."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        y0 = rg.data("y0", [-1, 2], dtype=dtype)
        target = rg.data("target", [-1, 2], dtype=dtype)
        w1 = rg.create_parameter("ode.w1", [2, hidden], dtype, init=("normal", 0.0, 0.5))
        b1 = rg.create_parameter("ode.b1", [hidden], dtype, init=0.0)
        w2 = rg.create_parameter("ode.w2", [hidden, 2], dtype, init=("normal", 0.0, 0.5 / np.sqrt(hidden)))
        y_end = solve(y0, (w1, b1, w2))
        loss = rg.mean(rg.square(y_end - target))
        rg.optim.Adam(lr).minimize(loss, memory_budget=memory_budget,
                                   feed_shapes={"y0": (batch, 2), "target": (batch, 2)})
    return main, startup, loss


def data(batch: int, seed: int = 0):
    angle = np.random.RandomState(seed).uniform(0, 2 * np.pi, batch)
    y0 = np.stack([np.cos(angle), np.sin(angle)], axis=1)
    target = 1.5 * np.stack([-np.sin(angle), np.cos(angle)], axis=1)
    return y0, target


def train(batch: int = 256, hidden: int = 32, steps: int = 50, memory_budget: int | None = None,
          seed: int = 0, log_every: int = 10):
    """Train; return (losses, peak bytes of the last step, seconds per step)."""
    main, startup, loss = build(batch, hidden, memory_budget)
    exe = rg.Executor()
    exe.run(startup)
    y0, target = data(batch, seed)
    losses = []
    started = time.perf_counter()
    for step in range(steps):
        value, = exe.run(main, feed={"y0": y0, "target": target}, fetch_list=[loss])
        losses.append(float(value))
        if log_every and step % log_every == 0:
            print(f"step {step:4d}  loss {losses[-1]:.5f}  peak {exe.last_stats.peak_bytes / 1e6:.2f} MB")
    per_step = (time.perf_counter() - started) / max(steps, 1)
    return losses, exe.last_stats.peak_bytes, per_step


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--budget-fraction", type=float, default=0.1,
                        help="memory budget as a fraction of the store-all peak")
    args = parser.parse_args(argv)
    print("store all:")
    losses, peak, per_step = train(args.batch, args.hidden, args.steps)
    budget = int(args.budget_fraction * peak)
    print(f"memory_budget={budget} bytes ({args.budget_fraction:.0%} of store-all's {peak} bytes):")
    b_losses, b_peak, b_per_step = train(args.batch, args.hidden, args.steps, memory_budget=budget)
    print(f"store all: peak {peak / 1e6:.2f} MB, {per_step * 1e3:.0f} ms/step, final loss {losses[-1]:.5f}")
    print(f"budgeted:  peak {b_peak / 1e6:.2f} MB (budget {budget / 1e6:.2f} MB), "
          f"{b_per_step * 1e3:.0f} ms/step ({b_per_step / per_step:.2f}x), final loss {b_losses[-1]:.5f}")


if __name__ == "__main__":
    main()
