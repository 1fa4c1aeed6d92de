"""How many threads BLAS may use while an executor runs a program.

The products of a training step are mostly small (a recurrent step's GEMM has
the batch as one side), so BLAS threads gain little on them; and when other
processes share the cores, OpenBLAS's spinning threads made whole runs 8-10x
slower here. So each ``Executor.run`` limits BLAS to ``threads`` (default
1) with ``threadpoolctl`` and gives the old setting back afterwards: the
library, not every script, takes care of it. Raise it for large products:
``rg.Executor(threads=4)``; ``retrograd train --threads`` passes it through.
"""
from __future__ import annotations

from contextlib import AbstractContextManager

from ..errors import ProgramError

DEFAULT_THREADS = 1


def check_threads(threads) -> int:
    """``threads`` as a positive int (None means DEFAULT_THREADS); ProgramError otherwise."""
    if threads is None:
        return DEFAULT_THREADS
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ProgramError(f"threads must be a positive int (BLAS threads per run), got {threads!r}")
    return threads


class BlasThreads:
    """``limit()`` is a context in which BLAS uses at most ``threads`` threads.

    Example::

        blas = BlasThreads(1)
        with blas.limit():
            a @ b
    """

    def __init__(self, threads=None):
        self.threads = check_threads(threads)
        self._controller = None

    def limit(self) -> AbstractContextManager:
        if self._controller is None:
            # Looked up on first use, once BLAS (NumPy's, torch's) is loaded; about 8 us per run after.
            from threadpoolctl import ThreadpoolController
            self._controller = ThreadpoolController()
        return self._controller.limit(limits=self.threads, user_api="blas")
