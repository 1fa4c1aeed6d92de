"""Activations: ``gelu``, ``silu``, ``leaky_relu``, ``elu``, ``softplus`` (PyTorch's definitions).

Kernels are backend methods (``backends/base.py``: Array API formulas; torch's own
``torch.nn.functional`` routines on the torch backend). Each gradient is written with rg ops (so second derivatives work); the ONNX
lowerings use basic nodes that onnxruntime runs in float32 and float64 alike
(its ``Gelu``, ``Elu``, ``LeakyRelu`` and ``Softplus`` kernels are float32-only).
"""
from __future__ import annotations

import math

from ...errors import ProgramError
from ...ir.program import Var, as_float
from ..core.lowering import lowers
from .elementwise import exp, sigmoid, tanh, where
from ..core.registry import ROW_WISE_ELEMENTWISE, append_op, defop
from ..core.shapes import float_same_as_first
from .special import erf_onnx, expm1_onnx, log1p_onnx

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715
SOFTPLUS_THRESHOLD = 20.0     # torch's default: softplus(x) = x above it


# --- GELU -----------------------------------------------------------------------------------------
# Gelu's gradient is one fused op, GeluGrad(x, dy) = dy * gelu'(x) (torch's gelu_backward on the
# torch backend); GeluGrad's own gradient is written with rg ops (gelu'' from the formulas below).

def _tanh_parts(x):
    """(t, u', u'') of u = sqrt(2/pi) (x + 0.044715 x^3), t = tanh(u)."""
    t = tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x))
    return t, SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x), (6.0 * SQRT_2_OVER_PI * GELU_CUBIC) * x


def _gelu_curvature(x: Var, approximate: str) -> Var:
    """gelu''(x): phi(x) (2 - x^2) exactly; (1 - t^2) (u' + x (u'' - 2 t u'^2) / 2) for tanh."""
    if approximate == "tanh":
        t, du, ddu = _tanh_parts(x)
        return (1.0 - t * t) * (du + 0.5 * x * (ddu - 2.0 * t * du * du))
    return exp(-0.5 * (x * x)) * (1.0 / math.sqrt(2.0 * math.pi)) * (2.0 - x * x)


@defop("Gelu", infer=float_same_as_first, grad=lambda g: [gelu_grad(g.x[0], g.dy, g.attrs["approximate"])],
       row_wise=ROW_WISE_ELEMENTWISE)
def _gelu(k, x):
    return k.backend.gelu(x, k.attrs["approximate"])


@lowers("Gelu")
def _gelu_onnx(g):
    x, dtype = g.ins[0], g.in_vars[0].dtype

    def c(value):
        return g.const(value, dtype)
    if g.attrs["approximate"] == "tanh":
        cube = g.node("Mul", [g.node("Mul", [x, x]), x])
        inner = g.node("Mul", [c(SQRT_2_OVER_PI), g.node("Add", [x, g.node("Mul", [c(GELU_CUBIC), cube])])])
        gate = g.node("Add", [c(1.0), g.node("Tanh", [inner])])
    else:
        gate = g.node("Add", [c(1.0), erf_onnx(g, g.node("Mul", [x, c(math.sqrt(0.5))]), dtype)])
    return [g.node("Mul", [g.node("Mul", [c(0.5), x]), gate])]


def _gelu_grad_grad(g):
    x, dy = g.x
    approximate = g.attrs["approximate"]
    return [g.dy * dy * _gelu_curvature(x, approximate), gelu_grad(x, g.dy, approximate)]


@defop("GeluGrad", inputs=("x", "dy"), infer=float_same_as_first, grad=_gelu_grad_grad)
def _gelu_grad(k, x, dy):
    """``dy * gelu'(x)``: ``Phi(x) + x phi(x)``, or the tanh form's derivative."""
    return k.backend.gelu_grad(x, dy, k.attrs["approximate"])


@lowers("GeluGrad")
def _gelu_grad_onnx(g):
    x, dy = g.ins
    dtype = g.in_vars[0].dtype

    def c(value):
        return g.const(value, dtype)

    def mul(*values):
        out = values[0]
        for v in values[1:]:
            out = g.node("Mul", [out, v])
        return out
    if g.attrs["approximate"] == "tanh":
        square = mul(x, x)
        t = g.node("Tanh", [mul(c(SQRT_2_OVER_PI), g.node("Add", [x, mul(c(GELU_CUBIC), square, x)]))])
        du = mul(c(SQRT_2_OVER_PI), g.node("Add", [c(1.0), mul(c(3.0 * GELU_CUBIC), square)]))
        slope = g.node("Add", [mul(c(0.5), g.node("Add", [c(1.0), t])),
                               mul(c(0.5), x, g.node("Sub", [c(1.0), mul(t, t)]), du)])
    else:
        cdf = mul(c(0.5), g.node("Add", [c(1.0), erf_onnx(g, mul(x, c(math.sqrt(0.5))), dtype)]))
        density = mul(g.node("Exp", [mul(c(-0.5), x, x)]), c(1.0 / math.sqrt(2.0 * math.pi)))
        slope = g.node("Add", [cdf, mul(x, density)])
    return [mul(dy, slope)]


def gelu_grad(x: Var, dy: Var, approximate: str = "none") -> Var:
    """``dy * gelu'(x)`` in one op (Gelu's gradient).

    Example::

        dx = gelu_grad(x, dy)
    """
    return append_op("GeluGrad", [x, dy], {"approximate": approximate})[0]


def gelu(x: Var, approximate: str = "none") -> Var:
    """``x * Phi(x)`` (Phi: the standard normal CDF), as ``torch.nn.functional.gelu``.

    ``approximate="tanh"``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.

    Args:
        x: A float Var (any shape).
        approximate: ``"none"`` (the exact form) or ``"tanh"``.

    Returns:
        A Var of ``x``'s shape and dtype.

    Raises:
        ProgramError: ``approximate`` is neither.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [3])
            y = rg.gelu(x)
        xv = np.array([-1., 0., 2.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, [-0.15865525, 0.0, 1.9544997])
        ```
    """
    if approximate not in ("none", "tanh"):
        raise ProgramError(f'gelu: approximate must be "none" or "tanh", got {approximate!r}')
    return append_op("Gelu", [x], {"approximate": approximate})[0]


# --- SiLU -------------------------------------------------------------------------------------------

def _silu_grad(g):
    x = g.x[0]
    s = sigmoid(x)
    return [g.dy * (s + x * s * (1.0 - s))]


@defop("Silu", infer=float_same_as_first, grad=_silu_grad)
def _silu(k, x):
    return k.backend.silu(x)


@lowers("Silu")
def _silu_onnx(g):
    """The kernel's formula (onnxruntime's float64 Sigmoid is off by 1e-5 relative far left)."""
    x, dtype = g.ins[0], g.in_vars[0].dtype
    one = g.const(1.0, dtype)
    z = g.node("Exp", [g.node("Neg", [g.node("Abs", [x])])])
    denominator = g.node("Add", [one, z])
    gate = g.node("Where", [g.node("GreaterOrEqual", [x, g.const(0.0, dtype)]),
                            g.node("Div", [one, denominator]), g.node("Div", [z, denominator])])
    return [g.node("Mul", [x, gate])]


def silu(x: Var) -> Var:
    """``x * sigmoid(x)`` (swish), as ``torch.nn.functional.silu``.

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
            y = rg.silu(x)
        xv = np.array([-1., 0., 2.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, xv / (1 + np.exp(-xv)))
        ```
    """
    return append_op("Silu", [x])[0]


# --- Leaky ReLU -------------------------------------------------------------------------------------

@defop("LeakyRelu", infer=float_same_as_first,
       grad=lambda g: [where(g.x[0] > 0.0, g.dy, g.dy * g.attrs["negative_slope"])])
def _leaky_relu(k, x):
    return k.backend.leaky_relu(x, k.attrs["negative_slope"])


@lowers("LeakyRelu")
def _leaky_relu_onnx(g):
    x, dtype = g.ins[0], g.in_vars[0].dtype
    positive = g.node("Greater", [x, g.const(0.0, dtype)])
    return [g.node("Where", [positive, x, g.node("Mul", [x, g.const(g.attrs["negative_slope"], dtype)])])]


def leaky_relu(x: Var, negative_slope: float = 0.01) -> Var:
    """``x`` where positive, ``negative_slope * x`` elsewhere.

    The gradient at 0 is the slope.

    Args:
        x: A float Var (any shape).
        negative_slope: The slope below 0.

    Returns:
        A Var of ``x``'s shape and dtype.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [3])
            y = rg.leaky_relu(x, negative_slope=0.1)
        xv = np.array([-2., 0., 3.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, [-0.2, 0.0, 3.0])
        ```
    """
    return append_op("LeakyRelu", [x], {"negative_slope": as_float(negative_slope, "leaky_relu: negative_slope")})[0]


# --- ELU --------------------------------------------------------------------------------------------

def _elu_grad(g):
    x, alpha = g.x[0], g.attrs["alpha"]
    return [where(x > 0.0, g.dy, g.dy * alpha * exp(where(x > 0.0, 0.0, x)))]


@defop("Elu", infer=float_same_as_first, grad=_elu_grad)
def _elu(k, x):
    return k.backend.elu(x, k.attrs["alpha"])


@lowers("Elu")
def _elu_onnx(g):
    x, dtype = g.ins[0], g.in_vars[0].dtype
    zero = g.const(0.0, dtype)
    negative = g.node("Mul", [g.const(g.attrs["alpha"], dtype), expm1_onnx(g, g.node("Min", [x, zero]), dtype)])
    return [g.node("Where", [g.node("Greater", [x, zero]), x, negative])]


def elu(x: Var, alpha: float = 1.0) -> Var:
    """``x`` where positive, ``alpha * (exp(x) - 1)`` elsewhere, as ``torch.nn.functional.elu``.

    Args:
        x: A float Var (any shape).
        alpha: The scale of the negative part.

    Returns:
        A Var of ``x``'s shape and dtype.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [3])
            y = rg.elu(x)
        xv = np.array([-1., 0., 2.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, [np.exp(-1.0) - 1.0, 0.0, 2.0])
        ```
    """
    return append_op("Elu", [x], {"alpha": as_float(alpha, "elu: alpha")})[0]


# --- Softplus ---------------------------------------------------------------------------------------

@defop("Softplus", infer=float_same_as_first,
       grad=lambda g: [where(g.x[0] > SOFTPLUS_THRESHOLD, g.dy, g.dy * sigmoid(g.x[0]))])
def _softplus(k, x):
    return k.backend.softplus(x, SOFTPLUS_THRESHOLD)


@lowers("Softplus")
def _softplus_onnx(g):
    x, dtype = g.ins[0], g.in_vars[0].dtype
    threshold = g.const(SOFTPLUS_THRESHOLD, dtype)
    smooth = log1p_onnx(g, g.node("Exp", [g.node("Min", [x, threshold])]), dtype)
    return [g.node("Where", [g.node("Greater", [x, threshold]), x, smooth])]


def softplus(x: Var) -> Var:
    """``log(1 + exp(x))``, as ``torch.nn.functional.softplus``.

    Beta is 1; above 20 the result is ``x`` itself.

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
            y = rg.softplus(x)
        xv = np.array([0., -30., 50.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, [np.log(2.0), 0.0, 50.0])
        ```
    """
    return append_op("Softplus", [x])[0]


