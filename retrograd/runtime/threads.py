"""How many threads BLAS may use while an executor runs a program.

The products of a training step are mostly small (a recurrent step's GEMM has
the batch as one side), so BLAS threads gain little on them; and when other
processes share the cores, OpenBLAS's spinning threads made whole runs 8-10x
slower here. So each ``Executor.run`` limits BLAS to ``threads`` (default
1) and gives the old setting back afterwards: the library, not every script,
takes care of it. Raise it for large products: ``rg.Executor(threads=4)``;
``retrograd train --threads`` passes it through.

The BLAS libraries are found with ``threadpoolctl`` (once, and again only
after new modules were imported, since that scan takes about a millisecond);
a run then reads and sets each library's thread count directly (a few
microseconds), where ``ThreadpoolController.limit`` takes about 25.
"""
from __future__ import annotations

import sys

from ..errors import ProgramError

DEFAULT_THREADS = 1

_found: tuple[int, list] = (-1, [])     # (len(sys.modules) at the scan, BLAS LibControllers)


def check_threads(threads) -> int:
    """``threads`` as a positive int (None means DEFAULT_THREADS); ProgramError otherwise."""
    if threads is None:
        return DEFAULT_THREADS
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ProgramError(f"threads must be a positive int (BLAS threads per run), got {threads!r}")
    return threads


def blas_libraries() -> list:
    """threadpoolctl's controllers of the BLAS libraries loaded in this process."""
    global _found
    modules = len(sys.modules)
    if _found[0] != modules:
        from threadpoolctl import ThreadpoolController
        _found = (modules, ThreadpoolController().select(user_api="blas").lib_controllers)
    return _found[1]


class BlasThreads:
    """``with blas.limit():`` BLAS uses at most ``threads`` threads inside.

    Example::

        blas = BlasThreads(1)
        with blas.limit():
            a @ b
    """

    def __init__(self, threads=None):
        self.threads = check_threads(threads)

    def limit(self) -> "_Limit":
        return _Limit(blas_libraries(), self.threads)


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
