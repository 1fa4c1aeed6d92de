"""The CuPy backend: arrays on a CUDA device.

Kernels use ``array_api_compat.cupy`` and run with the executor's device made
current (``on_device``). What the standard lacks: scatter-add is ``cupyx.scatter_add`` (NumPy's
``add.at``), a buffer is the array's memory allocation (views share it),
transfers are ``cupy.asarray`` and ``cupy.asnumpy``; device memory is the
default memory pool's bytes in use.
"""
from __future__ import annotations

import numpy as np

from ..errors import BackendError
from .base import Backend, Namespace


def is_array(array) -> bool:
    return type(array).__module__.startswith("cupy")


def array_to_numpy(array) -> np.ndarray:
    return array.get()


def _import_cupy():
    try:
        import cupy
        import cupyx
        import array_api_compat.cupy as compat
    except ImportError as exc:
        raise BackendError(f'backend "cupy" needs CuPy: pip install "retrograd[cupy]" ({exc})') from None
    return cupy, cupyx, compat


def _device_index(device: str | None) -> int:
    spelled = device or "cuda"
    kind, _, index = spelled.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise BackendError(f'backend "cupy" has no device {device!r}: use "cuda" or "cuda:N"')
    return int(index or 0)


class CupyBackend(Backend):
    name = "cupy"

    def __init__(self, device: str | None = None):
        index = _device_index(device)
        cupy, cupyx, compat = _import_cupy()
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except cupy.cuda.runtime.CUDARuntimeError as exc:
            raise BackendError(f'backend "cupy" finds no CUDA GPU: {exc}') from None
        if index >= count:
            raise BackendError(f'backend "cupy" has no device {device!r}: {count} CUDA device(s) visible')
        self.cupy, self.cupyx = cupy, cupyx
        self.cuda_device = cupy.cuda.Device(index)
        # CuPy creates arrays on its current device (array_api_compat ignores device=): the
        # executor runs kernels inside ``on_device()``, which makes ours current.
        super().__init__(Namespace(compat), f"cuda:{index}")

    def owns(self, array) -> bool:
        return isinstance(array, self.cupy.ndarray)

    def device_of(self, array) -> str:
        return f"cuda:{array.device.id}"

    def from_numpy(self, array: np.ndarray):
        with self.cuda_device:
            return self.cupy.asarray(array)

    def to_numpy(self, array) -> np.ndarray:
        return self.cupy.asnumpy(array)

    def scatter_add_rows(self, shape, dtype: str, ids, rows):
        with self.cuda_device:
            out = self.cupy.zeros(tuple(shape), dtype=dtype)
            ids = ids.reshape(-1)
            self.cupy.add.at(out, ids, rows.reshape((ids.shape[0],) + tuple(shape[1:])))
        return out

    def einsum(self, equation: str, *operands):
        with self.cuda_device:
            return self.cupy.einsum(equation, *operands)
    def erf(self, x):
        import cupyx.scipy.special
        return cupyx.scipy.special.erf(x)

    def cumsum(self, x, axis: int):
        return self.cupy.cumsum(x, axis=axis, dtype=x.dtype)

    def cumprod(self, x, axis: int):
        return self.cupy.cumprod(x, axis=axis, dtype=x.dtype)

    def take_along_axis(self, x, indices, axis: int):
        return self.cupy.take_along_axis(x, indices, axis)

    def put_along_axis(self, shape, indices, values, axis: int):
        out = self.cupy.zeros(tuple(shape), dtype=values.dtype)
        self.cupy.put_along_axis(out, indices, values, axis)
        return out

    def buffer_of(self, array) -> tuple[int, int]:
        memory = array.data.mem
        if memory is None:                 # an empty array owns no allocation
            return id(array), 0
        # The pool rounds allocations up (to 512 bytes): count the bytes of the array that owns
        # the allocation, as NumPy and torch do, so peak_bytes agrees across backends.
        owner = array
        while owner.base is not None:
            owner = owner.base
        return memory.ptr, owner.nbytes

    def device_memory(self) -> int | None:
        return int(self.cupy.get_default_memory_pool().used_bytes())

    def on_device(self):
        return self.cuda_device

