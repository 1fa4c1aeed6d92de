"""A character-level language model: embedding -> LSTM -> softmax over the next character.

The corpus is the source of a few Python standard-library modules, so nothing
is downloaded. The whole training step — forward over T time steps, backward
through time, Adam updates — is one program run by the executor; sampling
uses a second program with a single time step whose parameters are the same
names in the same scope.

Run it with::

    python examples/char_lm.py                      # about 30 s on 2 cores (400 steps)
    python examples/char_lm.py --cell gru --steps 300
    python examples/char_lm.py --cell milstm --hidden 128

It prints the loss (and bits per character) as it trains and a sample at the end.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import time

import numpy as np

import retrograd as rg

CORPUS_MODULES = ("textwrap", "string", "bisect", "heapq", "shlex")


def load_corpus(modules=CORPUS_MODULES) -> str:
    """The concatenated source of some standard-library modules (non-ASCII characters as '?')."""
    text = "\n".join(inspect.getsource(importlib.import_module(m)) for m in modules)
    return "".join(ch if ord(ch) < 128 else "?" for ch in text)


class Vocab:
    """Characters <-> ids."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {ch: i for i, ch in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        return np.array([self.index[ch] for ch in text], dtype=np.int64)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def _recurrent_layer(cell: str, x, hidden: int, states: list | None):
    """Run the chosen layer; return (h_all, last states as a list)."""
    states = states or []
    if cell == "gru":
        h_all, h_last = rg.layers.gru(x, hidden, *states[:1], name="rnn")
        return h_all, [h_last]
    layer = rg.layers.lstm if cell == "lstm" else rg.layers.milstm
    h_all, h_last, _, c_last = layer(x, hidden, *states[:2], name="rnn")
    return h_all, [h_last, c_last]


def n_states(cell: str) -> int:
    return 1 if cell == "gru" else 2


def build_model(ids, vocab: int, embed: int, hidden: int, cell: str, states=None):
    """Logits [T, N, vocab] for ids [T, N] (and the recurrent layer's last states)."""
    x = rg.layers.embedding(ids, vocab, embed, name="embed")
    h_all, last = _recurrent_layer(cell, x, hidden, states)
    return rg.layers.fc(h_all, vocab, name="out"), last


def build_training(vocab: int, embed: int, hidden: int, cell: str, lr: float, seed: int = 0):
    """(main, startup, loss): one Adam step on a batch of ids/targets [T, N] per run."""
    main, startup = rg.Program(random_seed=seed), rg.Program(random_seed=seed)
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, -1], dtype="int64")
        targets = rg.data("targets", [-1, -1], dtype="int64")
        logits, _ = build_model(ids, vocab, embed, hidden, cell)
        loss = rg.mean(rg.softmax_cross_entropy(logits, targets))
        rg.optim.Adam(lr, clip_norm=5.0).minimize(loss)
    return main, startup, loss


def build_sampler(vocab: int, embed: int, hidden: int, cell: str):
    """One time step: (program, state feeds, probabilities, new states), sharing the trained names."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        ids = rg.data("ids", [1, -1], dtype="int64")
        states = [rg.data(f"state{i}", [-1, hidden]) for i in range(n_states(cell))]
        logits, last = build_model(ids, vocab, embed, hidden, cell, states)
        probs = rg.softmax(logits)
    return main, states, probs, last


def batches(data: np.ndarray, seq_len: int, batch: int, rng: np.random.Generator):
    """Endless random windows: ids and next-character targets, time-major [T, N]."""
    while True:
        starts = rng.integers(0, len(data) - seq_len - 1, batch)
        windows = np.stack([data[s:s + seq_len + 1] for s in starts], axis=1)
        yield windows[:-1], windows[1:]


def sample(exe: rg.Executor, vocab: Vocab, hidden: int, cell: str, prime: str, length: int,
           temperature: float = 0.8, seed: int = 0) -> str:
    """Generate ``length`` characters after ``prime`` with the trained parameters in ``exe.scope``."""
    embed = exe.scope.get("embed.w").shape[1]
    program, state_vars, probs, last = build_sampler(len(vocab), embed, hidden, cell)
    rng = np.random.default_rng(seed)
    states = [np.zeros((1, hidden), np.float32) for _ in state_vars]

    def step(token: int) -> np.ndarray:
        nonlocal states
        feed = {"ids": np.array([[token]], np.int64), **{v.name: s for v, s in zip(state_vars, states)}}
        p, *states = exe.run(program, feed=feed, fetch_list=[probs] + last)
        return p[0, 0].astype(np.float64)

    for ch in prime[:-1]:                       # read the prime, keep only the states
        step(vocab.index.get(ch, 0))
    token, out = vocab.index.get(prime[-1], 0), []
    for _ in range(length):
        logits = np.log(np.maximum(step(token), 1e-12)) / temperature
        weights = np.exp(logits - logits.max())
        token = int(rng.choice(len(vocab), p=weights / weights.sum()))
        out.append(vocab.chars[token])
    return prime + "".join(out)


def main(steps: int = 400, hidden: int = 128, embed: int = 32, seq_len: int = 64, batch: int = 32,
         lr: float = 3e-3, cell: str = "lstm", sample_length: int = 300, log_every: int = 50,
         seed: int = 0) -> float:
    """Train and print progress and a sample; return the mean loss of the last ``log_every`` steps."""
    text = load_corpus()
    vocab = Vocab(text)
    data = vocab.encode(text)
    print(f"corpus: {len(text)} characters, vocabulary {len(vocab)}; {cell} with {hidden} units")
    main_prog, startup, loss = build_training(len(vocab), embed, hidden, cell, lr, seed)
    exe = rg.Executor()
    exe.run(startup)
    stream = batches(data, seq_len, batch, np.random.default_rng(seed))
    recent: list[float] = []
    started = time.perf_counter()
    for step in range(1, steps + 1):
        ids, targets = next(stream)
        loss_v, = exe.run(main_prog, feed={"ids": ids, "targets": targets}, fetch_list=[loss])
        recent = (recent + [float(loss_v)])[-log_every:]
        if step % log_every == 0 or step == steps:
            mean = float(np.mean(recent))
            rate = step * seq_len * batch / (time.perf_counter() - started)
            print(f"step {step:5d}  loss {mean:.3f}  ({mean / np.log(2):.2f} bits/char)  "
                  f"{rate:,.0f} chars/s  peak {exe.last_stats.peak_bytes / 2**20:.1f} MB")
    if sample_length:
        print("--- sample ---")
        print(sample(exe, vocab, hidden, cell, "def ", sample_length, seed=seed))
    return float(np.mean(recent))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--embed", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--cell", choices=["lstm", "gru", "milstm"], default="lstm")
    parser.add_argument("--sample-length", type=int, default=300)
    args = parser.parse_args()
    main(args.steps, args.hidden, args.embed, args.seq_len, args.batch, args.lr, args.cell,
         args.sample_length)
