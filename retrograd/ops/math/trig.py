"""``sin`` and ``cos``: elementwise on floats, each gradient written with the other (any order)."""
from __future__ import annotations

from ...ir.program import Var
from ..core.lowering import elementwise, lowers
from ..core.registry import append_op, defop
from ..core.shapes import float_same_as_first


@defop("Sin", infer=float_same_as_first, grad=lambda g: [g.dy * cos(g.x[0])])
def _sin(k, x):
    return k.xp.sin(x)


lowers("Sin")(elementwise("Sin"))


@defop("Cos", infer=float_same_as_first, grad=lambda g: [-(g.dy * sin(g.x[0]))])
def _cos(k, x):
    return k.xp.cos(x)


lowers("Cos")(elementwise("Cos"))


def sin(x: Var) -> Var:
    """Sine of ``x`` (radians), elementwise; float inputs.

    Example::

        y = rg.sin(x)          # dy/dx = cos(x)
    """
    return append_op("Sin", [x])[0]


def cos(x: Var) -> Var:
    """Cosine of ``x`` (radians), elementwise; float inputs.

    Example::

        c = rg.cos(angle)
    """
    return append_op("Cos", [x])[0]
