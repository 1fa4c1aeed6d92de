"""Rank 1 fails right after ``import retrograd``, before any collective, while rank 0 goes on to
the startup Broadcast; run by test_data_parallel.py under a plain ``mpiexec -n 2 python``.
Regression: rank 0 used to wait for rank 1 for ever (MPI was started only by the first collective)."""
import os

import numpy as np

import retrograd as rg

if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK")) == "1":
    raise RuntimeError("rank 1 fails before its first collective")
main, startup = rg.Program(random_seed=1), rg.Program(random_seed=1)
with rg.program_guard(main, startup):
    x = rg.data("x", [-1, 6])
    loss = rg.mean(rg.square(rg.layers.fc(x, 4, name="fc")))
    rg.distributed.DataParallel(rg.optim.SGD(0.1)).minimize(loss)
exe = rg.Executor()
exe.run(startup)
exe.run(main, feed={"x": np.ones((2, 6), "float32")})
print("rank 0 trained without rank 1", flush=True)
