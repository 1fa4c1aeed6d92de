"""Data parallelism over MPI (mpi4py): the same program on every rank, gradients averaged.

Without ``mpiexec`` (or without mpi4py) ``rank()`` is 0, ``world_size()`` 1
and the same code runs in one process. Importing this package starts MPI
only under a launcher that started several processes, so that from then on
an uncaught exception on one rank stops them all.

Example:
    ```python
    import numpy as np
    import retrograd as rg

    rank, size = rg.distributed.rank(), rg.distributed.world_size()   # mpiexec -n 4 python train.py
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        loss = rg.mean(rg.square(rg.layers.fc(x, 1, name="fc")))
        opt = rg.distributed.DataParallel(rg.optim.Adam(1e-3))
        params_grads = opt.minimize(loss)      # backward, AllReduce (mean over ranks), updates
    exe = rg.Executor()
    exe.run(startup)                           # every rank starts from rank 0's parameters
    for xb in [np.ones((8, 3), "float32")] * 2:
        exe.run(main, feed={"x": rg.distributed.shard(xb)})   # each rank its 1/size of the batch
    ```
"""
from ..errors import FeedError
from .comm import abort_all_ranks, launcher_size, start_under_launcher
from .comm import world as _world
from .data_parallel import DataParallel, average_gradients, broadcast_initial_values
from .ops import all_reduce, broadcast


def rank() -> int:
    """This process's rank in ``MPI.COMM_WORLD`` (0 in a single process).

    Returns:
        The rank.

    Raises:
        BackendError: A launcher started several processes but mpi4py is missing.

    Example:
        ```python
        import os
        import tempfile

        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            rg.layers.fc(rg.data("x", [-1, 3]), 2, name="fc")
        exe = rg.Executor()
        exe.run(startup)
        if rg.distributed.rank() == 0:                     # one rank writes the checkpoint
            rg.save_params(exe.scope, os.path.join(tempfile.mkdtemp(), "model.npz"), main)
        ```
    """
    return _world().rank


def world_size() -> int:
    """The number of ranks in ``MPI.COMM_WORLD`` (1 in a single process).

    Returns:
        The number of ranks.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        batch = np.arange(8)
        mine = batch[rg.distributed.rank()::rg.distributed.world_size()]
        assert rg.distributed.world_size() >= 1 and len(mine) == 8 // rg.distributed.world_size()
        ```
    """
    return _world().size


def shard(array, axis: int = 0):
    """This rank's equal share of ``array`` along ``axis`` (contiguous blocks, in rank order).

    The size along ``axis`` must divide by ``world_size()``: equal shards keep
    the mean of the ranks' mean losses equal to the whole batch's mean loss.

    Args:
        array: A NumPy array (or anything with ``shape`` and slicing).
        axis: The axis to split.

    Returns:
        This rank's block.

    Raises:
        FeedError: The size along ``axis`` does not divide by ``world_size()``.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        xb = np.arange(12).reshape(6, 2)
        mine = rg.distributed.shard(xb)
        assert len(mine) == 6 // rg.distributed.world_size()
        ```
    """
    size, index = world_size(), rank()
    count = array.shape[axis]
    if count % size:
        raise FeedError(f"cannot split {count} examples (axis {axis}) evenly over {size} ranks; "
                        f"use a batch size that divides by {size}")
    per_rank = count // size
    where = [slice(None)] * array.ndim
    where[axis] = slice(index * per_rank, (index + 1) * per_rank)
    return array[tuple(where)]


__all__ = ["rank", "world_size", "DataParallel", "all_reduce", "broadcast", "average_gradients",
           "broadcast_initial_values", "shard", "abort_all_ranks", "launcher_size"]

start_under_launcher()
