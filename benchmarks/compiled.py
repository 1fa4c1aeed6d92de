"""Compiled regions side by side: retrograd eager and ``compile=True`` against PyTorch eager,
``torch.compile`` of the PyTorch model and JAX ``jit``, in one run, one thread each.

Workloads (float32, CPU):

* ``cnn``: conv3x3 32 -> relu -> maxpool 2 -> conv3x3 64 -> relu -> maxpool 2 -> fc 10; batch 64
  of 1x28x28; SGD with momentum 0.9 (issue 34's CNN).
* ``lstm``: the default ``retrograd train`` step (embedding 64 -> LSTM 128 -> softmax over the
  vocabulary; batch 32 x 64 characters; Adam, clipping at 5) -- ``benchmarks/train.py``'s models.
* ``transformer``: ``examples/gpt_chars.py``'s model (2 blocks, width 64, batch 32 x 64, AdamW) --
  ``benchmarks/train_transformer.py``'s models.

Each engine's first ``--warmup`` steps (where compilers compile) are timed apart, as "first
steps (s)"; then timed rounds of ``--round`` steps alternate between engines (so they share the
machine's load) and steps/s is the median round's. ``torch.compile`` compiles the PyTorch
model's forward (its backward through AOTAutograd), the optimizer step stays eager, as in
PyTorch's own recipes. Results: ``benchmarks/results/compiled.md`` with ``--write``.

    python benchmarks/compiled.py --write                    # all three, 3 rounds of 5 steps
    python benchmarks/compiled.py --workloads cnn --rounds 5
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import retrograd as rg  # noqa: E402
from retrograd.cli import train  # noqa: E402
import cnn  # noqa: E402  (benchmarks/cnn.py: the CNN, its batches and its PyTorch twin)

RESULTS = ROOT / "benchmarks" / "results" / "compiled.md"
# --- the CNN (benchmarks/cnn.py's model and batches) ----------------------------------------------

def retrograd_cnn(compile: bool):
    batches = cnn.batches(8)
    main, startup, loss, _ = cnn.build()
    exe = rg.Executor(backend="torch", compile=compile)
    exe.run(startup)

    def step(i: int) -> float:
        return float(exe.run(main, feed=batches[i % len(batches)], fetch_list=[loss])[0])
    return step


def torch_cnn(compile: bool):
    import torch
    nn = torch.nn
    model = cnn.torch_model()
    opt = torch.optim.SGD(model.parameters(), lr=cnn.LR, momentum=cnn.MOMENTUM)
    forward = torch.compile(model) if compile else model
    batches = [(torch.from_numpy(b["x"]), torch.from_numpy(b["y"])) for b in cnn.batches(8)]

    def step(i: int) -> float:
        xs, ys = batches[i % len(batches)]
        loss = nn.functional.cross_entropy(forward(xs), ys)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()
    return step


def jax_cnn():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    keys = jax.random.split(jax.random.PRNGKey(0), 3)

    def uniform(key, shape, fan_in):
        bound = 1.0 / np.sqrt(fan_in)
        return jax.random.uniform(key, shape, jnp.float32, -bound, bound)

    params = {"w1": uniform(keys[0], (32, 1, 3, 3), 9), "b1": jnp.zeros(32),
              "w2": uniform(keys[1], (64, 32, 3, 3), 288), "b2": jnp.zeros(64),
              "w3": uniform(keys[2], (64 * 7 * 7, 10), 64 * 49), "b3": jnp.zeros(10)}

    def conv_relu_pool(x, w, b):
        y = jax.lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)))
        y = jax.nn.relu(y + b[None, :, None, None])
        return jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def loss_fn(p, x, y):
        h = conv_relu_pool(conv_relu_pool(x, p["w1"], p["b1"]), p["w2"], p["b2"])
        logp = jax.nn.log_softmax(h.reshape(h.shape[0], -1) @ p["w3"] + p["b3"])
        return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()

    @jax.jit
    def train_step(p, v, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        v = jax.tree_util.tree_map(lambda a, b: cnn.MOMENTUM * a + b, v, g)
        p = jax.tree_util.tree_map(lambda q, a: q - cnn.LR * a, p, v)
        return p, v, loss

    state = {"p": params, "v": jax.tree_util.tree_map(jnp.zeros_like, params)}
    batches = [(b["x"], b["y"]) for b in cnn.batches(8)]

    def step(i: int) -> float:
        xs, ys = batches[i % len(batches)]
        state["p"], state["v"], loss = train_step(state["p"], state["v"], xs, ys)
        return float(loss)
    return step


def cnn_steppers() -> dict:
    return {"retrograd eager (torch backend)": retrograd_cnn(False),
            "retrograd `compile=True`": retrograd_cnn(True),
            "PyTorch eager": torch_cnn(False),
            "`torch.compile` (PyTorch model)": torch_cnn(True),
            "JAX `jit` of the step": jax_cnn()}


# --- the char-LSTM LM step (benchmarks/train.py's models) ---------------------------------------------

def _lstm_args():
    return argparse.Namespace(model="lstm", hidden=128, layers=1, embed=64, seq_len=64, batch=32, lr=3e-3,
                              clip_norm=5.0)


def retrograd_lstm(corpus, compile: bool):
    args = _lstm_args()
    cfg = train.ModelConfig(args.model, args.hidden, args.layers, args.embed, None)
    t = train.build_training(cfg, args.seq_len, "adam", args.lr, args.clip_norm, seed=0)
    exe = rg.Executor(backend="torch", compile=compile)
    exe.run(t.startup)

    def step(i: int) -> float:
        xs, ys = train.batch_at(corpus, i, args.seq_len, args.batch, 0)
        return float(exe.run(t.main, feed={"chars": xs, "next_chars": ys}, fetch_list=[t.loss])[0])
    return step


def torch_lstm(corpus, compile: bool | str):
    """PyTorch's step; ``compile``: the loss function through ``torch.compile`` (Dynamo does not trace
    ``nn.LSTM``: it runs the whole function eagerly), or ``"parts"``: the embedding and the head with
    the loss compiled around an eager ``nn.LSTM`` (the most ``torch.compile`` can take of this model)."""
    import torch
    import train as bench_train
    step = bench_train.torch_stepper(_lstm_args(), corpus)
    if not compile:
        return step
    # the same model with its modules compiled: rebuild with torch.compile around the forward
    torch.manual_seed(0)
    args, vocab = _lstm_args(), len(train.VOCAB)
    embed, rnn = torch.nn.Embedding(vocab, args.embed), torch.nn.LSTM(args.embed, args.hidden)
    head = torch.nn.Linear(args.hidden, vocab)
    params = [*embed.parameters(), *rnn.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=args.lr)

    @torch.compile
    def loss_of(xs, ys):
        out, _ = rnn(embed(xs))
        logits = head(out.reshape(-1, args.hidden))
        return torch.nn.functional.cross_entropy(logits, ys.reshape(-1))

    if compile == "parts":
        embedded, head_loss = torch.compile(embed), torch.compile(
            lambda out, ys: torch.nn.functional.cross_entropy(head(out.reshape(-1, args.hidden)), ys.reshape(-1)))

        def loss_of(xs, ys):      # noqa: F811 -- the variant
            out, _ = rnn(embedded(xs))
            return head_loss(out, ys)

    def compiled_step(i: int) -> float:
        xs, ys = train.batch_at(corpus, i, args.seq_len, args.batch, 0)
        loss = loss_of(torch.from_numpy(xs), torch.from_numpy(ys))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.clip_norm)
        opt.step()
        return loss.item()
    return compiled_step


def lstm_steppers() -> dict:
    import train as bench_train
    corpus, _ = train.load_corpus()
    return {"retrograd eager (torch backend)": retrograd_lstm(corpus, False),
            "retrograd `compile=True`": retrograd_lstm(corpus, True),
            "PyTorch eager": torch_lstm(corpus, False),
            "`torch.compile` (PyTorch model)": torch_lstm(corpus, True),
            "`torch.compile` around `nn.LSTM` (embedding, head + loss)": torch_lstm(corpus, "parts"),
            "JAX `jit` of the step": bench_train.jax_stepper(_lstm_args(), corpus)}


# --- the small transformer step (benchmarks/train_transformer.py's models) ----------------------------

def transformer_steppers(steps: int) -> dict:
    import train_transformer as tt
    g = tt.gpt_module()
    if g is None:
        print("skipping the transformer: examples/gpt_chars.py is not in this checkout", flush=True)
        return {}
    corpus, _ = train.load_corpus()
    batch, lr = 32, 3e-3
    return {"retrograd eager (torch backend)": tt.retrograd_stepper(g, corpus, "torch", batch, lr, steps),
            "retrograd `compile=True`": tt.retrograd_stepper(g, corpus, "torch", batch, lr, steps, compile=True),
            "PyTorch eager": tt.torch_stepper(g, corpus, batch, lr, 1),
            "`torch.compile` (PyTorch model)": tt.torch_stepper(g, corpus, batch, lr, 1, compile=True),
            "JAX `jit` of the step": tt.jax_stepper(g, corpus, batch, lr)}


# --- timing ---------------------------------------------------------------------------------------------

def measure(steppers: dict, args) -> dict:
    """label -> (seconds of the first ``warmup`` steps, steps/s of the median round by wall time, by the
    process's CPU time, last loss). Rounds alternate between the engines, in reverse order every other
    round. CPU time (one thread each) does not count waiting for a core on a shared machine."""
    steppers = {k: v for k, v in steppers.items() if v is not None}
    first, walls, cpus, losses = {}, {k: [] for k in steppers}, {k: [] for k in steppers}, {}
    for name, step in steppers.items():
        started = time.perf_counter()
        for i in range(args.warmup):
            step(i)
        first[name] = time.perf_counter() - started
        print(f"  {name}: first {args.warmup} steps {first[name]:.1f} s", flush=True)
    i = args.warmup
    for round_ in range(args.rounds):
        order = list(steppers.items())
        for name, step in (order[::-1] if round_ % 2 else order):
            started, cpu = time.perf_counter(), time.process_time()
            for k in range(args.round):
                losses[name] = step(i + k)
            walls[name].append(time.perf_counter() - started)
            cpus[name].append(time.process_time() - cpu)
        i += args.round
    return {name: (first[name], args.round / float(np.median(walls[name])),
                   args.round / float(np.median(cpus[name])), losses[name]) for name in steppers}


def table(title: str, results: dict) -> str:
    base = results.get("PyTorch eager")
    lines = [f"### {title}", "", "| engine | steps/s (wall) | vs PyTorch eager (wall) | steps/s (CPU time) "
             "| vs PyTorch eager (CPU time) | first steps (s, compiles included) |",
             "|---|---|---|---|---|---|"]
    for name, (first, rate, cpu_rate, _) in results.items():
        ratio = f"{rate / base[1]:.2f}x" if base else "-"
        cpu_ratio = f"{cpu_rate / base[2]:.2f}x" if base else "-"
        lines.append(f"| {name} | {rate:.2f} | {ratio} | {cpu_rate:.2f} | {cpu_ratio} | {first:.1f} |")
    return "\n".join(lines) + "\n"


def machine(load_before: tuple = ()) -> str:
    import platform
    import torch
    cpu = platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    before = f"{', '.join(f'{x:.1f}' for x in load_before)} at the start, " if load_before else ""
    return (f"{cpu}, {os.cpu_count()} cores, shared (load average {before}{load} at the end of the run); one thread "
            f"per framework; PyTorch {torch.__version__}, Python {platform.python_version()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="cnn,lstm,transformer")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--round", type=int, default=5, help="steps per round")
    parser.add_argument("--warmup", type=int, default=3, help="steps timed apart (compiles happen here)")
    parser.add_argument("--write", action="store_true", help=f"write {RESULTS.relative_to(ROOT)}")
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    builders = {"cnn": ("CNN training step (batch 64, 1x28x28, SGD momentum)", cnn_steppers),
                "lstm": ("char-LSTM LM training step (`retrograd train` default)", lstm_steppers),
                "transformer": ("small transformer training step (gpt_chars: 2 blocks, d=64, AdamW)",
                                lambda: transformer_steppers(args.warmup + args.rounds * args.round))}
    text = []
    for name in args.workloads.split(","):
        title, build = builders[name]
        print(f"{title}:", flush=True)
        results = measure(build(), args)
        text.append(table(title, results))
        print(text[-1], flush=True)
    command = "python benchmarks/compiled.py " + " ".join(sys.argv[1:])
    report = (f"## Compiled regions (`Executor(backend=\"torch\", compile=True)`)\n\n"
              f"Command: `{command.strip()}` ({args.rounds} rounds of {args.round} steps after {args.warmup} "
              f"first steps), {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC.\n\n"
              f"Machine: {machine(load_before)}.\n\n"
              + "\n".join(text))
    print(report)
    if args.write:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
