"""Training speed: `retrograd train` vs the same model in PyTorch, in one run, same machine.

Both train the default character-level model of ``retrograd train`` (embedding
64 -> 1-layer LSTM 128 -> softmax over 96 characters; batch 32 x 64
characters; Adam lr 3e-3 with global-norm clipping at 5) on the same batches,
in float32 on the CPU. Reported: characters per second (batch x seq-len x
steps / wall time, after warm-up steps), and their ratio. With ``--write``
the "Training" section of ``benchmarks/RESULTS.md`` is replaced by the new
table (other sections are left as they are).

    python benchmarks/train.py --write            # default sizes, 60 timed steps each
    python benchmarks/train.py --model gru --hidden 256 --steps 30
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import retrograd as rg  # noqa: E402
from retrograd import train  # noqa: E402

RESULTS = ROOT / "benchmarks" / "RESULTS.md"


def bench_retrograd(args, corpus) -> tuple[float, list[float], int]:
    cfg = train.ModelConfig(args.model, args.hidden, args.layers, args.embed, None)
    t = train.build_training(cfg, args.seq_len, "adam", args.lr, args.clip_norm, seed=0)
    exe = rg.Executor()
    exe.run(t.startup)
    losses = []

    def step(i):
        xs, ys = train.batch_at(corpus, i, args.seq_len, args.batch, 0)
        loss, = exe.run(t.main, feed={"chars": xs, "next_chars": ys}, fetch_list=[t.loss])
        losses.append(float(loss))

    for i in range(args.warmup):
        step(i)
    started = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        step(i)
    return time.perf_counter() - started, losses, exe.last_stats.peak_bytes


def bench_torch(args, corpus) -> tuple[float, list[float]]:
    import torch
    torch.manual_seed(0)
    vocab = len(train.VOCAB)
    rnn_class = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[args.model]
    embed = torch.nn.Embedding(vocab, args.embed)
    rnn = rnn_class(args.embed, args.hidden, num_layers=args.layers)
    head = torch.nn.Linear(args.hidden, vocab)
    params = [*embed.parameters(), *rnn.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=args.lr)
    losses = []

    def step(i):
        xs, ys = train.batch_at(corpus, i, args.seq_len, args.batch, 0)
        out, _ = rnn(embed(torch.from_numpy(xs)))
        logits = head(out.reshape(-1, args.hidden))
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(ys).reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.clip_norm)
        opt.step()
        losses.append(loss.item())

    for i in range(args.warmup):
        step(i)
    started = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        step(i)
    return time.perf_counter() - started, losses


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch
    return (f"{cpu}, {os.cpu_count()} cores; Python {platform.python_version()}, "
            f"NumPy {np.__version__}, PyTorch {torch.__version__} ({torch.get_num_threads()} threads)")


def write_section(text: str) -> None:
    """Replace (or append) the '## Training' section of RESULTS.md, leaving the others alone."""
    old = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else "# Benchmark results\n"
    pattern = re.compile(r"^## Training\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(old):
        new = pattern.sub(lambda _: text, old, count=1)
    else:
        new = old.rstrip("\n") + "\n\n" + text
    RESULTS.write_text(new, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("lstm", "gru"), default="lstm")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--embed", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--clip-norm", type=float, default=5.0)
    parser.add_argument("--steps", type=int, default=60, help="timed steps per framework")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()

    corpus, _ = train.load_corpus()
    chars = args.steps * args.batch * args.seq_len
    rg_time, rg_losses, peak = bench_retrograd(args, corpus)
    torch_time, torch_losses = bench_torch(args, corpus)
    rg_cps, torch_cps = chars / rg_time, chars / torch_time
    ratio = rg_cps / torch_cps
    size = (f"{args.model}, {args.layers} x {args.hidden} hidden, embed {args.embed}, "
            f"batch {args.batch} x {args.seq_len} chars, Adam + clip {args.clip_norm:g}, float32")
    table = (
        "| framework | chars/s | ms/step | loss after warm-up + timed steps |\n"
        "|---|---:|---:|---:|\n"
        f"| retrograd (`retrograd train`'s program) | {rg_cps:,.0f} | {1000 * rg_time / args.steps:.1f} "
        f"| {rg_losses[-1]:.3f} |\n"
        f"| PyTorch (`torch.nn.{args.model.upper()}`, CPU) | {torch_cps:,.0f} | "
        f"{1000 * torch_time / args.steps:.1f} | {torch_losses[-1]:.3f} |\n")
    command = "python benchmarks/train.py" + "".join(f" {a}" for a in sys.argv[1:])
    section = (
        "## Training\n\n"
        f"Characters per second training the default `retrograd train` model ({size}); "
        f"{args.steps} timed steps after {args.warmup} warm-up steps, both frameworks in one run "
        "on the same batches.\n\n"
        f"{table}\n"
        f"**retrograd / PyTorch = {ratio:.2f}** (retrograd peak memory per step: "
        f"{peak / 2**20:.1f} MB).\n\n"
        f"Command: `{command}`  \nMachine: {machine()}\n\n")
    print(section)
    if args.write:
        write_section(section)
        print(f"wrote the Training section of {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
