"""``retrograd train``: train the character-level language model of ``retrograd/models/charlm.py``.

One program holds the forward pass, the backward pass and the optimizer's
updates; the job feeds it windows of standard-library source (or of your
``--text`` files), measures the loss on held-out text now and then, writes
checkpoints and a JSON-lines log if asked, and at the end saves the
parameters, draws the loss curve and prints a sample.

Examples::

    retrograd train                                    # the default run: about 30 s on 2 cores
    retrograd train --text notes.txt 'more/*.md'       # your own UTF-8 text
    retrograd train --steps 2000 --save m.npz --save-every 200 --log m.jsonl
    retrograd train --resume m.npz --steps 500         # 500 more steps, same options, back into m.npz
    retrograd train --recompute 256K                   # byte sizes take K/M/G suffixes
    retrograd train --optimizer momentum --lr 0.1 --weight-decay 1e-4

Failures end with one line saying what to change and a non-zero exit:
a parameter file that is missing, corrupt or from another model, optimizer
or vocabulary, a ``--seq-len`` longer than the text, or a loss that diverges
(non-finite, or far above where it started). The parameter file is only ever
replaced by a complete, healthy checkpoint: a diverged or interrupted run
leaves the last good one (and says which step it holds).

No run replaces a model file it did not load or make, unless ``--save PATH``
names it or ``--overwrite`` is given: a new run whose default file
(``retrograd-<model>.npz``) exists saves to the next free name
(``retrograd-<model>-2.npz``) and says so. A resumed run reads its options
from the file (``retrograd/cli/resume.py``) and saves back into it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

import retrograd as rg

from ..models.charlm import (BUILTIN_VOCAB, LR_SCHEDULES, MIN_CORPUS_CHARS, MODELS, OPTIMIZERS,
                             VOCAB, Corpus, ModelConfig, TrainError, Training, Vocab, batch_at,
                             build_loss, build_training, builtin_corpus, check_seq_len,
                             config_from_params, decode, encode, generate, held_out_batches,
                             load_corpus, load_text, make_lr, optimizer_of, read_record,
                             run_record, split_corpus, PRECISIONS)
from ..errors import RetrogradError
from ..models.generation import generate_text
from ..io import (ParamFileError, load_params, read_params, remove_stale_temps, save_params)
from ..options import non_negative, non_negative_int, parse_recompute, positive  # noqa: F401
from ..runtime.threads import ThreadLimit
from .resume import (RECORDED, new_run_options, options_record, resumed_options, text_files_of)
from . import plot
from .termplot import loss_curve

# --- the command ------------------------------------------------------------------------------

def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``retrograd train`` (defaults: the half-minute demonstration run).

    Example::

        parser = argparse.ArgumentParser(); add_train_arguments(parser)
        run_train(parser.parse_args(["--steps", "50"]))
    """
    pos_int, pos_float = positive(int), positive(float)

    def add(*flags, **options):
        # The options a model file records are left out of the namespace when not given, so a
        # resumed run takes the file's (retrograd/cli/resume.py); a new run takes RECORDED's defaults.
        if flags[0][2:].replace("-", "_") in RECORDED:
            options["default"] = argparse.SUPPRESS
        parser.add_argument(*flags, **options)
    add("--text", action="extend", nargs="+", metavar="FILE",
        help="train on these UTF-8 text files instead of the built-in corpus: several paths, or a "
             "glob such as 'notes/*.md' (the vocabulary is every character of the text)")
    add("--model", choices=MODELS, default="lstm",
        help="lstm, gru, milstm (recurrent layers) or transformer (default: lstm)")
    add("--hidden", type=pos_int, default=128, help="hidden units per layer (default: 128)")
    add("--layers", type=pos_int, default=1, help="stacked recurrent layers or blocks (default: 1)")
    add("--heads", type=pos_int, default=4, help="attention heads of --model transformer (default: 4)")
    add("--embed", type=pos_int, default=64, help="character embedding size (default: 64)")
    add("--seq-len", type=pos_int, default=64, help="characters per training window (default: 64)")
    add("--batch", type=pos_int, default=32, help="windows per step (default: 32)")
    add("--steps", type=pos_int, default=600,
        help="training steps to run (default: 600); with --resume, steps to run after the "
             "checkpoint's (the schedule keeps the length the first run gave it)")
    add("--lr", type=pos_float, default=3e-3, help="learning rate (default: 0.003)")
    add("--optimizer", choices=OPTIMIZERS, default="adam",
        help="optimizer (default: adam; momentum uses 0.9)")
    add("--weight-decay", type=non_negative, default=None,
        help="weight decay of the optimizer (default: the optimizer's own: 0, or 0.01 for adamw)")
    add("--lr-schedule", choices=LR_SCHEDULES, default="constant",
        help="constant, cosine (to 0 over the run) or step (divided by 10 at each third of the "
             "run) (default: constant)")
    add("--warmup", type=non_negative_int, default=0, metavar="STEPS",
        help="raise the learning rate linearly from 0 over this many steps (default: 0)")
    add("--clip-norm", type=non_negative, default=5.0,
        help="clip gradients to this global norm; 0 turns clipping off (default: 5.0)")
    add("--recompute", type=parse_recompute, default=None, metavar="none|steps|BYTES",
        help="recompute activations in the backward pass: per step, or under a byte budget "
             "such as 64M (default: none)")
    add("--save", metavar="PATH", default=None,
        help="where to write the parameters (default: the --resume file, else retrograd-<model>.npz, "
             "or the next free retrograd-<model>-N.npz when that exists)")
    add("--overwrite", action="store_true",
        help="replace retrograd-<model>.npz when it exists (without it, a new name is picked)")
    add("--resume", metavar="PATH", default=None,
        help="continue a saved run: its parameters, optimizer state and options (model, sizes, "
             "optimizer, schedule, text); options given again must agree")
    add("--threads", type=pos_int, default=None,
        help="threads of every library the run uses: BLAS, OpenMP, torch, onnxruntime (default: 1; "
             "more help only with a large --hidden or --batch, and slow everything down when other "
             "programs share the cores)")
    add("--precision", choices=tuple(PRECISIONS), default="fp32",
        help="fp32 (default), or mixed precision: bf16 / fp16 products with float32 weights "
             "(fp16 with dynamic loss scaling; rg.amp)")
    add("--backend", choices=("auto", "numpy", "torch", "cupy", "onnxruntime"), default="auto",
        help="what runs the program (default: auto, the fastest installed for the run: torch, else "
             "the onnxruntime engine, else numpy; torch with --device/--graphs, not the engine under MPI "
             "or --recompute); numpy is the embedded default; torch and cupy run on GPUs")
    add("--device", default=None,
        help="device of --backend: cpu, cuda or cuda:N (default: cpu; cuda for cupy)")
    add("--graphs", action="store_true",
        help="replay each step as a CUDA graph (--backend torch on a CUDA device): one launch instead "
             "of thousands of small ones per step")
    add("--compile", action="store_true",
        help="run each straight-line part of the step (forward, backward and updates between "
             "control-flow ops) as one torch.compile'd function (--backend torch; the first steps "
             "are slow while Inductor compiles)")
    add("--seed", type=int, default=0, help="seed for initialisation, batches and sampling (default: 0)")
    add("--check-finite", action="store_true",
        help="stop at the first op whose output holds NaN or Inf, naming it and its inputs "
             "(slower: one reduction per op output)")
    add("--sample-len", type=non_negative_int, default=300, help="characters to generate at the end (default: 300)")
    add("--temperature", type=pos_float, default=0.8, help="sampling temperature (default: 0.8)")
    add("--log-every", type=pos_int, default=None,
        help="print a progress line (and measure the held-out loss) every N steps "
             "(default: 10 times per run)")
    add("--log", metavar="PATH", default=None,
        help="write one JSON object per step to PATH (step, loss, chars_per_s, peak_bytes, and "
             "val_loss where the held-out loss was measured); a resumed run continues it from "
             "the checkpoint's step")
    add("--save-every", type=pos_int, default=None, metavar="N",
        help="also write the parameters to --save every N steps (atomically), so an "
             "interrupted run keeps its last checkpoint")
    add("--plot", action=argparse.BooleanOptionalAction, default=True,
        help="draw the loss curve as text at the end (default: on)")
    add("--plot-file", metavar="PATH", default=None,
        help="also draw the loss curve into an image (.png, .svg or .pdf; needs matplotlib: "
             'pip install "retrograd[plot]")')


# --backend auto: the fastest that is installed, measured on the default models (benchmarks/train.py,
# RESULTS.md "Training step": torch 0.91x-1.01x, the onnxruntime engine 0.83x-0.92x and NumPy 0.58x
# PyTorch's characters/s on a 2-core CPU; the transformer: torch 1.13x, the engine 0.93x PyTorch
# eager's).
AUTO_ORDER = ("torch", "onnxruntime", "numpy")


def choose_backend(args: argparse.Namespace) -> str:
    """``args.backend``, with ``auto`` resolved to the first of ``AUTO_ORDER`` that is installed and
    runs everything asked: a device, CUDA graphs or --compile need torch; data parallelism over MPI (its
    AllReduce) and a ``--recompute`` budget (the engine runs store-all) keep the engine out.

    Example::

        choose_backend(argparse.Namespace(backend="auto", device=None, graphs=False, recompute=None))
    """
    if args.backend != "auto":
        return args.backend
    order = AUTO_ORDER
    if args.device is not None or getattr(args, "graphs", False) or getattr(args, "compile", False):
        order = ("torch",)
    elif getattr(args, "recompute", None) is not None or rg.distributed.world_size() > 1:
        order = ("torch", "numpy")
    for name in order:
        try:
            rg.Executor(backend=name, device=args.device, threads=getattr(args, "threads", None))
        except rg.BackendError:
            continue
        return name
    return "numpy" if args.device is None else order[0]


def run_train(args: argparse.Namespace) -> int:
    """Train as ``args`` says; print progress, save, draw the loss curve, print a sample; return 0.

    Raises ``RetrogradError`` subclasses (one-line messages) for bad input and
    for a diverging loss; returns 130 after Ctrl-C.
    """
    saved = read_params(args.resume) if args.resume else None   # a missing or corrupt file fails first
    if saved is not None:
        resumed_options(args, saved, args.resume)
    else:
        new_run_options(args)
    save_path = save_target(args)
    _check_writable(save_path, "--save")
    remove_stale_temps(save_path)        # a killed save's temporary file of this one
    if args.log:
        _check_writable(Path(args.log), "--log")
    if args.plot_file:
        _check_plot_file(Path(args.plot_file))
    args.backend = choose_backend(args)
    checkpoint = Checkpoint(save_path)
    job = None
    try:
        with command_threads(args.threads):     # the whole command, not only each run
            text = TrainingText.load(args, saved)
            cfg = ModelConfig(args.model, args.hidden, args.layers, args.embed, args.recompute,
                              vocab=text.corpus.vocab, heads=args.heads)
            if saved is not None:
                check_resumable(saved, args.resume, cfg, args.optimizer)
            job, cfg = _fit_recompute_budget(args, cfg, checkpoint, text)
            out = _Reporter(args, job, text)
            with _open_log(args, job.first) as log:
                job.train(out, log)
            checkpoint.save(job.exe, job.training, job.step_done)
            sample = generate_text(job.exe, cfg, text.prompt, args.sample_len, args.temperature,
                                   args.seed) if rg.distributed.rank() == 0 else ""
            out.finish(job.losses, job.val_losses, save_path, sample)
    except KeyboardInterrupt:
        # The scope may hold a half-applied update: keep the last complete checkpoint instead.
        when = f"at step {job.step_done}" if job is not None else "before training started"
        print(f"retrograd train: interrupted {when}; {checkpoint.status()}", file=sys.stderr)
        return 130
    except (TrainError, rg.ExecutionError) as exc:      # ExecutionError: --check-finite's, say
        if job is None:
            raise                       # a setup failure: nothing can have been saved
        raise TrainError(f"{exc}; {checkpoint.status()}") from None
    return 0


def command_threads(threads: int | None):
    """``with command_threads(n):`` the command's thread count holds for all of its process --
    batches, checkpoints and sampling between the runs too -- not only inside each
    ``Executor.run`` (the command owns its process; a library call would not)."""
    pools = (sys.modules["torch"],) if "torch" in sys.modules else ()
    return ThreadLimit(threads, pools).limit()


def save_target(args) -> Path:
    """Where the run saves: ``--save``, else the ``--resume`` file (the run loaded it), else
    ``retrograd-<model>.npz`` -- or, when that exists and ``--overwrite`` is not given, the first
    free ``retrograd-<model>-N.npz`` (said on a line of its own)."""
    if args.save:
        return Path(args.save)
    if args.resume:
        return Path(args.resume)
    path = Path(f"retrograd-{args.model}.npz")
    if getattr(args, "overwrite", False) or not path.exists():
        return path
    free = next(p for p in (path.with_name(f"{path.stem}-{n}{path.suffix}") for n in range(2, 10**6))
                if not p.exists())
    if rg.distributed.rank() == 0:
        print(f"retrograd train: {path} exists and this run did not make it; saving to {free} "
              "(--overwrite replaces it; --save PATH names the file)")
    return free


@dataclass
class TrainingText:
    """What a run trains on: the corpus (``--text`` files or the built-in one), its training
    and held-out ids, the sampling prompt, the step the run starts from and the run record of
    the file it resumes (None for a new run)."""
    corpus: Corpus
    train: np.ndarray
    held_out: np.ndarray
    prompt: str
    first_step: int
    record: dict | None = None

    @classmethod
    def load(cls, args, saved: dict | None) -> "TrainingText":
        corpus = load_text(args.text) if args.text else builtin_corpus()
        train_ids, held_out = split_corpus(corpus.ids)
        check_seq_len(args.seq_len, train_ids, held_out)
        record = read_record(saved, args.resume) if saved is not None else {}
        first = int(np.asarray(saved.get("train.step", [0])).reshape(-1)[0]) if saved else 0
        # A resumed run keeps the prompt it was saved with (the file's record must stay the same).
        return cls(corpus, train_ids, held_out, record.get("prompt", corpus.prompt), first, record or None)

    def run_record(self, args, cfg: ModelConfig) -> dict:
        """The record the run's file keeps: the resumed file's as it is, or a new one."""
        if self.record is not None:
            return self.record
        return run_record(cfg, args.optimizer, self.prompt, options_record(args, text_files_of(self.corpus)))


def check_resumable(saved: dict, where: str, cfg: ModelConfig, optimizer: str) -> None:
    """TrainError (one line) when the file ``where`` holds another kind of model, another
    optimizer's state or another vocabulary than this run's; sizes are checked on loading."""
    old = config_from_params(saved, where)
    refuse = f"cannot resume from {where}: it"
    if old.model != cfg.model:
        raise TrainError(f"{refuse} holds a {old.model} model and this run builds {cfg.model}; resume "
                         f"with --model {old.model}, or start a new run without --resume")
    old_optimizer = optimizer_of(saved, read_record(saved, where))
    if old_optimizer != optimizer:
        raise TrainError(f"{refuse} was trained with --optimizer {old_optimizer}, whose state "
                         f"{optimizer} cannot continue; resume with --optimizer {old_optimizer}, or "
                         "start a new run without --resume")
    if old.vocab != cfg.vocab:
        raise TrainError(f"{refuse} was trained on another vocabulary ({_vocab_words(old.vocab)}) "
                         f"than this run's text ({_vocab_words(cfg.vocab)}); resume with the --text "
                         "files it was trained on, or start a new run without --resume")


def _vocab_words(vocab: Vocab) -> str:
    if vocab == BUILTIN_VOCAB:
        return "the built-in corpus's 96 characters"
    return f"{len(vocab) - 1} characters + unknown"


def _fit_recompute_budget(args, cfg: ModelConfig, checkpoint, text: TrainingText):
    """The run's ``Job``. With ``--recompute BYTES`` below what can fit (one step of the recurrent
    layers; a transformer's whole training step), say so and train with the least budget that
    fits (the library raises, naming it; the command offers the fix)."""
    if not isinstance(args.recompute, int):
        return Job(args, cfg, checkpoint, text), cfg
    for _ in range(args.layers + 1):
        try:
            job = Job(args, cfg, checkpoint, text)      # a transformer's budget is planned here
            job.plan_first_step()                       # a recurrent layer's, when it runs
            return job, cfg
        except RetrogradError as exc:
            least = getattr(exc, "least_budget", None)
            if least is None:
                raise
        if rg.distributed.rank() == 0:
            what = ("one training step of the transformer" if cfg.model == "transformer"
                    else f"one step of the {cfg.model} layers")
            print(f"retrograd train: --recompute {args.recompute:,} bytes cannot hold {what} at these "
                  f"sizes; using the least budget that fits, {least:,} bytes")
        args.recompute = least
        cfg = replace(cfg, recompute=least)
    return Job(args, cfg, checkpoint, text), cfg


def _check_plot_file(path: Path) -> None:
    if path.suffix.lower() not in plot.FORMATS:
        raise TrainError(f"cannot draw {path}: use a file name ending in {', '.join(plot.FORMATS)} "
                         "for --plot-file")
    if not plot.available():
        raise TrainError(f"--plot-file needs matplotlib, which is not installed: {plot.INSTALL_HINT}")
    _check_writable(path, "--plot-file")


def _check_writable(path: Path, option: str) -> None:
    """Fail before training, not after, when a file could not be written."""
    where = path.parent
    if not where.is_dir():
        raise TrainError(f"cannot write {path}: directory {where} does not exist; pass another {option}")
    if path.is_dir():
        raise TrainError(f"cannot write {path}: it is a directory; pass a file name to {option}")
    if not os.access(where, os.W_OK):
        raise TrainError(f"cannot write {path}: directory {where} is not writable; pass another {option}")


@contextmanager
def _open_log(args, first: int):
    """The ``--log`` file, or None (always, on ranks other than 0). A resumed run continues it
    from its checkpoint's step ``first``: lines of later steps (a run interrupted after its last
    checkpoint logged them) are dropped first, so no step is logged twice."""
    if not args.log or rg.distributed.rank() != 0:
        yield None
        return
    path = Path(args.log)
    if args.resume and path.is_file():
        _keep_log_until(path, first)
    with open(path, "a" if args.resume else "w", encoding="utf-8") as file:
        yield file


def _keep_log_until(path: Path, step: int) -> None:
    """Rewrite the JSON-lines log ``path`` with its records of steps up to ``step`` only (a line
    cut short by a killed run is dropped too)."""
    kept = []
    with open(path, encoding="utf-8", errors="replace") as file:
        for line in file:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step:
                kept.append(json.dumps(record) + "\n")
    path.write_text("".join(kept), encoding="utf-8")


class Checkpoint:
    """The ``--save`` file: written atomically, only with the state after a healthy step
    (by rank 0 alone when several MPI ranks train together)."""

    def __init__(self, path: Path):
        self.path = path
        self.step: int | None = None      # the step the file holds, once this run wrote it

    def save(self, exe, training: Training, step: int) -> None:
        if self.step != step:
            with _ctrl_c_deferred():    # the file and ``self.step`` change together
                if rg.distributed.rank() == 0:       # the program too: `retrograd show FILE`
                    save_params(exe.scope, self.path, training.main, with_program=True)
                self.step = step

    def status(self) -> str:
        if self.step is None:
            return f"nothing was saved ({self.path} is unchanged)"
        return f"{self.path} holds step {self.step} (the last checkpoint)"


@contextmanager
def _ctrl_c_deferred():
    """Hold a Ctrl-C that arrives inside the ``with`` until its end (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        if previous is not None:        # None: a handler not set from Python, cannot be put back
            signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


class Job:
    """One training run: the executor, the programs, the checkpoint and the history."""

    def __init__(self, args, cfg: ModelConfig, checkpoint: Checkpoint, text: TrainingText):
        self.args = args
        self.corpus = text.train
        self.val_batches = held_out_batches(text.held_out, args.seq_len, args.batch)
        # Under `mpiexec -n N`, every rank trains on its 1/N of each batch (the global batch is
        # unchanged); the gradients and the losses it reports are averaged over the ranks.
        ranks = rg.distributed.world_size()
        if args.batch % ranks:
            raise TrainError(f"--batch {args.batch} does not split evenly over {ranks} MPI ranks; "
                             f"use a multiple of {ranks}")
        # The schedule's length: the first run's (a resumed cosine does not stretch), or for files
        # that do not record it, this run's end.
        self.schedule_steps = getattr(args, "schedule_steps", None) or text.first_step + args.steps
        lr = make_lr(args.lr_schedule, args.lr, args.warmup, total_steps=self.schedule_steps)
        self.training = build_training(cfg, args.seq_len, args.optimizer, lr, args.clip_norm or None,
                                       args.seed, data_parallel=ranks > 1,
                                       weight_decay=args.weight_decay, prompt=text.prompt,
                                       batch=args.batch // ranks, precision=args.precision,
                                       record=text.run_record(args, cfg))
        self.val_program, self.val_loss = build_loss(cfg, args.seq_len, data_parallel=ranks > 1)
        self.exe = rg.Executor(threads=args.threads, backend=args.backend, device=args.device,
                               graphs=args.graphs, check_finite=args.check_finite,
                               compile=getattr(args, "compile", False))
        self.exe.run(self.training.startup)
        if args.resume:
            try:     # strict: state this run's optimizer would drop is refused, not lost
                load_params(self.exe.scope, args.resume, self.training.main, strict=True)
            except ParamFileError as exc:
                raise TrainError(f"{exc}; resume with the --model, --hidden, --layers, --embed and "
                                 "--optimizer of the run that saved it") from None
        self.first = int(self.exe.scope.get(self.training.step.name)[0])
        self.step_done = self.first
        self.checkpoint = checkpoint
        self.losses: list[float] = []
        self.val_losses: dict[int, float] = {}
        self.divergence = Divergence(args)

    def train(self, out: "_Reporter", log) -> None:
        args = self.args
        chars_per_step = args.seq_len * args.batch
        # Overflow on the way to a NaN loss is reported as one line, not as NumPy warnings.
        with out.progress() as tick, np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            started = time.perf_counter()
            for step in range(self.first + 1, self.first + args.steps + 1):
                loss = self.run_step(step - 1)
                self.divergence.check(loss, step)
                self.losses.append(loss)
                self.step_done = step
                cps = chars_per_step * len(self.losses) / (time.perf_counter() - started)
                peak = self.exe.last_stats.peak_bytes       # the training step's, before a held-out run
                checkpoint = bool(args.save_every) and step % args.save_every == 0
                val = None
                if out.reports(step) or checkpoint or step == out.total:
                    # The parameters after this step's update: what a checkpoint would hold.
                    val = self.measure_held_out()
                    self.divergence.check(val, step, "held-out loss")
                tick(step, loss, cps, peak, val, self.exe.backend.device_memory())
                if log is not None:
                    _log_line(log, step, loss, cps, peak, val)
                if checkpoint:
                    self.checkpoint.save(self.exe, self.training, step)

    def plan_first_step(self) -> None:
        """Run the first step without changing any parameter (its updates go to a child scope):
        a recompute budget too small for the sizes raises here, before training starts."""
        xs, ys = batch_at(self.corpus, self.first, self.args.seq_len, self.args.batch, self.args.seed)
        self.exe.run(self.training.main, feed=_shard_windows(xs, ys), fetch_list=[self.training.loss],
                     scope=self.exe.scope.new_child())      # updates land in the child, dropped here

    def run_step(self, step: int) -> float:
        xs, ys = batch_at(self.corpus, step, self.args.seq_len, self.args.batch, self.args.seed)
        loss, = self.exe.run(self.training.main, feed=_shard_windows(xs, ys),
                             fetch_list=[self.training.loss])
        return float(loss)

    def measure_held_out(self) -> float:
        """Mean loss over fixed windows of the held-out text (never trained on)."""
        total = 0.0
        for xs, ys in self.val_batches:
            loss, = self.exe.run(self.val_program, feed=_shard_windows(xs, ys),
                                 fetch_list=[self.val_loss])
            total += float(loss)
        value = total / len(self.val_batches)
        self.val_losses[self.step_done] = value
        return value


def _shard_windows(xs, ys) -> dict:
    """This rank's windows of a ``[seq_len, batch]`` batch (all of them in one process)."""
    return {"chars": rg.distributed.shard(xs, axis=1), "next_chars": rg.distributed.shard(ys, axis=1)}


class Divergence:
    """Stops a run whose loss is not finite or far above where it started.

    A step's training loss is that of the parameters before its update; the
    held-out loss measured after the update checks the parameters a
    checkpoint would hold, so no checkpoint is written before it passes.
    """

    FACTOR, MARGIN = 3.0, 5.0      # "far above": more than max(3x, +5 nats) the first loss

    def __init__(self, args):
        self.lr = args.lr
        self.start: float | None = None

    def limit(self) -> float:
        return max(self.FACTOR * self.start, self.start + self.MARGIN)

    def check(self, loss: float, step: int, name: str = "loss") -> None:
        """TrainError if ``loss`` (the training loss, or ``name``) shows the run diverging."""
        if self.start is None and math.isfinite(loss):
            self.start = loss
        if not math.isfinite(loss):
            what = f"the {name} became {loss} at step {step}"
        elif loss > self.limit():
            what = f"the {name} diverged at step {step}: {loss:.4g}, up from {self.start:.4g}"
        else:
            return
        raise TrainError(f"{what} (learning rate {self.lr:g}); lower --lr or set a smaller --clip-norm")


def _log_line(file, step: int, loss: float, cps: float, peak: int, val: float | None) -> None:
    record = {"step": step, "loss": loss, "chars_per_s": round(cps, 1), "peak_bytes": int(peak)}
    if val is not None:
        record["val_loss"] = val
    file.write(json.dumps(record) + "\n")
    file.flush()      # a killed run keeps every line it logged


class _Reporter:
    """The rich progress bar and the text lines around it."""

    def __init__(self, args, job: "Job", text: TrainingText):
        from rich.console import Console
        self.args = args
        self.first = first = job.first
        self.total = first + args.steps
        # Several MPI ranks: rank 0 alone prints.
        self.console = Console(highlight=False, soft_wrap=True, quiet=rg.distributed.rank() != 0)
        self.every = args.log_every or max(1, args.steps // 10)
        where = (f"resuming {args.resume} at step {first}, to step {first + args.steps}" if args.resume
                 else "from scratch")
        if args.lr_schedule != "constant":
            where += f"; {args.lr_schedule} schedule over steps 1-{job.schedule_steps}"
        ranks = rg.distributed.world_size()
        where += f", on {ranks} MPI ranks ({args.batch // ranks} windows each)" if ranks > 1 else ""
        self.console.print(
            f"retrograd train: {args.model}, {args.layers} x {args.hidden} hidden, "
            f"{args.optimizer} lr {args.lr:g}, batch {args.batch} x {args.seq_len} chars, "
            f"{args.steps} steps {where}, precision {args.precision}, backend {args.backend}"
            f"{'' if args.device is None else ' on ' + args.device}, {_threads_words(job.exe.threads)}\n"
            f"corpus: {text.corpus.describe(len(text.train), len(text.held_out))}")

    def reports(self, step: int) -> bool:
        """Whether ``step`` gets a progress line (and a held-out loss)."""
        return (step - self.first) % self.every == 0 or step == self.total

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

                def tick(step: int, loss: float, cps: float, peak: int, val: float | None,
                         device_bytes: int | None = None) -> None:
                    # On a GPU, also what the array library holds on the device now.
                    shown = _megabytes(peak) + ("" if device_bytes is None
                                                else f", device {_megabytes(device_bytes)}")
                    progress.update(task, completed=step, loss=f"{loss:.3f}", speed=f"{cps:,.0f}",
                                    peak=shown)
                    if val is not None:
                        progress.console.print(f"step {step:>6}  loss {loss:.4f}  held-out {val:.4f}  "
                                               f"{cps:,.0f} chars/s  peak {shown}")
                yield tick
        return bar()

    def finish(self, losses: list[float], val_losses: dict[int, float], save_path: Path,
               sample: str) -> None:
        head = float(np.mean(losses[: max(1, len(losses) // 10)]))
        tail = float(np.mean(losses[-max(1, len(losses) // 10):]))
        self.console.print(f"loss {head:.4f} -> {tail:.4f} (mean of the first and last tenth of the steps)")
        if self.args.plot and len(losses) > 1:
            self.console.print(loss_curve(losses, val_losses, self.first + 1), markup=False)
        if self.args.plot_file:
            plot.save_loss_curve(self.args.plot_file, losses, val_losses, self.first + 1)
            self.console.print(f"drew the loss curve into {self.args.plot_file}")
        self.console.print(f"saved parameters and optimizer state to {save_path}")
        self.console.print("sample:", style="bold")
        self.console.print(sample, markup=False)


def _threads_words(threads: int) -> str:
    return "1 thread" if threads == 1 else f"{threads} threads"


def _megabytes(n: int) -> str:
    return f"{n / 2**20:.1f} MB"
