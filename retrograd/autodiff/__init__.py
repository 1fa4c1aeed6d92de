"""append_backward, gradients, and the block backward that control-flow ops reuse."""
from .backward import BackwardResult, append_backward, build_backward, gradients

__all__ = ["BackwardResult", "append_backward", "build_backward", "gradients"]
