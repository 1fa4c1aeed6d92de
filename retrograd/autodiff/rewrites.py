"""Rewrites of a freshly built backward that another package provides, looked up by name.

``append_backward`` and ``gradients`` finish a backward with rewrites that are
memory policy, not differentiation: gradient ops reading a forward value only
for its shape read a stand-in (``"shape_stand_ins"``), and checkpoints or a
memory budget make the backward recompute forward values (``"recompute"``).
The memory package registers both when imported (``import retrograd`` does),
so autodiff imports nothing of it and the dependency runs one way:
memory -> autodiff -> ops -> ir.
"""
from __future__ import annotations

from typing import Callable

from ..errors import ProgramError

BACKWARD_REWRITES: dict[str, Callable] = {}


def register_backward_rewrite(name: str):
    """Decorator: ``fn`` is the backward rewrite called ``name``."""
    def register(fn: Callable) -> Callable:
        BACKWARD_REWRITES[name] = fn
        return fn
    return register


def backward_rewrite(name: str) -> Callable:
    """The registered rewrite ``name`` (ProgramError naming the package to import when missing)."""
    fn = BACKWARD_REWRITES.get(name)
    if fn is None:
        raise ProgramError(f"the backward rewrite '{name}' is not registered; import retrograd.memory")
    return fn
