"""LSTM forward + backward: retrograd ``layers.lstm`` vs hand-written NumPy vs PyTorch, on CPU.

Every implementation computes the same thing from the same float32 weights:
the loss ``sum(h_all)`` of a one-layer LSTM over ``x [T, N, D]`` (D = H) and
the gradients of the input and of every parameter. Before timing, the
benchmark checks that all of them agree on those gradients.

* ``retrograd``: ``layers.lstm`` + ``rg.gradients``, one compiled program;
  peak memory is ``exe.last_stats.peak_bytes``.
* ``numpy``: a hand-written LSTM with manual BPTT (no graph), written plainly:
  the input projection hoisted out of the loop (one GEMM), activations stored
  per step, the weight gradients computed as one GEMM each over all steps;
  peak memory from ``tracemalloc`` (NumPy reports its buffers to it). The
  target (retrograd within 1.25x) is measured against this one.
* ``numpy (tuned)``: the same, tuned further: one tanh call activates all
  gates, every temporary is written in place with ``out=`` (which kernels,
  written against the Array API, cannot do). Shown to say how far a
  determined hand-optimisation goes.
* ``torch.nn.LSTM`` and a hand-written ``torch`` cell loop (autograd); PyTorch
  does not report CPU peak memory, so that column says n/a.
* ``retrograd (onnxruntime)``: the same program run by
  ``rg.Executor(backend="onnxruntime")`` (exported to ONNX once, then one
  onnxruntime session run per call); its target is at most 1.0x
  ``torch.nn.LSTM`` (``x torch``), measured alternating with it run by run.
* ``jax (jit+scan)``: ``jax.jit(jax.value_and_grad(...))`` over ``lax.scan``,
  one XLA CPU thread.
* ``retrograd (torch|numpy|onnxruntime, fused)``: ``layers.lstm(..., fused=True)``, one
  ``LSTMSequence`` op (issue 22): oneDNN's RNN primitive on the torch CPU backend (what
  ``torch.nn.LSTM`` runs), one general kernel on NumPy, ONNX ``LSTM`` + Loops on onnxruntime.
  ``--vendor`` times only these, the NumPy executor, the onnxruntime engine, ``torch.nn.LSTM`` and
  JAX, all alternating in one group (ratios to ``torch.nn.LSTM``).

BLAS and PyTorch run one thread each unless ``OPENBLAS_NUM_THREADS`` is set:
the shapes of a recurrent step are small GEMMs, and on a machine shared with
other jobs a second BLAS thread waiting for a busy core makes timings
meaningless (it slowed every implementation here by 2-25x, unevenly).

Run::

    python benchmarks/rnn.py                    # all three configurations
    python benchmarks/rnn.py --quick            # a small configuration, for a smoke run
    python benchmarks/rnn.py --write            # also rewrite the "RNN" section of RESULTS.md
    python benchmarks/rnn.py --vendor --write   # issue 22's rows, its own section of RESULTS.md
    python benchmarks/rnn.py --vendor --clock cpu   # timed by the process's CPU time, not wall time
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Callable

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")     # before NumPy loads its BLAS
os.environ.setdefault("OMP_NUM_THREADS", os.environ["OPENBLAS_NUM_THREADS"])
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import retrograd as rg  # noqa: E402

CONFIGS = [(50, 64, 512), (50, 32, 128), (1000, 16, 256)]     # (T, N, H); D = H
TARGET_RATIO = 1.25          # retrograd / numpy at the two larger configurations
ENGINE_TARGET = 1.0          # retrograd (onnxruntime) / torch.nn.LSTM at every configuration
ENGINE = "retrograd (onnxruntime)"
RESULTS = Path(__file__).with_name("RESULTS.md")
# --clock cpu: the process's CPU time (every thread: XLA's too) instead of wall time, which on a
# machine shared with other jobs mostly measures waiting for a core.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
CLOCK = ["wall"]


# --- the shared problem ------------------------------------------------------------------

def make_problem(t: int, n: int, h: int, seed: int = 0) -> dict:
    r = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(h)

    def u(*shape):
        return r.uniform(-bound, bound, shape).astype(np.float32)

    return {"x": r.standard_normal((t, n, h)).astype(np.float32),
            "w_ih": u(h, 4 * h), "w_hh": u(h, 4 * h), "b": u(4 * h)}


GRAD_NAMES = ("x", "w_ih", "w_hh", "b")


# --- hand-written NumPy ------------------------------------------------------------------

def _sigmoid(a: np.ndarray) -> np.ndarray:
    out = np.tanh(a * 0.5)
    out *= 0.5
    out += 0.5
    return out


def numpy_lstm(x: np.ndarray, w_ih: np.ndarray, w_hh: np.ndarray, b: np.ndarray) -> tuple:
    """Loss sum(h_all) and its gradients (dx, dw_ih, dw_hh, db) by manual BPTT, written plainly:
    the input projection hoisted (one GEMM), activations and tanh(c) kept per step, each gate's
    gradient as one expression, the weight gradients as one GEMM each over all steps."""
    t_len, n, d = x.shape
    h = w_hh.shape[0]
    x2 = x.reshape(t_len * n, d)
    xw = (x2 @ w_ih + b).reshape(t_len, n, 4 * h)          # hoisted input projection
    hs = np.zeros((t_len + 1, n, h), np.float32)
    cs = np.zeros((t_len + 1, n, h), np.float32)
    acts = np.empty((t_len, n, 4 * h), np.float32)          # i, f, g, o after activation
    tanh_c = np.empty((t_len, n, h), np.float32)
    for t in range(t_len):
        gates = hs[t] @ w_hh
        gates += xw[t]
        a = acts[t]
        a[:, :2 * h] = _sigmoid(gates[:, :2 * h])
        a[:, 2 * h:3 * h] = np.tanh(gates[:, 2 * h:3 * h])
        a[:, 3 * h:] = _sigmoid(gates[:, 3 * h:])
        np.multiply(a[:, h:2 * h], cs[t], out=cs[t + 1])
        cs[t + 1] += a[:, :h] * a[:, 2 * h:3 * h]
        np.tanh(cs[t + 1], out=tanh_c[t])
        np.multiply(a[:, 3 * h:], tanh_c[t], out=hs[t + 1])
    loss = float(hs[1:].sum(dtype=np.float64))

    dgates = np.empty((t_len, n, 4 * h), np.float32)
    dh_next = np.zeros((n, h), np.float32)
    dc = np.zeros((n, h), np.float32)
    for t in reversed(range(t_len)):
        a = acts[t]
        i, f, g, o = a[:, :h], a[:, h:2 * h], a[:, 2 * h:3 * h], a[:, 3 * h:]
        dh = dh_next + 1.0                                    # d sum(h_all) / dh_t = 1
        tc = tanh_c[t]
        dc += dh * o * (1.0 - tc * tc)
        dg = dgates[t]
        dg[:, :h] = dc * g * i * (1.0 - i)
        dg[:, h:2 * h] = dc * cs[t] * f * (1.0 - f)
        dg[:, 2 * h:3 * h] = dc * i * (1.0 - g * g)
        dg[:, 3 * h:] = dh * tc * o * (1.0 - o)
        dc *= f
        dh_next = dg @ w_hh.T
    dg2 = dgates.reshape(t_len * n, 4 * h)
    dw_hh = hs[:-1].reshape(t_len * n, h).T @ dg2             # one GEMM over all steps
    dw_ih = x2.T @ dg2
    db = dg2.sum(axis=0)
    dx = (dg2 @ w_ih.T).reshape(t_len, n, d)
    return loss, (dx, dw_ih, dw_hh, db)


def _gate_vectors(h: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-column (scale, offset, tanh_cols) for gates | i | f | g | o |: sig(a) = 0.5 + 0.5 tanh(a/2),
    so one tanh call activates all four gates; the slope of an activation s is (1 - s)(s + tanh_cols)."""
    scale = np.full(4 * h, 0.5, np.float32)
    scale[2 * h:3 * h] = 1.0
    return scale, 1.0 - scale, 2.0 * scale - 1.0


def numpy_lstm_tuned(x: np.ndarray, w_ih: np.ndarray, w_hh: np.ndarray, b: np.ndarray) -> tuple:
    """``numpy_lstm`` written for speed: the input projection is one GEMM before the loop, all four
    gates are activated by one tanh call, the forward keeps the activations and
    tanh(c) per step, temporaries are written in place (``out=``), and the
    weight gradients are one GEMM each over all steps after the backward loop.
    """
    t_len, n, d = x.shape
    h = w_hh.shape[0]
    scale, offset, tanh_cols = _gate_vectors(h)
    x2 = x.reshape(t_len * n, d)
    xw = (x2 @ w_ih + b).reshape(t_len, n, 4 * h)          # hoisted input projection
    hs = np.zeros((t_len + 1, n, h), np.float32)
    cs = np.zeros((t_len + 1, n, h), np.float32)
    acts = np.empty((t_len, n, 4 * h), np.float32)          # i, f, g, o after activation
    tanh_c = np.empty((t_len, n, h), np.float32)
    for t in range(t_len):
        gates = hs[t] @ w_hh
        gates += xw[t]
        gates *= scale
        a = acts[t]
        np.tanh(gates, out=a)
        a *= scale
        a += offset
        np.multiply(a[:, h:2 * h], cs[t], out=cs[t + 1])
        cs[t + 1] += a[:, :h] * a[:, 2 * h:3 * h]
        np.tanh(cs[t + 1], out=tanh_c[t])
        np.multiply(a[:, 3 * h:], tanh_c[t], out=hs[t + 1])
    loss = float(hs[1:].sum(dtype=np.float64))

    dgates = np.empty((t_len, n, 4 * h), np.float32)
    dh = np.ones((n, h), np.float32)                          # d sum(h_all) / dh_T
    dc = np.zeros((n, h), np.float32)
    tmp = np.empty((n, h), np.float32)
    for t in reversed(range(t_len)):
        a = acts[t]
        tc = tanh_c[t]
        np.multiply(tc, tc, out=tmp)                          # dc += dh * o * (1 - tc^2)
        np.subtract(1.0, tmp, out=tmp)
        tmp *= a[:, 3 * h:]
        tmp *= dh
        dc += tmp
        dg = dgates[t]
        np.multiply(dc, a[:, 2 * h:3 * h], out=dg[:, :h])
        np.multiply(dc, cs[t], out=dg[:, h:2 * h])
        np.multiply(dc, a[:, :h], out=dg[:, 2 * h:3 * h])
        np.multiply(dh, tc, out=dg[:, 3 * h:])
        dg *= 1.0 - a                                         # times each activation's slope
        dg *= a + tanh_cols
        dc *= a[:, h:2 * h]
        dh = dg @ w_hh.T
        dh += 1.0
    dg2 = dgates.reshape(t_len * n, 4 * h)
    dw_hh = hs[:-1].reshape(t_len * n, h).T @ dg2             # one GEMM over all steps
    dw_ih = x2.T @ dg2
    db = dg2.sum(axis=0)
    dx = (dg2 @ w_ih.T).reshape(t_len, n, d)
    return loss, (dx, dw_ih, dw_hh, db)


def numpy_runner(problem: dict, lstm=numpy_lstm) -> tuple[Callable[[], tuple], Callable[[], int]]:
    def run():
        return lstm(problem["x"], problem["w_ih"], problem["w_hh"], problem["b"])

    def peak():
        gc.collect()
        tracemalloc.start()
        run()
        _, peak_bytes = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return peak_bytes
    return run, peak


# --- retrograd ---------------------------------------------------------------------------

def retrograd_runner(problem: dict, recompute=None, backend: str = "numpy",
                     fused: bool | None = None, compile: bool = False) -> tuple[Callable[[], tuple],
                                                                           Callable[[], int]]:
    main, startup = rg.Program(), rg.Program()
    t_len, n, d = problem["x"].shape
    h = problem["w_hh"].shape[0]
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, d], stop_gradient=False)
        h_all, _, _, _ = rg.layers.lstm(x, h, name="lstm", recompute=recompute, fused=fused)
        loss = rg.sum(h_all)
        params = [main.global_block().var(f"lstm.{k}") for k in ("w_ih", "w_hh", "b")]
        grads = rg.gradients(loss, [x] + params)
    exe = rg.Executor(backend=backend, compile=compile)
    exe.run(startup)
    for k in ("w_ih", "w_hh", "b"):
        exe.scope.set(f"lstm.{k}", problem[k])
    feed = {"x": problem["x"]}

    def run():
        loss_v, *grad_vs = exe.run(main, feed=feed, fetch_list=[loss] + grads)
        return float(loss_v), tuple(grad_vs)

    def peak():
        run()
        return exe.last_stats.peak_bytes
    return run, peak


def engine_runners(problem: dict) -> dict:
    """The retrograd program on the onnxruntime engine, when onnxruntime is installed."""
    try:
        runner = retrograd_runner(problem, backend="onnxruntime")
        runner[0]()                      # export + session build now, so a failure shows here
    except rg.BackendError as exc:
        print(f"skipping {ENGINE}: {exc}", flush=True)
        return {}
    return {ENGINE: runner}


# The rows of issue 22 ("vendor kernels"): `layers.lstm(fused=True)` builds one LSTMSequence op per
# layer and direction; on the torch CPU backend it runs oneDNN's RNN primitive (as torch.nn.LSTM does),
# elsewhere one general kernel (NumPy) or ONNX's LSTM forward + Loops backward (onnxruntime).
FUSED = {"retrograd (torch, fused)": "torch", "retrograd (numpy, fused)": "numpy",
         "retrograd (onnxruntime, fused)": "onnxruntime"}


def fused_runners(problem: dict) -> dict:
    """The ``fused=True`` program on each backend that is installed."""
    runners = {}
    for name, backend in FUSED.items():
        try:
            runner = retrograd_runner(problem, backend=backend, fused=True)
            runner[0]()
        except rg.BackendError as exc:
            print(f"skipping {name}: {exc}", flush=True)
            continue
        runners[name] = runner
    return runners


# --- JAX ---------------------------------------------------------------------------------

def jax_runners(problem: dict) -> dict:
    """``jit(value_and_grad)`` of the same LSTM written with ``lax.scan`` (one XLA CPU thread)."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return {}

    def loss_fn(x, w_ih, w_hh, b):
        t_len, n, d = x.shape
        h = w_hh.shape[0]
        xw = (x.reshape(t_len * n, d) @ w_ih + b).reshape(t_len, n, 4 * h)

        def step(carry, x_t):
            h_t, c_t = carry
            i, f, g, o = jnp.split(x_t + h_t @ w_hh, 4, axis=1)
            c_t = jax.nn.sigmoid(f) * c_t + jax.nn.sigmoid(i) * jnp.tanh(g)
            h_t = jax.nn.sigmoid(o) * jnp.tanh(c_t)
            return (h_t, c_t), h_t

        zeros = jnp.zeros((n, h), x.dtype)
        _, hs = jax.lax.scan(step, (zeros, zeros), xw)
        return hs.sum()

    grad_fn = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1, 2, 3)))
    args = [jnp.asarray(problem[k]) for k in GRAD_NAMES]

    def run():
        loss, grads = grad_fn(*args)
        return float(loss), tuple(np.asarray(g) for g in jax.block_until_ready(grads))
    return {"jax (jit+scan)": (run, None)}


# --- PyTorch -----------------------------------------------------------------------------

def torch_runners(problem: dict, compile: bool = False):
    """``torch.nn.LSTM`` and a hand-written cell loop (autograd); ``compile``: the module's forward
    through ``torch.compile`` (Dynamo does not trace ``nn.LSTM``: it runs eagerly inside it)."""
    try:
        import torch
    except ImportError:
        return {}
    torch.set_num_threads(int(os.environ["OPENBLAS_NUM_THREADS"]))
    h = problem["w_hh"].shape[0]
    t_len, n, d = problem["x"].shape
    w_ih = torch.tensor(problem["w_ih"], requires_grad=True)
    w_hh = torch.tensor(problem["w_hh"], requires_grad=True)
    b = torch.tensor(problem["b"], requires_grad=True)
    x = torch.tensor(problem["x"], requires_grad=True)
    module = torch.nn.LSTM(d, h)
    with torch.no_grad():
        module.weight_ih_l0.copy_(w_ih.T)
        module.weight_hh_l0.copy_(w_hh.T)
        module.bias_ih_l0.copy_(b)
        module.bias_hh_l0.zero_()
    module_params = [module.weight_ih_l0, module.weight_hh_l0, module.bias_ih_l0]
    forward = torch.compile(module) if compile else module

    def run_module():
        out, _ = forward(x)
        loss = out.sum()
        gx, gw_ih, gw_hh, gb = torch.autograd.grad(loss, [x] + module_params)
        return float(loss.detach()), (gx.numpy(), gw_ih.T.numpy(), gw_hh.T.numpy(), gb.numpy())

    def run_loop():
        xw = (x.reshape(t_len * n, d) @ w_ih + b).reshape(t_len, n, 4 * h)
        hs = []
        h_t = torch.zeros(n, h)
        c_t = torch.zeros(n, h)
        for x_t in xw.unbind(0):      # unbind: its backward stacks, no zero-filled [T, ...] per step
            gates = x_t + h_t @ w_hh
            i, f, g, o = gates.chunk(4, dim=1)
            c_t = torch.sigmoid(f) * c_t + torch.sigmoid(i) * torch.tanh(g)
            h_t = torch.sigmoid(o) * torch.tanh(c_t)
            hs.append(h_t)
        loss = torch.stack(hs).sum()
        grads = torch.autograd.grad(loss, [x, w_ih, w_hh, b])
        return float(loss.detach()), tuple(g.numpy() for g in grads)

    return {"torch.nn.LSTM": (run_module, None), "torch cell loop": (run_loop, None)}


# --- measuring ---------------------------------------------------------------------------

def interleaved_times(runs: dict[str, Callable[[], object]], repeats: int,
                      alternate: bool = False) -> dict[str, list[float]]:
    """Wall times of each run over ``repeats`` rounds; the runs are interleaved (one of each per
    round), so a change in the machine's load affects every implementation alike. With
    ``alternate`` every other round runs them in reverse order, so no implementation always
    runs right after the same other one (whose freed memory and cache state it inherits)."""
    for run in runs.values():
        run()                               # warm up: compile plans, fault in pages
    times: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(repeats):
        order = list(runs.items())
        for name, run in (order[::-1] if alternate and round_ % 2 else order):
            started = CLOCKS[CLOCK[0]]()
            run()
            times[name].append(CLOCKS[CLOCK[0]]() - started)
    return times


def check_agreement(results: dict[str, tuple], reference: str = "numpy") -> None:
    """Every implementation's gradients match the NumPy reference (float32 tolerances)."""
    ref_loss, ref_grads = results[reference]
    for name, (loss, grads) in results.items():
        if not np.isclose(loss, ref_loss, rtol=1e-4):
            raise SystemExit(f"{name}: loss {loss} differs from {reference}'s {ref_loss}")
        for gname, got, want in zip(GRAD_NAMES, grads, ref_grads):
            scale = float(np.abs(want).max()) or 1.0
            err = float(np.abs(np.asarray(got) - want).max()) / scale
            if err > 2e-3:
                raise SystemExit(f"{name}: gradient of {gname} differs from {reference}'s "
                                 f"(max error {err:.2e} of the largest entry)")


def bench_config(t_len: int, n: int, h: int, repeats: int, vendor: bool = False) -> list[dict]:
    problem = make_problem(t_len, n, h)
    if vendor:
        return bench_vendor(problem, repeats)
    torch_runs = torch_runners(problem)
    runners = {"retrograd": retrograd_runner(problem), "numpy": numpy_runner(problem),
               "numpy (tuned)": numpy_runner(problem, numpy_lstm_tuned), **engine_runners(problem),
               **jax_runners(problem), **torch_runs, **fused_runners(problem)}
    check_agreement({name: run() for name, (run, _) in runners.items()})
    # Groups alternate run by run: retrograd with the NumPy versions (the x numpy ratios), the
    # onnxruntime engine and JAX with torch.nn.LSTM (the x torch ratios), and the torch cell
    # loop alone: whichever implementation ran right after it was 40-50% slower here (the
    # memory that loop frees comes back cold), which would bias a comparison.
    ours = ("retrograd", "numpy", "numpy (tuned)")
    peers = ("torch.nn.LSTM", ENGINE, "jax (jit+scan)", *FUSED)
    groups = [list(ours), [name for name in peers if name in runners],
              [name for name in runners if name not in ours + peers]]
    times: dict[str, list[float]] = {}
    for group in groups:
        if group:
            times.update(interleaved_times({name: runners[name][0] for name in group}, repeats))
    rows = []
    for name, (_, peak) in runners.items():
        seconds = statistics.median(times[name])
        rows.append({"impl": name, "T": t_len, "N": n, "H": h, "seconds": seconds,
                     "vs_numpy": _ratio(times, name, "numpy", ours),
                     "vs_torch": _ratio(times, name, "torch.nn.LSTM", peers) if torch_runs else None,
                     "peak": peak() if peak is not None else None})
    return rows


VENDOR_ROWS = ("torch.nn.LSTM", "retrograd (torch, fused)", "retrograd (numpy, fused)", "retrograd",
               ENGINE, "retrograd (onnxruntime, fused)", "jax (jit+scan)")


def bench_vendor(problem: dict, repeats: int) -> list[dict]:
    """Issue 22's comparison: retrograd's engines (the fused LSTM on torch/NumPy/onnxruntime, the
    general program on the NumPy executor and the onnxruntime engine) beside torch.nn.LSTM and JAX,
    all alternating in one group; ``x torch`` is the median per-round ratio to torch.nn.LSTM. The
    hand-written NumPy LSTM is only the reference of the agreement check (not timed)."""
    t_len, n, _ = problem["x"].shape
    h = problem["w_hh"].shape[0]
    torch_runs = torch_runners(problem)
    if not torch_runs:
        raise SystemExit("--vendor compares with torch.nn.LSTM: install torch")
    candidates = {"torch.nn.LSTM": torch_runs["torch.nn.LSTM"], **fused_runners(problem),
                  "retrograd": retrograd_runner(problem), **engine_runners(problem), **jax_runners(problem)}
    runners = {name: candidates[name] for name in VENDOR_ROWS if name in candidates}
    check_agreement({"numpy": numpy_runner(problem)[0](),
                     **{name: run() for name, (run, _) in runners.items()}})
    times = interleaved_times({name: run for name, (run, _) in runners.items()}, repeats, alternate=True)
    group = tuple(runners)
    return [{"impl": name, "T": t_len, "N": n, "H": h, "seconds": statistics.median(times[name]),
             "vs_numpy": None, "vs_torch": _ratio(times, name, "torch.nn.LSTM", group),
             "peak": peak() if peak is not None else None}
            for name, (_, peak) in runners.items()]


# Issue 34's rows: retrograd's default engine (torch backend, the executor picks the fused LSTM where
# the backend's policy says so), compile=True, and the general program (fused=False) beside
# torch.nn.LSTM, torch.compile of it, and JAX.
ISSUE34_ROWS = ("torch.nn.LSTM", "`torch.compile`(nn.LSTM)", "retrograd (torch, default)",
                "retrograd (torch, compile=True)", "retrograd (torch, general)", "jax (jit+scan)")


def bench_issue34(problem: dict, repeats: int) -> list[dict]:
    """Issue 34's comparison, all rows alternating in one group; ``x torch`` and ``x jax`` are median
    per-round ratios (time over ``torch.nn.LSTM``'s / JAX's). The first run of each (compiles
    included) is reported as ``first s``."""
    t_len, n, _ = problem["x"].shape
    h = problem["w_hh"].shape[0]
    torch_runs = torch_runners(problem)
    if not torch_runs:
        raise SystemExit("--issue34 compares with torch.nn.LSTM: install torch")
    candidates = {"torch.nn.LSTM": torch_runs["torch.nn.LSTM"],
                  "`torch.compile`(nn.LSTM)": torch_runners(problem, compile=True)["torch.nn.LSTM"],
                  "retrograd (torch, default)": retrograd_runner(problem, backend="torch"),
                  "retrograd (torch, compile=True)": retrograd_runner(problem, backend="torch", compile=True),
                  "retrograd (torch, general)": retrograd_runner(problem, backend="torch", fused=False),
                  **jax_runners(problem)}
    runners = {name: candidates[name] for name in ISSUE34_ROWS if name in candidates}
    first = {}
    for name, (run, _) in runners.items():           # the first runs compile (timed apart)
        started = time.perf_counter()
        run()
        run()
        first[name] = time.perf_counter() - started
    check_agreement({"numpy": numpy_runner(problem)[0](),
                     **{name: run() for name, (run, _) in runners.items()}})
    times = interleaved_times({name: run for name, (run, _) in runners.items()}, repeats, alternate=True)
    group = tuple(runners)
    jax_name = "jax (jit+scan)" if "jax (jit+scan)" in runners else None
    return [{"impl": name, "T": t_len, "N": n, "H": h, "seconds": statistics.median(times[name]),
             "vs_numpy": None, "vs_torch": _ratio(times, name, "torch.nn.LSTM", group),
             "vs_jax": _ratio(times, name, jax_name, group) if jax_name else None, "first": first[name],
             "peak": None}
            for name in runners]


def issue34_markdown(rows: list[dict], command: str, info: dict, repeats: int, load: tuple[float, float]) -> str:
    lines = [f"Command: `{command}` ({CLOCK[0]} time, median of {repeats} alternating rounds after two "
             f"first runs)", "",
             f"Machine: {info['cpu']}, {info['cores']} cores, shared; PyTorch {info['torch']}; load average "
             f"{load[0]:.1f} before and {load[1]:.1f} after the run.", "",
             "| T | N | H | implementation | median ms | x nn.LSTM | x JAX | first 2 runs (s) |",
             "|--:|--:|--:|:--|--:|--:|--:|--:|"]
    for row in rows:
        lines.append(f"| {row['T']} | {row['N']} | {row['H']} | {row['impl']} | {row['seconds'] * 1e3:.1f} "
                     f"| {_x(row['vs_torch'])} | {_x(row['vs_jax'])} | {row['first']:.1f} |")
    return "\n".join(lines) + "\n"


def _ratio(times: dict[str, list[float]], name: str, reference: str, group: tuple) -> float:
    """Time of ``name`` over ``reference``'s: the median of per-round ratios where the two ran
    in the same rounds (steadier when the machine's load drifts), else a ratio of medians."""
    if name in group and reference in group:
        return statistics.median(a / b for a, b in zip(times[name], times[reference]))
    return statistics.median(times[name]) / statistics.median(times[reference])


# --- reporting -----------------------------------------------------------------------------

def machine() -> dict:
    model = platform.processor() or "unknown"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    try:
        import torch
        torch_version = f"{torch.__version__} ({torch.get_num_threads()} threads)"
    except ImportError:
        torch_version = "not installed"
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "torch": torch_version,
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default")}


def _x(ratio) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}"


def _mb(value) -> str:
    return "n/a" if value is None else f"{value / 2**20:.1f}"


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table
    table = Table(title="LSTM forward + backward (float32, CPU): median time and peak memory")
    for col in ("T", "N", "H", "implementation", "median ms", "x numpy", "x torch", "peak MB"):
        table.add_column(col, justify="left" if col == "implementation" else "right")
    for row in rows:
        table.add_row(str(row["T"]), str(row["N"]), str(row["H"]), row["impl"],
                      f"{row['seconds'] * 1e3:.1f}", _x(row["vs_numpy"]), _x(row["vs_torch"]),
                      _mb(row["peak"]))
    Console().print(table)


def markdown(rows: list[dict], command: str, info: dict, repeats: int, load: tuple[float, float]) -> str:
    lines = [
        "## RNN",
        "",
        "LSTM forward + backward (loss `sum(h_all)`, gradients of x and every parameter), float32, "
        "CPU, D = H. `retrograd` is `layers.lstm` + `rg.gradients`; `numpy` is a hand-written LSTM "
        "with manual BPTT, written plainly (input projection hoisted, activations kept per step, "
        "weight gradients as one GEMM over all steps); `numpy (tuned)` also activates all gates "
        "with one tanh call and writes every temporary in place (`out=`); "
        "PyTorch does not report CPU peak memory (n/a). All implementations are checked to agree on "
        f"the gradients before timing; times are the median of {repeats} runs after a warm-up, "
        "retrograd and the two NumPy versions alternating run by run, then the two PyTorch versions "
        "alternating; for those three, `x numpy` is the median of the per-round ratios to the numpy "
        "run next to it. `retrograd (onnxruntime)` is the same program on "
        "`rg.Executor(backend=\"onnxruntime\")`; it, `jax (jit+scan)` and `torch.nn.LSTM` alternate "
        "in a second group and `x torch` is their median per-round ratio to `torch.nn.LSTM` "
        "(one thread each: OMP/OpenBLAS 1, onnxruntime intra_op_num_threads=1, XLA without its "
        "Eigen thread pool).",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {info['cpu']}, {info['cores']} cores; Python {info['python']}, NumPy {info['numpy']}, "
        f"PyTorch {info['torch']}; OPENBLAS_NUM_THREADS={info['blas_threads']}; load average "
        f"{load[0]:.1f} before and {load[1]:.1f} after the run (other jobs were sharing the machine: "
        "compare the implementations within one table, not across tables).",
        "",
        "| T | N | H | implementation | median ms | x numpy | x torch | peak MB |",
        "|--:|--:|--:|:--|--:|--:|--:|--:|",
    ]
    for row in rows:
        lines.append(f"| {row['T']} | {row['N']} | {row['H']} | {row['impl']} | {row['seconds'] * 1e3:.1f} "
                     f"| {row['vs_numpy']:.2f} | {_x(row['vs_torch'])} | {_mb(row['peak'])} |")
    lines += ["", "Reading it:", ""] + [f"* {note}" for note in reading_notes(rows)] + [""]
    return "\n".join(lines)


def reading_notes(rows: list[dict]) -> list[str]:
    """The target check and what the numbers depend on, for the RESULTS section."""
    targets = [r for r in rows if r["impl"] == "retrograd" and (r["T"], r["N"], r["H"]) in CONFIGS[::2]]
    ratios = ", ".join(f"{r['vs_numpy']:.2f}x at (T={r['T']}, N={r['N']}, H={r['H']})" for r in targets)
    met = targets and all(r["vs_numpy"] <= TARGET_RATIO for r in targets)
    tuned = {(r["T"], r["N"], r["H"]): r["vs_numpy"] for r in rows if r["impl"] == "numpy (tuned)"}
    versus_tuned = ", ".join(f"{r['vs_numpy'] / tuned[(r['T'], r['N'], r['H'])]:.2f}x" for r in targets
                             if (r["T"], r["N"], r["H"]) in tuned)
    engine = [r for r in rows if r["impl"] == ENGINE and r["vs_torch"] is not None]
    engine_ratios = ", ".join(f"{r['vs_torch']:.2f}x at (T={r['T']}, N={r['N']}, H={r['H']})"
                              for r in engine) or "not run"
    engine_met = engine and all(r["vs_torch"] <= ENGINE_TARGET for r in engine)
    return [
        f"**Engine target** ({ENGINE} at most {ENGINE_TARGET}x `torch.nn.LSTM` at every "
        f"configuration): {'met' if engine_met else 'missed'} — {engine_ratios}.",
        f"**Target** (retrograd at most {TARGET_RATIO}x hand-written NumPy at the two larger "
        f"configurations): {'met' if met else 'missed'} — {ratios}. Against the tuned NumPy "
        f"version: {versus_tuned}.",
        "What retrograd runs: the input projection as one GEMM before the loop (`SeqLinear`, bias "
        "added in place); per step `MatMul` + the fused `LSTMUnit` (which adds `h @ w_hh` itself) "
        "forward and `LSTMUnitGrad` + `MatMul` backward (the gate activations are kept from the forward, not recomputed); "
        "`w_hh`'s gradient batched over time by the RecurrentNetwork op as one GEMM; the backward "
        "step's `dgates @ w_hh.T` as `(w_hh @ dgates.T).T` (OpenBLAS is slow with a transposed "
        "right operand when the left one has few rows; the hand-written versions keep `@ w_hh.T`). "
        "The remaining gap to NumPy is the executor's per-op dispatch, the op's per-step copies "
        "into its [T, ...] buffers, and kernels that allocate their results where tuned NumPy "
        "writes in place; it shows most at small sizes (T=50, N=32, H=128), where arithmetic is cheap.",
        "Peak memory: retrograd keeps per step the gate activations [N, 4H] and the states in one "
        "(T+1)-long tensor each; the NumPy reference also keeps tanh(c), hence its slightly larger peak.",
        "Noise: on this shared 2-core VM, repeated runs vary by about +-15%. First touches of "
        "freshly mapped memory are expensive (every implementation allocates several [T, N, 4H] "
        "buffers per run); the first `rg.Executor` tunes glibc's malloc to keep freed memory for "
        "the whole process (`retrograd/runtime/malloc.py`), so the NumPy and PyTorch versions here "
        "run with it too. With two BLAS threads, small per-step GEMMs waiting for a busy core made "
        "timings 2-25x slower and erratic, hence one thread.",
    ]


VENDOR_SECTION = "LSTM with vendor kernels (issue 22)"


def vendor_markdown(rows: list[dict], command: str, info: dict, repeats: int,
                    load: tuple[float, float]) -> str:
    lines = [
        f"## {VENDOR_SECTION}",
        "",
        "LSTM forward + backward (loss `sum(h_all)`, gradients of x and every parameter), float32, "
        "CPU, D = H, one thread each (`torch.set_num_threads(1)`, OMP/OpenBLAS 1, onnxruntime "
        "intra_op_num_threads=1, XLA without its Eigen thread pool). `fused` rows build "
        "`rg.layers.lstm(..., fused=True)`: one `LSTMSequence` op and its gradient op, run by oneDNN's "
        "RNN primitive on the torch CPU backend (`aten::mkldnn_rnn_layer` + `_backward`, what "
        "`torch.nn.LSTM` runs), by one general kernel on NumPy, as ONNX `LSTM` + Loops on "
        "onnxruntime; `retrograd` and `retrograd (onnxruntime)` are the general program "
        "(`RecurrentNetwork` with `LSTMUnit` steps). All rows are checked to agree on the gradients "
        "(with a hand-written NumPy LSTM) and then alternate run by run, in reverse order every other "
        f"round; times ({'CPU time of the process' if CLOCK[0] == 'cpu' else 'wall time'}) are medians of "
        f"{repeats} rounds after a warm-up, `x torch` the median per-round "
        "ratio to `torch.nn.LSTM`; peak MB is "
        "`exe.last_stats.peak_bytes` (PyTorch and JAX do not report it: n/a).",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {info['cpu']}, {info['cores']} cores, shared with other jobs; Python {info['python']}, "
        f"NumPy {info['numpy']}, PyTorch {info['torch']}; load average {load[0]:.1f} before and "
        f"{load[1]:.1f} after the run.",
        "",
        "| T | N | H | implementation | median ms | x torch | peak MB |",
        "|--:|--:|--:|:--|--:|--:|--:|",
    ]
    for row in rows:
        lines.append(f"| {row['T']} | {row['N']} | {row['H']} | {row['impl']} | {row['seconds'] * 1e3:.1f} "
                     f"| {_x(row['vs_torch'])} | {_mb(row['peak'])} |")
    return "\n".join(lines) + "\n"


def write_section(text: str, title: str = "RNN") -> None:
    """Replace (or append) the '## <title>' section of RESULTS.md, leaving other sections alone."""
    old = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\n"
    start = old.find(f"## {title}\n")
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        end = old.find("\n## ", start + 1)
        new = old[:start] + text + ("" if end < 0 else "\n" + old[end + 1:])
    RESULTS.write_text(new)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one small configuration (smoke run)")
    parser.add_argument("--write", action="store_true", help="rewrite the RNN section of RESULTS.md")
    parser.add_argument("--config", action="append", metavar="T,N,H",
                        help="run only this configuration (repeatable)")
    parser.add_argument("--vendor", action="store_true",
                        help="issue 22's rows only (fused LSTM on every backend, the NumPy executor, "
                             "the onnxruntime engine, torch.nn.LSTM, JAX), alternating in one group; "
                             "with --write, the 'LSTM with vendor kernels (issue 22)' section")
    parser.add_argument("--issue34", action="store_true",
                        help="issue 34's rows (retrograd default / compile=True / general on torch, "
                             "nn.LSTM, torch.compile, JAX), printed as a Markdown table")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="what a run's time is: wall time (default) or the process's CPU time")
    args = parser.parse_args(argv)
    CLOCK[0] = args.clock
    configs = [(10, 4, 32)] if args.quick else CONFIGS
    if args.config:
        configs = [tuple(int(v) for v in c.split(",")) for c in args.config]
    load_before = os.getloadavg()[0]
    rows = []
    for t_len, n, h in configs:
        if args.issue34:
            rows.extend(bench_issue34(make_problem(t_len, n, h), args.repeats))
        else:
            rows.extend(bench_config(t_len, n, h, args.repeats, vendor=args.vendor))
        print(f"done T={t_len} N={n} H={h}", flush=True)
    load = (load_before, os.getloadavg()[0])
    if args.issue34:
        command = "python benchmarks/rnn.py " + " ".join(argv if argv is not None else sys.argv[1:])
        print(issue34_markdown(rows, command.strip(), machine(), args.repeats, load))
        return rows
    print_table(rows)
    info = machine()
    print(f"{info['cpu']}, {info['cores']} cores; numpy {info['numpy']}; torch {info['torch']}")
    if args.write:
        command = "python benchmarks/rnn.py " + " ".join(a for a in (argv if argv is not None else sys.argv[1:]))
        if args.vendor:
            write_section(vendor_markdown(rows, command.strip(), info, args.repeats, load), VENDOR_SECTION)
        else:
            write_section(markdown(rows, command.strip(), info, args.repeats, load))
        print(f"wrote the {VENDOR_SECTION if args.vendor else 'RNN'} section of {RESULTS}")
    return rows


if __name__ == "__main__":
    main()
