"""AllReduce (mean of floats, sum of ints, and its gradient) on 2 ranks; run by test_collectives.py.

Each rank holds different values; the results are checked against NumPy
here, on every rank, for each backend named on the command line. A failed
check raises, which (under ``python -m mpi4py``) aborts every rank.
"""
import sys

import numpy as np

import retrograd as rg

rank, size = rg.distributed.rank(), rg.distributed.world_size()
main, startup = rg.Program(), rg.Program()
with rg.program_guard(main, startup):
    x = rg.data("x", [3], dtype="float64")
    counts = rg.data("counts", [2], dtype="int64")
    w = rg.create_parameter("w", [3], dtype="float64")
    mean_xw, = rg.distributed.all_reduce([x * w], "mean")
    total, = rg.distributed.all_reduce([counts], "sum")
    loss = rg.sum(mean_xw * mean_xw)
    dx, dw = rg.gradients(loss, [x, w])

xs = [np.array([1.0, 2.0, 3.0]) * (r + 1) for r in range(size)]
w_value = np.array([0.5, -1.0, 2.0])
mean_xw_ref = np.mean([xr * w_value for xr in xs], axis=0)
for backend in sys.argv[1:]:
    exe = rg.Executor(backend=backend)
    exe.run(startup)
    exe.scope.set("w", w_value)
    got = exe.run(main, feed={"x": xs[rank], "counts": np.array([rank, 10])},
                  fetch_list=[mean_xw, total, dx, dw])
    # d/d(input) of a mean over ranks is the mean over ranks of the output gradients (2*y on every rank).
    want = [mean_xw_ref, np.array([sum(range(size)), 10 * size]), 2 * mean_xw_ref * w_value,
            2 * mean_xw_ref * xs[rank]]
    for name, g, e in zip(["mean", "sum", "dx", "dw"], got, want):
        np.testing.assert_allclose(g, e, rtol=1e-12, err_msg=f"rank {rank}, {backend}: {name}")
    sys.stdout.write(f"rank {rank} {backend} ok\n")
