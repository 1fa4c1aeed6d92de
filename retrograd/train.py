"""``retrograd train``: a character-level language model trained on Python's own standard library.

The corpus is a fixed list of standard-library modules read from
``sysconfig.get_paths()["stdlib"]``, so nothing is downloaded. The model is
an embedding, ``--layers`` recurrent layers (``rg.layers.lstm``, ``gru`` or
``milstm``) and a softmax over a fixed 96-character vocabulary; one program
holds the forward pass, the backward pass and the optimizer's updates, and a
second, forward-only program over one time step shares the parameters to
generate a sample at the end.

Examples::

    retrograd train                                    # the default run: about a minute on 2 cores
    retrograd train --model gru --hidden 256 --steps 2000 --save gru.npz
    retrograd train --resume gru.npz --model gru --hidden 256 --steps 500

Failures (a parameter file that is missing, corrupt or from another model;
a learning rate that makes the loss NaN) end with one line saying what to do
and a non-zero exit; the parameter file is written only after a successful
run, so a failed run never overwrites it.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import math
import os
import re
import sys
import sysconfig
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import retrograd as rg

from .errors import RetrogradError
from .io import ParamFileError, load_params, read_params, save_params

# --- the data -------------------------------------------------------------------------------

# '\n' then printable ASCII; anything else (tabs, non-ASCII) reads as '?'. Fixed, so a
# parameter file fits any corpus.
VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))
_INDEX = {ch: i for i, ch in enumerate(VOCAB)}
_UNKNOWN = _INDEX["?"]
_ASCII_TO_ID = np.array([_INDEX.get(chr(c), _UNKNOWN) for c in range(128)], dtype=np.int64)

# Modules present in every supported Python; read in this order.
CORPUS_MODULES = ("textwrap", "string", "difflib", "argparse", "shlex", "fnmatch", "heapq", "bisect",
                  "dataclasses", "functools", "contextlib", "enum", "pprint", "random", "inspect",
                  "typing")
MIN_CORPUS_CHARS = 100_000


class TrainError(RetrogradError):
    """The training job cannot go on; the message says what to change."""


def encode(text: str) -> np.ndarray:
    """Character ids (int64) of ``text`` in the fixed vocabulary.

    Example::

        encode("def f():")      # array([69, 70, 71, 0, ...])
    """
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    ids = np.full(codes.shape, _UNKNOWN, dtype=np.int64)
    ascii = codes < 128
    ids[ascii] = _ASCII_TO_ID[codes[ascii]]
    return ids


def decode(ids) -> str:
    """Text of character ids (the inverse of ``encode`` on the vocabulary)."""
    return "".join(VOCAB[int(i)] for i in ids)


def load_corpus() -> tuple[np.ndarray, list[str]]:
    """The training text as ids, and the files it came from (deterministic for a Python version).

    Example::

        ids, files = load_corpus()
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [stdlib / f"{m}.py" for m in CORPUS_MODULES if (stdlib / f"{m}.py").is_file()]
    text = "".join(f.read_text(encoding="utf-8", errors="replace") for f in files)
    if len(text) < MIN_CORPUS_CHARS:  # an unusual installation: take whatever modules it has
        for extra in sorted(stdlib.glob("*.py")):
            if extra not in files:
                files.append(extra)
                text += extra.read_text(encoding="utf-8", errors="replace")
            if len(text) >= MIN_CORPUS_CHARS:
                break
    if len(text) < 1000:
        raise TrainError(f"the Python standard library at {stdlib} has too little source to train on")
    return encode(text), [f.name for f in files]


def batch_at(corpus: np.ndarray, step: int, seq_len: int, batch: int, seed: int):
    """Inputs and next-character targets ``[seq_len, batch]`` for training step ``step``.

    Each step draws its own windows from ``(seed, step)``, so a resumed run
    sees the same batches the uninterrupted run would have.
    """
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(corpus) - seq_len - 1, size=batch)
    index = starts[None, :] + np.arange(seq_len)[:, None]
    return corpus[index], corpus[index + 1]


# --- the model ------------------------------------------------------------------------------

MODELS = ("lstm", "gru", "milstm")


@dataclass(frozen=True)
class ModelConfig:
    model: str = "lstm"
    hidden: int = 128
    layers: int = 1
    embed: int = 64
    recompute: object = None

    def has_cell(self) -> bool:
        return self.model != "gru"


@dataclass
class Net:
    """Handles to one built copy of the model."""
    ids: object
    logits: object              # [T*N, V]
    h0: list                    # per layer: data Var [N, H] or None
    c0: list
    h_last: list
    c_last: list


def build_net(cfg: ModelConfig, seq_len: int, with_states: bool) -> Net:
    """Build the model into the current programs; parameter names do not depend on ``seq_len``.

    ``with_states`` adds per-layer initial-state inputs (``<layer>.h0``/``.c0``),
    used by the one-step sampling program; training starts every window at zero.
    """
    ids = rg.data("chars", [seq_len, -1], dtype="int64")
    table = rg.create_parameter("embed.w", [len(VOCAB), cfg.embed], init=("normal", 0.0, 0.1))
    x = rg.gather(table, ids)                                   # [T, N, E]
    h0s, c0s, h_lasts, c_lasts = [], [], [], []
    for layer in range(cfg.layers):
        name = f"{cfg.model}{layer}"
        h0 = rg.data(f"{name}.h0", [-1, cfg.hidden]) if with_states else None
        c0 = rg.data(f"{name}.c0", [-1, cfg.hidden]) if with_states and cfg.has_cell() else None
        x, h_last, c_last = _recurrent_layer(cfg, x, h0, c0, name)
        h0s.append(h0), c0s.append(c0), h_lasts.append(h_last), c_lasts.append(c_last)
    w = rg.create_parameter("out.w", [cfg.hidden, len(VOCAB)])
    b = rg.create_parameter("out.b", [len(VOCAB)])
    logits = rg.matmul(rg.reshape(x, [-1, cfg.hidden]), w) + b
    return Net(ids, logits, h0s, c0s, h_lasts, c_lasts)


def _recurrent_layer(cfg: ModelConfig, x, h0, c0, name: str):
    """One layer: ``(h_all, h_last, c_last or None)``."""
    if cfg.model == "gru":
        h_all, h_last = rg.layers.gru(x, cfg.hidden, h0=h0, name=name, recompute=cfg.recompute)
        return h_all, h_last, None
    layer = rg.layers.lstm if cfg.model == "lstm" else rg.layers.milstm
    h_all, h_last, _, c_last = layer(x, cfg.hidden, h0=h0, c0=c0, name=name, recompute=cfg.recompute)
    return h_all, h_last, c_last


def _optimizer(name: str, lr: float, clip_norm: float | None):
    if name == "adam":
        return rg.optim.Adam(lr, clip_norm=clip_norm)
    if name == "momentum":
        return rg.optim.Momentum(lr, 0.9, clip_norm=clip_norm)
    return rg.optim.SGD(lr, clip_norm=clip_norm)


@dataclass
class Training:
    main: object
    startup: object
    net: Net
    loss: object
    step: object                # persistable int64[1]: training steps done (saved with the rest)


def build_training(cfg: ModelConfig, seq_len: int, optimizer: str, lr: float,
                   clip_norm: float | None, seed: int) -> Training:
    """The training program: mean cross-entropy of next characters, its backward pass and the updates.

    Example::

        t = build_training(ModelConfig(hidden=64), seq_len=32, optimizer="adam", lr=3e-3,
                           clip_norm=5.0, seed=0)
        print(t.main)
    """
    main, startup = rg.Program(random_seed=seed), rg.Program(random_seed=seed)
    with rg.program_guard(main, startup):
        net = build_net(cfg, seq_len, with_states=False)
        targets = rg.data("next_chars", [seq_len, -1], dtype="int64")
        loss = rg.mean(rg.softmax_cross_entropy(net.logits, rg.reshape(targets, [-1])))
        _optimizer(optimizer, lr, clip_norm).minimize(loss)
        step = rg.optim.create_state("train.step", [1], "int64")
        rg.optim.increment(step)
    return Training(main, startup, net, loss, step)


def build_sampler(cfg: ModelConfig):
    """A forward-only program over one time step, with the training program's parameter names."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        net = build_net(cfg, 1, with_states=True)
        probs = rg.softmax(net.logits)
    return main, net, probs


def generate(exe, cfg: ModelConfig, prime: str, length: int, temperature: float, seed: int) -> str:
    """``prime`` followed by ``length`` characters drawn from the model, one step at a time.

    The recurrent states go round through the feed: each run fetches every
    layer's last ``h`` (and ``c``) and feeds them back as the next ``h0``/``c0``.

    Example::

        print(generate(exe, cfg, "def ", 200, temperature=0.8, seed=0))
    """
    main, net, probs = build_sampler(cfg)
    rng = np.random.default_rng(seed)
    state_in = [v for pair in zip(net.h0, net.c0) for v in pair if v is not None]
    state_out = [v for pair in zip(net.h_last, net.c_last) for v in pair if v is not None]
    states = [np.zeros((1, cfg.hidden), dtype=np.float32) for _ in state_in]

    def advance(char_id: int) -> np.ndarray:
        nonlocal states
        feed = {net.ids.name: np.array([[char_id]], dtype=np.int64)}
        feed.update((v.name, value) for v, value in zip(state_in, states))
        p, *states = exe.run(main, feed=feed, fetch_list=[probs] + state_out)
        return p[0]

    for char_id in encode(prime[:-1]):
        advance(int(char_id))
    drawn = []
    char_id = int(encode(prime[-1:])[0]) if prime else _INDEX["\n"]
    for _ in range(length):
        char_id = _draw(rng, advance(char_id), temperature)
        drawn.append(char_id)
    return prime + decode(drawn)


def _draw(rng, p: np.ndarray, temperature: float) -> int:
    logits = np.log(np.maximum(p.astype(np.float64), 1e-30)) / temperature
    q = np.exp(logits - logits.max())
    return int(rng.choice(len(q), p=q / q.sum()))


# --- the command ------------------------------------------------------------------------------

def parse_recompute(text: str):
    """``none`` -> None, ``steps`` -> "steps", a byte budget (``65536``, ``64k``, ``8M``, ``1G``) -> int."""
    text = text.strip().lower()
    if text == "none":
        return None
    if text == "steps":
        return "steps"
    match = re.fullmatch(r"(\d+)\s*([kmg]?)b?", text)
    if not match:
        raise argparse.ArgumentTypeError(f"'{text}' is not none, steps or a byte budget like 64M")
    return int(match.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[match.group(2)]


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a {kind.__name__}") from None
        if not value > 0 or (kind is float and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be a positive {kind.__name__}, got {text}")
        return value
    parse.__name__ = f"positive {kind.__name__}"
    return parse


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def set_blas_threads(n: int) -> bool:
    """Ask NumPy's OpenBLAS to use ``n`` threads; False when that BLAS cannot be found.

    The per-time-step GEMMs of a recurrent network are small (batch x hidden);
    OpenBLAS's threads gain little on them and, when other processes compete
    for the cores, make each one 10x slower. NumPy offers no call for this,
    so the library's own ``*_set_num_threads`` is called through ctypes.
    """
    libs_dir = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in sorted(glob.glob(os.path.join(libs_dir, "*openblas*"))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                       "openblas_set_num_threads64_", "openblas_set_num_threads"):
            setter = getattr(lib, symbol, None)
            if setter is not None:
                setter(int(n))
                return True
    return False


def _non_negative_int(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return int(text)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``retrograd train`` (defaults: the one-minute demonstration run).

    Example::

        parser = argparse.ArgumentParser(); add_train_arguments(parser)
        run_train(parser.parse_args(["--steps", "50"]))
    """
    pos_int, pos_float = _positive(int), _positive(float)
    add = parser.add_argument
    add("--model", choices=MODELS, default="lstm", help="recurrent layer type (default: lstm)")
    add("--hidden", type=pos_int, default=128, help="hidden units per layer (default: 128)")
    add("--layers", type=pos_int, default=1, help="stacked recurrent layers (default: 1)")
    add("--embed", type=pos_int, default=64, help="character embedding size (default: 64)")
    add("--seq-len", type=pos_int, default=64, help="characters per training window (default: 64)")
    add("--batch", type=pos_int, default=32, help="windows per step (default: 32)")
    add("--steps", type=pos_int, default=600, help="training steps to run (default: 600)")
    add("--lr", type=pos_float, default=3e-3, help="learning rate (default: 0.003)")
    add("--optimizer", choices=("adam", "momentum", "sgd"), default="adam",
        help="optimizer (default: adam; momentum uses 0.9)")
    add("--clip-norm", type=_non_negative, default=5.0,
        help="clip gradients to this global norm; 0 turns clipping off (default: 5.0)")
    add("--recompute", type=parse_recompute, default=None, metavar="none|steps|BYTES",
        help="recompute activations in the backward pass: per step, or under a byte budget "
             "such as 64M (default: none)")
    add("--save", metavar="PATH", default=None,
        help="where to write the parameters (default: retrograd-<model>.npz)")
    add("--resume", metavar="PATH", default=None,
        help="start from parameters and optimizer state saved by an earlier run with the same model options")
    add("--threads", type=pos_int, default=1,
        help="BLAS threads (default: 1; more help only with a large --hidden or --batch, and "
             "slow everything down when other programs share the cores)")
    add("--seed", type=int, default=0, help="seed for initialisation, batches and sampling (default: 0)")
    add("--sample-len", type=_non_negative_int, default=300, help="characters to generate at the end (default: 300)")
    add("--temperature", type=pos_float, default=0.8, help="sampling temperature (default: 0.8)")
    add("--log-every", type=pos_int, default=None,
        help="print a progress line every N steps (default: 10 lines per run)")


def run_train(args: argparse.Namespace) -> int:
    """Train as ``args`` says; print progress, save the parameters, print a sample; return 0.

    Raises ``RetrogradError`` subclasses (one-line messages) for bad input.
    """
    cfg = ModelConfig(args.model, args.hidden, args.layers, args.embed, args.recompute)
    save_path = Path(args.save if args.save else f"retrograd-{args.model}.npz")
    _check_writable(save_path)
    if args.resume:
        read_params(args.resume)                # a missing or corrupt file fails before any work
    set_blas_threads(args.threads)
    corpus, files = load_corpus()
    training = build_training(cfg, args.seq_len, args.optimizer, args.lr, args.clip_norm or None,
                              args.seed)
    exe = rg.Executor()
    exe.run(training.startup)
    if args.resume:
        try:
            load_params(exe.scope, args.resume, training.main)
        except ParamFileError as exc:
            raise TrainError(f"{exc}; resume with the --model, --hidden, --layers, --embed and "
                             "--optimizer of the run that saved it") from None
    first = int(exe.scope.get(training.step.name)[0])
    out = _Reporter(args, first, len(corpus), files)
    try:
        losses = _train_loop(exe, training, corpus, args, first, out)
    except KeyboardInterrupt:
        print(f"retrograd train: interrupted; nothing was saved ({save_path} is unchanged)",
              file=sys.stderr)
        return 130
    save_params(exe.scope, save_path, training.main)
    sample = generate(exe, cfg, "def ", args.sample_len, args.temperature, args.seed)
    out.finish(losses, save_path, sample)
    return 0


def _check_writable(path: Path) -> None:
    """Fail before training, not after, when the parameters could not be saved."""
    where = path.parent
    if not where.is_dir():
        raise TrainError(f"cannot save to {path}: directory {where} does not exist; pass another --save")
    if path.is_dir():
        raise TrainError(f"cannot save to {path}: it is a directory; pass a file name to --save")
    if not os.access(where, os.W_OK):
        raise TrainError(f"cannot save to {path}: directory {where} is not writable; pass another --save")


def _train_loop(exe, training: Training, corpus: np.ndarray, args, first: int,
                out: "_Reporter") -> list[float]:
    losses = []
    chars_per_step = args.seq_len * args.batch
    # Overflow on the way to a NaN loss is reported below, as one line, not as NumPy warnings.
    with out.progress() as tick, np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        started = time.perf_counter()
        for step in range(first, first + args.steps):
            xs, ys = batch_at(corpus, step, args.seq_len, args.batch, args.seed)
            loss, = exe.run(training.main, feed={"chars": xs, "next_chars": ys},
                            fetch_list=[training.loss])
            loss = float(loss)
            if not math.isfinite(loss):
                raise TrainError(f"the loss became {loss} at step {step + 1} (learning rate {args.lr:g}); "
                                 "lower --lr or set a smaller --clip-norm (nothing was saved)")
            losses.append(loss)
            done = step - first + 1
            cps = chars_per_step * done / (time.perf_counter() - started)
            tick(step + 1, loss, cps, exe.last_stats.peak_bytes)
    return losses


class _Reporter:
    """The rich progress bar and the text lines around it."""

    def __init__(self, args, first: int, corpus_chars: int, files: list[str]):
        from rich.console import Console
        self.args = args
        self.first = first
        self.total = first + args.steps
        self.console = Console(highlight=False, soft_wrap=True)
        self.every = args.log_every or max(1, args.steps // 10)
        where = f"resuming {args.resume} at step {first}" if args.resume else "from scratch"
        self.console.print(
            f"retrograd train: {args.model}, {args.layers} x {args.hidden} hidden, "
            f"{args.optimizer} lr {args.lr:g}, batch {args.batch} x {args.seq_len} chars, "
            f"{args.steps} steps {where}\n"
            f"corpus: {corpus_chars:,} characters of the standard library ({', '.join(files[:4])}, ...)")

    def progress(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        @contextmanager
        def bar():
            progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("loss {task.fields[loss]}"),
                                TextColumn("{task.fields[speed]} chars/s"),
                                TextColumn("peak {task.fields[peak]}"), TimeRemainingColumn(),
                                console=self.console, transient=False)
            with progress:
                task = progress.add_task("train", total=self.total, completed=self.first,
                                         loss="-", speed="-", peak="-")

                def tick(step: int, loss: float, cps: float, peak: int) -> None:
                    progress.update(task, completed=step, loss=f"{loss:.3f}", speed=f"{cps:,.0f}",
                                    peak=_megabytes(peak))
                    if (step - self.first) % self.every == 0 or step == self.total:
                        progress.console.print(f"step {step:>6}  loss {loss:.4f}  {cps:,.0f} chars/s  "
                                               f"peak {_megabytes(peak)}")
                yield tick
        return bar()

    def finish(self, losses: list[float], save_path: Path, sample: str) -> None:
        head = float(np.mean(losses[: max(1, len(losses) // 10)]))
        tail = float(np.mean(losses[-max(1, len(losses) // 10):]))
        self.console.print(f"loss {head:.4f} -> {tail:.4f} (mean of the first and last tenth of the steps)")
        self.console.print(f"saved parameters and optimizer state to {save_path}")
        self.console.print("sample:", style="bold")
        self.console.print(sample, markup=False)


def _megabytes(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


def main(argv=None) -> int:
    """``python -m retrograd.train ARGS`` — the same as ``retrograd train ARGS``."""
    from .cli import main as cli_main
    return cli_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
