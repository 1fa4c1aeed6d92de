"""The "onnxruntime" name: host arrays, programs run whole by the onnxruntime engine.

Kernels are not used: ``Executor.run`` hands each program to the engine registered for
this name (``retrograd.onnx.engine.OnnxRuntimeEngine`` registers itself with
``retrograd.runtime.engines``), which exports it to ONNX and runs it; the engine checks
``device`` when the executor makes it. Values in the scope stay NumPy arrays (host memory),
also with ``device="cuda"``, where onnxruntime-gpu's CUDA provider computes.
"""
from __future__ import annotations

from ..errors import BackendError
from .numpy_backend import NumpyBackend


class OnnxRuntimeBackend(NumpyBackend):
    name = "onnxruntime"
    runs_whole_programs = True

    def __init__(self, device: str | None = None):
        try:
            import onnx  # noqa: F401  (both are needed: export, then run)
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            raise BackendError(f'backend "onnxruntime" needs onnx and onnxruntime: '
                               f'pip install "retrograd[onnx]" ({exc})') from None
        super().__init__()
        self.engine_device = device      # read by the engine, which knows the providers
