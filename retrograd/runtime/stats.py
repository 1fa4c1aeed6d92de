"""What a run cost: wall time, ops run, and the peak of live array bytes."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class RunStats:
    time_s: float = 0.0
    ops_run: int = 0
    peak_bytes: int = 0


class MemoryMeter:
    """Counts the distinct buffers the executor holds: a view adds nothing new.

    Deterministic for a given program and feed, so memory claims can be tested.
    ``buffer_of(array) -> (identity, bytes)`` is the backend's (torch: the
    tensor's storage, so views of one tensor count once).
    """

    def __init__(self, buffer_of):
        self.buffer_of = buffer_of
        self.live: dict[int, list] = {}   # buffer id -> [bytes, references]
        self.total = 0
        self.peak = 0

    def hold(self, array) -> None:
        if type(array) is np.ndarray and array.base is None:   # the common case, kept fast
            key, nbytes = id(array), array.nbytes
        else:
            key, nbytes = self.buffer_of(array)
        entry = self.live.get(key)
        if entry is None:
            self.live[key] = [nbytes, 1, array]
            self.total += nbytes
            if self.total > self.peak:
                self.peak = self.total
        else:
            entry[1] += 1

    def release(self, array) -> None:
        key = id(array) if type(array) is np.ndarray and array.base is None else self.buffer_of(array)[0]
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self.live[key]
            self.total -= entry[0]
