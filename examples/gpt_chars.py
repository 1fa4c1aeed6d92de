"""A small GPT-style character model: embeddings -> transformer blocks -> a softmax over characters.

The model (GPT-2's layout, tiny)::

    x = tok[ids] + pos[positions]                       # [N, L, D]: token and learned position embeddings
    x = transformer_block(x) x layers                   # pre-norm, causal self-attention + GELU MLP
    logits = fc(layer_norm(x))                          # [N, L, vocab]

trained to predict the next character of the built-in corpus (Python
standard-library sources, ``retrograd.models.charlm``: nothing is downloaded) with
AdamW and a cosine learning-rate schedule with warmup. The held-out loss is
measured with ``main.clone(for_test=True)``, the forward-only form of the
training program (no updates, dropout off), on text never trained on, and
compared with the unigram loss (the entropy of the character frequencies, what
a model that ignores context gets). Generation runs the same test program on
the characters so far (positions are fed, so any length up to ``seq_len``).

Run it with::

    python examples/gpt_chars.py                    # 300 steps, 75-115 s on 2 cores (NumPy)
    python examples/gpt_chars.py --layers 4 --width 128 --steps 1000 --backend torch
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

import retrograd as rg
from retrograd.models import charlm

VOCAB = len(charlm.VOCAB)


@dataclass(frozen=True)
class Config:
    width: int = 64          # D
    heads: int = 4
    layers: int = 2
    seq_len: int = 64        # L, also the number of learned positions
    dropout: float = 0.0


def build_model(ids, positions, cfg: Config):
    """Logits [N, L, vocab] for ids [N, L] at positions [L] (0, 1, ...)."""
    x = (rg.layers.embedding(ids, VOCAB, cfg.width, name="tok")
         + rg.layers.embedding(positions, cfg.seq_len, cfg.width, name="pos"))
    for i in range(cfg.layers):
        x = rg.layers.transformer_block(x, cfg.heads, causal=True, dropout=cfg.dropout, name=f"blk{i}")
    return rg.layers.fc(rg.layers.layer_norm(x, name="ln_f"), VOCAB, name="head")


@dataclass
class Model:
    main: rg.Program
    startup: rg.Program
    test: rg.Program         # main.clone(for_test=True)
    loss: rg.Var
    logits: rg.Var


def build(cfg: Config, lr: float, steps: int, seed: int = 0) -> Model:
    """The training program (forward, backward, AdamW) and its test form."""
    main, startup = rg.Program(random_seed=seed), rg.Program(random_seed=seed)
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, -1], dtype="int64")                   # [N, L], batch-major
        targets = rg.data("targets", [-1, -1], dtype="int64")
        positions = rg.data("positions", [-1], dtype="int64")           # [L]
        logits = build_model(ids, positions, cfg)
        loss = rg.mean(rg.softmax_cross_entropy(logits, targets))
        schedule = rg.optim.lr.cosine(lr, total_steps=steps, warmup_steps=max(1, steps // 10), min_lr=lr / 10)
        rg.optim.AdamW(schedule, weight_decay=0.01, clip_norm=1.0).minimize(loss)
    return Model(main, startup, main.clone(for_test=True), loss, logits)


def unigram_loss(train_ids: np.ndarray, held_out: np.ndarray) -> float:
    """Cross-entropy of the held-out text under the training text's character frequencies."""
    counts = np.bincount(train_ids, minlength=VOCAB) + 1.0          # +1: no character has p = 0
    log_p = np.log(counts / counts.sum())
    return float(-log_p[held_out].mean())


def batch_major(ids: np.ndarray, targets: np.ndarray) -> dict:
    """charlm's time-major [L, N] windows as the model's [N, L] feed."""
    return {"ids": np.ascontiguousarray(ids.T), "targets": np.ascontiguousarray(targets.T),
            "positions": np.arange(ids.shape[0], dtype=np.int64)}


def held_out_loss(exe: rg.Executor, model: Model, held_out: np.ndarray, seq_len: int, batch: int) -> float:
    losses = [exe.run(model.test, feed=batch_major(i, t), fetch_list=[model.loss])[0]
              for i, t in charlm.held_out_batches(held_out, seq_len, batch)]
    return float(np.mean(losses))


def generate(exe: rg.Executor, model: Model, prime: str, length: int, seq_len: int,
             temperature: float = 0.8, seed: int = 0) -> str:
    """``prime`` and ``length`` sampled characters, each from the test program's last logits."""
    rng = np.random.default_rng(seed)
    ids = list(charlm.encode(prime))
    for _ in range(length):
        window = np.array(ids[-seq_len:], dtype=np.int64)[None]
        feed = {"ids": window, "positions": np.arange(window.shape[1], dtype=np.int64),
                "targets": np.zeros_like(window)}
        logits, = exe.run(model.test, feed=feed, fetch_list=[model.logits])
        scaled = logits[0, -1].astype(np.float64) / temperature
        p = np.exp(scaled - scaled.max())
        ids.append(int(rng.choice(VOCAB, p=p / p.sum())))
    return charlm.decode(ids)


def main(steps: int = 300, cfg: Config = Config(), batch: int = 32, lr: float = 3e-3, backend: str = "numpy",
         log_every: int = 50, sample_length: int = 200, seed: int = 0) -> dict:
    """Train, print progress, the held-out and unigram losses and a sample; return the numbers."""
    ids, files = charlm.load_corpus()
    train_ids, held_out = charlm.split_corpus(ids)
    unigram = unigram_loss(train_ids, held_out)
    print(f"corpus: {len(ids):,} characters from {len(files)} files; unigram loss {unigram:.3f} nats")
    model = build(cfg, lr, steps, seed)
    exe = rg.Executor(backend=backend)
    exe.run(model.startup)
    recent: list[float] = []
    started = time.perf_counter()
    for step in range(steps):
        feed = batch_major(*charlm.batch_at(train_ids, step, cfg.seq_len, batch, seed))
        loss, = exe.run(model.main, feed=feed, fetch_list=[model.loss])
        recent = (recent + [float(loss)])[-log_every:]
        if (step + 1) % log_every == 0 or step + 1 == steps:
            rate = (step + 1) * cfg.seq_len * batch / (time.perf_counter() - started)
            print(f"step {step + 1:5d}  loss {np.mean(recent):.3f}  {rate:,.0f} chars/s")
    result = {"train_loss": float(np.mean(recent)), "unigram_loss": unigram,
              "held_out_loss": held_out_loss(exe, model, held_out, cfg.seq_len, batch),
              "seconds": time.perf_counter() - started}
    print(f"held-out loss {result['held_out_loss']:.3f} nats (unigram {unigram:.3f}) "
          f"after {steps} steps, {result['seconds']:.1f} s")
    if sample_length:
        print("--- sample ---")
        print(generate(exe, model, "def ", sample_length, cfg.seq_len, seed=seed))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--backend", default="numpy", help="numpy (default), torch or onnxruntime")
    parser.add_argument("--sample-length", type=int, default=200)
    args = parser.parse_args()
    main(args.steps, Config(args.width, args.heads, args.layers, args.seq_len, args.dropout), args.batch,
         args.lr, args.backend, sample_length=args.sample_length)
