"""Scope, Executor (compiled plans), run statistics."""
from .executor import Executor, RunContext
from .scope import Scope, ScopeError
from .stats import RunStats

__all__ = ["Executor", "RunContext", "RunStats", "Scope", "ScopeError"]
