"""The NumPy backend: host arrays, the default."""
from __future__ import annotations

import numpy as np

from .base import Backend


SMALL_ROWS = 64     # at 64 rows x @ y.T and (y @ x.T).T took the same time


def array_namespace():
    """NumPy itself from 2.0 on (it is an Array API namespace); before that,
    ``array_api_compat.numpy``, which adds what 1.26 lacks (``isdtype``, ``astype``, ``concat``, ...)."""
    if np.lib.NumpyVersion(np.__version__) >= "2.0.0":
        return np
    import array_api_compat.numpy as compat
    return compat


def is_array(array) -> bool:
    return isinstance(array, np.ndarray)


def array_to_numpy(array) -> np.ndarray:
    return array


class NumpyBackend(Backend):
    name = "numpy"

    def __init__(self, device: str | None = None):
        super().__init__(array_namespace(), "cpu")

    def owns(self, array) -> bool:
        return isinstance(array, np.ndarray)

    def from_numpy(self, array: np.ndarray) -> np.ndarray:
        return array

    def to_numpy(self, array) -> np.ndarray:
        return array

    def matmul(self, x, y, transpose_x: bool = False, transpose_y: bool = False):
        if transpose_y and not transpose_x and x.ndim == 2 and y.ndim == 2 and x.shape[0] <= SMALL_ROWS:
            # x @ y.T as (y @ x.T).T: OpenBLAS is slow at a product whose right operand is
            # transposed when the left one has few rows (an LSTM backward step's dgates @ w_hh.T:
            # [32, 512] x [512, 128] 56 -> 43 us; [16, 1024] x [1024, 256] 168 -> 96 us)
            return np.ascontiguousarray(np.matmul(y, x.T).T)
        return super().matmul(x, y, transpose_x, transpose_y)

    def scatter_add_rows(self, shape, dtype: str, ids, rows):
        out = np.zeros(tuple(shape), dtype=dtype)
        ids = ids.reshape(-1)
        if ids.size == 0:
            return out
        rows = rows.reshape((ids.shape[0],) + tuple(shape[1:]))
        # Sorting the ids and summing runs with reduceat is ~5x faster than np.add.at.
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        starts = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
        out[sorted_ids[starts]] = np.add.reduceat(rows[order], starts, axis=0)
        return out

    def erf(self, x):
        try:
            from scipy.special import erf
        except ImportError:        # SciPy is optional: the Array API form (within 2e-15)
            return super().erf(x)
        return erf(x)

    # NumPy's own spellings: array_api_compat's namespace for NumPy 1.26 may lack the newer
    # Array API functions (cumulative_prod, take_along_axis).
    def cumsum(self, x, axis: int):
        return np.cumsum(x, axis=axis, dtype=x.dtype)

    def cumprod(self, x, axis: int):
        return np.cumprod(x, axis=axis, dtype=x.dtype)

    def take_along_axis(self, x, indices, axis: int):
        return np.take_along_axis(x, indices, axis)

    def sort_descending(self, x, axis: int):
        # NumPy's argsort has no descending order: a stable ascending sort of the reversed
        # axis, read backwards, orders equal values by index (any dtype; no negation).
        ascending = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
        return (x.shape[axis] - 1 - np.flip(ascending, axis)).astype(np.int64)

    def put_along_axis(self, shape, indices, values, axis: int):
        out = np.zeros(tuple(shape), dtype=values.dtype)
        np.put_along_axis(out, indices, values, axis)
        return out

    def buffer_of(self, array) -> tuple[int, int]:
        if not isinstance(array, np.ndarray):      # a NumPy scalar (np.sum of an array)
            return id(array), int(getattr(array, "nbytes", 0))
        base = array
        while isinstance(base.base, np.ndarray):
            base = base.base
        return id(base), base.nbytes
