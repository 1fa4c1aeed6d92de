"""The NumPy backend: host arrays, the default."""
from __future__ import annotations

import functools

import numpy as np

from ..ir.dtypes import is_low_float, numpy_dtype
from . import numpy_einsum, numpy_erf
from .base import Backend, dtype_name


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


def _row_dot(a, b):
    """``sum(a * b, axis=-1, keepdims=True)`` without the product's temporary."""
    return np.einsum("...i,...i->...", a, b)[..., None]


def _column_dot(a, b):
    """``sum(a * b)`` over every axis but the last (a norm's weight gradient)."""
    d = a.shape[-1]
    return np.einsum("ij,ij->j", a.reshape(-1, d), b.reshape(-1, d))


def _scale_shift(y, rstd, weight, bias) -> None:
    """``y = y * rstd * weight + bias`` in place (any of the three may be None)."""
    for factor in (rstd, weight):
        if factor is not None:
            y *= factor
    if bias is not None:
        y += bias


def _widened(array):
    return array.astype(np.float32) if isinstance(array, np.ndarray) and array.dtype.itemsize == 2 \
        and array.dtype.kind in "fV" else array


def _in_float32(kernel, out_dtypes, k, *arrays):
    """Run ``kernel`` on the arrays with bfloat16/float16 ones widened to float32; round the
    outputs declared low-precision back to their dtype."""
    result = kernel(k, *(_widened(a) for a in arrays))
    if isinstance(result, tuple):
        return tuple(_rounded(r, d) for r, d in zip(result, out_dtypes))
    return _rounded(result, out_dtypes[0])


def _rounded(array, dtype):
    if dtype is None or not isinstance(array, np.ndarray) or array.dtype == dtype:
        return array
    with np.errstate(over="ignore"):     # beyond float16's range is inf, as on every device
        return array.astype(dtype)


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

    def dtype_of(self, name) -> object:
        return numpy_dtype(dtype_name(name))

    def kernel_for(self, kernel, op, block):
        """Ops that read or write bfloat16 or float16 compute in float32 and round their float
        outputs to the declared dtype: NumPy has no BLAS nor fast loops for either (ml_dtypes'
        bfloat16 arithmetic goes through float32 anyway, and mixes with Python floats to float32)."""
        if op.sub_blocks():
            return kernel
        declared = [block.find_var(n) for n in op.outputs]
        names = [v.dtype if v is not None else None for v in declared]
        read = [block.find_var(n) for n in op.inputs]
        if not any(is_low_float(d) for d in names + [v.dtype for v in read if v is not None]):
            return kernel
        out_dtypes = [numpy_dtype(d) if d is not None and is_low_float(d) else None for d in names]
        numpy_dtype("bfloat16" if "bfloat16" in names else "float32")      # a missing ml_dtypes: said here
        return functools.partial(_in_float32, kernel, tuple(out_dtypes))

    def matmul(self, x, y, transpose_x: bool = False, transpose_y: bool = False):
        if transpose_y and not transpose_x and x.ndim == 2 and y.ndim == 2 and x.shape[0] <= SMALL_ROWS:
            # x @ y.T as (y @ x.T).T: OpenBLAS is slow at a product whose right operand is
            # transposed when the left one has few rows (an LSTM backward step's dgates @ w_hh.T:
            # [32, 512] x [512, 128] 56 -> 43 us; [16, 1024] x [1024, 256] 168 -> 96 us)
            return np.ascontiguousarray(np.matmul(y, x.T).T)
        return super().matmul(x, y, transpose_x, transpose_y)

    # Layer norm and RMS norm with fewer passes and temporaries than the generic ones (norm_math):
    # row dot products by einsum, and in-place updates; [4096, 1024] float32 forward + backward
    # about 1.6x faster.
    def layer_norm(self, x, weight, bias, eps: float):
        mean = np.mean(x, axis=-1, keepdims=True)
        y = np.subtract(x, mean)
        rstd = _row_dot(y, y)
        rstd /= x.shape[-1]
        rstd += eps
        np.sqrt(rstd, out=rstd)
        np.reciprocal(rstd, out=rstd)
        _scale_shift(y, rstd, weight, bias)
        return y, mean, rstd

    def layer_norm_backward(self, dy, x, mean, rstd, weight, want_weight: bool, want_bias: bool):
        xhat = np.subtract(x, mean)
        xhat *= rstd
        dweight = _column_dot(dy, xhat) if want_weight else None
        dbias = np.sum(dy, axis=tuple(range(dy.ndim - 1))) if want_bias else None
        dx = dy * weight if weight is not None else dy.copy()
        mean_dx_xhat = _row_dot(dx, xhat)
        mean_dx_xhat /= x.shape[-1]
        dx -= np.mean(dx, axis=-1, keepdims=True)
        xhat *= mean_dx_xhat
        dx -= xhat
        dx *= rstd
        return dx, dweight, dbias

    def rms_norm(self, x, weight, eps: float):
        rstd = _row_dot(x, x)
        rstd /= x.shape[-1]
        rstd += eps
        np.sqrt(rstd, out=rstd)
        np.reciprocal(rstd, out=rstd)
        y = x * rstd
        _scale_shift(y, None, weight, None)
        return y, rstd

    def rms_norm_backward(self, dy, x, rstd, weight, want_weight: bool):
        xn = x * rstd
        dweight = _column_dot(dy, xn) if want_weight else None
        dx = dy * weight if weight is not None else dy.copy()
        mean_dx_xn = _row_dot(dx, xn)
        mean_dx_xn /= x.shape[-1]
        xn *= mean_dx_xn
        dx -= xn
        dx *= rstd
        return dx, dweight

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

    def einsum(self, equation: str, *operands):
        return numpy_einsum.einsum(equation, *operands)     # pairwise, each one batched matmul
    def erf(self, x):
        if x.dtype == np.float32:     # a float32 rational form in cached chunks: ~10x SciPy's speed
            return numpy_erf.erf(x)
        try:
            from scipy.special import erf
        except ImportError:        # SciPy is optional: the Array API form (within 2e-15)
            return super().erf(x)
        return erf(x)

    def gelu(self, x, approximate: str = "none"):
        if approximate == "none" and x.dtype == np.float32:
            return numpy_erf.gelu(x)
        return super().gelu(x, approximate)

    def gelu_grad(self, x, dy, approximate: str = "none"):
        if approximate == "none" and x.dtype == np.float32 and dy.dtype == np.float32 and dy.shape == x.shape:
            return numpy_erf.gelu_grad(x, dy)
        return super().gelu_grad(x, dy, approximate)

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

    def add_along_axis(self, x, indices, values, axis: int):
        np.put_along_axis(x, indices, np.take_along_axis(x, indices, axis) + values, axis)
        return x

    def layouts(self, arrays) -> tuple:
        # (Backend.layouts) an array that owns its memory is its own buffer: no walk to the base
        buffers: dict = {}
        described: list = []
        count = 0
        for array in arrays:
            if type(array) is np.ndarray and array.base is None:
                key, nbytes = id(array), array.nbytes
            else:
                key, nbytes = self.buffer_of(array)
            if key not in buffers:
                buffers[key] = count
                count += 1
            described += [(buffers[key], nbytes, array.shape, array.dtype, array.strides)]
        return tuple(described)

    def buffer_of(self, array) -> tuple[int, int]:
        if not isinstance(array, np.ndarray):      # a NumPy scalar (np.sum of an array)
            return id(array), int(getattr(array, "nbytes", 0))
        base = array
        while isinstance(base.base, np.ndarray):
            base = base.base
        return id(base), base.nbytes
