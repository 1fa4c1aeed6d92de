"""Scope: names to arrays, with a parent for lookups that fall through."""
from __future__ import annotations

from typing import Iterator

import numpy as np

from ..errors import RetrogradError


class ScopeError(RetrogradError, KeyError):
    """A name asked of a scope holds no value."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Scope:
    """Holds persistable values (parameters, optimizer state) across runs.

    An executor's scope has the executor's backend (``scope.backend``): it holds
    that backend's arrays, and ``set`` moves a NumPy array (or a list, or a
    number) onto the backend's device once. A scope without a backend stores
    what it is given.

    Example::

        exe = rg.Executor()
        exe.run(startup)
        w = exe.scope.get("fc1.w")
        exe.scope.set("fc1.w", w * 0.5)
    """

    def __init__(self, parent: "Scope | None" = None, backend=None):
        self.parent = parent
        self.backend = backend if backend is not None or parent is None else parent.backend
        self.vars: dict[str, object] = {}

    def find(self, name: str):
        """The value of ``name`` here or in an ancestor, or None."""
        scope: Scope | None = self
        while scope is not None:
            if name in scope.vars:
                return scope.vars[name]
            scope = scope.parent
        return None

    def get(self, name: str):
        value = self.find(name)
        if value is None:
            raise ScopeError(f"scope holds no value named '{name}'"
                             " (run the startup program to initialise parameters)")
        return value

    def set(self, name: str, value) -> None:
        """Store ``value`` (NumPy or the backend's array) under ``name`` in this scope."""
        backend = self.backend
        if backend is not None and backend.owns(value):
            self.vars[name] = value
            return
        if not (hasattr(value, "shape") and hasattr(value, "dtype")):
            value = np.asarray(value)
        if backend is not None and isinstance(value, (np.ndarray, np.generic)):
            value = backend.from_numpy(np.asarray(value))
        self.vars[name] = value

    def has(self, name: str) -> bool:
        return self.find(name) is not None

    __contains__ = has

    def names(self) -> list[str]:
        return sorted(self.vars)

    def new_child(self) -> "Scope":
        return Scope(parent=self, backend=self.backend)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"Scope({len(self.vars)} values)"
