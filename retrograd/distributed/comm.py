"""Who the ranks are and how they talk: mpi4py's ``COMM_WORLD``, or one process alone.

MPI is started only when a launcher (``mpiexec``, ``srun``) says this
process is one of several (then as soon as ``retrograd`` is imported), or
when the user already started it (``from mpi4py import MPI``, ``python -m
mpi4py``). Otherwise ``world()`` is a one-rank stand-in whose collectives do
nothing, so the same program runs unchanged in a plain ``python train.py``.

Under several ranks, an exception that nobody catches stops every rank
(``MPI_Abort``) after printing its traceback: the others would otherwise wait
in the next collective for ever.

Example::

    comm = world()
    print(comm.rank, comm.size)
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time

import numpy as np

from ..errors import BackendError

ABORT_GRACE_S = 0.2     # seconds between printing the error and MPI_Abort

# Environment variables in which launchers announce the number of processes they started
# (MPICH/Hydra, Intel MPI and Cray PMI; Open MPI; MVAPICH; Slurm's srun).
LAUNCHER_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")
INSTALL_HINT = 'pip install "retrograd[mpi]" (mpi4py and an MPI library; or mpi4py built against your site MPI)'


class LocalComm:
    """One process alone: every collective leaves the buffers as they are."""

    rank = 0
    size = 1

    def allreduce_sum(self, buffer: np.ndarray) -> None:
        """Sum ``buffer`` over the ranks, in place."""

    def broadcast(self, buffer: np.ndarray, root: int = 0) -> None:
        """Overwrite ``buffer`` with rank ``root``'s, in place."""

    def allgather(self, value) -> list:
        """Every rank's ``value``, in rank order."""
        return [value]


class MPIComm:
    """mpi4py's ``COMM_WORLD`` with the three collectives retrograd uses, on host NumPy buffers."""

    def __init__(self, mpi):
        self._mpi = mpi
        self._comm = mpi.COMM_WORLD
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()

    def allreduce_sum(self, buffer: np.ndarray) -> None:
        self._comm.Allreduce(self._mpi.IN_PLACE, buffer, op=self._mpi.SUM)

    def broadcast(self, buffer: np.ndarray, root: int = 0) -> None:
        self._comm.Bcast(buffer, root=root)

    def allgather(self, value) -> list:
        return self._comm.allgather(value)

    def abort(self, code: int = 1) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        # The launcher stops forwarding the ranks' output once one aborts: give it a moment to
        # pass on what this rank just printed (CI lost a traceback once without it).
        time.sleep(ABORT_GRACE_S)
        self._comm.Abort(code)


_world: LocalComm | MPIComm | None = None


def world() -> LocalComm | MPIComm:
    """The communicator of all ranks (created on first use)."""
    global _world
    if _world is None:
        _world = _connect()
    return _world


def start_under_launcher() -> None:
    """Under a launcher that started several processes, with mpi4py installed, start MPI now:
    the abort-on-error hook is then in place before the first collective, so a rank failing
    early still stops the others (they would wait for it in ``MPI_Init`` or a collective)."""
    if launcher_size() > 1 and importlib.util.find_spec("mpi4py") is not None:
        try:
            world()
        except BackendError:
            pass        # not at import: the first rank(), world_size() or collective raises it


def launcher_size() -> int:
    """How many processes a launcher (``mpiexec``, ``srun``...) says it started; 1 when none did.

    Read from the launcher's environment variables; never starts MPI.

    Returns:
        The number of processes.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        if rg.distributed.launcher_size() > 1:       # started by mpiexec -n 2 ...
            print("rank", rg.distributed.rank(), "of", rg.distributed.world_size())
        ```
    """
    for name in LAUNCHER_SIZE_VARS:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 1


def _connect() -> LocalComm | MPIComm:
    requested = launcher_size()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        if requested <= 1:
            return LocalComm()
        mpi = _import_mpi(requested)
    comm = MPIComm(mpi)
    if requested > 1 and comm.size != requested:
        # Each process would train alone, all of them writing the same files.
        raise BackendError(f"the launcher started {requested} processes but MPI sees {comm.size}: "
                           "mpi4py's MPI library is not the launcher's (use the mpiexec of the MPI "
                           "mpi4py was built with; under Slurm, srun --mpi=pmix or pmi2 as the site says)")
    return _with_abort_on_error(comm)


def _import_mpi(requested: int):
    try:
        from mpi4py import MPI
    except ImportError:
        raise BackendError(f"this process was started as one of {requested} ranks, but mpi4py cannot "
                           f"be imported; install it: {INSTALL_HINT}") from None
    return MPI


def _with_abort_on_error(comm: MPIComm) -> MPIComm:
    """Make an uncaught exception on this rank stop all ranks once its traceback is printed."""
    if comm.size > 1:
        previous = sys.excepthook

        def print_then_abort(kind, value, tb):
            previous(kind, value, tb)
            comm.abort(1)
        sys.excepthook = print_then_abort
    return comm


def abort_all_ranks(code: int = 1, message: str | None = None) -> None:
    """Print ``message`` to stderr, then stop every rank when there are several.

    One write, ``[rank r]`` first on ranks other than 0; then, when this process
    is one of several ranks, ``MPI_Abort`` with ``code``; in a single process,
    return after printing (the caller ends as usual). For a program that
    reports its own errors: ranks still waiting in a collective for this one
    would otherwise hang. Never starts MPI.

    Args:
        code: The exit status for ``MPI_Abort``.
        message: What to print, or None.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        def train() -> int:
            try:
                raise rg.FeedError("feed 'x' is missing")
            except rg.RetrogradError as exc:
                rg.distributed.abort_all_ranks(2, f"train.py: {exc}")
                return 2


        assert train() == 2                                # one process: printed, then returned
        ```
    """
    several = _world is not None and _world.size > 1
    if message is not None:
        where = f"[rank {_world.rank}] " if several and _world.rank else ""
        sys.stderr.write(f"{where}{message}\n")
        sys.stderr.flush()
    if several:
        _world.abort(code)
