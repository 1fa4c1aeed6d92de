"""Scope: names to arrays, with a parent for lookups that fall through."""
from __future__ import annotations

from typing import Iterator

import numpy as np

from ..errors import RetrogradError


class ScopeError(RetrogradError, KeyError):
    """A name asked of a scope holds no value (also a ``KeyError``).

    Example:
        ```python
        import retrograd as rg

        try:
            rg.Scope().get("fc1.w")
        except rg.ScopeError as exc:
            print(exc)                                 # names the value and the fix
        ```
    """

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Scope:
    """Holds persistable values (parameters, optimizer state) across runs, by name.

    An executor's scope has the executor's backend (``scope.backend``): it holds
    that backend's arrays, and ``set`` moves a NumPy array (or a list, or a
    number) onto the backend's device once. A scope without a backend stores
    what it is given. Lookups fall through to the parent.

    Args:
        parent: The scope lookups fall through to, or None.
        backend: The Backend whose arrays it holds; the parent's by default.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            rg.layers.fc(rg.data("x", [-1, 3]), 2, name="fc1")
        exe = rg.Executor()
        exe.run(startup)
        w = exe.scope.get("fc1.w")
        exe.scope.set("fc1.w", w * 0.5)
        assert np.allclose(exe.scope.get("fc1.w"), w * 0.5) and "fc1.b" in exe.scope
        ```
    """

    def __init__(self, parent: "Scope | None" = None, backend=None):
        self.parent = parent
        self.backend = backend if backend is not None or parent is None else parent.backend
        self.vars: dict[str, object] = {}

    def find(self, name: str):
        """The value of ``name`` here or in an ancestor, or None.

        Args:
            name: The value's name.

        Returns:
            The array, or None.

        Example:
            ```python
            import retrograd as rg

            outer = rg.Scope()
            outer.set("w", [1.0, 2.0])
            inner = outer.new_child()
            assert list(inner.find("w")) == [1.0, 2.0] and inner.find("v") is None
            ```
        """
        scope: Scope | None = self
        while scope is not None:
            if name in scope.vars:
                return scope.vars[name]
            scope = scope.parent
        return None

    def get(self, name: str):
        """The value of ``name`` here or in an ancestor.

        Args:
            name: The value's name.

        Returns:
            The array.

        Raises:
            ScopeError: No value has that name (the message says to run the
                startup program).

        Example:
            ```python
            import retrograd as rg

            scope = rg.Scope()
            scope.set("step", 3)
            assert scope.get("step") == 3
            ```
        """
        value = self.find(name)
        if value is None:
            raise ScopeError(f"scope holds no value named '{name}'"
                             " (run the startup program to initialise parameters)")
        return value

    def set(self, name: str, value) -> None:
        """Store ``value`` under ``name`` in this scope.

        Args:
            name: The value's name.
            value: A NumPy array, a list or number (made an array), or an array of
                the scope's backend; NumPy values move to the backend's device once.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            scope = rg.Executor().scope
            scope.set("w", np.ones((2, 2), "float32"))
            assert scope.get("w").shape == (2, 2)
            ```
        """
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
        """Whether ``name`` has a value here or in an ancestor (also ``name in scope``).

        Args:
            name: The value's name.

        Returns:
            True when it has one.

        Example:
            ```python
            import retrograd as rg

            scope = rg.Scope()
            scope.set("w", 1.0)
            assert scope.has("w") and "w" in scope and not scope.has("v")
            ```
        """
        return self.find(name) is not None

    __contains__ = has

    def names(self) -> list[str]:
        """The names this scope holds itself (not its ancestors'), sorted.

        Returns:
            A sorted list of names (also what iterating the scope gives).

        Example:
            ```python
            import retrograd as rg

            scope = rg.Scope()
            scope.set("b", 0.0)
            scope.set("a", 1.0)
            assert scope.names() == ["a", "b"] == list(scope)
            ```
        """
        return sorted(self.vars)

    def new_child(self) -> "Scope":
        """A new, empty scope whose lookups fall through to this one (same backend).

        Returns:
            The child Scope.

        Example:
            ```python
            import retrograd as rg

            parent = rg.Scope()
            parent.set("w", 2.0)
            child = parent.new_child()
            child.set("h", 1.0)
            assert child.get("w") == 2.0 and not parent.has("h")
            ```
        """
        return Scope(parent=self, backend=self.backend)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"Scope({len(self.vars)} values)"
