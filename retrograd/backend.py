"""Old spelling of the backend helpers, kept so that ``retrograd.backend`` imports still work.

New code uses ``retrograd.backends`` (``get_backend(name, device)``, a
``Backend`` object per executor, ``k.backend`` in kernels). These functions take
an array namespace ``xp`` first, as before, and forward to its backend.
"""
from __future__ import annotations

import numpy as np

from .backends import backend_for_namespace, dtype_name, to_numpy

__all__ = ["dtype_of", "dtype_name", "is_numpy", "to_numpy", "from_numpy", "random_uniform",
           "random_normal", "random_keep_mask", "scatter_add_rows", "buffer_of"]


def dtype_of(xp, name) -> object:
    """The namespace's dtype object for a dtype name ("float32", ...) or any backend's dtype."""
    found = getattr(xp, dtype_name(name), None)
    return found if found is not None else backend_for_namespace(xp).dtype_of(name)


def is_numpy(xp) -> bool:
    return xp is np


def from_numpy(xp, array: np.ndarray):
    return array if xp is np else backend_for_namespace(xp).from_numpy(array)


def random_uniform(xp, seed, shape, low: float, high: float, dtype: str):
    return backend_for_namespace(xp).random_uniform(seed, shape, low, high, dtype)


def random_normal(xp, seed, shape, mean: float, std: float, dtype: str):
    return backend_for_namespace(xp).random_normal(seed, shape, mean, std, dtype)


def random_keep_mask(xp, seed, shape, keep_prob: float):
    return backend_for_namespace(xp).random_keep_mask(seed, shape, keep_prob)


def scatter_add_rows(xp, shape, dtype: str, ids, rows):
    return backend_for_namespace(xp).scatter_add_rows(shape, dtype, ids, rows)


def buffer_of(array) -> tuple[int, int]:
    """(identity, bytes) of the memory a NumPy array lives in: views share their base's."""
    return backend_for_namespace(np).buffer_of(array)
