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
    """``floor(x / y)`` elementwise, broadcasting (Python's ``x // y``); integers stay integers.

    Example::

        q = rg.floor_divide(x, 3.0)      # also x // 3.0
    """
    return _binary("FloorDivide", x, y)


def mod(x, y) -> Var:
    """``x - floor(x / y) * y`` elementwise, broadcasting (Python's ``x % y``: the sign of ``y``).

    Example::

        phase = rg.mod(t, 7.0)                     # or t % 7.0
    """
    return _binary("Mod", x, y)


OPERATORS.update(floor_divide=floor_divide, mod=mod)      # x // y and x % y on Vars
