"""Rank 1 feeds a batch of the wrong width while rank 0 waits in the AllReduce.

Run by test_data_parallel.py under ``mpiexec -n 2``: the FeedError on rank 1
must end every rank (no hang) with its message on stderr.
"""
import numpy as np

import retrograd as rg

main, startup = rg.Program(random_seed=1), rg.Program(random_seed=1)
with rg.program_guard(main, startup):
    x = rg.data("x", [-1, 6])
    loss = rg.mean(rg.square(rg.layers.fc(x, 4, name="fc")))
    rg.distributed.DataParallel(rg.optim.SGD(0.1)).minimize(loss)
exe = rg.Executor()
exe.run(startup)
width = 6 if rg.distributed.rank() == 0 else 5
exe.run(main, feed={"x": np.ones((4, width), "float32")})
print(f"rank {rg.distributed.rank()} finished a step it should not have", flush=True)
