"""The character-level language model of ``retrograd train`` and ``retrograd sample``.

The data: a fixed list of standard-library modules read from
``sysconfig.get_paths()["stdlib"]`` (nothing is downloaded), so the text, and
with it the losses of a run, depend on the Python version's copies of those
modules. The last tenth of the characters is held out for validation and
never trained on (``split_corpus``).

The model: an embedding, ``layers`` recurrent layers (``rg.layers.lstm``,
``gru`` or ``milstm``) and a softmax over a fixed 96-character vocabulary.
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

import sysconfig
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

import retrograd as rg

from .errors import RetrogradError

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
    """The training job (or sampling) cannot go on; the message says what to change."""


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

    def for_backend(self, backend: str, device: str | None = None) -> "ModelConfig":
        """This config with the LSTM built as one fused op per layer where the backend runs it
        with a vendor kernel (torch on the CPU: oneDNN, as ``torch.nn.LSTM``); unchanged elsewhere.

        Example::

            cfg = ModelConfig().for_backend("torch")       # layers.lstm(..., fused=True)
        """
        fused = self.model == "lstm" and backend == "torch" and device in (None, "cpu")
        return replace(self, fused=fused) if fused != self.fused else self

    fused: bool = False         # the LSTM as layers.lstm(..., fused=True); set by for_backend


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
    if cfg.model == "lstm":
        h_all, h_last, _, c_last = rg.layers.lstm(x, cfg.hidden, h0=h0, c0=c0, name=name,
                                                  recompute=cfg.recompute, fused=cfg.fused)
        return h_all, h_last, c_last
    h_all, h_last, _, c_last = rg.layers.milstm(x, cfg.hidden, h0=h0, c0=c0, name=name,
                                                recompute=cfg.recompute)
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
                   clip_norm: float | None, seed: int, data_parallel: bool = False) -> Training:
    """The training program: mean cross-entropy of next characters, its backward pass and the updates.

    With ``data_parallel`` (several MPI ranks, each fed its shard of the
    batch) the gradients are averaged over the ranks before the updates
    (``rg.distributed.DataParallel``) and ``loss`` is the whole batch's: the
    mean of the ranks' losses.

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
        opt = _optimizer(optimizer, lr, clip_norm)
        (rg.distributed.DataParallel(opt) if data_parallel else opt).minimize(loss)
        if data_parallel:
            loss, = rg.distributed.all_reduce([loss], "mean")
        step = rg.optim.create_state("train.step", [1], "int64")
        rg.optim.increment(step)
    return Training(main, startup, net, loss, step)


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
    table = params.get("embed.w")
    if table is None or table.ndim != 2 or table.shape[0] != len(VOCAB):
        raise TrainError(f"{where} is not a model saved by `retrograd train` (it has no "
                         f"embed.w of {len(VOCAB)} rows)")
    for model in MODELS:
        layers = 0
        while f"{model}{layers}.w_hh" in params:
            layers += 1
        if layers:
            hidden = params[f"{model}0.w_hh"].shape[0]
            return ModelConfig(model=model, hidden=int(hidden), layers=layers, embed=int(table.shape[1]))
    raise TrainError(f"{where} is not a model saved by `retrograd train` (no recurrent layer "
                     f"{', '.join(m + '0.w_hh' for m in MODELS)})")


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
