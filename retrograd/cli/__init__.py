"""The ``retrograd`` command: argument parsing (``main``), ``train``, ``sample``, the exported
sampler's lines (``onnx_sampler``), and the text and image loss plots."""
from .main import main

__all__ = ["main"]
