"""Rank 1 builds a wider hidden layer than rank 0.

Run by test_data_parallel.py under ``mpiexec -n 2``: every rank must get a
RetrogradError naming the parameter from the startup program's Broadcast,
before any step; each prints it and exits cleanly.
"""
import sys

import numpy as np

import retrograd as rg

rank = rg.distributed.rank()
main, startup = rg.Program(random_seed=1), rg.Program(random_seed=1)
with rg.program_guard(main, startup):
    x = rg.data("x", [-1, 6])
    h = rg.layers.fc(x, 8 + rank, act="tanh", name="hidden")
    loss = rg.mean(rg.square(rg.layers.fc(h, 1, name="out")))
    rg.distributed.DataParallel(rg.optim.Adam(0.01)).minimize(loss)
exe = rg.Executor()
try:
    exe.run(startup)
except rg.RetrogradError as exc:
    sys.stdout.write(f"rank {rank} refused: {type(exc).__name__}: {exc}\n")   # one write: ranks share stdout
else:
    exe.run(main, feed={"x": np.ones((2, 6), "float32")})
    sys.stdout.write(f"rank {rank} trained a mismatched program\n")
