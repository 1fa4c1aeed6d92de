"""retrograd's memory budget against PyTorch's ``torch.compile`` with
``torch._functorch.config.activation_memory_budget``: two measured Pareto fronts (peak memory
against step time) for the same models, each point in a fresh process.

Models (float32, one thread on both sides, the training step's forward and backward with the
gradients of every parameter; no optimizer update):

* ``tfm``: the transformer LM of ``retrograd train --model transformer`` (``models/charlm.build_net``:
  token + learned position embeddings, pre-norm GPT-2 blocks, a final layer norm and the output
  layer, mean cross-entropy), 4 blocks, D=256, 4 heads, context T=256, batch 16, V=96;
  ``--small``: 2 blocks, D=128, T=128, batch 8.
* ``lstm``: the LSTM LM of ``retrograd train`` (``models/charlm.build_net``: embedding 64, one
  ``layers.lstm`` of 128, the output layer over every step), T=128, batch 32, V=96
  (``--small``: T=64, batch 16). The torch model writes the same cell as a loop over time
  steps (``torch.compile`` unrolls it; ``torch.nn.LSTM`` would run as one opaque oneDNN call
  that no partitioner can rematerialise into).

The budget axis is a fraction ``f`` of store-all's *activation* memory, as torch's knob is:
torch gets ``activation_memory_budget = f``; retrograd gets ``memory_budget = P - (1 - f) * K``
bytes, with ``P`` store-all's planned peak and ``K`` the bytes store-all keeps from the forward
for the backward (``rg.memory.report(...).kept_bytes``). Fractions run from the least the
planner can fit (the ``ProgramError``'s least budget, turned into a fraction) to 1.

Peak memory, measured the same way on both sides: each point runs in a fresh process with
glibc's malloc told to return freed memory to the system (``MALLOC_MMAP_THRESHOLD_=65536``,
``MALLOC_TRIM_THRESHOLD_=65536``: every array above 64 KiB is its own mapping, unmapped when
freed; retrograd's own malloc tuning then stands aside); after two warm-up steps (compilation,
first-touch) the resident set ``VmRSS`` is the steady state (the model, its inputs, the
compiled code); ``/proc/self/clear_refs`` is written ``5`` (resets ``VmHWM``), one step runs,
and ``VmHWM - steady`` is the step's peak above it. retrograd's own ``last_stats.peak_bytes``
is printed beside it. Then malloc is switched to keep freed memory (as retrograd's executor
does by default: no page faults per step, for both sides) and the step time is the least CPU
time of ``--steps`` steps (one thread each side; CPU time, not wall clock: this machine's two
cores are shared, wall clock there measures the other jobs).

    PYTHONPATH=. python benchmarks/memory_vs_torch.py --small            # ~10 minutes here
    PYTHONPATH=. python benchmarks/memory_vs_torch.py --models tfm       # the issue's size
    PYTHONPATH=. python benchmarks/memory_vs_torch.py --small --out benchmarks/results/memory_vs_torch_small

    PYTHONPATH=. python benchmarks/memory_vs_torch.py --planning 1000    # planning time, 10,007 ops
    PYTHONPATH=. python benchmarks/memory_vs_torch.py --planning 100,200,500,1000   # 1k, 2k, 5k, 10k ops
    PYTHONPATH=. python benchmarks/memory_vs_torch.py --models lstm --small --ab 0.86,0.5,0.25 --steps 25
                                              # recompute policies before/after, timed in turns
    PYTHONPATH=. python benchmarks/memory_vs_torch.py --models lstm --ab 0.86,0.5,0.25 --steps 25 --policy cheap_first,tape_first

    PYTHONPATH=. python benchmarks/memory_vs_torch.py --models tfm --sides torch --fractions 1.0,0.5,0.25 > torch.log
    PYTHONPATH=. python benchmarks/memory_vs_torch.py --from-log rg.log torch.log --out PREFIX
                                              # one side at given fractions, merged with another run's

``--out PREFIX`` writes PREFIX.md (the table, command, machine, load) and PREFIX.png (the plot).
``--worker`` is internal: one point, printed as one JSON line.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # this checkout's retrograd

VOCAB = 96


@dataclass(frozen=True)
class Size:
    layers: int
    hidden: int
    seq: int
    batch: int
    heads: int = 4
    embed: int = 64


SIZES = {
    ("tfm", False): Size(layers=4, hidden=256, seq=256, batch=16),
    ("tfm", True): Size(layers=2, hidden=128, seq=128, batch=8),
    ("lstm", False): Size(layers=1, hidden=128, seq=128, batch=32),
    ("lstm", True): Size(layers=1, hidden=128, seq=64, batch=16),
}
ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1",
       "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# --- measuring, the same for both sides ----------------------------------------------------------

def _status(key: str) -> int:
    """``key`` of /proc/self/status in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def _reset_hwm() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def _keep_freed_memory() -> None:
    """glibc's malloc keeps freed memory from here on (retrograd's executor default; no page faults)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt(-3, 32 << 20)      # M_MMAP_THRESHOLD
    libc.mallopt(-1, 512 << 20)     # M_TRIM_THRESHOLD


def measure(step, steps: int) -> dict:
    """Peak resident memory of one ``step()`` above the steady state after two, then its time."""
    step()
    step()
    gc.collect()
    steady = _status("VmRSS")
    _reset_hwm()
    step()
    peak = _status("VmHWM") - steady
    _keep_freed_memory()
    step()
    times, walls = [], []
    for _ in range(steps):
        cpu, wall = time.process_time(), time.perf_counter()
        step()
        times.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return {"steady_mb": steady / 1e6, "peak_mb": peak / 1e6, "time_s": min(times), "wall_s": min(walls),
            "times": times}


# --- retrograd -----------------------------------------------------------------------------------

def rg_program(model: str, size: Size, budget: int | None, policy: str | None = None):
    """The training step's program (forward, loss, backward) of ``retrograd train --model model``,
    built under the recompute policy ``policy`` (``rg.memory.policies``; None: the default)."""
    import retrograd as rg
    from retrograd.models.charlm import ModelConfig, build_net
    cfg = ModelConfig(model="transformer" if model == "tfm" else "lstm", hidden=size.hidden,
                      layers=size.layers, embed=size.embed, heads=size.heads)
    main, startup = rg.Program(random_seed=0), rg.Program(random_seed=0)
    with rg.memory.policies.policy(policy or rg.memory.policies.DEFAULT), rg.program_guard(main, startup):
        net = build_net(cfg, size.seq, with_states=False)
        targets = rg.data("next_chars", [size.seq, -1], dtype="int64")
        loss = rg.mean(rg.softmax_cross_entropy(net.logits, rg.reshape(targets, [-1])))
        shapes = {"chars": (size.seq, size.batch), "next_chars": (size.seq, size.batch)}
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes=shapes if budget is not None else None)
    return main, startup, [loss] + [g for _, g in pairs], shapes


def rg_store_all(model: str, size: Size) -> dict:
    """Store-all's planned peak ``P``, kept activations ``K`` and the least budget the planner names."""
    import re
    import retrograd as rg
    from retrograd.memory.peak import planned_peak
    main, _, fetch, shapes = rg_program(model, size, None)
    kept = rg.memory.report(main, feed_shapes=shapes).kept_bytes
    peak = planned_peak(main.global_block(), [v.name for v in fetch], shapes)
    try:
        rg_program(model, size, 1)
        least = 1
    except rg.ProgramError as exc:
        least = int(re.search(r"the least budget that fits is (\d+) bytes", str(exc)).group(1))
    return {"planned": peak, "kept": kept, "least": least, "least_fraction": 1 - (peak - least) / kept}


RG_BACKEND = "numpy"      # retrograd's side runs on this backend (--rg-backend)


def rg_worker(model: str, size: Size, fraction: float, steps: int, policy: str | None = None) -> dict:
    import retrograd as rg
    base = rg_store_all(model, size)
    budget = None if fraction >= 1 else int(base["planned"] - (1 - fraction) * base["kept"])
    started = time.perf_counter()
    main, startup, fetch, shapes = rg_program(model, size, budget, policy)
    plan_s = time.perf_counter() - started
    exe = rg.Executor(backend=RG_BACKEND, threads=1)
    exe.run(startup)
    rng = np.random.RandomState(0)
    feed = {"chars": rng.randint(0, VOCAB, shapes["chars"]), "next_chars": rng.randint(0, VOCAB, shapes["chars"])}
    losses = []

    def step():
        out = exe.run(main, feed=feed, fetch_list=fetch)
        losses.append(float(out[0]))
        del out

    result = measure(step, steps)
    plan = getattr(main, "memory_plan", None)
    result.update(budget=budget, executor_peak_mb=exe.last_stats.peak_bytes / 1e6, loss=losses[0], plan_s=plan_s,
                  planned_mb=None if plan is None else plan.planned_peak / 1e6,
                  micro_batches=getattr(plan, "micro_batches", 1), store_all_planned_mb=base["planned"] / 1e6,
                  kept_mb=base["kept"] / 1e6)
    return result


# --- torch ---------------------------------------------------------------------------------------

def torch_model(model: str, size: Size):
    """The same model in torch: the same layout, shapes and parameter count."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            n, t, d = x.shape
            h = self.ln1(x)
            q, k, v = (p(h).view(n, t, self.heads, d // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(n, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, size.hidden)
            self.pos = nn.Embedding(size.seq, size.hidden)
            self.blocks = nn.ModuleList(Block(size.hidden, size.heads) for _ in range(size.layers))
            self.ln_f = nn.LayerNorm(size.hidden)
            self.out = nn.Linear(size.hidden, VOCAB)

        def forward(self, ids, targets):           # ids, targets [T, N], time-major as charlm's
            x = self.embed(ids.t()) + self.pos.weight[: ids.shape[0]]
            for block in self.blocks:
                x = block(x)
            logits = self.out(self.ln_f(x))                           # [N, T, V]
            return F.cross_entropy(logits.reshape(-1, VOCAB), targets.t().reshape(-1))

    class LSTM(nn.Module):
        def __init__(self):
            super().__init__()
            h = size.hidden
            self.embed = nn.Embedding(VOCAB, size.embed)
            self.w_ih = nn.Parameter(torch.randn(size.embed, 4 * h) * 0.1)
            self.w_hh = nn.Parameter(torch.randn(h, 4 * h) * 0.1)
            self.b = nn.Parameter(torch.zeros(4 * h))
            self.out = nn.Linear(h, VOCAB)

        def forward(self, ids, targets):           # the cell of rg.layers.lstm: gates i, f, g, o
            x = self.embed(ids) @ self.w_ih + self.b                   # [T, N, 4H]: hoisted, as retrograd
            n, hidden = ids.shape[1], self.w_hh.shape[0]
            h = c = x.new_zeros(n, hidden)
            hs = []
            for t in range(ids.shape[0]):
                i, f, g, o = (x[t] + h @ self.w_hh).chunk(4, dim=1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                hs.append(h)
            logits = self.out(torch.stack(hs))                          # [T, N, V]
            return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    torch.manual_seed(0)
    return Transformer() if model == "tfm" else LSTM()


def torch_worker(model: str, size: Size, fraction: float, steps: int, backend: str) -> dict:
    import torch
    import torch._functorch.config as functorch_config
    torch.set_num_threads(1)
    functorch_config.activation_memory_budget = float(fraction)
    net = torch_model(model, size)
    compiled = torch.compile(net, backend=backend)
    rng = np.random.RandomState(0)
    ids = torch.from_numpy(rng.randint(0, VOCAB, (size.seq, size.batch)))
    targets = torch.from_numpy(rng.randint(0, VOCAB, (size.seq, size.batch)))
    losses = []

    def step():
        net.zero_grad(set_to_none=True)          # gradients are made (and counted) by every step
        loss = compiled(ids, targets)
        loss.backward()
        losses.append(float(loss.detach()))

    started = time.perf_counter()
    step()
    compile_s = time.perf_counter() - started
    result = measure(step, steps)
    result.update(loss=losses[0], compile_s=compile_s)
    return result


# --- planning time ------------------------------------------------------------------------------

def planning_time(layers: int, fraction: float = 0.5, rows: int = 1024, width: int = 64) -> str:
    """CPU time of ``rg.memory.report`` and of the budgeted ``append_backward`` on a deep MLP
    (``layers`` tanh ``fc`` layers: 10 * layers + 7 ops with the backward), the budget at
    ``fraction`` of store-all's activations."""
    import retrograd as rg
    from retrograd.memory.peak import planned_peak
    shapes = {"x": (rows, width)}

    def build(budget):
        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            h = rg.data("x", [-1, width])
            for i in range(layers):
                h = rg.layers.fc(h, width, act="tanh", name=f"fc{i}")
            loss = rg.mean(h * h)
            pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes=shapes if budget else None)
        return main, [loss] + [g for _, g in pairs]

    started = time.process_time()
    main, fetch = build(None)
    store_all_s = time.process_time() - started
    started = time.process_time()
    kept = rg.memory.report(main, feed_shapes=shapes).kept_bytes
    report_s = time.process_time() - started
    budget = int(planned_peak(main.global_block(), [v.name for v in fetch], shapes) - (1 - fraction) * kept)
    started = time.process_time()
    budgeted, _ = build(budget)
    budget_s = time.process_time() - started
    return (f"| MLP, {layers} layers | {len(main.global_block().ops):,} | {len(budgeted.global_block().ops):,} | "
            f"{store_all_s:.2f} s | {report_s:.2f} s | {budget_s:.2f} s | {budget_s - store_all_s:.2f} s |")


# --- policies, before/after in one process -------------------------------------------------------

def policy_ab(model: str, small: bool, fractions: list[float], steps: int, policies: list[str]) -> list[str]:
    """retrograd's step under each recompute policy (``rg.memory.policies``) at each fraction, all
    built in this process and timed in turns (step CPU time, the least of ``steps`` each): on a
    shared machine the load then weighs on every policy alike, where separate processes (the
    sweep) see different loads. Returns markdown table rows."""
    import retrograd as rg
    size = SIZES[(model, small)]
    base = rg_store_all(model, size)
    runs = {}
    for f in sorted(set(fractions) | {1.0}, reverse=True):
        for policy in policies if f < 1 else policies[:1]:
            budget = None if f >= 1 else int(base["planned"] - (1 - f) * base["kept"])
            main, startup, fetch, shapes = rg_program(model, size, budget, policy)
            exe = rg.Executor(backend=RG_BACKEND, threads=1)
            exe.run(startup)
            rng = np.random.RandomState(0)
            feed = {"chars": rng.randint(0, VOCAB, shapes["chars"]), "next_chars": rng.randint(0, VOCAB, shapes["chars"])}
            exe.run(main, feed=feed, fetch_list=fetch)
            runs[(f, policy)] = (exe, main, feed, fetch, [])
    for _ in range(steps):
        for exe, main, feed, fetch, times in runs.values():
            started = time.process_time()
            exe.run(main, feed=feed, fetch_list=fetch)
            times.append(time.process_time() - started)
    store_all = min(runs[(1.0, policies[0])][4])
    rows = ["| f | policy | budget MB | executor peak MB | time ms | x store-all |", "|--:|---|--:|--:|--:|--:|"]
    for (f, policy), (exe, main, _, _, times) in runs.items():
        plan = getattr(main, "memory_plan", None)
        rows.append(f"| {f:.2f} | {'store all' if f >= 1 else policy} | {'' if plan is None else f'{plan.budget / 1e6:.2f}'} | "
                    f"{exe.last_stats.peak_bytes / 1e6:.2f} | {min(times) * 1e3:.1f} | {min(times) / store_all:.2f} |")
    return rows


# --- the sweep -----------------------------------------------------------------------------------

def run_point(side: str, model: str, small: bool, fraction: float, steps: int, backend: str,
              timeout: int, policy: str | None = None) -> dict:
    """One point in a fresh process (the environment of ``ENV``)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", side, "--models", model,
           "--fraction", repr(fraction), "--steps", str(steps), "--torch-backend", backend]
    cmd += ["--policy", policy] if policy else []
    cmd += ["--small"] if small else []
    cmd += ["--rg-backend", RG_BACKEND]
    env = dict(os.environ, **ENV, PYTHONPATH=str(ROOT))
    env.pop("RETROGRAD_MALLOC", None)
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout} s"}
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    if done.returncode or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1][:200]}
    return json.loads(lines[-1])


def fractions_for(least: float, count: int) -> list[float]:
    """``count`` fractions from ``least`` (rounded up to a percent) to 1, evenly spaced, the nearest
    ones moved onto 0.5 and 0.25 where those fit (the issue's targets)."""
    lo = min(max(np.ceil(least * 100) / 100, 0.01), 1.0)
    points = [float(f) for f in np.round(np.linspace(lo, 1.0, count), 2)]
    for target in (0.5, 0.25):
        inner = [i for i in range(1, count - 1)]
        if target >= lo and inner and target not in points:
            points[min(inner, key=lambda i: abs(points[i] - target))] = target
    return sorted(set(points))


def sweep(model: str, args) -> list[dict]:
    size = SIZES[(model, args.small)]
    base = rg_store_all(model, size)
    fracs = ([float(f) for f in args.fractions.split(",")] if args.fractions
             else fractions_for(base["least_fraction"], args.points))
    print(f"# {model} {size}: store-all planned {base['planned'] / 1e6:.1f} MB, kept {base['kept'] / 1e6:.1f} MB, "
          f"least budget {base['least'] / 1e6:.1f} MB = fraction {base['least_fraction']:.3f}; fractions {fracs}",
          flush=True)
    rows = []
    for f in sorted(fracs, reverse=True):
        for side in ("retrograd", "torch"):
            if side == "torch" and args.no_torch or side not in args.sides.split(","):
                continue
            r = run_point(side, model, args.small, f, args.steps, args.torch_backend, args.timeout, args.policy)
            r.update(side=side, model=model, fraction=f, size=str(size))
            rows.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "times"}), flush=True)
    return rows


def rows_from_logs(paths: list[str]) -> list[dict]:
    """The points printed by earlier sweeps (a later line of the same point wins, unless an error)."""
    points: dict = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.startswith("{") and '"side"' in line:
                r = json.loads(line)
                key = (r["model"], r["side"], r["fraction"])
                if key not in points or "error" not in r:
                    points[key] = r
    return list(points.values())


def table(rows: list[dict]) -> list[str]:
    """One markdown table: both sides per fraction, ratios to each side's own store-all (f = 1)."""
    base = {(r["model"], r["side"]): r for r in rows if r["fraction"] == 1.0 and "error" not in r}
    out = ["| model | f | rg budget MB | rg planned MB | rg executor peak MB | rg RSS peak MB | rg time s | "
           "rg x store-all | torch RSS peak MB | torch time s | torch x store-all |",
           "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for model in dict.fromkeys(r["model"] for r in rows):
        for f in sorted({r["fraction"] for r in rows if r["model"] == model}, reverse=True):
            cells = [model, f"{f:.2f}"]
            for side in ("retrograd", "torch"):
                r = next((r for r in rows if (r["model"], r["side"], r["fraction"]) == (model, side, f)), None)
                b = base.get((model, side))
                if r is None:
                    cells += [""] * (6 if side == "retrograd" else 3)
                    continue
                if "error" in r:
                    cells += ([r["error"][:60]] + [""] * 5) if side == "retrograd" else [r["error"][:60], "", ""]
                    continue
                ratio = "" if b is None else f"{r['time_s'] / b['time_s']:.2f}"
                if side == "retrograd":
                    cells += ["store all" if r["budget"] is None else f"{r['budget'] / 1e6:.1f}",
                              _mb(r.get("planned_mb")), f"{r['executor_peak_mb']:.1f}"]
                cells += [f"{r['peak_mb']:.1f}", f"{r['time_s']:.3f}", ratio]
            out.append("| " + " | ".join(cells) + " |")
    return out


def _mb(v) -> str:
    return "" if v is None else f"{v:.1f}"


def plot(rows: list[dict], path: Path) -> None:
    """Both fronts per model: measured peak above steady state (x) against step time (y)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        for side, mark in (("retrograd", "o-"), ("torch", "s--")):
            pts = sorted((r["peak_mb"], r["time_s"], r["fraction"]) for r in rows
                         if r["model"] == model and r["side"] == side and "error" not in r)
            if not pts:
                continue
            label = "retrograd memory_budget" if side == "retrograd" else "torch.compile activation_memory_budget"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], mark, label=label)
            for x, y, f in pts:
                ax.annotate(f"{f:.2f}", (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
        size = next(r["size"] for r in rows if r["model"] == model)
        ax.set_title(f"{model}: {size}", fontsize=8)
        ax.set_xlabel("peak resident memory above steady state, MB (VmHWM)")
        ax.set_ylabel("step CPU time, s (best of steps, 1 thread)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _machine() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="tfm,lstm", help="comma-separated: tfm, lstm")
    parser.add_argument("--small", action="store_true", help="the smaller sizes (see the module docstring)")
    parser.add_argument("--points", type=int, default=8, help="fractions from the least that fits to 1 (the nearest moved onto 0.5 and 0.25)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per point (the least CPU time is kept)")
    parser.add_argument("--torch-backend", default="inductor", help="torch.compile's backend (inductor; "
                        "aot_eager_decomp_partition partitions the same way without generating code)")
    parser.add_argument("--no-torch", action="store_true", help="retrograd's front only")
    parser.add_argument("--sides", default="retrograd,torch", help="comma-separated: retrograd, torch "
                        "(one side only, to be merged with the other's run by --from-log)")
    parser.add_argument("--fractions", default=None, help="comma-separated fractions instead of --points' "
                        "(another run's, to match its points)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per point")
    parser.add_argument("--out", default=None, help="write PREFIX.md, PREFIX.json and PREFIX.png")
    parser.add_argument("--from-log", nargs="+", default=None, help="make the table and plot from the "
                        "JSON lines of earlier runs' output (a later line of the same point wins, unless an error)")
    parser.add_argument("--planning", default=None, metavar="LAYERS",
                        help="instead of the sweep: planning time of a LAYERS-deep MLP (1000: 10,007 ops; "
                        "a comma-separated list: one row each)")
    parser.add_argument("--policy", default=None, help="retrograd's recompute policy (rg.memory.policies."
                        "POLICIES: cheap_first, the default; tape_first, keep_tail; checkpoints, the one before "
                        "issue 35's second round)")
    parser.add_argument("--ab", default=None, metavar="FRACTIONS", help="instead of the sweep: retrograd "
                        "under each --policy (comma-separated; default checkpoints,cheap_first) at these "
                        "fractions, in one process, timed in turns (one model: --models lstm)")
    parser.add_argument("--worker", choices=("retrograd", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--fraction", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument("--rg-backend", default="numpy", help="retrograd's backend (numpy: the default "
                        "executor; torch: the same ATen kernels as the torch side, eager)")
    args = parser.parse_args()
    global RG_BACKEND
    RG_BACKEND = args.rg_backend
    if args.worker:
        model = args.models
        size = SIZES[(model, args.small)]
        result = (rg_worker(model, size, args.fraction, args.steps, args.policy) if args.worker == "retrograd"
                  else torch_worker(model, size, args.fraction, args.steps, args.torch_backend))
        print(json.dumps(result), flush=True)
        return
    if args.ab:
        load0 = os.getloadavg()
        rows = policy_ab(args.models, args.small, [float(f) for f in args.ab.split(",")], args.steps,
                         (args.policy or "checkpoints,cheap_first").split(","))
        print("\n".join(rows))
        print(f"load average {load0[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
        return
    if args.planning:
        print("| program | ops | budgeted ops | store-all append_backward | rg.memory.report | budgeted append_backward "
              "| of which planning | load |")
        for layers in args.planning.split(","):
            print(planning_time(int(layers)), f"{os.getloadavg()[0]:.2f} |", flush=True)
        return
    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    for model in args.models.split(",") if args.from_log is None else []:
        rows += sweep(model, args)
    if args.from_log is not None:
        rows = rows_from_logs(args.from_log)
    load1 = os.getloadavg()
    import torch
    head = [f"command: PYTHONPATH=. python benchmarks/memory_vs_torch.py {' '.join(sys.argv[1:])}",
            f"machine: {_machine()}, {os.cpu_count()} cpus (shared), python {platform.python_version()}, "
            f"numpy {np.__version__}, torch {torch.__version__} (torch.compile backend {args.torch_backend}), "
            "one thread per side",
            f"date: {started}; load average at the start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
            f"at the end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}", ""]
    lines = head + table(rows)
    print("\n".join(lines))
    if args.out:
        prefix = Path(args.out)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        prefix.with_suffix(".md").write_text("\n".join(lines) + "\n")
        prefix.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
        plot(rows, prefix.with_suffix(".png"))


if __name__ == "__main__":
    main()
