"""Elementwise arithmetic, comparisons and matmul, each with its gradient beside it.

Binary ops broadcast like NumPy; their gradients are reduced back to each
input's run-time shape by ``SumTo`` (see ``unbroadcast``).
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import ShapeError
from ...ir.dtypes import is_float
from ...ir.program import OPERATORS, Var, as_float, as_ints
from ..array.creation import constant, fill_like, scalar_like, zeros_like
from ..core.registry import ROW_WISE_ELEMENTWISE, append_op, defop
from ..core.lowering import axes_input, compare, elementwise, lowers
from ..core.shapes import (broadcast_rule, broadcast_shapes, compare_rule, float_same_as_first,
                           same_as_first)


def _operands(a, b, what: str) -> tuple[Var, Var]:
    """Both operands as Vars: a number or NumPy array beside a Var becomes a constant
    (``scalar_like``), so ``x + np.ones(8)`` works as ``x + 1.0`` does, reflected forms too."""
    if not isinstance(a, Var) and not isinstance(b, Var):
        raise ShapeError(f"{what} needs at least one Var operand, got {a!r:.60} and {b!r:.60}")
    a = scalar_like(a, b) if not isinstance(a, Var) else a
    b = scalar_like(b, a) if not isinstance(b, Var) else b
    return a, b


def _binary(type: str, a, b) -> Var:
    return append_op(type, list(_operands(a, b, type)))[0]


# --- Broadcast reduction used by every binary gradient -------------------------

def _sum_to_rule(ins, attrs):
    return [(ins[1].shape, ins[0].dtype)]


@defop("SumTo", inputs=("x", "like"), infer=_sum_to_rule, nondiff=(1,), shape_only=(1,),
       grad=lambda g: [expand_as(g.dy, g.x[0]), None])
def _sum_to(k, x, like):
    """Sum ``x`` over the axes NumPy broadcasting added to reach it from ``like``'s shape."""
    target = like.shape
    if tuple(x.shape) == tuple(target):
        return x
    lead = x.ndim - len(target)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(target) if d == 1 and x.shape[lead + i] != 1)
    out = k.xp.sum(x, axis=axes, keepdims=True) if axes else x
    return k.xp.reshape(out, tuple(target))


@lowers("SumTo")
def _sum_to_onnx(g):
    x, like = g.in_vars
    lead = x.ndim - like.ndim
    out = g.ins[0]
    if lead:
        out = g.node("ReduceSum", [out, axes_input(g, range(lead))], keepdims=0)
    pairs = list(zip(x.shape[lead:], like.shape))
    if all((t >= 0 and t != 1) or s == 1 for s, t in pairs):      # decided when built
        axes = [i for i, (s, t) in enumerate(pairs) if t == 1 and s != 1]
        if axes:
            out = g.node("ReduceSum", [out, axes_input(g, axes)], keepdims=1)
        return [out]
    # Which axes broadcasting stretched is known only at run time: like is 1 there, x is not.
    one = g.const([1], "int64")
    stretched = g.node("And", [g.node("Equal", [g.shape(g.ins[1]), one]),
                               g.node("Not", [g.node("Equal", [g.shape(out), one])])])
    axes = g.node("Reshape", [g.node("NonZero", [stretched]), g.const([-1], "int64")])
    out = g.node("ReduceSum", [out, axes], keepdims=1, noop_with_empty_axes=1)
    return [g.node("Reshape", [out, g.shape(g.ins[1])], allowzero=1)]


def sum_to(x: Var, like: Var) -> Var:
    """Reduce ``x`` to the run-time shape of ``like`` (undoes broadcasting)."""
    return append_op("SumTo", [x, like])[0]


def _expand_as_rule(ins, attrs):
    return [(ins[1].shape, ins[0].dtype)]


def _expand_as_grad(g):
    # The reductions are appended by op type: the reduce family's builders use this module's
    # ops (expand_as, exp, where), so importing them here would make the two families a circle.
    dx = g.dy
    if g.attrs["mean_axes"]:
        dx = append_op("Mean", [dx], {"axis": as_ints(g.attrs["mean_axes"], "axis"), "keepdims": True})[0]
    if g.attrs["axes"]:
        dx = append_op("Sum", [dx], {"axis": as_ints(g.attrs["axes"], "axis"), "keepdims": False})[0]
    return [sum_to(dx, g.x[0]), None]


@defop("ExpandAs", inputs=("x", "like"), infer=_expand_as_rule, nondiff=(1,), shape_only=(1,),
       grad=_expand_as_grad)
def _expand_as(k, x, like):
    """Insert size-1 axes at ``axes``, broadcast to ``like``'s shape, divide by the sizes of ``mean_axes``."""
    xp = k.xp
    for axis in k.attrs["axes"]:
        x = xp.expand_dims(x, axis=axis)
    out = xp.broadcast_to(x, tuple(like.shape))
    count = 1
    for axis in k.attrs["mean_axes"]:
        count *= like.shape[axis]
    return out / count if count != 1 else out


@lowers("ExpandAs")
def _expand_as_onnx(g):
    x = g.ins[0]
    if g.attrs["axes"]:
        x = g.node("Unsqueeze", [x, axes_input(g, g.attrs["axes"])])
    out = g.node("Expand", [x, g.shape(g.ins[1])])
    if g.attrs["mean_axes"]:
        sizes = g.node("Gather", [g.shape(g.ins[1]), g.const(list(g.attrs["mean_axes"]), "int64")])
        count = g.cast(g.node("ReduceProd", [sizes], keepdims=0), g.out_vars[0].dtype)
        out = g.node("Div", [out, count])
    return [out]


def expand_as(x: Var, like: Var, axes=(), mean_axes=()) -> Var:
    """Broadcast ``x`` (size-1 axes inserted at ``axes``) to ``like``'s run-time shape.

    With ``mean_axes`` the result is divided by the run-time sizes of those axes
    (the gradient of a mean).
    """
    return append_op("ExpandAs", [x, like], {"axes": sorted(axes), "mean_axes": sorted(mean_axes)})[0]


def unbroadcast(grad: Var, x: Var, *others: Var) -> Var:
    """``grad`` reduced to ``x``'s run-time shape; no op when broadcasting cannot have grown x.

    ``others`` are the op's other operands: where ``x`` has an unknown dimension
    and no other operand could stretch it (its dimension there is 1 or absent),
    that axis needs no reduction. ``x`` itself among the others (``x * x``)
    cannot stretch it.
    """
    others = tuple(o for o in others if o is not x)
    if grad.shape == x.shape and all(_not_stretched(x, i, others) for i in range(x.ndim)):
        return grad
    return sum_to(grad, x)


def _not_stretched(x: Var, axis: int, others) -> bool:
    if x.shape[axis] >= 0:
        return True
    offset = x.ndim - axis
    return all(o.ndim < offset or o.shape[o.ndim - offset] == 1 for o in others)


# --- Binary arithmetic -------------------------------------------------------------

def _add_grad(g):
    a, b = g.x
    return [unbroadcast(g.dy, a, b), unbroadcast(g.dy, b, a)]


@defop("Add", inputs=("x", "y"), infer=broadcast_rule, grad=_add_grad, row_wise=ROW_WISE_ELEMENTWISE)
def _add(k, x, y):
    return x + y


lowers("Add")(elementwise("Add"))


def _sub_grad(g):
    a, b = g.x
    return [unbroadcast(g.dy, a, b), unbroadcast(neg(g.dy), b, a)]


@defop("Sub", inputs=("x", "y"), infer=broadcast_rule, grad=_sub_grad, row_wise=ROW_WISE_ELEMENTWISE)
def _sub(k, x, y):
    return x - y


lowers("Sub")(elementwise("Sub"))


def _mul_grad(g):
    a, b = g.x
    return [unbroadcast(g.dy * b, a, b), unbroadcast(g.dy * a, b, a)]


@defop("Mul", inputs=("x", "y"), infer=broadcast_rule, grad=_mul_grad, row_wise=ROW_WISE_ELEMENTWISE)
def _mul(k, x, y):
    return x * y


lowers("Mul")(elementwise("Mul"))


def _div_grad(g):
    a, b = g.x
    da = g.dy / b
    return [unbroadcast(da, a, b), unbroadcast(neg(da * g.y), b, a)]


def _div_rule(ins, attrs):
    """True division (NumPy's): integer / integer is float64."""
    [(shape, dtype)] = broadcast_rule(ins, attrs)
    return [(shape, dtype if is_float(dtype) else "float64")]


@defop("Div", inputs=("x", "y"), infer=_div_rule, grad=_div_grad, row_wise=ROW_WISE_ELEMENTWISE)
def _div(k, x, y):
    return x / y


lowers("Div")(elementwise("Div"))


def _pow_grad(g):
    a, b = g.x
    da = g.dy * b * pow(a, b - 1.0)
    db = g.dy * g.y * log(a)
    return [unbroadcast(da, a, b), unbroadcast(db, b, a)]


@defop("Pow", inputs=("x", "y"), infer=broadcast_rule, grad=_pow_grad)
def _pow(k, x, y):
    return k.xp.pow(x, y) if hasattr(k.xp, "pow") else x ** y


lowers("Pow")(elementwise("Pow"))


def _minmax_grad(pick_first_where):
    def grad(g):
        a, b = g.x
        # Ties split the gradient evenly, as PyTorch does.
        first = where(pick_first_where(a, b), fill_like(g.dy, 1.0), fill_like(g.dy, 0.0))
        first = where(equal(a, b), fill_like(g.dy, 0.5), first)
        return [unbroadcast(g.dy * first, a, b), unbroadcast(g.dy * (1.0 - first), b, a)]
    return grad


@defop("Maximum", inputs=("x", "y"), infer=broadcast_rule, grad=_minmax_grad(lambda a, b: greater(a, b)))
def _maximum(k, x, y):
    return k.xp.maximum(x, y)


lowers("Maximum")(elementwise("Max"))


@defop("Minimum", inputs=("x", "y"), infer=broadcast_rule, grad=_minmax_grad(lambda a, b: less(a, b)))
def _minimum(k, x, y):
    return k.xp.minimum(x, y)


lowers("Minimum")(elementwise("Min"))


def add(x, y) -> Var:
    """Elementwise ``x + y``.

    NumPy broadcasting; ``x + y`` on Vars does the same (reflected forms with numbers too).

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
            z = rg.add(x, y)                      # or x + y
        xv = np.array([[1., 2., 3.], [4., 5., 6.]], "float32")
        yv = np.array([10., 20., 30.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=[z])
        assert np.allclose(out, xv + yv)
        ```
    """
    return _binary("Add", x, y)


def sub(x, y) -> Var:
    """Elementwise ``x - y``.

    NumPy broadcasting; ``x - y`` on Vars does the same (reflected forms with numbers too).

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
            z = rg.sub(x, y)                      # or x - y
        xv = np.array([[1., 2., 3.], [4., 5., 6.]], "float32")
        yv = np.array([10., 20., 30.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=[z])
        assert np.allclose(out, xv - yv)
        ```
    """
    return _binary("Sub", x, y)


def mul(x, y) -> Var:
    """Elementwise ``x * y``.

    NumPy broadcasting; ``x * y`` on Vars does the same (reflected forms with numbers too).

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
            z = rg.mul(x, y)                      # or x * y
        xv = np.array([[1., 2., 3.], [4., 5., 6.]], "float32")
        yv = np.array([10., 20., 30.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=[z])
        assert np.allclose(out, xv * yv)
        ```
    """
    return _binary("Mul", x, y)


def div(x, y) -> Var:
    """Elementwise ``x / y``.

    NumPy broadcasting; ``x / y`` on Vars does the same (reflected forms with numbers too).

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
            z = rg.div(x, y)                      # or x / y
        xv = np.array([[1., 2., 3.], [4., 5., 6.]], "float32")
        yv = np.array([10., 20., 30.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=[z])
        assert np.allclose(out, xv / yv)
        ```
    """
    return _binary("Div", x, y)


def pow(x, y) -> Var:
    """Elementwise ``x ** y``.

    NumPy broadcasting; ``x ** y`` on Vars does the same.

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
            z = rg.pow(x, y)                      # or x ** y
        xv = np.array([[1., 2., 3.], [4., 5., 6.]], "float32")
        yv = np.array([1., 2., 0.5], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=[z])
        assert np.allclose(out, xv ** np.array([1., 2., 0.5], 'float32'))
        ```
    """
    return _binary("Pow", x, y)


def maximum(x, y) -> Var:
    """Elementwise maximum of ``x`` and ``y``.

    Where they tie, each operand gets half of the gradient.

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
            z = rg.maximum(x, y)
        xv = np.array([[1., 2., 3.], [4., 5., 6.]], "float32")
        yv = np.array([2., 2., 7.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=[z])
        assert np.allclose(out, np.maximum(xv, yv))
        ```
    """
    return _binary("Maximum", x, y)


def minimum(x, y) -> Var:
    """Elementwise minimum of ``x`` and ``y``.

    Where they tie, each operand gets half of the gradient.

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
            z = rg.minimum(x, y)
        xv = np.array([[1., 2., 3.], [4., 5., 6.]], "float32")
        yv = np.array([2., 2., 7.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=[z])
        assert np.allclose(out, np.minimum(xv, yv))
        ```
    """
    return _binary("Minimum", x, y)


# --- Comparisons and logic (bool outputs, no gradient) ------------------------------

@defop("Less", inputs=("x", "y"), infer=compare_rule)
def _less(k, x, y):
    return x < y


lowers("Less")(compare("Less"))


@defop("LessEqual", inputs=("x", "y"), infer=compare_rule)
def _less_equal(k, x, y):
    return x <= y


lowers("LessEqual")(compare("LessOrEqual"))


@defop("Greater", inputs=("x", "y"), infer=compare_rule)
def _greater(k, x, y):
    return x > y


lowers("Greater")(compare("Greater"))


@defop("GreaterEqual", inputs=("x", "y"), infer=compare_rule)
def _greater_equal(k, x, y):
    return x >= y


lowers("GreaterEqual")(compare("GreaterOrEqual"))


@defop("Equal", inputs=("x", "y"), infer=compare_rule)
def _equal(k, x, y):
    return x == y


lowers("Equal")(compare("Equal"))


def _bool_rule(ins, attrs):
    if ins[0].dtype != "bool":
        raise ShapeError(f"'{ins[0].name}' must be bool, got {ins[0].dtype}")
    return [(ins[0].shape, "bool")]


@defop("LogicalNot", infer=_bool_rule)
def _logical_not(k, x):
    return k.xp.logical_not(x)


lowers("LogicalNot")(elementwise("Not"))


def less(x, y) -> Var:
    """Elementwise ``x < y``.

    The result is bool and has no gradient; ``x < y`` on Vars does the same.

    Args:
        x: A Var, a Python number or a NumPy array (beside a Var it becomes a
            constant, weakly typed as Python scalars are in NumPy).
        y: The same; at least one of ``x`` and ``y`` is a Var.

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
            z = rg.less(x, y)                      # or x < y
        xv = np.array([[1., 2., 3.], [4., 5., 6.]], "float32")
        yv = np.array([2., 2., 7.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=[z])
        assert np.array_equal(out, xv < yv)
        ```
    """
    return _binary("Less", x, y)


def less_equal(x, y) -> Var:
    """Elementwise ``x <= y``.

    The result is bool and has no gradient; ``x <= y`` on Vars does the same.

    Args:
        x: A Var, a Python number or a NumPy array (beside a Var it becomes a
            constant, weakly typed as Python scalars are in NumPy).
        y: The same; at least one of ``x`` and ``y`` is a Var.

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
            z = rg.less_equal(x, y)                      # or x <= y
        xv = np.array([[1., 2., 3.], [4., 5., 6.]], "float32")
        yv = np.array([2., 2., 7.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=[z])
        assert np.array_equal(out, xv <= yv)
        ```
    """
    return _binary("LessEqual", x, y)


def greater(x, y) -> Var:
    """Elementwise ``x > y``.

    The result is bool and has no gradient; ``x > y`` on Vars does the same.

    Args:
        x: A Var, a Python number or a NumPy array (beside a Var it becomes a
            constant, weakly typed as Python scalars are in NumPy).
        y: The same; at least one of ``x`` and ``y`` is a Var.

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
            z = rg.greater(x, y)                      # or x > y
        xv = np.array([[1., 2., 3.], [4., 5., 6.]], "float32")
        yv = np.array([2., 2., 7.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=[z])
        assert np.array_equal(out, xv > yv)
        ```
    """
    return _binary("Greater", x, y)


def greater_equal(x, y) -> Var:
    """Elementwise ``x >= y``.

    The result is bool and has no gradient; ``x >= y`` on Vars does the same.

    Args:
        x: A Var, a Python number or a NumPy array (beside a Var it becomes a
            constant, weakly typed as Python scalars are in NumPy).
        y: The same; at least one of ``x`` and ``y`` is a Var.

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
            z = rg.greater_equal(x, y)                      # or x >= y
        xv = np.array([[1., 2., 3.], [4., 5., 6.]], "float32")
        yv = np.array([2., 2., 7.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=[z])
        assert np.array_equal(out, xv >= yv)
        ```
    """
    return _binary("GreaterEqual", x, y)


def equal(x, y) -> Var:
    """Elementwise ``x == y``.

    The result is bool and has no gradient. ``==`` on Vars is *not* overloaded (it
    is identity, so Vars stay hashable): use this function.

    Args:
        x: A Var, a Python number or a NumPy array (beside a Var it becomes a
            constant, weakly typed as Python scalars are in NumPy).
        y: The same; at least one of ``x`` and ``y`` is a Var.

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
            z = rg.equal(x, y)
        xv = np.array([[1., 2., 3.], [4., 5., 6.]], "float32")
        yv = np.array([1., 5., 6.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=[z])
        assert np.array_equal(out, xv == yv)
        ```
    """
    return _binary("Equal", x, y)


def logical_not(x: Var) -> Var:
    """Elementwise NOT of a bool Var.

    Args:
        x: A bool Var.

    Returns:
        A Var of ``x``'s shape and dtype.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [3], dtype="bool")
            y = rg.logical_not(x)
        xv = np.array([True, False, True], "bool")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, [False, True, False])
        ```
    """
    return append_op("LogicalNot", [x])[0]


# --- Where ---------------------------------------------------------------------------

def _where_rule(ins, attrs):
    cond, a, b = ins
    if cond.dtype != "bool":
        raise ShapeError(f"condition '{cond.name}' must be bool, got {cond.dtype}")
    if a.dtype != b.dtype:
        raise ShapeError(f"branches must share a dtype, got {a.dtype} and {b.dtype}")
    return [(broadcast_shapes(cond.shape, a.shape, b.shape), a.dtype)]


def _where_grad(g):
    cond, a, b = g.x
    zero = zeros_like(g.dy)
    return [None, unbroadcast(where(cond, g.dy, zero), a, cond, b),
            unbroadcast(where(cond, zero, g.dy), b, cond, a)]


@defop("Where", inputs=("cond", "x", "y"), infer=_where_rule, nondiff=(0,), grad=_where_grad)
def _where(k, cond, x, y):
    return k.xp.where(cond, x, y)


@lowers("Where")
def _where_onnx(g):
    return [g.node("Where", g.ins)]


def where(cond: Var, x, y) -> Var:
    """``x`` where ``cond`` holds, else ``y``, broadcasting all three.

    The gradient flows to ``x`` where ``cond`` holds and to ``y`` elsewhere.

    Args:
        cond: A bool Var (or a bool array / Python bool, made a constant).
        x: A Var, Python number or NumPy array: the values where ``cond`` holds.
        y: The same, for the other places; numbers follow the other branch's dtype.

    Returns:
        A Var of the broadcast shape and the branches' dtype.

    Raises:
        ShapeError: ``cond`` is not bool, the branches' dtypes differ, or the
            shapes do not broadcast.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [4])
            y = rg.where(x > 0.0, x, 0.0)              # relu by hand
        xv = np.array([-1.0, 2.0, -3.0, 4.0], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert list(out) == [0.0, 2.0, 0.0, 4.0]
        ```
    """
    if not isinstance(cond, Var):
        cond = constant(np.asarray(cond), "bool")
    if not isinstance(x, Var) and not isinstance(y, Var):
        x = constant(x)                      # both Python scalars: float32 / int64 / bool
        y = scalar_like(y, x)
    other = x if isinstance(x, Var) else y
    x = scalar_like(x, other)
    y = scalar_like(y, other)
    return append_op("Where", [cond, x, y])[0]


# --- Unary ----------------------------------------------------------------------------

def _unary(type: str, x: Var) -> Var:
    return append_op(type, [x])[0]


@defop("Neg", infer=same_as_first, grad=lambda g: [neg(g.dy)], row_wise=ROW_WISE_ELEMENTWISE)
def _neg(k, x):
    return -x


lowers("Neg")(elementwise("Neg"))


@defop("Exp", infer=float_same_as_first, grad=lambda g: [g.dy * g.y], row_wise=ROW_WISE_ELEMENTWISE)
def _exp(k, x):
    return k.xp.exp(x)


lowers("Exp")(elementwise("Exp"))


@defop("Log", infer=float_same_as_first, grad=lambda g: [g.dy / g.x[0]], row_wise=ROW_WISE_ELEMENTWISE)
def _log(k, x):
    return k.xp.log(x)


lowers("Log")(elementwise("Log"))


@defop("Tanh", infer=float_same_as_first, grad=lambda g: [g.dy * (1.0 - g.y * g.y)], row_wise=ROW_WISE_ELEMENTWISE)
def _tanh(k, x):
    return k.xp.tanh(x)


lowers("Tanh")(elementwise("Tanh"))


@defop("Sigmoid", infer=float_same_as_first, grad=lambda g: [g.dy * g.y * (1.0 - g.y)], row_wise=ROW_WISE_ELEMENTWISE)
def _sigmoid(k, x):
    xp = k.xp
    # exp of -|x| never overflows; both branches are exact formulas of sigmoid.
    z = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1.0 / (1.0 + z), z / (1.0 + z))


lowers("Sigmoid")(elementwise("Sigmoid"))


@defop("Relu", infer=same_as_first, grad=lambda g: [relu_grad(g.y, g.dy)], row_wise=ROW_WISE_ELEMENTWISE)
def _relu(k, x):
    return k.backend.relu(x)


lowers("Relu")(elementwise("Relu"))


# Relu's gradient is one op, ReluGrad(y, dy) = dy where y > 0, else 0 (torch's threshold_backward
# on the torch backend, one pass instead of a comparison and a select). It reads Relu's output
# (y > 0 exactly where x > 0, NaN included), so the input can be freed after the forward.
@defop("ReluGrad", inputs=("y", "dy"), infer=lambda ins, attrs: [(ins[1].shape, ins[1].dtype)], nondiff=(0,),
       grad=lambda g: [None, relu_grad(g.x[0], g.dy)], row_wise=ROW_WISE_ELEMENTWISE)
def _relu_grad(k, y, dy):
    """``dy`` where ``y`` (Relu's output) is positive, 0 elsewhere."""
    return k.backend.relu_grad(y, dy)


@lowers("ReluGrad")
def _relu_grad_onnx(g):
    y, dy = g.ins
    zero = g.const(0.0, g.in_vars[1].dtype)
    return [g.node("Where", [g.node("Greater", [y, g.const(0, g.in_vars[0].dtype)]), dy, zero])]


def relu_grad(y: Var, dy: Var) -> Var:
    """The gradient of ``relu`` given its output ``y`` and the output's gradient ``dy``, as one op.

    Example::

        dx = relu_grad(y, dy)          # dy where y > 0, else 0
    """
    return append_op("ReluGrad", [y, dy])[0]


@defop("Square", infer=same_as_first, grad=lambda g: [g.dy * 2.0 * g.x[0]], row_wise=ROW_WISE_ELEMENTWISE)
def _square(k, x):
    return x * x


@lowers("Square")
def _square_onnx(g):
    return [g.node("Mul", [g.ins[0], g.ins[0]])]


@defop("Sqrt", infer=float_same_as_first, grad=lambda g: [g.dy * 0.5 / g.y])
def _sqrt(k, x):
    return k.xp.sqrt(x)


lowers("Sqrt")(elementwise("Sqrt"))


@defop("Abs", infer=same_as_first, grad=lambda g: [g.dy * sign(g.x[0])])
def _abs(k, x):
    return k.xp.abs(x)


lowers("Abs")(elementwise("Abs"))


@defop("Sign", infer=same_as_first, grad=lambda g: [zeros_like(g.x[0])])
def _sign(k, x):
    return k.xp.sign(x)


lowers("Sign")(elementwise("Sign"))


def neg(x: Var) -> Var:
    """Elementwise ``-x``; also ``-x`` on Vars.

    Args:
        x: A numeric Var (any shape).

    Returns:
        A Var of ``x``'s shape and dtype.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [3])
            y = rg.neg(x)
        xv = np.array([1., -2., 0.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, -xv)
        ```
    """
    return _unary("Neg", x)


def exp(x: Var) -> Var:
    """Elementwise ``e ** x``.

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
            y = rg.exp(x)
        xv = np.array([0., 1., -1.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, np.exp(xv))
        ```
    """
    return _unary("Exp", x)


def log(x: Var) -> Var:
    """Elementwise natural logarithm.

    NaN below 0 and ``-inf`` at 0, as NumPy.

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
            y = rg.log(x)
        xv = np.array([1., 2., 10.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, np.log(xv))
        ```
    """
    return _unary("Log", x)


def tanh(x: Var) -> Var:
    """Elementwise hyperbolic tangent.

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
            y = rg.tanh(x)
        xv = np.array([0., 1., -2.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, np.tanh(xv))
        ```
    """
    return _unary("Tanh", x)


def sigmoid(x: Var) -> Var:
    """Elementwise ``1 / (1 + exp(-x))``, computed without overflow.

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
            y = rg.sigmoid(x)
        xv = np.array([0., 100., -100.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, [0.5, 1.0, 0.0])
        ```
    """
    return _unary("Sigmoid", x)


def relu(x: Var) -> Var:
    """Elementwise ``max(x, 0)``.

    The gradient is 0 where ``x <= 0``.

    Args:
        x: A numeric Var (any shape).

    Returns:
        A Var of ``x``'s shape and dtype.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [3])
            y = rg.relu(x)
        xv = np.array([-1., 0., 2.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, [0., 0., 2.])
        ```
    """
    return _unary("Relu", x)


def square(x: Var) -> Var:
    """Elementwise ``x * x``.

    Args:
        x: A numeric Var (any shape).

    Returns:
        A Var of ``x``'s shape and dtype.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [3])
            y = rg.square(x)
        xv = np.array([-1., 2., 3.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, [1., 4., 9.])
        ```
    """
    return _unary("Square", x)


def sqrt(x: Var) -> Var:
    """Elementwise square root.

    NaN below 0, as NumPy.

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
            y = rg.sqrt(x)
        xv = np.array([1., 4., 9.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, [1., 2., 3.])
        ```
    """
    return _unary("Sqrt", x)


def abs(x: Var) -> Var:
    """Elementwise ``|x|``.

    The gradient at 0 is 0.

    Args:
        x: A numeric Var (any shape).

    Returns:
        A Var of ``x``'s shape and dtype.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [3])
            y = rg.abs(x)
        xv = np.array([-1.5, 0., 2.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, [1.5, 0., 2.])
        ```
    """
    return _unary("Abs", x)


def sign(x: Var) -> Var:
    """Elementwise -1, 0 or 1 by the sign of ``x``.

    Its gradient is 0.

    Args:
        x: A numeric Var (any shape).

    Returns:
        A Var of ``x``'s shape and dtype.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [3])
            y = rg.sign(x)
        xv = np.array([-3., 0., 2.], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[y])
        assert np.allclose(out, [-1., 0., 1.])
        ```
    """
    return _unary("Sign", x)


# --- Clip ---------------------------------------------------------------------------------

def _clip_grad(g):
    x = g.x[0]
    inside = (x >= g.attrs["lo"]) if g.attrs["lo"] is not None else None
    if g.attrs["hi"] is not None:
        upper = x <= g.attrs["hi"]
        inside = upper if inside is None else logical_and(inside, upper)
    return [g.dy if inside is None else where(inside, g.dy, 0.0)]


@defop("Clip", infer=same_as_first, grad=_clip_grad)
def _clip(k, x):
    lo, hi = k.attrs["lo"], k.attrs["hi"]
    # 0-d bounds made by a fill, not copied from the host (a copy cannot be captured in a CUDA graph)
    if lo is not None:
        x = k.xp.maximum(x, k.xp.full((), lo, dtype=x.dtype))
    if hi is not None:
        x = k.xp.minimum(x, k.xp.full((), hi, dtype=x.dtype))
    return x


@lowers("Clip")
def _clip_onnx(g):
    x, dtype = g.ins[0], g.in_vars[0].dtype
    if g.attrs["lo"] is not None:
        x = g.node("Max", [x, g.const(g.attrs["lo"], dtype)])
    if g.attrs["hi"] is not None:
        x = g.node("Min", [x, g.const(g.attrs["hi"], dtype)])
    return [x if x != g.ins[0] else g.node("Identity", [x])]


def clip(x: Var, lo: float | None, hi: float | None) -> Var:
    """Clamp ``x`` to ``[lo, hi]``; either bound may be None.

    The gradient passes where ``lo <= x <= hi`` and is 0 elsewhere.

    Args:
        x: A numeric Var.
        lo: The lower bound, or None for none.
        hi: The upper bound, or None for none.

    Returns:
        A Var of ``x``'s shape and dtype.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            p = rg.data("p", [3])
            q = rg.clip(p, 1e-6, 1.0)
        (out,) = rg.Executor().run(main, feed={"p": np.array([0.0, 0.5, 2.0], "float32")}, fetch_list=[q])
        assert np.allclose(out, [1e-6, 0.5, 1.0])
        ```
    """
    return append_op("Clip", [x], {"lo": None if lo is None else as_float(lo, "clip: lo"),
                                   "hi": None if hi is None else as_float(hi, "clip: hi")})[0]


@defop("LogicalAnd", inputs=("x", "y"), infer=compare_rule)
def _logical_and(k, x, y):
    return k.xp.logical_and(x, y)


lowers("LogicalAnd")(elementwise("And"))


def logical_and(x, y) -> Var:
    """Elementwise AND of bools, broadcasting.

    A NumPy bool array or a Python bool may stand for one side.

    Args:
        x: A Var, a Python number or a NumPy array (beside a Var it becomes a
            constant, weakly typed as Python scalars are in NumPy).
        y: The same; at least one of ``x`` and ``y`` is a Var.

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
            x = rg.data("x", [2, 3], dtype="bool")
            y = rg.data("y", [3], dtype="bool")
            z = rg.logical_and(x, y)
        xv = np.array([[True, False, True], [False, False, True]], "bool")
        yv = np.array([True, True, False], "bool")
        (out,) = rg.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=[z])
        assert np.array_equal(out, xv & yv)
        ```
    """
    return _binary("LogicalAnd", x, y)


# --- MatMul -------------------------------------------------------------------------------

def _matmul_rule(ins, attrs):
    a, b = ins
    if a.dtype != b.dtype:
        raise ShapeError(f"matmul operands must share a dtype, got {a.dtype} and {b.dtype}")
    if a.ndim < 2 or b.ndim < 2:
        raise ShapeError("matmul operands need at least 2 dimensions (reshape vectors first)")
    m, ka = (a.shape[-1], a.shape[-2]) if attrs.get("transpose_x") else a.shape[-2:]
    kb, n = (b.shape[-1], b.shape[-2]) if attrs.get("transpose_y") else b.shape[-2:]
    if ka >= 0 and kb >= 0 and ka != kb:
        raise ShapeError(f"inner dimensions differ: {ka} vs {kb}")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return [(batch + (m, n), a.dtype)]


def _matmul_grad(g):
    a, b = g.x
    ta, tb = g.attrs.get("transpose_x", False), g.attrs.get("transpose_y", False)
    dy = g.dy
    # d(A@B): dA = dY @ B^T, dB = A^T @ dY, with the transposes folded into flags.
    da = matmul(b, dy, transpose_x=tb, transpose_y=True) if ta else matmul(dy, b, transpose_y=not tb)
    db = matmul(dy, a, transpose_x=True, transpose_y=ta) if tb else matmul(a, dy, transpose_x=not ta)
    if a.ndim == 2 and b.ndim == 2:
        return [da, db]
    return [unbroadcast(da, a, b), unbroadcast(db, b, a)]


def _matmul_flops(ins, outs, attrs) -> int:
    inner = ins[0][-2] if attrs.get("transpose_x") else ins[0][-1]
    return 2 * math.prod(outs[0]) * inner


@defop("MatMul", inputs=("x", "y"), infer=_matmul_rule, grad=_matmul_grad, batch_rows=(0,), flops=_matmul_flops)
def _matmul(k, x, y):
    return k.backend.matmul(x, y, bool(k.attrs.get("transpose_x")), bool(k.attrs.get("transpose_y")))


@lowers("MatMul")
def _matmul_onnx(g):
    x, y = g.ins
    if (g.attrs.get("transpose_x") and not g.attrs.get("transpose_y") and g.ndim(0) == g.ndim(1) == 2
            and g.in_vars[0].dtype in ("float32", "float64")):
        # x^T y (a weight gradient): onnxruntime's Gemm reads x transposed ~8% faster than the
        # MatMul it fuses with a Transpose (FusedMatMul), e.g. [2048,128]^T @ [2048,512]
        return [g.node("Gemm", [x, y], transA=1)]
    if g.attrs.get("transpose_x"):
        x = g.node("Transpose", [x], perm=_swap_last(g.in_vars[0].ndim))
    if g.attrs.get("transpose_y"):
        y = g.node("Transpose", [y], perm=_swap_last(g.in_vars[1].ndim))
    return [g.node("MatMul", [x, y])]


def _swap_last(ndim: int) -> list[int]:
    return list(range(ndim - 2)) + [ndim - 1, ndim - 2]


def matmul(x, y, transpose_x: bool = False, transpose_y: bool = False) -> Var:
    """Batched matrix product, with NumPy ``matmul`` broadcasting over leading axes.

    Also ``x @ y`` on Vars. A number or NumPy array beside a Var becomes a constant.

    Args:
        x: A Var ``[..., M, K]`` (at least 2-D; reshape vectors first).
        y: A Var ``[..., K, N]`` of the same dtype.
        transpose_x: Multiply by ``x``'s transpose over its last two axes.
        transpose_y: Multiply by ``y``'s transpose over its last two axes.

    Returns:
        A Var ``[..., M, N]`` (leading axes broadcast).

    Raises:
        ShapeError: An operand has fewer than 2 dimensions, the dtypes differ or
            the inner dimensions disagree.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [-1, 3])
            w = rg.data("w", [3, 2])
            h = rg.matmul(x, w)                        # x [N, 3] @ w [3, 2] -> [N, 2]
            g = rg.matmul(x, x, transpose_y=True)      # x @ x.T -> [N, N]
        xv = np.arange(6, dtype="float32").reshape(2, 3)
        wv = np.ones((3, 2), "float32")
        hv, gv = rg.Executor().run(main, feed={"x": xv, "w": wv}, fetch_list=[h, g])
        assert np.allclose(hv, xv @ wv) and np.allclose(gv, xv @ xv.T)
        ```
    """
    if not isinstance(x, Var) or not isinstance(y, Var):
        x, y = _operands(x, y, "matmul")
    attrs = {}
    if transpose_x:
        attrs["transpose_x"] = True
    if transpose_y:
        attrs["transpose_y"] = True
    return append_op("MatMul", [x, y], attrs, name="matmul")[0]


OPERATORS.update(add=add, sub=sub, mul=mul, div=div, matmul=matmul, pow=pow, neg=neg,
                 less=less, less_equal=less_equal, greater=greater, greater_equal=greater_equal)


# --- AddN: summing gradient contributions ---------------------------------------------------

def _add_n_rule(ins, attrs):
    if not ins:
        raise ShapeError("add_n needs at least one input")
    shape = broadcast_shapes(*(v.shape for v in ins))
    dtypes = {v.dtype for v in ins}
    if len(dtypes) > 1:
        raise ShapeError(f"add_n inputs must share a dtype, got {', '.join(sorted(dtypes))}")
    return [(shape, ins[0].dtype)]


# sums_inputs: passes that look through gradient accumulation (the recurrent op's
# weight-gradient batching) ask for this property rather than the op's name.
@defop("AddN", inputs=("xs*",), infer=_add_n_rule, sums_inputs=True,
       grad=lambda g: [unbroadcast(g.dy, x, *(o for o in g.x if o is not x)) for x in g.x])
def _add_n(k, *xs):
    """Sum of any number of same-shaped tensors (how fan-out gradients are combined)."""
    if len(xs) == 1:
        return k.xp.asarray(xs[0], copy=True)
    total = xs[0] + xs[1]
    for x in xs[2:]:
        total = total + x
    return total


@lowers("AddN")
def _add_n_onnx(g):
    """Sum, or Add for two terms: onnxruntime's GemmSumFusion folds a two-input Sum into a Gemm
    feeding it and fails at session build (``gemm_input_edge.src_arg_index < 2``) when that
    Gemm reads the third or later output of a node (a weight gradient ``x^T dy`` of a Split's
    part); it leaves Add alone, and Add is what the kernel computes."""
    if len(g.ins) == 2:
        return [g.node("Add", g.ins)]
    return [g.node("Sum" if len(g.ins) > 1 else "Identity", g.ins)]


def add_n(xs) -> Var:
    """Elementwise sum of a list of Vars of one shape and dtype.

    Args:
        xs: The Vars to add (one or more).

    Returns:
        A Var of their shape and dtype.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            a, b, c = (rg.data(n, [2]) for n in "abc")
            total = rg.add_n([a, b, c])
        feed = {"a": np.ones(2, "float32"), "b": np.ones(2, "float32"), "c": np.full(2, 3.0, "float32")}
        (out,) = rg.Executor().run(main, feed=feed, fetch_list=[total])
        assert list(out) == [5.0, 5.0]
        ```
    """
    return append_op("AddN", list(xs))[0]
