"""Data-parallel Adam on shards; run by test_data_parallel.py under ``mpiexec -n 2``.

Each rank builds its program with its own seed (so only the startup
``Broadcast`` can make the initial parameters agree), trains STEPS steps on
its shard of every batch and saves its parameters and optimizer state to
``<prefix>.rank<r>.npz``. The test compares them with one process trained on
the whole batches (``build`` and ``batches`` below, imported by the test).
"""
import sys

import numpy as np

import retrograd as rg

BATCH, STEPS = 8, 3


def build(wrap, seed: int):
    """An MLP classifier with Adam; its clipping and weight decay see the averaged gradients
    (Adam alone would not tell a sum over the ranks from a mean)."""
    main, startup = rg.Program(random_seed=seed), rg.Program(random_seed=seed)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 6])
        labels = rg.data("labels", [-1], dtype="int64")
        h = rg.layers.fc(x, 8, act="tanh", name="fc1")
        logits = rg.layers.fc(h, 3, name="fc2")
        loss = rg.mean(rg.softmax_cross_entropy(logits, labels))
        opt = wrap(rg.optim.Adam(0.05, clip_norm=0.5, weight_decay=0.1))
        opt.minimize(loss)
    return main, startup, loss, opt.grad_norm


def batches():
    rng = np.random.default_rng(7)
    for _ in range(STEPS):
        yield {"x": rng.standard_normal((BATCH, 6)).astype("float32"),
               "labels": rng.integers(0, 3, size=BATCH)}


def persistables(exe, main) -> dict:
    return {v.name: np.array(exe.scope.get(v.name)) for v in main.list_vars() if v.persistable}


def run(prefix: str) -> None:
    rank = rg.distributed.rank()
    main, startup, loss, grad_norm = build(rg.distributed.DataParallel, seed=rank + 1)
    exe = rg.Executor()
    exe.run(startup)
    norms = []
    for feed in batches():
        shard = {name: rg.distributed.shard(value) for name, value in feed.items()}
        norms.append(exe.run(main, feed=shard, fetch_list=[grad_norm])[0])
    np.savez(f"{prefix}.rank{rank}.npz", grad_norms=np.array(norms), **persistables(exe, main))


if __name__ == "__main__":
    run(sys.argv[1])
