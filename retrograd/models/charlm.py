"""The character-level language model of ``retrograd train`` and ``retrograd sample``.

The data: by default a fixed list of standard-library modules read from
``sysconfig.get_paths()["stdlib"]`` (nothing is downloaded), so the text, and
with it the losses of a run, depend on the Python version's copies of those
modules; or the user's UTF-8 files (``load_text``, ``retrograd train --text``).
The last tenth of the characters is held out for validation and never
trained on (``split_corpus``).

The vocabulary (``Vocab``): for the built-in corpus a fixed 96 characters
('\n' and printable ASCII, '?' standing for anything else); for your text
every character it holds plus one unknown symbol (U+FFFD). It is saved in the
parameter file with the model's kind and the optimizer (``RECORD``, a
persistable of the training program), so ``retrograd sample`` and exported
models use it and a resume with another model, optimizer or vocabulary is
refused.

The model: an embedding, ``layers`` recurrent layers (``rg.layers.lstm``,
``gru`` or ``milstm``) and a softmax over the vocabulary.
``build_training`` puts the forward pass, the backward pass and the
optimizer's updates in one program; ``build_loss`` and ``build_sampler`` are
forward-only programs with the same parameter names, for the held-out loss
and for generating text one character at a time.

Example::

    ids, files = load_corpus()
    train_ids, held_out = split_corpus(ids)
    t = build_training(ModelConfig(hidden=64), seq_len=32, optimizer="adam", lr=3e-3,
                       clip_norm=5.0, seed=0)
"""
from __future__ import annotations

import glob
import json
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

import retrograd as rg

from ..errors import RetrogradError
from .transformer_lm import time_major_logits

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


UNKNOWN_SYMBOL = "\ufffd"      # what characters outside a text's vocabulary read as
PROMPT_CHARS = 4               # a sample starts from the training text's first characters


class TrainError(RetrogradError):
    """The training job (or sampling) cannot go on; the message says what to change."""


@dataclass(frozen=True)
class Vocab:
    """The characters a model reads and writes: id ``i`` is ``chars[i]``; any other character
    reads as id ``unknown``.

    Example::

        v = Vocab.of_text("hello")        # chars "ehlo" + U+FFFD, unknown 4
        v.decode(v.encode("hell!"))       # "hell\ufffd"
    """
    chars: str
    unknown: int

    @classmethod
    def of_text(cls, text: str) -> "Vocab":
        """Every character of ``text`` (in code point order) plus the unknown symbol."""
        codes = np.unique(_code_points(text))
        chars = "".join(map(chr, codes.tolist()))
        if UNKNOWN_SYMBOL not in chars:
            chars += UNKNOWN_SYMBOL
        return cls(chars, chars.index(UNKNOWN_SYMBOL))

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """Character ids (int64) of ``text``."""
        table = _code_points(self.chars)
        order = np.argsort(table, kind="stable")
        codes = _code_points(text)
        at = np.minimum(np.searchsorted(table[order], codes), len(table) - 1)
        ids = order[at].astype(np.int64)
        ids[table[ids] != codes] = self.unknown
        return ids

    def decode(self, ids) -> str:
        """Text of character ids (the inverse of ``encode`` on the vocabulary)."""
        return "".join(self.chars[int(i)] for i in ids)


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)


BUILTIN_VOCAB = Vocab(VOCAB, _UNKNOWN)


def encode(text: str) -> np.ndarray:
    """Character ids (int64) of ``text`` in the built-in corpus's fixed vocabulary.

    Example::

        encode("def f():")      # array([69, 70, 71, 0, ...])
    """
    codes = _code_points(text)
    ids = np.full(codes.shape, _UNKNOWN, dtype=np.int64)
    ascii = codes < 128
    ids[ascii] = _ASCII_TO_ID[codes[ascii]]
    return ids


def decode(ids) -> str:
    """Text of character ids in the fixed vocabulary (the inverse of ``encode`` on it)."""
    return BUILTIN_VOCAB.decode(ids)


@dataclass
class Corpus:
    """The text a run trains on, as ids of its vocabulary.

    Example::

        corpus = load_text(["notes.txt", "more/*.md"])
        print(corpus.describe(), len(corpus.vocab))
    """
    ids: np.ndarray
    vocab: Vocab
    sources: list = field(default_factory=list)     # [(file name, characters)]
    prompt: str = "def "                            # where a sample starts by default
    builtin: bool = False

    def describe(self, train_chars: int, held_out_chars: int) -> str:
        """Where the text comes from and how it is split, for the header of a run.

        Example::

            corpus.describe(12_981, 1_442)
            # 'story.txt (12,351 characters), b.md (2,072): 12,981 characters to train on, ...'
        """
        if self.builtin:
            names = ", ".join(name for name, _ in self.sources[:4])
            return (f"{train_chars:,} characters of the standard library ({names}, ...), "
                    f"{held_out_chars:,} more held out")
        shown = [f"{name} ({n:,} characters)" for name, n in self.sources[:4]]
        more = len(self.sources) - len(shown)
        files = ", ".join(shown) + (f" and {more} more files" if more else "")
        return (f"{files}: {train_chars:,} characters to train on, {held_out_chars:,} held out; "
                f"vocabulary {len(self.vocab) - 1} characters + 1 unknown")


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


def builtin_corpus() -> Corpus:
    """The default training text, the standard-library modules of ``load_corpus``."""
    ids, files = load_corpus()
    return Corpus(ids, BUILTIN_VOCAB, [(name, 0) for name in files], "def ", builtin=True)


def load_text(patterns: Sequence[str]) -> Corpus:
    """The UTF-8 files ``patterns`` name (file names or globs such as ``notes/**/*.md``, each
    glob's matches in sorted order), joined, with the vocabulary of every character they hold.

    TrainError (one line naming the file) for a pattern that matches nothing, a directory, or a
    file that is not UTF-8.

    Example::

        corpus = load_text(["notes.txt", "more/*.md"])
    """
    texts, sources = [], []
    for path in expand_patterns(patterns):
        text = _read_utf8(path)
        texts.append(text)
        sources.append((str(path), len(text)))
    text = "".join(texts)
    if not text:
        raise TrainError(f"--text {' '.join(patterns)}: the files hold no text")
    vocab = Vocab.of_text(text)
    return Corpus(vocab.encode(text), vocab, sources, text[:PROMPT_CHARS])


def expand_patterns(patterns: Sequence[str]) -> list[Path]:
    found: list[Path] = []
    for pattern in patterns:
        matches = [Path(pattern)] if Path(pattern).exists() else \
            [Path(m) for m in sorted(glob.glob(pattern, recursive=True))]
        if not matches:
            missing = "no file matches" if glob.has_magic(pattern) else "no such file"
            raise TrainError(f"--text {pattern}: {missing}")
        for path in matches:
            if path.is_dir():
                raise TrainError(f"--text {path}: is a directory; name its files "
                                 f"(e.g. --text '{path / '*.txt'}')")
            if path not in found:
                found.append(path)
    return found


def _read_utf8(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TrainError(f"--text {path}: cannot read it: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TrainError(f"--text {path} is not UTF-8 text (byte {exc.start}: {exc.reason}); "
                         "convert it to UTF-8 first") from None


def check_seq_len(seq_len: int, train_ids: np.ndarray, held_out: np.ndarray) -> None:
    """TrainError (one line) when windows of ``seq_len`` characters and their next characters
    do not fit in the training text or in the held-out text."""
    for what, ids, spare in (("training", train_ids, 2), ("held-out", held_out, 1)):
        if len(ids) < seq_len + spare:
            raise TrainError(f"--seq-len {seq_len} is longer than the {what} text ({len(ids):,} "
                             f"characters); use --seq-len {max(1, len(ids) - spare)} or less, or "
                             "train on more text")


def split_corpus(ids: np.ndarray, held_out: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """``(training text, held-out text)``: the last ``held_out`` of the characters is never trained on.

    Example::

        train_ids, val_ids = split_corpus(load_corpus()[0])
    """
    cut = len(ids) - int(len(ids) * held_out)
    return ids[:cut], ids[cut:]


def held_out_batches(ids: np.ndarray, seq_len: int, batch: int, count: int = 4):
    """``count`` fixed batches of windows spread evenly over ``ids`` (the same every call)."""
    starts = np.linspace(0, len(ids) - seq_len - 1, count * batch).astype(np.int64)
    index = starts.reshape(count, 1, batch) + np.arange(seq_len)[None, :, None]
    return [(ids[i], ids[i + 1]) for i in index]


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

RECURRENT_MODELS = ("lstm", "gru", "milstm")
MODELS = RECURRENT_MODELS + ("transformer",)


@dataclass(frozen=True)
class ModelConfig:
    model: str = "lstm"
    hidden: int = 128
    layers: int = 1
    embed: int = 64
    recompute: object = None
    vocab: Vocab = BUILTIN_VOCAB
    heads: int = 4              # attention heads (--model transformer)

    def has_cell(self) -> bool:
        return self.model != "gru"

    def for_backend(self, backend: str, device: str | None = None) -> "ModelConfig":
        """This config, unchanged: the executor picks the backend's vendor LSTM kernel itself now
        (``passes.fuse_recurrent_cells``: oneDNN on the torch CPU backend, as ``torch.nn.LSTM``);
        kept for callers that still ask.

        Example::

            cfg = ModelConfig().for_backend("torch")       # == ModelConfig()
        """
        del backend, device
        return self

    fused: bool | None = None   # layers.lstm(..., fused=): None lets the executor choose


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
    if cfg.model == "transformer":
        return build_transformer_net(cfg, seq_len, with_states)
    ids = rg.data("chars", [seq_len, -1], dtype="int64")
    table = rg.create_parameter("embed.w", [len(cfg.vocab), cfg.embed], init=("normal", 0.0, 0.1))
    x = rg.gather(table, ids)                                   # [T, N, E]
    h0s, c0s, h_lasts, c_lasts = [], [], [], []
    for layer in range(cfg.layers):
        name = f"{cfg.model}{layer}"
        h0 = rg.data(f"{name}.h0", [-1, cfg.hidden]) if with_states else None
        c0 = rg.data(f"{name}.c0", [-1, cfg.hidden]) if with_states and cfg.has_cell() else None
        x, h_last, c_last = _recurrent_layer(cfg, x, h0, c0, name)
        h0s.append(h0), c0s.append(c0), h_lasts.append(h_last), c_lasts.append(c_last)
    w = rg.create_parameter("out.w", [cfg.hidden, len(cfg.vocab)])
    b = rg.create_parameter("out.b", [len(cfg.vocab)])
    logits = rg.matmul(rg.reshape(x, [-1, cfg.hidden]), w) + b
    return Net(ids, logits, h0s, c0s, h_lasts, c_lasts)


def build_transformer_net(cfg: ModelConfig, seq_len: int, with_states: bool) -> Net:
    """``--model transformer``: GPT-2's layout (``retrograd/models/transformer_lm.py``): ``layers`` blocks
    of ``rg.layers.transformer_block`` (``heads`` heads, width ``hidden``) over token embeddings
    plus learned positions, one per character of a window (``pos.w``: ``seq_len`` rows).

    It carries no state from one step to the next, so it has no one-step sampling program
    (``with_states``): text comes from ``retrograd/models/generation.py``'s key/value cache.
    """
    if with_states:
        raise TrainError("a transformer has no one-step sampling program (`retrograd export` without "
                         "--generate); use `retrograd export --generate` or `retrograd sample`")
    ids = rg.data("chars", [seq_len, -1], dtype="int64")
    return Net(ids, time_major_logits(ids, cfg, max_positions=seq_len), [], [], [], [])


def _recurrent_layer(cfg: ModelConfig, x, h0, c0, name: str):
    """One layer: ``(h_all, h_last, c_last or None)``."""
    if cfg.model == "gru":
        h_all, h_last = rg.layers.gru(x, cfg.hidden, h0=h0, name=name, recompute=cfg.recompute)
        return h_all, h_last, None
    if cfg.model == "lstm":
        h_all, h_last, _, c_last = rg.layers.lstm(x, cfg.hidden, h0=h0, c0=c0, name=name,
                                                  recompute=cfg.recompute, fused=cfg.fused)
        return h_all, h_last, c_last
    h_all, h_last, _, c_last = rg.layers.milstm(x, cfg.hidden, h0=h0, c0=c0, name=name,
                                                recompute=cfg.recompute)
    return h_all, h_last, c_last


# --optimizer NAME: the rg.optim class and the arguments the command fixes. A class this version
# of rg.optim lacks is named in one line when asked for (make_optimizer).
OPTIMIZERS = {
    "sgd": ("SGD", {}),
    "momentum": ("Momentum", {"momentum": 0.9}),
    "adam": ("Adam", {}),
    "adamw": ("AdamW", {}),
    "rmsprop": ("RMSProp", {}),
    "adagrad": ("Adagrad", {}),
}


def make_optimizer(name: str, lr, clip_norm: float | None, weight_decay: float | None = None):
    """The ``rg.optim`` optimizer ``--optimizer name`` means (``weight_decay`` None: the class's
    default). ``lr`` is a number or an ``rg.optim.lr`` schedule.

    Example::

        opt = make_optimizer("momentum", 0.1, clip_norm=5.0)     # rg.optim.Momentum(0.1, 0.9, ...)
    """
    class_name, fixed = OPTIMIZERS[name]
    cls = getattr(rg.optim, class_name, None)
    if cls is None:
        raise TrainError(f"--optimizer {name} is not available yet: it needs rg.optim.{class_name}, "
                         "which this version of retrograd does not have; use --optimizer "
                         f"{' or '.join(n for n, (c, _) in OPTIMIZERS.items() if hasattr(rg.optim, c))}")
    options = dict(fixed, clip_norm=clip_norm)
    if weight_decay is not None:
        options["weight_decay"] = weight_decay
    return cls(lr, **options)


# --lr-schedule NAME: (the rg.optim.lr function, its arguments from (base lr, warmup steps, total
# steps)). "step" divides the rate by 10 at each third of the run (torch's StepLR, gamma 0.1).
LR_SCHEDULES = {
    "constant": ("linear_warmup", lambda base, warmup, total: {"base": base, "warmup_steps": warmup}),
    "cosine": ("cosine", lambda base, warmup, total: {"base": base, "total_steps": total,
                                                      "warmup_steps": warmup}),
    "step": ("step_decay", lambda base, warmup, total: {"base": base,
                                                        "step_size": max(1, total // 3), "gamma": 0.1}),
}


def make_lr(schedule: str, base: float, warmup: int = 0, total_steps: int = 1):
    """The learning rate ``--lr-schedule schedule --warmup warmup`` means: ``base`` itself for a
    constant rate without warmup, else an ``rg.optim.lr`` schedule over ``total_steps`` updates.

    Example::

        lr = make_lr("cosine", 3e-3, warmup=100, total_steps=1000)   # rg.optim.lr.cosine(...)
    """
    if schedule == "constant" and warmup == 0:
        return base
    if schedule == "step" and warmup:
        raise TrainError("--warmup works with --lr-schedule constant or cosine, not step")
    if schedule == "cosine" and warmup >= total_steps:
        raise TrainError(f"--warmup {warmup} is not below the run's {total_steps} steps; "
                         "use a shorter --warmup or more --steps")
    function, arguments = LR_SCHEDULES[schedule]
    build = getattr(getattr(rg.optim, "lr", None), function, None)
    if build is None:
        raise TrainError(f"--lr-schedule {schedule}{' --warmup' if warmup else ''} is not available "
                         f"yet: it needs rg.optim.lr.{function}, which this version of retrograd does "
                         "not have; train with a constant --lr")
    kwargs = arguments(base, warmup, total_steps)
    return build(kwargs.pop("base"), **kwargs)


@dataclass
class Training:
    main: object
    startup: object
    net: Net
    loss: object
    step: object                # persistable int64[1]: training steps done (saved with the rest)


# --precision NAME: the dtype the products compute in (rg.amp.decorate), None for float32 throughout.
PRECISIONS = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}


def build_training(cfg: ModelConfig, seq_len: int, optimizer: str, lr,
                   clip_norm: float | None, seed: int, data_parallel: bool = False, *,
                   weight_decay: float | None = None, prompt: str = "def ", batch: int | None = None,
                   precision: str = "fp32", record: dict | None = None) -> Training:
    """The training program: mean cross-entropy of next characters, its backward pass and the updates.

    ``optimizer`` is a name of ``OPTIMIZERS``; ``lr`` a number or a schedule
    (``make_lr``). With ``data_parallel`` (several MPI ranks, each fed its
    shard of the batch) the gradients are averaged over the ranks before the
    updates (``rg.distributed.DataParallel``) and ``loss`` is the whole
    batch's: the mean of the ranks' losses. The startup program also writes
    ``RECORD`` (model kind, optimizer, vocabulary, ``prompt``; or ``record``,
    the run record of a file a resumed run continues), saved with the
    parameters. A transformer's byte ``cfg.recompute`` bounds the whole step at ``batch``
    windows (``whole_step_budget``). ``precision`` ``"bf16"``/``"fp16"`` trains in mixed
    precision (``rg.amp.decorate``; fp16 with dynamic loss scaling).

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
        opt = make_optimizer(optimizer, lr, clip_norm, weight_decay)
        if PRECISIONS[precision] is not None:
            if data_parallel:
                raise TrainError(f"--precision {precision} does not run under MPI yet; use --precision fp32")
            opt = rg.amp.decorate(opt, dtype=PRECISIONS[precision])
        (rg.distributed.DataParallel(opt) if data_parallel else opt).minimize(
            loss, **whole_step_budget(cfg, seq_len, batch))
        if data_parallel:
            loss, = rg.distributed.all_reduce([loss], "mean")
        step = rg.optim.create_state("train.step", [1], "int64")
        rg.optim.increment(step)
    _save_record(record if record is not None else run_record(cfg, optimizer, prompt), main, startup)
    return Training(main, startup, net, loss, step)


def whole_step_budget(cfg: ModelConfig, seq_len: int, batch: int | None) -> dict:
    """``minimize``'s memory options for ``cfg``: a transformer's byte ``recompute`` is the whole
    training step's ``memory_budget`` at ``[seq_len, batch]`` windows (a recurrent model's is
    each layer's own, given to the layer); ``{}`` otherwise.

    Example::

        whole_step_budget(ModelConfig("transformer", recompute=4 << 20), 64, 32)
        # {'memory_budget': 4194304, 'feed_shapes': {'chars': (64, 32), 'next_chars': (64, 32)}}
    """
    budget = cfg.recompute
    if cfg.model != "transformer" or isinstance(budget, bool) or not isinstance(budget, int):
        return {}
    if batch is None:
        raise TrainError("a transformer's memory budget needs the batch size its windows run at")
    return {"memory_budget": budget, "feed_shapes": {"chars": (seq_len, batch), "next_chars": (seq_len, batch)}}


# --- what the parameter file says about the run ---------------------------------------------

RECORD = "train.record"     # persistable int32 [n]: the code points of a JSON object


def run_record(cfg: ModelConfig, optimizer: str, prompt: str = "def ", options: dict | None = None) -> dict:
    """What a parameter file keeps about its run besides the arrays: the model kind, the
    optimizer, the vocabulary, the default sampling prompt and (``options``) the command's
    options a resumed run reads back.

    Example::

        run_record(ModelConfig(), "adam")["vocab"][:3]       # '\n !'
    """
    record = {"model": cfg.model, "optimizer": optimizer, "vocab": cfg.vocab.chars,
              "unknown": cfg.vocab.unknown, "prompt": prompt}
    if cfg.model == "transformer":
        record["heads"] = cfg.heads
    if options is not None:
        record["options"] = options
    return record


def _save_record(record: dict, main, startup) -> None:
    codes = np.frombuffer(json.dumps(record).encode("utf-32-le"), dtype=np.uint32).astype(np.int32)
    main.global_block().create_var(RECORD, [len(codes)], "int32", persistable=True)
    target = startup.global_block().create_var(RECORD, [len(codes)], "int32", persistable=True)
    with rg.program_guard(startup, rg.Program()):
        rg.assign(rg.constant(codes, "int32"), output=target)


def read_record(params: dict[str, np.ndarray], where: str) -> dict:
    """The run record of a parameter file's arrays (``{}`` for files saved before records:
    their vocabulary is the built-in one)."""
    codes = params.get(RECORD)
    if codes is None:
        return {}
    try:
        record = json.loads(np.asarray(codes, dtype=np.uint32).tobytes().decode("utf-32-le"))
        fits = isinstance(record["vocab"], str) and 0 <= record["unknown"] < len(record["vocab"])
    except (ValueError, KeyError, TypeError):       # not JSON, not an object, a key missing
        fits = False
    if not fits:
        raise TrainError(f"{where}: its {RECORD} is damaged (not the JSON `retrograd train` writes)")
    return record


def optimizer_of(params: dict[str, np.ndarray], record: dict) -> str:
    """The ``--optimizer`` a file was trained with: from its record, or for older files from
    the optimizer state it holds (``.moment2``: adam, ``.velocity``: momentum, none: sgd)."""
    if "optimizer" in record:
        return record["optimizer"]
    if any(name.endswith(".moment2") for name in params):
        return "adam"
    return "momentum" if any(name.endswith(".velocity") for name in params) else "sgd"


def build_loss(cfg: ModelConfig, seq_len: int, data_parallel: bool = False):
    """A forward-only program of the training loss (for held-out text): ``(program, loss)``;
    with ``data_parallel``, the mean of the ranks' losses on their shards."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        net = build_net(cfg, seq_len, with_states=False)
        targets = rg.data("next_chars", [seq_len, -1], dtype="int64")
        loss = rg.mean(rg.softmax_cross_entropy(net.logits, rg.reshape(targets, [-1])))
        if data_parallel:
            loss, = rg.distributed.all_reduce([loss], "mean")
    return main, loss


def config_from_params(params: dict[str, np.ndarray], where: str) -> ModelConfig:
    """The ``ModelConfig`` a parameter file saved by ``retrograd train`` was trained with.

    The names say the layer type and count (``lstm0.w_hh``, ``lstm1.w_hh``),
    the shapes the sizes; TrainError (naming ``where``) for any other file.
    """
    record = read_record(params, where)
    vocab = Vocab(record["vocab"], record["unknown"]) if record else BUILTIN_VOCAB
    table = params.get("embed.w")
    if table is None or table.ndim != 2 or table.shape[0] != len(vocab):
        raise TrainError(f"{where} is not a model saved by `retrograd train` (it has no "
                         f"embed.w of {len(vocab)} rows)")
    if record.get("model") == "transformer":
        layers = 0
        while f"block{layers}.ln1.w" in params:
            layers += 1
        return ModelConfig("transformer", hidden=int(table.shape[1]), layers=layers, embed=int(table.shape[1]),
                           vocab=vocab, heads=int(record.get("heads", 4)))
    for model in RECURRENT_MODELS:
        layers = 0
        while f"{model}{layers}.w_hh" in params:
            layers += 1
        if layers:
            hidden = params[f"{model}0.w_hh"].shape[0]
            return ModelConfig(model=model, hidden=int(hidden), layers=layers, embed=int(table.shape[1]),
                               vocab=vocab)
    raise TrainError(f"{where} is not a model saved by `retrograd train` (no recurrent layer "
                     f"{', '.join(m + '0.w_hh' for m in RECURRENT_MODELS)})")


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

    vocab = cfg.vocab
    for char_id in vocab.encode(prime[:-1]):
        advance(int(char_id))
    drawn = []
    char_id = int(vocab.encode(prime[-1:] or "\n")[0])
    for _ in range(length):
        char_id = _draw(rng, advance(char_id), temperature)
        drawn.append(char_id)
    return prime + vocab.decode(drawn)


def _draw(rng, p: np.ndarray, temperature: float) -> int:
    logits = np.log(np.maximum(p.astype(np.float64), 1e-30)) / temperature
    q = np.exp(logits - logits.max())
    return int(rng.choice(len(q), p=q / q.sum()))
