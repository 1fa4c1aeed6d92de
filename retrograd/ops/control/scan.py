"""``scan``, ``fori_loop`` and ``map``: the functional loops (JAX's ``lax.scan``/``fori_loop``/
``lax.map``, TensorFlow's ``scan``/``map_fn``), thin builders over the ``Scan`` op
(``while_loop.py``: a counted loop binding row i of each sliced input and stacking per-iteration
values). They differentiate like any ``Scan`` (to any order; the gradient is a ``Scan`` the other
way) and export to ONNX as a ``Loop``.
"""
from __future__ import annotations

from typing import Callable

from ...errors import ProgramError
from ...ir.builder import block_guard, current_block
from ...ir.program import Block, Var
from ..core import streams
from ..array.creation import assign, constant
from ..math.elementwise import maximum, sub
from ..core.registry import append_op
from ..core.subblocks import (as_vars, bound_var, names_of, outer_reads, shapes_compatible, unique)
from ..array.tensor import cast, dim
from .tensor_array import TensorArray


def _as_list(value, what: str) -> tuple[list[Var], type | None]:
    """``value`` (a Var, or a list/tuple of Vars) as a list, and its form: None for a single Var,
    else its type (list or tuple), so results come back in the form given."""
    if isinstance(value, Var):
        return [value], None
    if isinstance(value, (list, tuple)) and all(isinstance(v, Var) for v in value):
        return list(value), type(value)
    raise ProgramError(f"{what} must be a Var or a list/tuple of Vars, got {value!r}")


def _shaped(vars_: list[Var], form: type | None):
    return vars_[0] if form is None else form(vars_)


def _owned(block: Block, vars_: list[Var]) -> list[Var]:
    """``vars_`` as values of ``block``: one computed outside it (a closure) is copied in, so each
    iteration has a value of its own to keep."""
    with block_guard(block):
        return [v if v.name in block.vars else assign(v) for v in vars_]


def _check_carries(where: str, inits: list[Var], new: list[Var]) -> None:
    if len(new) != len(inits):
        raise ProgramError(f"{where}: the function returns {len(new)} carries ({names_of(new)}) for "
                           f"{len(inits)} initial ones ({names_of(inits)})")
    for j, (init, var) in enumerate(zip(inits, new)):
        if var.dtype != init.dtype or not shapes_compatible(init.shape, var.shape):
            raise ProgramError(f"{where}: carry {j} is '{init.name}' {init.type_str()} but the function makes "
                               f"'{var.name}' {var.type_str()}; a carry keeps its dtype and shape")


def _build_scan(where: str, count: Var, inits: list[Var], xs: list[Var], step: Callable, reverse: bool):
    """A Scan op of ``count`` iterations: ``step(carry_vars, x_vars) -> (new carries, ys)``, both
    lists; returns (finals, stacked ys)."""
    block = current_block()
    for var in inits + xs:
        if not block.sees(var):
            raise ProgramError(f"{where}: '{var.name}' belongs to {block.home_of(var)}, which block "
                               f"{block.idx} cannot see")
    for x in xs:
        if x.ndim < 1:
            raise ProgramError(f"{where}: '{x.name}' {x.type_str()} has no axis 0 to loop over")
    body = block.program.create_block(block)
    carries = [_carried(body, v) for v in inits]
    rows = [body.create_var(body.program.unique_name(f"{x.name}.row"), x.shape[1:], x.dtype) for x in xs]
    with block_guard(body):
        new, ys = step(carries, rows)
    new, _ = as_vars(list(new), f"{where}: the function's carries", body)
    ys, _ = as_vars(list(ys), f"{where}: the function's outputs", body)
    _check_carries(where, inits, new)
    new, ys = _owned(body, new), _owned(body, ys)
    reads = unique(outer_reads(body, [v.name for v in new + ys]))
    attrs = {"body": body, "carry_binds": [v.name for v in carries], "body_outs": [v.name for v in new],
             "x_binds": [v.name for v in rows], "ys": [v.name for v in ys], "ys_like": [None] * len(ys),
             "ys_full": [True] * len(ys), "reverse": bool(reverse)}
    if any(isinstance(v, TensorArray) for v in inits):   # carried arrays grow: each step's shapes kept
        attrs["ragged"] = True
    # an empty carried array whose element sizes are -1 would stack to 0 for them after zero steps
    arrays = [j for j, v in enumerate(inits) if isinstance(v, TensorArray) and any(d < 0 for d in v.shape[1:])]
    if arrays:
        attrs["array_carries"] = arrays
    if arrays or any(d < 0 for y in ys for d in y.shape):    # zero steps: one step on zero rows gives the sizes
        attrs["zero_step_shapes"] = True
    attrs.update(streams.stream_attrs(body))    # a loop key when the step draws random numbers
    outs = append_op("Scan", [count] + inits + xs + [block.var(n) for n in reads], attrs, name="scan")
    finals = [TensorArray.of(v, init.element_shape) if isinstance(init, TensorArray) else v
              for v, init in zip(outs[:len(inits)], inits)]
    return finals, outs[len(inits):]


def _carried(body: Block, init: Var) -> Var:
    """The step's Var for a carry: a TensorArray (of any size) for a TensorArray carry."""
    if not isinstance(init, TensorArray):
        return bound_var(body, f"{init.name}.cur", init)
    var = body.create_var(body.program.unique_name(f"{init.name}.cur"), (-1,) + init.shape[1:], init.dtype)
    return TensorArray.of(var, init.element_shape)


def scan(fn: Callable, init, xs, reverse: bool = False):
    """``carry, y_t = fn(carry, x_t)`` over axis 0 of ``xs``; returns ``(carry, ys)`` (as ``jax.lax.scan``).

    T is read at run time (T = 0 gives ``init`` and empty ``ys``; sizes declared -1 in a
    ``ys`` or in an empty carried TensorArray's elements come from one step run on zero rows,
    so the stacks are ``[0, *what a step gives]``). ``fn`` is
    called once, to build the step, and may read any variable of the enclosing
    blocks; gradients reach ``init``, ``xs`` and those variables (summed over
    steps), to any order.

    Args:
        fn: ``fn(carry, x_t) -> (new_carry, y_t)``; the carry keeps its form,
            dtypes and shapes; ``y_t`` is a Var, a list of Vars or None.
        init: A Var or a list/tuple of Vars: the initial carry.
        xs: A Var ``[T, ...]`` or a list of them (same T); ``fn`` gets the row
            ``x_t`` in the same form.
        reverse: Run t = T-1 .. 0 (``ys[t]`` still belongs to ``xs[t]``).

    Returns:
        ``(carry, ys)``: the final carry, and the ``y_t`` stacked to
        ``[T, ...]`` (in ``y_t``'s form; None when ``fn`` returned None).

    Raises:
        ProgramError: ``fn`` does not return a ``(carry, y)`` pair.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            xs = rg.data("xs", [-1, 2])                # [T, 2]
            total, running = rg.scan(lambda acc, x: (acc + x, acc + x), rg.zeros_like(xs[0]), xs)
            back, _ = rg.scan(lambda acc, x: (acc * 0.5 + x, None), rg.zeros_like(xs[0]), xs, reverse=True)
        xv = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], "float32")
        t, r, b = rg.Executor().run(main, feed={"xs": xv}, fetch_list=[total, running, back])
        assert t.tolist() == [9.0, 12.0] and np.array_equal(r, np.cumsum(xv, axis=0))
        assert b.tolist() == [1.0 + 1.5 + 1.25, 2.0 + 2.0 + 1.5]
        ```
    """
    inits, carry_form = _as_list(init, "scan: init")
    seqs, x_form = _as_list(xs, "scan: xs")
    shape = {}

    def step(carries, rows):
        out = fn(_shaped(carries, carry_form), _shaped(rows, x_form))
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise ProgramError(f"scan: fn must return (carry, y), got {out!r}")
        new, y = out
        new, _ = _as_list(new, "scan: fn's carry")
        shape["none"] = y is None
        if y is None:
            return new, []
        ys, shape["ys"] = _as_list(y, "scan: fn's y")
        return new, ys
    finals, ys = _build_scan("scan", dim(seqs[0], 0), inits, seqs, step, reverse)
    carry = _shaped(finals, carry_form)
    if shape["none"]:
        return carry, None
    return carry, _shaped(ys, shape["ys"])


def _bound(value, what: str) -> Var:
    if isinstance(value, Var):
        if value.dtype not in ("int32", "int64") or value.shape not in ((), (1,)):
            raise ProgramError(f"fori_loop: {what} must be an int or an integer scalar Var, got {value!r}")
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return constant(value, dtype="int64")
    raise ProgramError(f"fori_loop: {what} must be an int or an integer scalar Var, got {value!r}")


def fori_loop(lower, upper, body_fn: Callable, init):
    """``val = body_fn(i, val)`` for ``i`` in ``lower .. upper-1`` (as ``jax.lax.fori_loop``); returns ``val``.

    Built as a ``Scan`` of ``max(upper - lower, 0)`` iterations, so it is
    reverse-differentiable (to any order) whatever the bounds.

    Args:
        lower: An int or an integer scalar Var (a run-time bound).
        upper: The same; no iterations when ``upper <= lower``.
        body_fn: ``body_fn(i, val) -> val``, ``i`` an int64 scalar Var.
        init: A Var or a list/tuple of Vars.

    Returns:
        The final ``val``, in the form of ``init``.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x0 = rg.data("x0", [2])
            n = rg.data("n", [], dtype="int64")
            x = rg.fori_loop(0, n, lambda i, x: x + rg.cast(i, "float32"), x0)   # x0 + 0 + 1 + ... + n-1
        feed = {"x0": np.zeros(2, "float32"), "n": np.array(4)}
        (out,) = rg.Executor().run(main, feed=feed, fetch_list=[x])
        assert out.tolist() == [6.0, 6.0]
        ```
    """
    vals, form = _as_list(init, "fori_loop: init")
    if isinstance(lower, int) and isinstance(upper, int) and not isinstance(lower, bool) \
            and not isinstance(upper, bool):
        count = constant(max(upper - lower, 0), dtype="int64")
    else:
        low, high = _bound(lower, "lower"), _bound(upper, "upper")
        count = maximum(sub(high, low), constant(0, dtype=high.dtype))
    start = _bound(lower, "lower")
    start = start if start.dtype == "int64" else cast(start, "int64")

    def step(carries, rows):
        i, vals_ = carries[0], carries[1:]
        new, _ = _as_list(body_fn(i, _shaped(vals_, form)), "fori_loop: body_fn's result")
        return [i + 1] + new, []
    finals, _ = _build_scan("fori_loop", count, [start] + vals, [], step, False)
    return _shaped(finals[1:], form)


def map(fn: Callable, xs):
    """``fn`` applied to each row of ``xs`` along axis 0, the results stacked (as ``jax.lax.map``).

    Differentiable to any order.

    Args:
        fn: ``fn(row) -> Var`` (or a list of Vars); called once, to build the step.
        xs: A Var ``[T, ...]`` or a list of them (``fn`` gets the rows in the same form).

    Returns:
        A Var ``[T, ...]`` (or a list of them, in ``fn``'s form).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [-1, 2])
            norms = rg.map(lambda row: rg.sqrt(rg.sum(row * row)), x)     # [T, D] -> [T]
        xv = np.array([[3.0, 4.0], [0.0, 1.0]], "float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[norms])
        assert np.allclose(out, [5.0, 1.0])
        ```
    """
    seqs, x_form = _as_list(xs, "map: xs")
    shape = {}

    def step(carries, rows):
        ys, shape["form"] = _as_list(fn(_shaped(rows, x_form)), "map: fn's result")
        return [], ys
    _, ys = _build_scan("map", dim(seqs[0], 0), [], seqs, step, False)
    return _shaped(ys, shape["form"])
