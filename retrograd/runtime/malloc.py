"""``keep_freed_memory``: glibc's malloc told once to keep freed array memory in the process.

A training step allocates and frees arrays of the same few MB every step.
glibc's default malloc serves such sizes from fresh ``mmap`` pages (or trims
them off its heap when freed) and gives them back to the OS on ``free``, so
every step pays a page fault per 4 KiB it touches: ~3,000 faults, about 15%
of the default ``retrograd train`` step on the NumPy executor. Raising the
mmap threshold (to 64 MiB, or glibc's own maximum of 32 MiB where it refuses
more) and the trim threshold (to 256 MiB) keeps that memory in the heap for
the next step: ~2 faults per step; the peak resident memory is unchanged,
but up to 256 MiB freed at the top of the heap stays mapped until reused.

``Executor()`` calls it once per process (the first executor made). It does
nothing where malloc is not glibc's (macOS, Windows, musl), where the user set
glibc's own knobs (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``,
``GLIBC_TUNABLES``: theirs win), or with ``RETROGRAD_MALLOC=default``.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1      # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLDS = (64 << 20, 32 << 20)     # the first glibc accepts (it caps the value on some builds)
TRIM_THRESHOLD = 256 << 20
USER_KNOBS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")
SWITCH = "RETROGRAD_MALLOC"

_done: list[bool] = []     # one entry once this process has decided (tuned or not)


def keep_freed_memory() -> bool:
    """Tune glibc's malloc as the module docstring says, once; True if it was tuned (now or before)."""
    if not _done:
        _done.append(_tune())
    return _done[0]


def _tune() -> bool:
    if os.environ.get(SWITCH, "").lower() == "default" or any(k in os.environ for k in USER_KNOBS):
        return False
    libc = _glibc()
    if libc is None:
        return False
    if not any(libc.mallopt(M_MMAP_THRESHOLD, size) == 1 for size in MMAP_THRESHOLDS):
        return False
    return libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1


def _glibc():
    """The C library when it is glibc (it has ``gnu_get_libc_version``), else None."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc
