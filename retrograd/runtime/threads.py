"""One thread count for every library a run uses: ``rg.Executor(threads=N)``.

While ``Executor.run`` computes, BLAS and OpenMP (every library ``threadpoolctl``
finds: OpenBLAS, MKL, torch's libgomp, ...) and the backend's own pools (torch's
intra-op threads: ``Backend.thread_pools``) use at most ``threads`` threads;
the old counts come back afterwards, so the rest of the process is untouched.
Settings a library takes once per process are made when the executor is
created (torch's inter-op pool: ``Backend.fix_threads``); the onnxruntime
engine builds its sessions with ``threads`` intra- and inter-op threads.

Why the default is 1 (``DEFAULT_THREADS``): the products of a training step
are small (a recurrent step's GEMM has the batch as one side), so more
threads gain little on them, and when other processes share the cores the
threads of an OpenMP team wait for each other at every op: the default
``retrograd train`` on torch ran 4x slower with torch's default of one thread
per core than with one thread, idle, and 1.8x slower beside two busy
processes (benchmarks/results/threads.md). Raise it for large products:
``rg.Executor(threads=4)``; ``retrograd train --threads 4``.

The libraries are found with ``threadpoolctl`` (once, and again only after
new modules were imported, since that scan takes about a millisecond); a run
then reads and sets each library's count directly (a few microseconds).
"""
from __future__ import annotations

import os
import sys

from ..errors import ProgramError

DEFAULT_THREADS = 1

_found: tuple[int, list] = (-1, [])     # (len(sys.modules) at the scan, threadpoolctl LibControllers)


def check_threads(threads) -> int:
    """``threads`` as a positive int (None means DEFAULT_THREADS); ProgramError otherwise."""
    if threads is None:
        return DEFAULT_THREADS
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ProgramError(f"threads must be a positive int (threads per run for BLAS, OpenMP, torch "
                           f"and onnxruntime), got {threads!r}")
    return threads


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity; ``os.cpu_count()`` where unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def native_libraries() -> list:
    """threadpoolctl's controllers of the BLAS and OpenMP libraries loaded in this process."""
    global _found
    modules = len(sys.modules)
    if _found[0] != modules:
        from threadpoolctl import ThreadpoolController
        _found = (modules, list(ThreadpoolController().lib_controllers))
    return _found[1]


blas_libraries = native_libraries       # the older name


class ThreadLimit:
    """``with limit.limit():`` every library uses at most ``threads`` threads inside.

    ``pools`` are further objects with ``get_num_threads()`` and
    ``set_num_threads(n)`` (the ``torch`` module, say) limited the same way.

    Example::

        limit = ThreadLimit(1)
        with limit.limit():
            a @ b
    """

    def __init__(self, threads=None, pools: tuple = ()):
        self.threads = check_threads(threads)
        self.pools = tuple(pools)

    def limit(self) -> "_Limit":
        return _Limit(native_libraries() + list(self.pools), self.threads)


BlasThreads = ThreadLimit               # the older name


class _Limit:
    """Sets each library to ``threads`` on entry where it differs; puts the old counts back on exit."""

    def __init__(self, libraries: list, threads: int):
        self.libraries = libraries
        self.threads = threads
        self.changed: list[tuple[object, int]] = []

    def __enter__(self) -> None:
        for lib in self.libraries:
            before = lib.get_num_threads()
            if before is not None and before != self.threads:
                lib.set_num_threads(self.threads)
                self.changed.append((lib, before))

    def __exit__(self, *exc) -> None:
        for lib, before in reversed(self.changed):
            lib.set_num_threads(before)
        self.changed.clear()
