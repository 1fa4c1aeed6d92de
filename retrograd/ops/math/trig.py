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
    """Sine of ``x`` (radians), elementwise.

    Args:
        x: A float Var (any shape).

    Returns:
        A Var of ``x``'s shape and dtype.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [3])
            y = rg.sin(x)
        xv = np.array([0., np.pi / 2, np.pi], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, np.sin(xv))
        ```
    """
    return append_op("Sin", [x])[0]


def cos(x: Var) -> Var:
    """Cosine of ``x`` (radians), elementwise.

    Args:
        x: A float Var (any shape).

    Returns:
        A Var of ``x``'s shape and dtype.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [3])
            y = rg.cos(x)
        xv = np.array([0., np.pi / 2, np.pi], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, np.cos(xv))
        ```
    """
    return append_op("Cos", [x])[0]
