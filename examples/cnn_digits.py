"""A small CNN on scikit-learn's 8x8 digits: conv layers, max pooling, Adam, a held-out split.

The 1797 digit images ship with scikit-learn (``sklearn.datasets.load_digits``:
nothing is downloaded; ``pip install "retrograd[examples]"``). A fifth of them,
picked with a fixed seed, is held out; the model never trains on it::

    x [N, 1, 8, 8] -> conv 3x3, 16 filters, relu -> conv 3x3, 32 filters, relu
                   -> max_pool 2x2 -> [N, 32, 4, 4] -> fc 64, relu -> fc 10 -> softmax cross-entropy

The default run (600 Adam steps of 64 images) reaches about 98-99% held-out
accuracy in well under a minute on 2 cores with the NumPy backend.

Run it with::

    python examples/cnn_digits.py
    python examples/cnn_digits.py --steps 200 --backend torch
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import retrograd as rg


def load_split(seed: int = 0, held_out: float = 0.2):
    """(x_train, y_train, x_test, y_test): images [N, 1, 8, 8] in [0, 1], int64 labels."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[:, None, :, :]
    y = digits.target.astype("int64")
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(len(y) * held_out))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def model(images):
    """Logits [N, 10] of images [N, 1, 8, 8]; the parameters are named, so a second program
    built by this function shares them through the scope."""
    h = rg.layers.conv2d(images, 16, 3, padding=1, act="relu", name="c1")
    h = rg.layers.conv2d(h, 32, 3, padding=1, act="relu", name="c2")
    h = rg.max_pool2d(h, 2)                                           # [N, 32, 4, 4]
    h = rg.layers.fc(rg.reshape(h, [-1, 32 * 4 * 4]), 64, act="relu", name="fc1")
    return rg.layers.fc(h, 10, name="logits")


def build(lr: float, seed: int):
    """(train program, startup, loss, eval program, eval logits)."""
    main, startup = rg.Program(random_seed=seed), rg.Program(random_seed=seed)
    with rg.program_guard(main, startup):
        images = rg.data("images", [-1, 1, 8, 8])
        labels = rg.data("labels", [-1], dtype="int64")
        loss = rg.mean(rg.softmax_cross_entropy(model(images), labels))
        rg.optim.Adam(lr).minimize(loss)
    # TODO: evaluate through main.clone(for_test=True) once Program.clone takes for_test; until then
    # a forward-only program built by the same function reads the same parameters from the scope.
    evaluation = rg.Program(random_seed=seed)
    with rg.program_guard(evaluation, rg.Program()):
        logits = model(rg.data("images", [-1, 1, 8, 8]))
    return main, startup, loss, evaluation, logits


def accuracy(exe, evaluation, logits, x, y, batch: int = 512) -> float:
    correct = 0
    for start in range(0, len(y), batch):
        out, = exe.run(evaluation, feed={"images": x[start:start + batch]}, fetch_list=[logits])
        correct += int((out.argmax(axis=1) == y[start:start + batch]).sum())
    return correct / len(y)


def main(steps: int = 600, batch: int = 64, lr: float = 3e-3, seed: int = 0, backend: str = "numpy",
         log_every: int = 100) -> dict:
    """Train, then evaluate on the held-out images; returns the losses and accuracies."""
    x_train, y_train, x_test, y_test = load_split(seed)
    program, startup, loss, evaluation, logits = build(lr, seed)
    exe = rg.Executor(backend=backend)
    exe.run(startup)
    rng = np.random.default_rng(seed)
    started, loss_value = time.perf_counter(), float("nan")
    for step in range(1, steps + 1):
        picked = rng.integers(0, len(y_train), batch)
        loss_value, = exe.run(program, feed={"images": x_train[picked], "labels": y_train[picked]},
                              fetch_list=[loss])
        loss_value = float(loss_value)
        if log_every and step % log_every == 0:
            print(f"step {step:4d}  loss {loss_value:.4f}  {time.perf_counter() - started:5.1f} s")
    result = {"steps": steps, "loss": loss_value,
              "train_accuracy": accuracy(exe, evaluation, logits, x_train, y_train),
              "test_accuracy": accuracy(exe, evaluation, logits, x_test, y_test),
              "seconds": time.perf_counter() - started}
    print(f"held-out accuracy {result['test_accuracy']:.2%} ({len(y_test)} images), "
          f"train {result['train_accuracy']:.2%}, {result['seconds']:.1f} s")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="numpy", help="numpy, torch, onnxruntime, ...")
    args = parser.parse_args()
    main(steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed, backend=args.backend)
