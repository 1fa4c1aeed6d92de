"""Any other Array API namespace passed as ``Executor(xp=...)``, e.g. ``array_api_strict``.

Such a namespace is taken to hold host arrays that NumPy can read through
DLPack (array-api-strict wraps NumPy arrays): it is a portability check for the
kernels, not a device. Scatter-add, which the standard lacks, is done with
NumPy on the host copy.
"""
from __future__ import annotations

import numpy as np

from .base import Backend
from .numpy_backend import NumpyBackend


class NamespaceBackend(Backend):
    name = "namespace"

    def __init__(self, xp):
        super().__init__(xp, "cpu")
        self.name = getattr(xp, "__name__", "namespace")

    def owns(self, array) -> bool:
        return type(array).__module__.split(".")[0] == self.name.split(".")[0]

    def from_numpy(self, array: np.ndarray):
        return self.xp.asarray(array)

    def to_numpy(self, array) -> np.ndarray:
        return np.from_dlpack(array)

    def scatter_add_rows(self, shape, dtype: str, ids, rows):
        host = NumpyBackend().scatter_add_rows(shape, dtype, self.to_numpy(ids), self.to_numpy(rows))
        return self.from_numpy(host)

    def einsum(self, equation: str, *operands):
        return self.from_numpy(NumpyBackend().einsum(equation, *(self.to_numpy(x) for x in operands)))

    def buffer_of(self, array) -> tuple[int, int]:
        # array-api-strict keeps its NumPy array in ``_array``: views share that array's base.
        # (DLPack would give each view its own capsule, hiding what it shares.)
        inner = getattr(array, "_array", None)
        if isinstance(inner, np.ndarray):
            return NumpyBackend().buffer_of(inner)
        host = np.from_dlpack(array)
        return host.__array_interface__["data"][0], host.nbytes
