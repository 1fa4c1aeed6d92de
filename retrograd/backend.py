"""The few array operations the Array API standard lacks, in one place.

Kernels compute with the namespace the executor passes them (``k.xp``);
whatever needs NumPy specifically (random numbers, scatter-add, memory
accounting of views) goes through these helpers so that another backend only
has to replace this module's functions.
"""
from __future__ import annotations

import numpy as np


def dtype_of(xp, name) -> object:
    """The namespace's dtype object for a dtype name ("float32", ...) or any backend's dtype."""
    return getattr(xp, dtype_name(name))


def dtype_name(dtype) -> str:
    """The retrograd name ("float32", ...) of any backend's dtype object."""
    return str(dtype).rsplit(".", 1)[-1]


def is_numpy(xp) -> bool:
    return xp is np


def to_numpy(array) -> np.ndarray:
    """A NumPy view (or copy) of any backend's array."""
    if isinstance(array, np.ndarray):
        return array
    if hasattr(array, "_array"):  # array-api-strict wraps a NumPy array
        return np.asarray(array._array)
    return np.asarray(array)


def from_numpy(xp, array: np.ndarray):
    return array if xp is np else xp.asarray(array)


def random_uniform(xp, seed, shape, low: float, high: float, dtype: str):
    rng = np.random.default_rng(seed)
    return from_numpy(xp, rng.uniform(low, high, size=tuple(shape)).astype(dtype))


def random_normal(xp, seed, shape, mean: float, std: float, dtype: str):
    rng = np.random.default_rng(seed)
    return from_numpy(xp, (rng.standard_normal(size=tuple(shape)) * std + mean).astype(dtype))


def random_keep_mask(xp, seed, shape, keep_prob: float):
    """Bernoulli(keep_prob) as a bool array; the same seed gives the same mask."""
    rng = np.random.default_rng(seed)
    return from_numpy(xp, rng.random(size=tuple(shape)) < keep_prob)


def scatter_add_rows(xp, shape, dtype: str, ids, rows):
    """zeros(shape) with ``rows[i]`` added into row ``ids[i]`` (repeats accumulate)."""
    out = np.zeros(tuple(shape), dtype=dtype)
    ids_np = to_numpy(ids).reshape(-1)
    rows_np = to_numpy(rows).reshape((ids_np.shape[0],) + tuple(shape[1:]))
    if ids_np.size == 0:
        return from_numpy(xp, out)
    # Sorting the ids and summing runs with reduceat is ~5x faster than np.add.at.
    order = np.argsort(ids_np, kind="stable")
    sorted_ids = ids_np[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
    out[sorted_ids[starts]] = np.add.reduceat(rows_np[order], starts, axis=0)
    return from_numpy(xp, out)


def buffer_of(array) -> tuple[int, int]:
    """(identity, bytes) of the memory an array lives in: views share their base's."""
    if isinstance(array, np.ndarray):
        base = array
        while isinstance(base.base, np.ndarray):
            base = base.base
        return id(base), base.nbytes
    inner = getattr(array, "_array", None)
    if inner is not None:
        return buffer_of(inner)
    return id(array), int(getattr(array, "nbytes", 0))
