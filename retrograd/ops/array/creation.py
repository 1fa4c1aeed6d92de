"""Ops and builders that create values: data, parameters, constants, fills, random init."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ... import backend
from ...errors import ProgramError, ShapeError
from ...ir.builder import current_block, default_main_program, default_startup_program
from ...ir.dtypes import canonical, is_float
from ...ir.program import Block, Op, Var, as_int, as_ints, as_list
from ..core.registry import append_op, defop
from ..core.lowering import lowers
from ..core.shapes import same_as_first
from ..core.streams import random_key


def _attr_shape(ins, attrs):
    return [(tuple(attrs["shape"]), attrs["dtype"])]


def _static_shape(shape: Sequence[int], what: str) -> list[int]:
    shape = as_ints(shape, f"{what}: shape")
    if any(d < 0 for d in shape):
        raise ShapeError(f"{what} needs a fully known shape, got {shape}")
    return shape


# --- Constant -----------------------------------------------------------------

@defop("Constant", inputs=(), infer=_attr_shape)
def _constant(k):
    """A value fixed in the program (stored in its attributes)."""
    # Moved to the device once per plan, not per run: kernels never write into their inputs,
    # and a device graph cannot copy from the host while it is captured (runtime/graphs.py).
    if k.cached is None:
        k.cached = k.xp.asarray(np.asarray(k.attrs["value"], dtype=k.attrs["dtype"]).reshape(k.attrs["shape"]))
    return k.cached


@lowers("Constant")
def _constant_onnx(g):
    a = g.attrs
    return [g.const(np.asarray(a["value"], dtype=a["dtype"]).reshape(a["shape"]), a["dtype"])]


def constant(value, dtype=None, name: str | None = None) -> Var:
    """A constant Var holding ``value`` (a number or array).

    Example::

        two = rg.constant(2.0)                    # float32 scalar
        ids = rg.constant([1, 2, 3])              # int64 vector
    """
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:          # ragged nested lists, ...
        raise ProgramError(f"cannot make a constant of {type(value).__name__}: {exc}") from None
    if dtype is None:
        dtype = _default_dtype(array)
    dtype = canonical(dtype)
    array = array.astype(dtype)
    attrs = {"value": array.tolist(), "shape": list(array.shape), "dtype": dtype}
    return append_op("Constant", [], attrs, name=name or "const")[0]


def _default_dtype(array: np.ndarray) -> str:
    if array.dtype.kind == "f":
        return "float32" if array.dtype == np.float64 and array.ndim == 0 else canonical(array.dtype)
    if array.dtype.kind in "iu":
        return "int64"
    if array.dtype.kind == "b":
        return "bool"
    raise ProgramError(f"cannot make a constant of dtype {array.dtype}")


def scalar_like(value, other: Var) -> Var:
    """A Python or NumPy number, or a NumPy array, as a constant for an op with ``other``.

    Such operands are "weakly typed", as Python scalars are in NumPy: floats
    follow the other operand's float dtype (``x_f32 + np.ones(8)`` is float32);
    integers stay int64 next to integer Vars and follow a float Var's dtype;
    bools stay bool. A float array next to an integer Var keeps its own dtype.
    """
    if isinstance(value, Var):
        return value
    if isinstance(value, np.ndarray):
        kind = value.dtype.kind
        if kind not in "biuf":
            raise ProgramError(f"cannot combine a NumPy array of dtype {value.dtype} with Var '{other.name}'")
        if kind == "b":
            dtype = "bool"
        elif is_float(other.dtype):
            dtype = other.dtype
        else:
            dtype = "int64" if kind in "iu" else canonical(value.dtype)
        return constant(value, dtype)
    if isinstance(value, (bool, np.bool_)):
        dtype = "bool"
    elif isinstance(value, (int, np.integer)):
        dtype = other.dtype if is_float(other.dtype) else "int64"
    elif isinstance(value, (float, np.floating)):
        dtype = other.dtype if is_float(other.dtype) else "float32"
    else:
        raise ProgramError(f"cannot combine {type(value).__name__} {value!r:.60} with Var '{other.name}' "
                           "(operands are Vars, Python or NumPy numbers, or NumPy arrays)")
    return constant(value, dtype)


# --- Fill and friends -----------------------------------------------------------

@defop("Fill", inputs=(), infer=_attr_shape)
def _fill(k):
    """A tensor of one value with a shape known when the program is built."""
    return k.xp.full(tuple(k.attrs["shape"]), k.attrs["value"], dtype=backend.dtype_of(k.xp, k.attrs["dtype"]))


@lowers("Fill")
def _fill_onnx(g):
    a = g.attrs
    return [g.const(np.full(tuple(a["shape"]), a["value"], dtype=a["dtype"]), a["dtype"])]


def fill(shape: Sequence[int], value: float, dtype: str = "float32") -> Var:
    """A tensor of ``shape`` filled with ``value``.

    Example::

        ones = rg.fill([2, 3], 1.0)
    """
    shape = _static_shape(shape, "fill")
    return append_op("Fill", [], {"shape": shape, "value": float(value) if is_float(canonical(dtype))
                                  else int(value), "dtype": canonical(dtype)})[0]


def _fill_like_rule(ins, attrs):
    return [(ins[0].shape, attrs.get("dtype") or ins[0].dtype)]


@defop("FillLike", infer=_fill_like_rule, nondiff=(0,), shape_only=(0,), grad=lambda g: [None])
def _fill_like(k, x):
    """A tensor shaped like ``x`` (at run time) filled with one value."""
    dtype = k.attrs.get("dtype") or str(x.dtype)
    return k.xp.full(x.shape, k.attrs["value"], dtype=backend.dtype_of(k.xp, dtype))


@lowers("FillLike")
def _fill_like_onnx(g):
    return [g.fill(g.shape(g.ins[0]), g.attrs["value"], g.out_vars[0].dtype)]


def fill_like(x: Var, value: float, dtype: str | None = None) -> Var:
    """A tensor with ``x``'s run-time shape filled with ``value``.

    Example::

        half = rg.fill_like(x, 0.5)                # x's shape at run time
    """
    return append_op("FillLike", [x], {"value": value, "dtype": canonical(dtype) if dtype else None})[0]


@defop("ShapeStandIn", infer=same_as_first, nondiff=(0,), shape_only=(0,), recomputable=False,
       stand_in=True)
def _shape_stand_in(k, x):
    """``x``'s run-time shape and dtype at the cost of one element: a zero-stride view of a zero.

    Ops that read a value only for its shape (``shape_only``) can read this
    instead, so the value itself may be freed (``memory/shape_reads.py``).
    Keeping it is cheaper than recomputing it (``recomputable=False``). No
    gradient flows through it: nothing depends on the value behind a shape.
    """
    return k.xp.broadcast_to(k.xp.zeros((), dtype=x.dtype), tuple(x.shape))


@lowers("ShapeStandIn")
def _shape_stand_in_onnx(g):
    return [g.fill(g.shape(g.ins[0]), 0, g.out_vars[0].dtype)]


def shape_stand_in(x: Var) -> Var:
    """A one-element stand-in with ``x``'s run-time shape and dtype, for ops reading ``x`` only
    for its shape.

    Example::

        like = shape_stand_in(h)     # 'h.shape': h may be freed, like has h's shape at run time
    """
    block = current_block()
    name = f"{x.name}.shape"
    name = block.program.unique_name(name) if block.program.has_name(name) else name
    out = block.create_var(name, x.shape, x.dtype, stop_gradient=True)
    return append_op("ShapeStandIn", [x], outputs=[out], block=block)[0]


def zeros_like(x: Var) -> Var:
    """Zeros of ``x``'s run-time shape and dtype.

    Example::

        z = rg.zeros_like(x)
    """
    return fill_like(x, 0.0 if is_float(x.dtype) else 0)


def ones_like(x: Var) -> Var:
    """Ones of ``x``'s run-time shape and dtype.

    Example::

        o = rg.ones_like(x)
    """
    return fill_like(x, 1.0 if is_float(x.dtype) else 1)


@defop("Assign", infer=same_as_first, grad=lambda g: [g.dy])
def _assign(k, x):
    """A copy of ``x`` (its own buffer)."""
    return k.xp.asarray(x, copy=True)


@lowers("Assign")
def _assign_onnx(g):
    return [g.node("Identity", g.ins)]


def assign(x: Var, output: Var | None = None) -> Var:
    """Copy ``x``; with ``output``, write the copy into an existing Var.

    Example::

        rg.assign(new_h, output=h)                 # h takes new_h's value
    """
    return append_op("Assign", [x], outputs=None if output is None else [output])[0]


# --- Random initialisers (startup program) ---------------------------------------

def random_key_of(k, seed: int) -> list:
    """The key a random creation op draws from: (seed, loop iterations) for initialisers, the
    same values in every run; with ``per_run`` (``rg.rand``, ``rg.randn``) the run's id too."""
    if k.attrs.get("per_run"):
        return random_key(k, seed)
    return [seed, *k.run.rng_path]


@defop("UniformRandom", inputs=(), infer=_attr_shape, random=True)
def _uniform(k):
    """Uniform(low, high) values from the op's seed: the same program gives the same values
    (inside a loop, new ones per iteration: the seed is extended by ``k.run.rng_path``; with
    ``per_run``, new ones per run)."""
    a = k.attrs
    return k.backend.random_uniform(random_key_of(k, a["seed"]), a["shape"], a["low"], a["high"], a["dtype"])


def uniform_onnx(g, shape: str, per_run: bool) -> str:
    """The keyed generator's uniform draw of op attrs ``low``, ``high``, ``seed``, ``dtype``, shaped
    by the int64 1-D value ``shape``, in float64 as the kernels, rounded once."""
    a = g.attrs
    bits = g.random_bits(a["seed"], shape, per_run=per_run)
    u = g.node("Mul", [g.cast(bits, "float64"), g.const(2.0 ** -32, "float64")])
    value = g.node("Add", [g.const(a["low"], "float64"),
                           g.node("Mul", [g.const(a["high"] - a["low"], "float64"), u])])
    return g.cast(value, a["dtype"])


@lowers("UniformRandom")
def _uniform_onnx(g):
    return [uniform_onnx(g, g.const(list(g.attrs["shape"]), "int64"), bool(g.attrs.get("per_run")))]


@defop("GaussianRandom", inputs=(), infer=_attr_shape, random=True)
def _gaussian(k):
    """Normal(mean, std) values from the op's seed (and ``k.run.rng_path`` inside loops; the
    run's id with ``per_run``)."""
    a = k.attrs
    return k.backend.random_normal(random_key_of(k, a["seed"]), a["shape"], a["mean"], a["std"], a["dtype"])


def normal_onnx(g, shape: str, per_run: bool) -> str:
    """The keyed generator's Box-Muller draw in the graph (``+ - * /`` only, operation for
    operation as the kernels, so the numbers are the same bit for bit; inside loops too)."""
    a = g.attrs
    z = g.normal_from_bits(g.random_bits(a["seed"], shape, per_run=per_run),
                           g.random_bits(a["seed"], shape, salt=0x5BD1E995, per_run=per_run))
    value = g.node("Add", [g.const(a["mean"], "float64"), g.node("Mul", [g.const(a["std"], "float64"), z])])
    return g.cast(value, a["dtype"])


@lowers("GaussianRandom")
def _gaussian_onnx(g):
    return [normal_onnx(g, g.const(list(g.attrs["shape"]), "int64"), bool(g.attrs.get("per_run")))]


def _init_op(init, shape: list[int], dtype: str, seed: int) -> tuple[str, dict]:
    """Translate an ``init=`` argument into (op type, attrs) for the startup program."""
    base = {"shape": shape, "dtype": dtype}
    if init is None:
        init = "xavier" if len(shape) >= 2 else "zeros"
    if callable(init):                       # init(shape) -> array, evaluated now (nothing is pickled)
        init = np.asarray(init(tuple(shape)))
    if isinstance(init, np.generic) or (isinstance(init, np.ndarray) and init.ndim == 0 and shape != []):
        init = init.item()
    if isinstance(init, (list, tuple)) and not (init and isinstance(init[0], str)):
        init = np.asarray(init)
    if isinstance(init, (int, float)) and not isinstance(init, bool):
        return "Fill", {**base, "value": float(init)}
    if isinstance(init, np.ndarray):
        if list(init.shape) != shape:
            raise ProgramError(f"init array has shape {list(init.shape)}, parameter shape is {shape}")
        return "Constant", {**base, "value": init.astype(dtype).tolist()}
    if isinstance(init, str):
        init = (init,)
    kind, *args = init
    if kind in ("zeros", "ones"):
        return "Fill", {**base, "value": 0.0 if kind == "zeros" else 1.0}
    if kind == "xavier":
        fan_in, fan_out = _fans(shape)
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        return "UniformRandom", {**base, "low": -limit, "high": limit, "seed": seed}
    if kind == "uniform":
        low, high = args if args else (-1.0, 1.0)
        return "UniformRandom", {**base, "low": float(low), "high": float(high), "seed": seed}
    if kind == "normal":
        mean, std = args if args else (0.0, 1.0)
        return "GaussianRandom", {**base, "mean": float(mean), "std": float(std), "seed": seed}
    raise ProgramError(f"unknown initializer {init!r}; use a number, an array, 'zeros', 'ones', "
                       "'xavier', ('uniform', low, high) or ('normal', mean, std)")


def _fans(shape: list[int]) -> tuple[int, int]:
    if len(shape) < 2:
        return (shape[0] if shape else 1), (shape[0] if shape else 1)
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[0] * receptive, shape[1] * receptive


def create_parameter(name: str, shape: Sequence[int], dtype: str = "float32", init=None,
                     trainable: bool = True) -> Var:
    """A persistable, trainable Var initialised by an op in the startup program.

    ``init`` is None (Xavier-uniform for matrices, zeros otherwise), a number,
    an array (or nested list), ``"zeros"``, ``"ones"``, ``"xavier"``,
    ``("uniform", lo, hi)``, ``("normal", mean, std)``, or a callable
    ``init(shape) -> array`` evaluated once, when the program is built. Seeds come from the program's ``random_seed``
    and the build order, so rebuilding gives the same values. Asking again for
    an existing parameter with the same shape returns it (weight sharing).

    Example::

        w = rg.create_parameter("proj.w", [8, 4], init=("normal", 0.0, 0.02))
    """
    shape = _static_shape(shape, f"parameter '{name}'")
    dtype = canonical(dtype)
    main_block = default_main_program().global_block()
    existing = main_block.vars.get(name)
    if existing is not None:
        if not existing.is_parameter or list(existing.shape) != shape or existing.dtype != dtype:
            raise ProgramError(f"'{name}' already exists in block 0 as {existing.type_str()}; "
                               f"cannot create parameter {dtype}{shape} with that name")
        return existing
    flags = dict(persistable=True, trainable=trainable, is_parameter=True)
    param = main_block.create_var(name, shape, dtype, **flags)
    startup = default_startup_program()
    start_block = startup.global_block()
    if name not in start_block.vars:
        out = start_block.create_var(name, shape, dtype, **flags)
        op_type, attrs = _init_op(init, shape, dtype, startup.next_seed())
        start_block.append_op(Op(op_type, [], [out.name], attrs))
    return param


def data(name: str, shape: Sequence[int], dtype: str = "float32", stop_gradient: bool = True) -> Var:
    """An input fed at run time; ``-1`` (or None) marks a dimension known only then.

    Example::

        x = rg.data("x", [-1, 8])                  # float32, any batch size
        labels = rg.data("labels", [-1], dtype="int64")
    """
    block = default_main_program().global_block()
    shape = [-1 if d is None else as_int(d, f"data '{name}': a dimension") for d in as_list(shape, f"data '{name}': shape")]
    return block.create_var(name, shape, dtype, is_data=True, stop_gradient=stop_gradient)


def create_var(name: str, shape: Sequence[int], dtype: str = "float32", block: Block | None = None,
               **flags) -> Var:
    """Declare a Var in the current block without an op (for ops with ``outputs=``)."""
    block = block or current_block()
    return block.create_var(name, shape, dtype, **flags)
