"""ONNX export of retrograd programs: ``rg.onnx.export(program, path, fetch_list, scope=None, opset=None)``.

Importing this package needs no onnx; calling ``export`` without it raises
``rg.BackendError`` naming ``pip install "retrograd[onnx]"``. The graph
building lives in ``graph.py`` and ``model.py`` (``build_model``: the entry the
onnxruntime engine uses), the per-op lowerings next to each op
(``retrograd/ops/core/lowering.py``).
"""
from __future__ import annotations

from .export import export  # noqa: F401
from . import engine  # noqa: F401  (registers the onnxruntime engine with the runtime)

__all__ = ["export"]
