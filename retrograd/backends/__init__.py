"""Backends: one array library on one device behind one lookup.

``get_backend(name="numpy", device=None)`` returns a ``Backend`` (see
``base.py``): ``.name``, ``.device``, ``.xp`` (the Array API namespace kernels
compute with, through ``array_api_compat``) and the few operations the
standard lacks, each written once per library in its own module:

* ``numpy_backend``: host arrays (the default);
* ``torch_backend``: PyTorch tensors, device ``"cpu"``, ``"cuda"`` or ``"cuda:N"``;
* ``cupy_backend``: CuPy arrays, device ``"cuda"`` or ``"cuda:N"``;
* ``onnxruntime_backend``: runs whole programs with onnxruntime (``Backend.engine``);
* ``namespace_backend``: any other namespace given as ``Executor(xp=...)``
  (array-api-strict), a host-side portability check.

Random draws are keyed and computed with integer ops on the device
(``keyed_random``): every backend draws the same numbers for the same key.

Example:
    ```python
    import numpy as np
    import retrograd as rg

    be = rg.backends.get_backend("numpy", "cpu")        # or ("torch", "cpu"), ("torch", "cuda")
    t = be.from_numpy(np.ones(3, "float32"))
    assert np.allclose(be.to_numpy(be.xp.exp(t)), np.e)
    ```
"""
from __future__ import annotations

import numpy as np

from ..errors import BackendError
from . import cupy_backend, numpy_backend, torch_backend
from .base import Backend, dtype_name
from .cupy_backend import CupyBackend
from .namespace_backend import NamespaceBackend
from .numpy_backend import NumpyBackend
from .onnxruntime_backend import OnnxRuntimeBackend
from .torch_backend import TorchBackend

__all__ = ["Backend", "BACKENDS", "get_backend", "backend_for_namespace", "to_numpy", "dtype_name"]

BACKENDS = {
    "numpy": NumpyBackend,
    "torch": TorchBackend,
    "cupy": CupyBackend,
    "onnxruntime": OnnxRuntimeBackend,
}


def get_backend(name: str = "numpy", device: str | None = None) -> Backend:
    """The backend ``name`` on ``device``.

    Args:
        name: ``"numpy"`` (default), ``"torch"``, ``"cupy"`` or ``"onnxruntime"``.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, or None for the backend's default.

    Returns:
        A ``Backend``.

    Raises:
        BackendError: An unknown backend, a device it cannot use, or a missing
            library (naming the pip extra).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        be = rg.backends.get_backend("numpy")
        t = be.from_numpy(np.ones(3, "float32"))
        assert be.name == "numpy" and be.device == "cpu" and np.isclose(be.to_numpy(be.xp.exp(t))[0], np.e)
        ```
    """
    cls = BACKENDS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise BackendError(f"unknown backend {name!r}: choose one of {', '.join(map(repr, BACKENDS))}")
    if name == "numpy" and device not in (None, "cpu"):
        raise BackendError(f'backend "numpy" runs on device "cpu" only, not {device!r} '
                           '(for a GPU use backend="torch" or "cupy")')
    return cls(device)


def backend_for_namespace(xp, device: str | None = None) -> Backend:
    """The backend of an array namespace given as ``Executor(xp=...)``.

    NumPy, torch and CuPy (plain or through ``array_api_compat``) get their own
    backends; any other namespace runs on the host through a generic backend.

    Args:
        xp: An array namespace (``numpy``, ``torch``, ``array_api_strict``...).
        device: The device, or None.

    Returns:
        A ``Backend``.

    Raises:
        BackendError: A host-only namespace asked for another device.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        assert rg.backends.backend_for_namespace(np).name == "numpy"
        ```
    """
    if xp is np:
        return get_backend("numpy", device)
    module = getattr(xp, "__name__", "")
    for prefix, name in (("torch", "torch"), ("array_api_compat.torch", "torch"),
                         ("cupy", "cupy"), ("array_api_compat.cupy", "cupy"),
                         ("array_api_compat.numpy", "numpy")):
        if module == prefix:
            return get_backend(name, device)
    if device not in (None, "cpu"):
        raise BackendError(f"namespace {module or xp!r} runs on the host; device {device!r} "
                           'needs backend="torch" or "cupy"')
    return NamespaceBackend(xp)


_ARRAY_MODULES = (numpy_backend, torch_backend, cupy_backend)


def dtype_of(xp, name) -> object:
    """The namespace's dtype object for a dtype name ("float32", ...) or any library's dtype;
    what the namespace lacks (NumPy's bfloat16, from ml_dtypes) its backend gives.

    Example:
        ```python
        import numpy as np
        from retrograd.backends import dtype_of

        assert dtype_of(np, "float32") is np.float32
        ```
    """
    found = getattr(xp, dtype_name(name), None)
    return found if found is not None else backend_for_namespace(xp).dtype_of(name)


def to_numpy(array) -> np.ndarray:
    """A NumPy array of any backend's array (a view where the array is on the host).

    Args:
        array: A NumPy, torch, CuPy or other array (DLPack or array-like).

    Returns:
        A NumPy array.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        exe = rg.Executor()
        exe.scope.set("w", np.ones((2, 2), "float32"))
        w = rg.backends.to_numpy(exe.scope.get("w"))
        assert isinstance(w, np.ndarray) and w.shape == (2, 2)
        ```
    """
    for module in _ARRAY_MODULES:
        if module.is_array(array):
            return module.array_to_numpy(array)
    if hasattr(array, "__dlpack__"):         # array-api-strict and other host namespaces
        return np.from_dlpack(array)
    return np.asarray(array)
