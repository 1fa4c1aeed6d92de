"""The "onnxruntime" name: host arrays, programs run whole by the onnxruntime engine.

Kernels are not used: ``Executor.run`` hands each program to
``retrograd.onnx.engine.OnnxRuntimeEngine`` (``Backend.engine``), which exports
it to ONNX and runs it. Values in the scope stay NumPy arrays (host memory),
also with ``device="cuda"``, where onnxruntime-gpu's CUDA provider computes.
"""
from __future__ import annotations

from ..errors import BackendError
from .numpy_backend import NumpyBackend


class OnnxRuntimeBackend(NumpyBackend):
    name = "onnxruntime"

    def __init__(self, device: str | None = None):
        try:
            import onnx  # noqa: F401  (both are needed: export, then run)
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            raise BackendError(f'backend "onnxruntime" needs onnx and onnxruntime: '
                               f'pip install "retrograd[onnx]" ({exc})') from None
        super().__init__()
        self.engine = _engine_class()
        self.engine_device = self.engine.check_device(device)   # "cuda" needs onnxruntime-gpu


def _engine_class():
    """``retrograd.onnx.engine.OnnxRuntimeEngine``, imported only when this backend is asked for."""
    from importlib import import_module
    try:
        return import_module("retrograd.onnx.engine").OnnxRuntimeEngine
    except (ImportError, AttributeError) as exc:
        raise BackendError(f'backend "onnxruntime" is unavailable: its engine failed to import ({exc})') from None
