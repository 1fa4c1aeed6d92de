"""Mixed precision: training steps per second in bfloat16 / float16 (``rg.amp.decorate``) against
float32, and against ``torch.autocast`` eager on the same model.

Model: an MLP ``x [B, D] -> fc(H) -> gelu -> fc(H) -> gelu -> fc(V)`` with
``softmax_cross_entropy`` and AdamW (B=256, D=512, H=1024, V=512), one training
step per run (forward, backward, update). Rows:

* retrograd on the torch backend and on NumPy: fp32, bf16, fp16 (the program
  ``rg.amp.decorate`` rewrote; fp16 with dynamic loss scaling);
* torch eager: fp32, and ``torch.autocast(dtype=bfloat16 / float16)`` with
  ``torch.amp.GradScaler`` for float16 (torch's own mixed precision).

Steps/s is the best of ``--rounds`` interleaved rounds of ``--steps`` steps,
one thread each (BLAS, torch intra-op). Writes ``benchmarks/results/amp.md``
with ``--write``.

    python benchmarks/amp.py --rounds 3 --steps 5 --write
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
from pathlib import Path

import numpy as np

import retrograd as rg

B, D, H, V = 256, 512, 1024, 512


def retrograd_step(backend: str, precision: str):
    main, startup = rg.Program(random_seed=0), rg.Program(random_seed=0)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, D])
        y = rg.data("y", [-1], "int64")
        h = rg.layers.fc(x, H, act="gelu", name="fc1")
        h = rg.layers.fc(h, H, act="gelu", name="fc2")
        loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(h, V, name="out"), y))
        opt = rg.optim.AdamW(1e-4)
        if precision != "fp32":
            opt = rg.amp.decorate(opt, dtype={"bf16": "bfloat16", "fp16": "float16"}[precision])
        opt.minimize(loss)
    exe = rg.Executor(backend=backend, threads=1)
    exe.run(startup)
    xb, yb = _batch()
    feed = {"x": xb, "y": yb}
    return lambda: exe.run(main, feed=feed)


def torch_step(precision: str):
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(D, H), torch.nn.GELU(), torch.nn.Linear(H, H),
                                torch.nn.GELU(), torch.nn.Linear(H, V))
    opt = torch.optim.AdamW(model.parameters(), 1e-4)
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None
    xb, yb = _batch()
    x, y = torch.from_numpy(xb), torch.from_numpy(yb)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    return step


def _cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.machine())


def _flags() -> str:
    try:
        words = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "unknown"
    found = [f for f in ("avx512_bf16", "amx_bf16", "avx512_fp16", "f16c") if f in words]
    return ", ".join(found) if found else "none of avx512_bf16, amx_bf16, avx512_fp16, f16c"


def _batch():
    rng = np.random.default_rng(0)
    return rng.standard_normal((B, D)).astype(np.float32), rng.integers(0, V, B)


def measure(rows: dict, rounds: int, steps: int) -> dict:
    for run in rows.values():
        run()                                   # compile / warm up
    best = {name: float("inf") for name in rows}
    for _ in range(rounds):
        for name, run in rows.items():
            started = time.perf_counter()
            for _ in range(steps):
                run()
            best[name] = min(best[name], (time.perf_counter() - started) / steps)
    return {name: 1.0 / t for name, t in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="write benchmarks/results/amp.md")
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    rows = {}
    for backend in ("torch", "numpy"):
        for precision in ("fp32", "bf16", "fp16"):
            rows[f"retrograd {backend} {precision}"] = retrograd_step(backend, precision)
    for precision in ("fp32", "bf16", "fp16"):
        name = "torch eager fp32" if precision == "fp32" else f"torch.autocast eager {precision}"
        rows[name] = torch_step(precision)
    load_before = os.getloadavg()
    rates = measure(rows, args.rounds, args.steps)
    load_after = os.getloadavg()
    table = _table(rates)
    print(table)
    if args.write:
        _write(table, args, load_before, load_after)


def _table(rates: dict) -> str:
    lines = ["| run | steps/s | vs its fp32 | vs torch.autocast eager (same dtype) |", "|---|---|---|---|"]
    for name, rate in rates.items():
        precision = name.rsplit(" ", 1)[-1]
        base = rates[name.rsplit(" ", 1)[0] + " fp32"] if not name.startswith("torch") else rates["torch eager fp32"]
        ref = rates.get(f"torch.autocast eager {precision}") if precision != "fp32" else rates["torch eager fp32"]
        lines.append(f"| {name} | {rate:.2f} | {rate / base:.2f}x | {rate / ref:.2f}x |")
    return "\n".join(lines)


def _write(table: str, args, load_before, load_after) -> None:
    import torch
    path = Path(__file__).parent / "results" / "amp.md"
    path.parent.mkdir(exist_ok=True)
    cpu = _cpu_name()
    path.write_text(f"""# Mixed precision (`rg.amp`): steps/s, bf16 / fp16 against fp32 and torch.autocast

Command: `python benchmarks/amp.py --rounds {args.rounds} --steps {args.steps} --write`
Model: MLP {D} -> {H} -> {H} -> {V} (gelu), softmax cross-entropy, AdamW, batch {B}; one thread.
Machine: {cpu}, {os.cpu_count()} cores, shared with other jobs; no native bfloat16 or float16
arithmetic in NumPy; torch's oneDNN uses what the CPU has (flags below).
Date: {datetime.date.today().isoformat()}; torch {torch.__version__}, numpy {np.__version__}.
Load average before / after: {' '.join(f'{v:.2f}' for v in load_before)} / {' '.join(f'{v:.2f}' for v in load_after)}.

{table}

The CPU flags: {_flags()}. NumPy has no bfloat16/float16 arithmetic: retrograd's NumPy
backend widens each low-precision op to float32 and rounds its result, so the
casts are extra passes and low precision is slower there. On the torch backend
the products run in torch's own bfloat16/float16 kernels (oneDNN; this CPU has
AMX-BF16). `rg.amp` makes `fc`'s product and bias one `SeqLinear` in the low
dtype (as torch's `linear` under autocast) and keeps the activations between
layers in it. float16 is slower than float32 for everyone here (no float16
GEMM path in oneDNN on this CPU, plus loss scaling). The machine was loaded
(see the load average): ratios from one interleaved run, +-30% between runs.
GPU: unmeasured
(no GPU was lent to this task); the goal there is bf16 >= 1.5x float32 and
>= 1.0x torch.autocast eager.
""")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
