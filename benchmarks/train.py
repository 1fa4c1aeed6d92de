"""Training speed: `retrograd train` vs the same model in PyTorch, in one run, same machine.

Both train the default character-level model of ``retrograd train`` (embedding
64 -> 1-layer LSTM 128 -> softmax over 96 characters; batch 32 x 64
characters; Adam lr 3e-3 with global-norm clipping at 5) on the same batches,
in float32 on the CPU, with the same number of threads (``--threads``, default 1:
multithreaded BLAS on small per-step GEMMs collapses when other processes
compete for the cores, for NumPy and PyTorch alike). Reported: characters per second (batch x seq-len x
steps / wall time, after warm-up steps), and their ratios. Beside the NumPy
executor it trains the same program on ``rg.Executor(backend="onnxruntime")``
(target: at least PyTorch's characters per second) and the same model in JAX
(``jit`` of one whole training step, the LSTM as ``lax.scan``, Adam and
clipping written out as in ``torch.optim``), all on one thread. With ``--write``
the "Training step" section of ``benchmarks/RESULTS.md`` is replaced by the new
table (other sections are left as they are). The torch backend row runs the
model as ``retrograd train --backend torch`` does: each LSTM layer as one fused
op (oneDNN, issue 22), which the executor picks for that backend.

    python benchmarks/train.py --write            # default sizes, 6 rounds of 10 steps each
    python benchmarks/train.py --model gru --hidden 256 --rounds 3
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time
from pathlib import Path


def _threads_option(argv: list[str]) -> str:
    """``--threads N`` read before NumPy loads: BLAS fixes its thread count at import."""
    for i, arg in enumerate(argv):
        if arg == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
    return "1"


THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
USER_ENV = dict(os.environ)          # the end-to-end timing runs with the user's own settings
THREADS = _threads_option(sys.argv[1:])
for _var in THREAD_VARS:
    os.environ[_var] = THREADS
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "benchmarks"))
import retrograd as rg  # noqa: E402
from retrograd.cli import train  # noqa: E402

RESULTS = ROOT / "benchmarks" / "RESULTS.md"


def retrograd_stepper(args, corpus, backend: str = "numpy"):
    """A function running one training step of the `retrograd train` program, and the executor.

    The model is built as `retrograd train --backend <backend>` builds it: on torch (CPU) the executor
    runs each LSTM layer as one fused op (``passes.fuse_recurrent_cells``: oneDNN, as ``torch.nn.LSTM``)."""
    cfg = train.ModelConfig(args.model, args.hidden, args.layers, args.embed, None)
    t = train.build_training(cfg, args.seq_len, "adam", args.lr, args.clip_norm, seed=0)
    exe = rg.Executor(backend=backend)
    exe.run(t.startup)

    def step(i: int) -> float:
        xs, ys = train.batch_at(corpus, i, args.seq_len, args.batch, 0)
        loss, = exe.run(t.main, feed={"chars": xs, "next_chars": ys}, fetch_list=[t.loss])
        return float(loss)
    return step, exe


def engine_stepper(args, corpus, backend: str = "onnxruntime"):
    """The same program on the onnxruntime engine (or another backend); also the seconds its first
    run took (export + session build + one step), or None when the backend is unavailable."""
    try:
        step, exe = retrograd_stepper(args, corpus, backend=backend)
        started = time.perf_counter()
        step(0)
    except rg.BackendError as exc:
        print(f"skipping the {backend} backend: {exc}", flush=True)
        return None, None
    return step, time.perf_counter() - started


def jax_stepper(args, corpus):
    """The same model, Adam and clipping in JAX: one ``jax.jit`` of the whole training step."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    if args.model != "lstm" or args.layers != 1:
        return None
    vocab, h, e = len(train.VOCAB), args.hidden, args.embed
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    bound = 1.0 / np.sqrt(h)
    uniform = lambda key, shape, b: jax.random.uniform(key, shape, jnp.float32, -b, b)  # noqa: E731
    params = {"embed": jax.random.normal(keys[0], (vocab, e), jnp.float32),
              "w_ih": uniform(keys[1], (e, 4 * h), bound), "w_hh": uniform(keys[2], (h, 4 * h), bound),
              "b": jnp.zeros(4 * h, jnp.float32),
              "w_out": uniform(keys[3], (h, vocab), bound), "b_out": jnp.zeros(vocab, jnp.float32)}

    def loss_fn(p, xs, ys):
        x = p["embed"][xs]                                    # [T, N, E]
        t_len, n = xs.shape
        xw = x @ p["w_ih"] + p["b"]

        def step(carry, x_t):
            h_t, c_t = carry
            i, f, g, o = jnp.split(x_t + h_t @ p["w_hh"], 4, axis=1)
            c_t = jax.nn.sigmoid(f) * c_t + jax.nn.sigmoid(i) * jnp.tanh(g)
            h_t = jax.nn.sigmoid(o) * jnp.tanh(c_t)
            return (h_t, c_t), h_t

        zeros = jnp.zeros((n, h), jnp.float32)
        _, hs = jax.lax.scan(step, (zeros, zeros), xw)
        logits = hs.reshape(-1, h) @ p["w_out"] + p["b_out"]
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, ys.reshape(-1, 1), axis=1).mean()

    b1, b2, eps = 0.9, 0.999, 1e-8

    @jax.jit
    def train_step(p, m, v, t, xs, ys):
        loss, g = jax.value_and_grad(loss_fn)(p, xs, ys)
        norm = jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(g)))
        scale = jnp.minimum(1.0, args.clip_norm / (norm + 1e-6))
        g = jax.tree_util.tree_map(lambda x: x * scale, g)
        t = t + 1
        m = jax.tree_util.tree_map(lambda a, b: b1 * a + (1 - b1) * b, m, g)
        v = jax.tree_util.tree_map(lambda a, b: b2 * a + (1 - b2) * b * b, v, g)
        step_size = args.lr / (1 - b1 ** t)
        denom_scale = jnp.sqrt(1 - b2 ** t)
        p = jax.tree_util.tree_map(lambda q, a, b: q - step_size * a / (jnp.sqrt(b) / denom_scale + eps),
                                   p, m, v)
        return p, m, v, t, loss

    state = {"p": params, "m": jax.tree_util.tree_map(jnp.zeros_like, params),
             "v": jax.tree_util.tree_map(jnp.zeros_like, params), "t": jnp.float32(0)}

    def step(i: int) -> float:
        xs, ys = train.batch_at(corpus, i, args.seq_len, args.batch, 0)
        state["p"], state["m"], state["v"], state["t"], loss = train_step(
            state["p"], state["m"], state["v"], state["t"], xs, ys)
        return float(loss)
    return step


def torch_stepper(args, corpus):
    """The same model, optimizer and clipping in PyTorch (torch.nn.LSTM / GRU on the CPU)."""
    import torch
    torch.set_num_threads(int(THREADS))
    torch.manual_seed(0)
    vocab = len(train.VOCAB)
    rnn_class = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[args.model]
    embed = torch.nn.Embedding(vocab, args.embed)
    rnn = rnn_class(args.embed, args.hidden, num_layers=args.layers)
    head = torch.nn.Linear(args.hidden, vocab)
    params = [*embed.parameters(), *rnn.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=args.lr)

    def step(i: int) -> float:
        xs, ys = train.batch_at(corpus, i, args.seq_len, args.batch, 0)
        out, _ = rnn(embed(torch.from_numpy(xs)))
        logits = head(out.reshape(-1, args.hidden))
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(ys).reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.clip_norm)
        opt.step()
        return loss.item()
    return step


def interleaved(steppers: dict, args) -> dict:
    """Warm each up, then alternate rounds of ``--round`` steps; per framework: round times, losses.

    Alternating rounds exposes both frameworks to the same machine load, so
    their ratio holds even when the machine is busy with other work.
    """
    results = {name: {"times": [], "losses": []} for name in steppers}
    for name, step in steppers.items():
        for i in range(args.warmup):
            results[name]["losses"].append(step(i))
    i = args.warmup
    for _ in range(args.rounds):
        for name, step in steppers.items():
            started = time.perf_counter()
            for k in range(args.round):
                results[name]["losses"].append(step(i + k))
            results[name]["times"].append(time.perf_counter() - started)
        i += args.round
    return results


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
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return (f"{cpu}, {os.cpu_count()} cores (load average {load} at the end of the run); "
            f"{THREADS} BLAS/PyTorch thread(s) per framework; "
            f"Python {platform.python_version()}, NumPy {np.__version__}, "
            f"PyTorch {torch.__version__}")


def time_cli() -> str:
    """Wall time of the default `retrograd train`, as a user runs it (output discarded)."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "retrograd", "train"], cwd=tmp,
                              capture_output=True, text=True, env={**USER_ENV, "PYTHONPATH": str(ROOT)})
        seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"retrograd train failed: {done.stderr.strip()}")
    summary = [line for line in done.stdout.splitlines() if line.startswith("loss ")]
    return (f"The default `retrograd train` (no options) took {seconds:.0f} s end to end here"
            + (f"; {summary[-1]}" if summary else "") + ".\n\n")


SECTION = "Training step"      # the earlier "## Training" section stays as that run's record


def write_section(text: str, title: str = SECTION) -> None:
    """Replace (or append) the '## <title>' section of RESULTS.md, leaving the others alone."""
    old = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else "# Benchmark results\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(old):
        new = pattern.sub(lambda _: text, old, count=1)
    else:
        new = old.rstrip("\n") + "\n\n" + text
    RESULTS.write_text(new, encoding="utf-8")


def transformer_main(args, corpus) -> int:
    """``--model transformer``: examples/gpt_chars.py's model per backend beside PyTorch eager and JAX."""
    import train_transformer
    steps = args.warmup + args.rounds * args.round + 1
    steppers = train_transformer.steppers(corpus, args.batch, args.lr, int(THREADS), steps)
    if not steppers:
        print("skipped: this checkout has no examples/gpt_chars.py (or no rg.layers.transformer_block) yet")
        return 0
    results = interleaved(steppers, args)
    seq_len = train_transformer.gpt_module().Config().seq_len
    chars = args.round * args.batch * seq_len
    cps = {name: chars / float(np.median(r["times"])) for name, r in results.items()}
    eager = "PyTorch eager (`torch.nn`)"
    jax = next((name for name in cps if name.startswith("JAX")), None)
    table = ("| framework | chars/s | ms/step | x PyTorch eager | x JAX | loss at the end |\n"
             "|---|---:|---:|---:|---:|---:|\n") + "".join(
        f"| {name} | {cps[name]:,.0f} | {1000 * args.batch * seq_len / cps[name]:.1f} "
        f"| {cps[name] / cps[eager]:.2f} | {f'{cps[name] / cps[jax]:.2f}' if jax else 'n/a'} "
        f"| {results[name]['losses'][-1]:.3f} |\n" for name in cps)
    command = "python benchmarks/train.py" + "".join(f" {a}" for a in sys.argv[1:])
    section = (
        f"## {SECTION} (transformer)\n\n"
        "Characters per second training the transformer of `examples/gpt_chars.py` (width 64, 4 heads, "
        f"2 pre-norm blocks, GELU MLP, 64 positions; batch {args.batch} x 64 characters, AdamW + clip 1.0, "
        "float32, one thread), all frameworks in one process on the same batches, "
        f"{args.warmup} warm-up steps each, then {args.rounds} alternating rounds of {args.round} steps; "
        "the median round counts. PyTorch eager is the same layers from `torch.nn`; JAX one `jit` of the "
        "whole step. Losses differ by initialisation and by retrograd's learning-rate warmup (the "
        "example's cosine schedule over these steps, warmup a tenth of them).\n\n"
        f"{table}\n"
        f"Command: `{command}`  \nMachine: {machine()}\n\n")
    print(section)
    if args.write:
        write_section(section, f"{SECTION} (transformer)")
        print(f"wrote the {SECTION} (transformer) section of {RESULTS}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("lstm", "gru", "transformer"), default="lstm",
                        help="transformer: the model of examples/gpt_chars.py at its sizes (batch 32 x 64; "
                             "--batch and --lr apply, the LSTM size options do not)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--embed", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--clip-norm", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=6, help="alternating timed rounds")
    parser.add_argument("--round", type=int, default=10, help="steps per round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="BLAS / PyTorch threads for both frameworks (default: 1, which keeps "
                             "the comparison steady on a machine shared with other work)")
    parser.add_argument("--time-cli", action="store_true",
                        help="also time the default `retrograd train` end to end")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()

    corpus, _ = train.load_corpus()
    if args.model == "transformer":
        return transformer_main(args, corpus)
    rg_step, exe = retrograd_stepper(args, corpus)
    engine_step, first_run_s = engine_stepper(args, corpus)
    torch_backend_step, _ = engine_stepper(args, corpus, backend="torch")
    steppers = {"retrograd": rg_step, "torch backend": torch_backend_step, "onnxruntime": engine_step,
                "jax": jax_stepper(args, corpus), "torch": torch_stepper(args, corpus)}
    results = interleaved({name: step for name, step in steppers.items() if step is not None}, args)
    chars = args.round * args.batch * args.seq_len
    cps = {name: chars / float(np.median(r["times"])) for name, r in results.items()}
    ratio = cps["retrograd"] / cps["torch"]
    peak = exe.last_stats.peak_bytes
    size = (f"{args.model}, {args.layers} x {args.hidden} hidden, embed {args.embed}, "
            f"batch {args.batch} x {args.seq_len} chars, Adam + clip {args.clip_norm:g}, float32")
    fused = " (one fused LSTM op: oneDNN)" if args.model == "lstm" else ""
    rows = [("retrograd, NumPy executor (`retrograd train --backend numpy`)", "retrograd"),
            (f"retrograd, torch backend{fused} (`retrograd train`'s default where torch is installed)",
             "torch backend"),
            ("retrograd, onnxruntime engine (the same program)", "onnxruntime"),
            ("JAX (`jit` of the whole step, `lax.scan`, 1 thread)", "jax"),
            (f"PyTorch (`torch.nn.{args.model.upper()}`, CPU)", "torch")]
    jax_ratio = (lambda key: f"{cps[key] / cps['jax']:.2f}") if "jax" in cps else (lambda key: "n/a")
    table = ("| framework | chars/s | ms/step | x PyTorch | x JAX | loss at the end |\n"
             "|---|---:|---:|---:|---:|---:|\n") + "".join(
        f"| {label} | {cps[key]:,.0f} | {1000 * args.batch * args.seq_len / cps[key]:.1f} "
        f"| {cps[key] / cps['torch']:.2f} | {jax_ratio(key)} | {results[key]['losses'][-1]:.3f} |\n"
        for label, key in rows if key in results)
    engine_line = ""
    if "onnxruntime" in results:
        engine_line = (f"**onnxruntime engine / PyTorch = {cps['onnxruntime'] / cps['torch']:.2f}** "
                       f"(target: at least 1.0); its first run (export + session build + one step) "
                       f"took {first_run_s:.2f} s (target for the session build: under 1 s).\n\n")
    if "torch backend" in results:
        engine_line += (f"**torch backend / PyTorch = {cps['torch backend'] / cps['torch']:.2f}**"
                        + (f", / JAX = {cps['torch backend'] / cps['jax']:.2f}" if "jax" in cps else "")
                        + " (issue 22's targets: at least 1.0 each).\n\n")
    steps = args.warmup + args.rounds * args.round
    command = "python benchmarks/train.py" + "".join(f" {a}" for a in sys.argv[1:])
    section = (
        f"## {SECTION}\n\n"
        f"Characters per second training the default `retrograd train` model ({size}), "
        f"all frameworks in one process on the same batches: {args.warmup} warm-up steps each, "
        f"then {args.rounds} alternating rounds of {args.round} steps; the median round counts. "
        f"Losses differ only by initialisation ({steps} steps each). Alternating rounds expose "
        "all to the same background load; on a shared machine (see the load average) repeated "
        "runs still vary by about +-25%. The first `rg.Executor` tunes glibc's malloc for the "
        "whole process (`retrograd/runtime/malloc.py`), so PyTorch and JAX run with it too "
        "(PyTorch's step alone: about 5% faster with it).\n\n"
        f"{table}\n"
        f"**retrograd / PyTorch = {ratio:.2f}** (retrograd peak memory per step: "
        f"{peak / 2**20:.1f} MB).\n\n"
        f"{engine_line}"
        f"{time_cli() if args.time_cli else ''}"
        f"Command: `{command}`  \nMachine: {machine()}\n\n")
    print(section)
    if args.write:
        write_section(section)
        print(f"wrote the {SECTION} section of {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
