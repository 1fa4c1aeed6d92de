"""``logical_or`` and ``not_equal``: elementwise, broadcasting, bool results, no gradient."""
from __future__ import annotations

from ...errors import ShapeError
from ...ir.program import Var
from ..array.creation import scalar_like
from ..core.lowering import compare, elementwise, lowers
from ..core.registry import append_op, defop
from ..core.shapes import compare_rule


def _both_bool_rule(ins, attrs):
    for var in ins:
        if var.dtype != "bool":
            raise ShapeError(f"'{var.name}' must be bool, got {var.dtype}")
    return compare_rule(ins, attrs)


@defop("LogicalOr", inputs=("x", "y"), infer=_both_bool_rule)
def _logical_or(k, x, y):
    return k.xp.logical_or(x, y)


lowers("LogicalOr")(elementwise("Or"))


@defop("NotEqual", inputs=("x", "y"), infer=compare_rule)
def _not_equal(k, x, y):
    return x != y


@lowers("NotEqual")
def _not_equal_onnx(g):
    return [g.node("Not", [compare("Equal")(g)[0]])]


def logical_or(a: Var, b: Var) -> Var:
    """Elementwise ``a or b`` of bool Vars, broadcasting.

    Example::

        outside = rg.logical_or(x < -1.0, x > 1.0)
    """
    return append_op("LogicalOr", [a, b])[0]


def not_equal(a, b) -> Var:
    """Elementwise ``a != b`` (bool), broadcasting; one operand may be a Python number.

    Example::

        nonzero = rg.not_equal(ids, 0)
    """
    if not isinstance(a, Var) and not isinstance(b, Var):
        raise ShapeError(f"not_equal needs at least one Var operand, got {a!r} and {b!r}")
    a = scalar_like(a, b) if not isinstance(a, Var) else a
    b = scalar_like(b, a) if not isinstance(b, Var) else b
    return append_op("NotEqual", [a, b])[0]
