"""What a run cost: wall time, ops run, and the peak of live array bytes."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RunStats:
    """What the last ``Executor.run`` did (``exe.last_stats``).

    Attributes:
        time_s: Wall time of the run, in seconds.
        ops_run: How many ops ran (each op of a loop body once per iteration).
        peak_bytes: The largest total of live array bytes the executor held
            during the run (distinct buffers; views count once).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            y = rg.exp(rg.data("x", [256]))
        exe = rg.Executor()
        exe.run(main, feed={"x": np.zeros(256, "float32")}, fetch_list=[y])
        stats = exe.last_stats
        assert stats.ops_run == 1 and stats.peak_bytes >= 2 * 256 * 4 and stats.time_s > 0
        ```
    """
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
        self.live: dict[int, list] = {}   # buffer id -> [bytes, references, an array of it]
        # id(array) -> [buffer id, bytes, holds, array] for arrays that are not plain NumPy
        # arrays: asking a backend for the buffer (torch: the storage) costs more than the
        # dict lookup, and release() would ask again. The array is kept so its id stays its own.
        self.seen: dict[int, list] = {}
        self.total = 0
        self.peak = 0
        self.holds = 0          # hold() calls (the executor tells its own from a kernel's)

    def hold(self, array) -> None:
        self.holds += 1
        if type(array) is np.ndarray and array.base is None:   # the common case, kept fast
            key, nbytes = id(array), array.nbytes
        elif array is None:         # an output nothing reads, which the kernel did not compute
            return
        else:
            known = self.seen.get(id(array))
            if known is None:
                key, nbytes = self.buffer_of(array)
                self.seen[id(array)] = [key, nbytes, 1, array]
            else:
                key, nbytes = known[0], known[1]
                known[2] += 1
        entry = self.live.get(key)
        if entry is None:
            self.live[key] = [nbytes, 1, array]
            self.total += nbytes
            if self.total > self.peak:
                self.peak = self.total
        else:
            entry[1] += 1

    def release(self, array) -> None:
        if type(array) is np.ndarray and array.base is None:
            key = id(array)
        else:
            known = self.seen.get(id(array))
            if known is None:
                return
            key = known[0]
            known[2] -= 1
            if known[2] == 0:
                del self.seen[id(array)]
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self.live[key]
            self.total -= entry[0]


@dataclass
class MeterRecord:
    """What the memory meter counted in one run of a straight-line plan, op by op.

    A run of the same plan from the same start (``Backend.layouts`` of the
    values it starts from: shapes, dtypes, strides, buffers shared) holds the
    same arrays at the same points: kernels make outputs of the sizes, and
    views or copies, their inputs' layouts decide. So the executor meters such
    a plan once per start and replays the record (``Executor.run``): no
    ``hold``/``release`` per value. Each replayed step's output shapes are
    compared with ``shapes`` (a kernel whose output size depends on values); at
    the first difference the meter takes over from ``peaks`` of the steps
    before, op by op.

    Attributes:
        start_peak: Bytes held before the first step (the starting values).
        peaks: The meter's peak after each step.
        shapes: Each step's output shapes (None for an output left uncomputed).
    """
    start_peak: int
    peaks: list = field(default_factory=list)
    shapes: list = field(default_factory=list)
    # the persistable writes the recorded run found of the declared shape and dtype (Executor._write_back)
    trusted_writes: frozenset = field(default=frozenset(), compare=False)

    @property
    def peak(self) -> int:
        """The run's peak bytes."""
        return self.peaks[-1] if self.peaks else self.start_peak

    def peak_before(self, index: int) -> int:
        """The peak up to (not including) step ``index``."""
        return self.peaks[index - 1] if index else self.start_peak
