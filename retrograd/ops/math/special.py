"""Elementwise special functions: ``erf``, ``log1p``, ``expm1``, ``rsqrt``; gradients in rg ops.

``erf`` runs on each backend's own routine (torch, CuPy, SciPy) or the Array
API form of ``retrograd/backends/special.py``; ONNX has ``Erf`` but
onnxruntime runs it on float32 only, so float64 is lowered to that module's
series and continued fraction, node for node.
"""
from __future__ import annotations

import math

from ...ir.program import Var
from ...backends import special
from ..core.lowering import lowers
from ..core.registry import append_op, defop
from ..core.shapes import float_same_as_first


def _erf_grad(g):
    x = g.x[0]
    return [g.dy * (2.0 / math.sqrt(math.pi)) * exp(-(x * x))]


@defop("Erf", infer=float_same_as_first, grad=_erf_grad)
def _erf(k, x):
    return k.backend.erf(x)


def erf_onnx(g, x: str, dtype: str) -> str:
    """ONNX ``erf(x)``: the ``Erf`` node in float32, ``backends/special.erf`` in float64."""
    if dtype != "float64":
        return g.node("Erf", [x])

    def c(value):
        return g.const(value, dtype)
    a = g.node("Abs", [x])
    near = g.node("Min", [a, c(special.ERF_CUT)])
    term = total = near
    twice_square = g.node("Mul", [g.node("Mul", [c(2.0), near]), near])
    for n in range(1, special.ERF_SERIES_TERMS + 1):
        term = g.node("Div", [g.node("Mul", [term, twice_square]), c(float(2 * n + 1))])
        total = g.node("Add", [total, term])
    gauss = g.node("Exp", [g.node("Neg", [g.node("Mul", [near, near])])])
    small = g.node("Mul", [g.node("Mul", [c(2.0 / math.sqrt(math.pi)), gauss]), total])
    far = g.node("Min", [g.node("Max", [a, c(special.ERF_CUT)]), c(special.ERF_CAP)])
    fraction = far
    for k in range(special.ERF_FRACTION_DEPTH, 0, -1):
        fraction = g.node("Add", [far, g.node("Div", [c(k / 2.0), fraction])])
    tail = g.node("Div", [g.node("Exp", [g.node("Neg", [g.node("Mul", [far, far])])]),
                          g.node("Mul", [c(math.sqrt(math.pi)), fraction])])
    large = g.node("Sub", [c(1.0), tail])
    value = g.node("Where", [g.node("Less", [a, c(special.ERF_CUT)]), small, large])
    return g.node("Mul", [g.node("Sign", [x]), value])


@lowers("Erf")
def _erf_onnx(g):
    return [erf_onnx(g, g.ins[0], g.in_vars[0].dtype)]


@defop("Log1p", infer=float_same_as_first, grad=lambda g: [g.dy / (g.x[0] + 1.0)])
def _log1p(k, x):
    return k.xp.log1p(x)


@lowers("Log1p")
def _log1p_onnx(g):
    return [log1p_onnx(g, g.ins[0], g.in_vars[0].dtype)]


def log1p_onnx(g, x: str, dtype: str) -> str:
    """ONNX log(1 + x) with the rounding of ``1 + x`` corrected: ``log(u) * x / (u - 1)`` for
    ``u = 1 + x`` (Goldberg's trick; ``x`` itself where ``u == 1``)."""
    u = g.node("Add", [x, g.const(1.0, dtype)])
    um1 = g.node("Sub", [u, g.const(1.0, dtype)])
    exact = g.node("Equal", [um1, g.const(0.0, dtype)])
    safe = g.node("Where", [exact, g.const(1.0, dtype), um1])
    scaled = g.node("Div", [g.node("Mul", [g.node("Log", [u]), x]), safe])
    inf = g.node("IsInf", [u])
    return g.node("Where", [exact, x, g.node("Where", [inf, u, scaled])])


@defop("Expm1", infer=float_same_as_first, grad=lambda g: [g.dy * (g.y + 1.0)])
def _expm1(k, x):
    return k.xp.expm1(x)


@lowers("Expm1")
def _expm1_onnx(g):
    return [expm1_onnx(g, g.ins[0], g.in_vars[0].dtype)]


def expm1_onnx(g, x: str, dtype: str) -> str:
    """ONNX exp(x) - 1 with the rounding corrected: ``(u - 1) * x / log(u)`` for ``u = exp(x)``
    (Kahan's trick; ``x`` where ``u == 1``, ``-1`` where ``u - 1 == -1``, ``u`` where infinite)."""
    u = g.node("Exp", [x])
    um1 = g.node("Sub", [u, g.const(1.0, dtype)])
    log_u = g.node("Log", [u])
    exact = g.node("Equal", [um1, g.const(0.0, dtype)])
    flat = g.node("Or", [g.node("Equal", [um1, g.const(-1.0, dtype)]), g.node("IsInf", [u])])
    safe = g.node("Where", [exact, g.const(1.0, dtype), log_u])
    scaled = g.node("Div", [g.node("Mul", [um1, x]), safe])
    return g.node("Where", [exact, x, g.node("Where", [flat, um1, scaled])])


@defop("Rsqrt", infer=float_same_as_first, grad=lambda g: [g.dy * -0.5 * g.y * g.y * g.y])
def _rsqrt(k, x):
    return 1.0 / k.xp.sqrt(x)


@lowers("Rsqrt")
def _rsqrt_onnx(g):
    return [g.node("Reciprocal", [g.node("Sqrt", g.ins)])]


def erf(x: Var) -> Var:
    """The error function ``2/sqrt(pi) * integral_0^x exp(-t^2) dt``, elementwise; float inputs.

    Example::

        y = rg.erf(x)           # dy/dx = 2/sqrt(pi) * exp(-x^2)
    """
    return append_op("Erf", [x])[0]


def log1p(x: Var) -> Var:
    """``log(1 + x)``, accurate for small ``x``. Example: ``rg.log1p(x)``."""
    return append_op("Log1p", [x])[0]


def expm1(x: Var) -> Var:
    """``exp(x) - 1``, accurate for small ``x``. Example: ``rg.expm1(x)``."""
    return append_op("Expm1", [x])[0]


def rsqrt(x: Var) -> Var:
    """``1 / sqrt(x)``, elementwise. Example: ``inv_std = rg.rsqrt(var + 1e-5)``."""
    return append_op("Rsqrt", [x])[0]


from .elementwise import exp  # noqa: E402  (math imports nothing from here; kept last for symmetry)
