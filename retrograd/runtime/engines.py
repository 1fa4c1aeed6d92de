"""Engines: runners of whole programs for backends that do not run kernels one by one.

A backend that declares ``runs_whole_programs`` (onnxruntime) is served by the engine
registered for its name. Engines sit above the executor and register themselves when their
package is imported (``retrograd.onnx.engine`` registers "onnxruntime"), so a backend never
imports an engine and the runtime never imports ``retrograd.onnx``.
"""
from __future__ import annotations

from typing import Callable

from ..errors import BackendError

# backend name -> factory(executor) -> engine (with run(program, feed, fetch_list, scope, return_numpy))
ENGINES: dict[str, Callable] = {}


def register_engine(backend_name: str, factory: Callable) -> None:
    ENGINES[backend_name] = factory


def engine_for(executor):
    """The engine running `executor`'s programs, or None for backends that run kernels."""
    backend = executor.backend
    if not backend.runs_whole_programs:
        return None
    if backend.name not in ENGINES:
        raise BackendError(f'backend "{backend.name}" runs programs through an engine, and none is '
                           f"registered (import retrograd.onnx registers onnxruntime's)")
    return ENGINES[backend.name](executor)
