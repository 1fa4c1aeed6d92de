"""``floor_divide`` and ``mod``: division rounded down and its remainder, as NumPy's and Python's.

``floor_divide(a, b) = floor(a / b)`` and ``mod(a, b) = a - floor(a / b) * b``
(the sign of ``b``, like Python's ``%``, NumPy's ``remainder`` and
``torch.remainder``), for integer and float operands, broadcasting. The
gradient of ``floor_divide`` is zero (where it is defined: away from the
jumps); of ``mod``, ``1`` for ``a`` and ``-floor(a / b)`` for ``b``.
"""
from __future__ import annotations

from ...errors import ShapeError
from ...ir.dtypes import is_float
from ...ir.program import OPERATORS, Var
from ..array.creation import scalar_like, zeros_like
from ..core.lowering import inputs_as, lowers
from .elementwise import neg, unbroadcast
from ..core.registry import append_op, defop
from ..core.shapes import broadcast_rule


def _binary(op_type: str, a, b) -> Var:
    if not isinstance(a, Var) and not isinstance(b, Var):
        raise ShapeError(f"{op_type} needs at least one Var operand, got {a!r} and {b!r}")
    a = scalar_like(a, b) if not isinstance(a, Var) else a
    b = scalar_like(b, a) if not isinstance(b, Var) else b
    return append_op(op_type, [a, b])[0]


@defop("FloorDivide", inputs=("x", "y"), infer=broadcast_rule,
       grad=lambda g: [unbroadcast(zeros_like(g.dy), x, *g.x) for x in g.x])
def _floor_divide(k, x, y):
    return k.xp.floor_divide(x, y)


@lowers("FloorDivide")
def _floor_divide_onnx(g):
    dtype = g.out_vars[0].dtype
    a, b = inputs_as(g, dtype)
    if is_float(dtype):
        return [g.node("Floor", [g.node("Div", [a, b])])]
    # ONNX Div truncates integers; (a - a mod b) / b is exact and rounds down.
    return [g.node("Div", [g.node("Sub", [a, g.node("Mod", [a, b], fmod=0)]), b])]


def _mod_grad(g):
    a, b = g.x
    return [unbroadcast(g.dy, a, b), unbroadcast(neg(g.dy * floor_divide(a, b)), b, a)]


@defop("Mod", inputs=("x", "y"), infer=broadcast_rule, grad=_mod_grad)
def _mod(k, x, y):
    return k.xp.remainder(x, y)


@lowers("Mod")
def _mod_onnx(g):
    dtype = g.out_vars[0].dtype
    a, b = inputs_as(g, dtype)
    if not is_float(dtype):
        return [g.node("Mod", [a, b], fmod=0)]      # integers: the divisor's sign
    # ONNX's float Mod is C's fmod (the dividend's sign); NumPy's remainder is a - floor(a/b) b.
    return [g.node("Sub", [a, g.node("Mul", [g.node("Floor", [g.node("Div", [a, b])]), b])])]


def floor_divide(x, y) -> Var:
    """``floor(x / y)`` elementwise, broadcasting (Python's ``x // y``).

    Integers stay integers; ``x // y`` on Vars does the same.

    Args:
        x: A Var, a Python number or a NumPy array (beside a Var it becomes a
            constant, weakly typed as Python scalars are in NumPy).
        y: The same; at least one of ``x`` and ``y`` is a Var.

    Returns:
        A Var of the broadcast shape; two Vars' dtypes promote as in NumPy.

    Raises:
        ShapeError: The shapes do not broadcast, or neither operand is a Var.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [2, 3], dtype="int64")
            y = rg.data("y", [3], dtype="int64")
            z = rg.floor_divide(x, y)                      # or x // y
        xv = np.array([[7, -7, 6], [1, 2, 3]], "int64")
        yv = np.array([2, 2, -4], "int64")
        (out,) = rg.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=[z])
        assert np.allclose(out, xv // yv)
        ```
    """
    return _binary("FloorDivide", x, y)


def mod(x, y) -> Var:
    """``x - floor(x / y) * y`` elementwise, broadcasting (Python's ``x % y``).

    The result has the sign of ``y``; ``x % y`` on Vars does the same.

    Args:
        x: A Var, a Python number or a NumPy array (beside a Var it becomes a
            constant, weakly typed as Python scalars are in NumPy).
        y: The same; at least one of ``x`` and ``y`` is a Var.

    Returns:
        A Var of the broadcast shape; two Vars' dtypes promote as in NumPy
        (float32 and int64 give float64).

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
            z = rg.mod(x, y)                      # or x % y
        xv = np.array([[7., -7., 6.], [1., 2., 3.]], "float32")
        yv = np.array([2., 2., -4.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=[z])
        assert np.allclose(out, xv % yv)
        ```
    """
    return _binary("Mod", x, y)


OPERATORS.update(floor_divide=floor_divide, mod=mod)      # x // y and x % y on Vars
