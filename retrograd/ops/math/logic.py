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
    """Elementwise OR of bool Vars, broadcasting.

    Args:
        a: A bool Var.
        b: A bool Var.

    Returns:
        A bool Var of the broadcast shape.

    Raises:
        ShapeError: The shapes do not broadcast.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [2, 3], dtype="bool")
            y = rg.data("y", [3], dtype="bool")
            z = rg.logical_or(x, y)
        xv = np.array([[True, False, True], [False, False, True]], "bool")
        yv = np.array([True, False, False], "bool")
        (out,) = rg.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=[z])
        assert np.array_equal(out, xv | yv)
        ```
    """
    return append_op("LogicalOr", [a, b])[0]


def not_equal(a, b) -> Var:
    """Elementwise ``a != b`` (bool), broadcasting.

    One operand may be a Python number.

    Args:
        a: A Var, a Python number or a NumPy array (beside a Var it becomes a
            constant, weakly typed as Python scalars are in NumPy).
        b: The same; at least one of ``a`` and ``b`` is a Var.

    Returns:
        A bool Var of the broadcast shape.

    Raises:
        ShapeError: The shapes do not broadcast, or neither operand is a Var.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [2, 3])
            y = rg.data("y", [3])
            z = rg.not_equal(x, y)
        xv = np.array([[1., 2., 3.], [4., 5., 6.]], "float32")
        yv = np.array([1., 5., 6.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=[z])
        assert np.array_equal(out, xv != yv)
        ```
    """
    if not isinstance(a, Var) and not isinstance(b, Var):
        raise ShapeError(f"not_equal needs at least one Var operand, got {a!r} and {b!r}")
    a = scalar_like(a, b) if not isinstance(a, Var) else a
    b = scalar_like(b, a) if not isinstance(b, Var) else b
    return append_op("NotEqual", [a, b])[0]
