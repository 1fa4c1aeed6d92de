"""Every op's forward result equals a NumPy computation written here.

One table, ``CASES``, maps each op type to a generator of random cases:
inputs (declared shapes may hold -1; the fed arrays are concrete), a builder
and a NumPy reference. Each case runs on NumPy and on array-api-strict, and
the result must also match the output Var's declared shape and dtype.
``test_every_op_has_a_case`` fails when an op of the core families has no
entry here.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import retrograd as rg
from retrograd import backends as backend
from retrograd.ops.math import elementwise as ops_math
from retrograd.ops.array.creation import shape_stand_in
from retrograd.ops.nn import softmax_dropout as ops_nn
from retrograd.ops.array import tensor as ops_tensor
from retrograd.ops.core.registry import append_op

# Every forward case runs on NumPy, on the strict Array API namespace (portability) and on
# PyTorch (CPU) through array_api_compat (the torch backend's namespace); a namespace whose
# library is missing drops out, and test_every_namespace_is_installed skips saying which.
OPTIONAL_NAMESPACES = {"array_api_strict": "array-api-strict", "array_api_compat.torch": "torch"}


def _namespace(name: str):
    """The module ``name``, or None when its library is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


BACKENDS = [np, *filter(None, map(_namespace, OPTIONAL_NAMESPACES))]


@pytest.mark.parametrize("name", sorted(OPTIONAL_NAMESPACES))
def test_every_namespace_is_installed(name):
    """Where a namespace is missing, its forward cases do not run: say so as a skip."""
    if _namespace(name) is None:
        pytest.skip(f"the forward cases do not run on {name}: pip install {OPTIONAL_NAMESPACES[name]}")
    assert _namespace(name) in BACKENDS


FAMILIES = {"math", "reduce", "creation", "tensor", "nn"}
# Random ops cannot equal a NumPy formula; they have property tests at the end of this file.
RANDOM_OPS = {"UniformRandom", "GaussianRandom", "Dropout"}
# issue 19's families (ops-math) and their random ops (tests/ops/test_random_ops.py)
FAMILIES |= {"activation", "special", "logic", "extrema", "cumulative"}
RANDOM_OPS |= {"UniformRandomLike", "GaussianRandomLike", "RandomIntegers", "Categorical"}
FLOATS = ("float32", "float64")
SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --- Case machinery ------------------------------------------------------------------

@dataclass
class Case:
    inputs: list            # [(declared shape, array)]
    build: Callable         # (*Vars) -> Var | list[Var]
    ref: Callable           # (*arrays) -> array | list[array]
    rtol: float | None = None


class Gen:
    """Draws shapes, declared shapes with -1 dims and arrays for one case."""

    def __init__(self, draw):
        self.draw = draw
        self.rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    def pick(self, options):
        return self.draw(st.sampled_from(list(options)))

    def int(self, low: int, high: int) -> int:
        return self.draw(st.integers(low, high))

    def shape(self, min_dims=0, max_dims=3, min_side=1, max_side=4) -> tuple[int, ...]:
        return self.draw(hnp.array_shapes(min_dims=min_dims, max_dims=max_dims,
                                          min_side=min_side, max_side=max_side))

    def broadcastable(self, n: int, min_dims=0, max_dims=3) -> tuple:
        shapes = self.draw(hnp.mutually_broadcastable_shapes(num_shapes=n, min_dims=min_dims,
                                                             max_dims=max_dims, max_side=4))
        return shapes.input_shapes

    def declare(self, shape) -> list[int]:
        """``shape`` with some dimensions replaced by -1 (known only at run time)."""
        return [-1 if self.draw(st.booleans()) else d for d in shape]

    def floats(self, shape, dtype="float32", low=-3.0, high=3.0) -> np.ndarray:
        return self.rng.uniform(low, high, size=shape).astype(dtype)

    def away_from_zero(self, shape, dtype) -> np.ndarray:
        sign = np.where(self.rng.random(size=shape) < 0.5, -1.0, 1.0)
        return (sign * self.rng.uniform(0.5, 3.0, size=shape)).astype(dtype)

    def ints(self, shape, low: int, high: int, dtype="int64") -> np.ndarray:
        return self.rng.integers(low, high, size=shape).astype(dtype)

    def bools(self, shape) -> np.ndarray:
        return self.rng.random(size=shape) < 0.5


CASES: dict[str, Callable[[Gen], Case]] = {}


def case(*types):
    def register(make):
        for t in types:
            CASES[t] = (lambda m, t: lambda g: m(g, t))(make, t)
        return make
    return register


def run(case_: Case, xp):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        vars_ = [rg.data(f"in{i}", decl, str(a.dtype)) for i, (decl, a) in enumerate(case_.inputs)]
        outs = case_.build(*vars_)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    exe = rg.Executor(xp=xp)
    exe.run(startup)
    feed = {f"in{i}": a for i, (_, a) in enumerate(case_.inputs)}
    got = exe.run(main, feed=feed, fetch_list=outs)
    return outs, [backend.to_numpy(v) for v in got]


def check(case_: Case) -> None:
    expected = case_.ref(*[a for _, a in case_.inputs])
    expected = [np.asarray(e) for e in (expected if isinstance(expected, list) else [expected])]
    for xp in BACKENDS:
        outs, got = run(case_, xp)
        assert len(got) == len(expected)
        for var, g, e in zip(outs, got, expected):
            where = f"{var.name} on {xp.__name__}"
            assert g.shape == e.shape, f"{where}: shape {g.shape}, NumPy gives {e.shape}"
            assert g.dtype == e.dtype, f"{where}: dtype {g.dtype}, NumPy gives {e.dtype}"
            assert var.dtype == str(g.dtype), f"{where}: declared {var.dtype}, got {g.dtype}"
            assert len(var.shape) == g.ndim and all(d < 0 or d == s for d, s in zip(var.shape, g.shape)), \
                f"{where}: declared {var.type_str()}, got {g.shape}"
            if g.dtype.kind == "f":
                rtol = case_.rtol or (2e-5 if g.dtype == np.float32 else 1e-12)
                np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol, err_msg=where)
            else:
                np.testing.assert_array_equal(g, e, err_msg=where)


# --- Elementwise math -----------------------------------------------------------------------

BINARY = {"Add": (rg.add, np.add), "Sub": (rg.sub, np.subtract), "Mul": (rg.mul, np.multiply),
          "Div": (rg.div, np.divide), "Pow": (rg.pow, np.power),
          "Maximum": (rg.maximum, np.maximum), "Minimum": (rg.minimum, np.minimum)}


@case(*BINARY)
def _binary(g: Gen, type_: str) -> Case:
    builder, fn = BINARY[type_]
    sa, sb = g.broadcastable(2)
    dtype = g.pick(FLOATS + (("int64",) if type_ in ("Add", "Sub", "Mul", "Maximum", "Minimum") else ()))
    if dtype == "int64":
        a, b = g.ints(sa, -5, 6), g.ints(sb, -5, 6)
    elif type_ == "Pow":
        a, b = g.floats(sa, dtype, 0.5, 2.0), g.floats(sb, dtype, -2.0, 2.0)
    elif type_ == "Div":
        a, b = g.floats(sa, dtype), g.away_from_zero(sb, dtype)
    else:
        a, b = g.floats(sa, dtype), g.floats(sb, dtype)
        if g.draw(st.booleans()):   # few distinct values: ties (maximum, minimum) happen
            a, b = g.ints(sa, -2, 3).astype(dtype), g.ints(sb, -2, 3).astype(dtype)
    return Case([(g.declare(sa), a), (g.declare(sb), b)], builder, fn, rtol=1e-4 if type_ == "Pow" else None)


COMPARE = {"Less": (rg.less, np.less), "LessEqual": (rg.less_equal, np.less_equal),
           "Greater": (rg.greater, np.greater), "GreaterEqual": (rg.greater_equal, np.greater_equal),
           "Equal": (rg.equal, np.equal)}


@case(*COMPARE)
def _compare(g: Gen, type_: str) -> Case:
    builder, fn = COMPARE[type_]
    sa, sb = g.broadcastable(2)
    dtype = g.pick(FLOATS + ("int64",))
    a, b = g.ints(sa, 0, 3).astype(dtype), g.ints(sb, 0, 3).astype(dtype)   # small values: ties happen
    return Case([(g.declare(sa), a), (g.declare(sb), b)], builder, fn)


@case("LogicalNot")
def _logical_not(g: Gen, type_: str) -> Case:
    s = g.shape()
    return Case([(g.declare(s), g.bools(s))], rg.logical_not, np.logical_not)


@case("LogicalAnd")
def _logical_and(g: Gen, type_: str) -> Case:
    sa, sb = g.broadcastable(2)
    return Case([(g.declare(sa), g.bools(sa)), (g.declare(sb), g.bools(sb))], rg.logical_and, np.logical_and)


@case("Where")
def _where(g: Gen, type_: str) -> Case:
    sc, sa, sb = g.broadcastable(3)
    dtype = g.pick(FLOATS + ("int64",))
    return Case([(g.declare(sc), g.bools(sc)), (g.declare(sa), g.ints(sa, -9, 9).astype(dtype)),
                 (g.declare(sb), g.ints(sb, -9, 9).astype(dtype))], rg.where, np.where)


def _np_sigmoid(x):
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(x.dtype)


UNARY = {"Neg": (rg.neg, np.negative), "Exp": (rg.exp, np.exp), "Log": (rg.log, np.log),
         "Tanh": (rg.tanh, np.tanh), "Sigmoid": (rg.sigmoid, _np_sigmoid),
         "Relu": (rg.relu, lambda x: np.maximum(x, 0)), "Square": (rg.square, np.square),
         "Sqrt": (rg.sqrt, np.sqrt), "Abs": (rg.abs, np.abs), "Sign": (rg.sign, np.sign)}


@case(*UNARY)
def _unary(g: Gen, type_: str) -> Case:
    builder, fn = UNARY[type_]
    s, dtype = g.shape(), g.pick(FLOATS)
    if type_ in ("Log", "Sqrt"):
        x = g.floats(s, dtype, 0.1, 5.0)
    elif type_ == "Sigmoid":
        x = g.floats(s, dtype, -60.0, 60.0)     # far tails: no overflow warnings, no NaN
    else:
        x = g.floats(s, dtype)
    return Case([(g.declare(s), x)], builder, fn)


@case("Sin", "Cos")
def _trig(g: Gen, type_: str) -> Case:
    s, dtype = g.shape(), g.pick(FLOATS)
    builder, fn = {"Sin": (rg.sin, np.sin), "Cos": (rg.cos, np.cos)}[type_]
    return Case([(g.declare(s), g.floats(s, dtype, -7.0, 7.0))], builder, fn, rtol=1e-5)


@case("FloorDivide", "Mod")
def _rounding_division(g: Gen, type_: str) -> Case:
    sa, sb = g.broadcastable(2)
    dtype = g.pick(FLOATS + ("int64",))
    a = g.ints(sa, -20, 20).astype(dtype) if dtype == "int64" else g.floats(sa, dtype, -9.0, 9.0)
    b = g.away_from_zero(sb, "float64").round().astype(dtype) if dtype == "int64" else g.away_from_zero(sb, dtype)
    builder, fn = {"FloorDivide": (rg.floor_divide, np.floor_divide), "Mod": (rg.mod, np.remainder)}[type_]
    return Case([(g.declare(sa), a), (g.declare(sb), b)], builder, fn, rtol=1e-5)


@case("ReverseSequence")
def _reverse_sequence(g: Gen, type_: str) -> Case:
    s = g.shape(min_dims=2, min_side=0)
    x = g.floats(s)
    if g.draw(st.booleans()):
        return Case([(g.declare(s), x)], rg.reverse_sequence, lambda a: a[::-1])
    lengths = g.ints((s[1],), 0, s[0] + 1)

    def ref(a, n):
        out = a.copy()
        for i, length in enumerate(n):
            out[:length, i] = a[:length, i][::-1]
        return out
    return Case([(g.declare(s), x), (g.declare((s[1],)), lengths)], rg.reverse_sequence, ref)


@case("Shape")
def _shape(g: Gen, type_: str) -> Case:
    s = g.shape(min_side=0)
    return Case([(g.declare(s), g.floats(s))], ops_tensor.shape, lambda x: np.asarray(x.shape, dtype=np.int64))


@case("Dim")
def _dim(g: Gen, type_: str) -> Case:
    s = g.shape(min_dims=1, min_side=0)
    axis = g.int(-len(s), len(s) - 1)
    return Case([(g.declare(s), g.floats(s))], lambda x: ops_tensor.dim(x, axis),
                lambda x: np.asarray(x.shape[axis], dtype=np.int64))


@case("Clip")
def _clip(g: Gen, type_: str) -> Case:
    s, dtype = g.shape(), g.pick(FLOATS)
    lo = g.pick([None, -1.0, 0.5])
    hi = g.pick([None, 1.0, 2.5])
    return Case([(g.declare(s), g.floats(s, dtype))], lambda x: rg.clip(x, lo, hi),
                lambda x: np.clip(x, lo, hi) if (lo, hi) != (None, None) else x)


@case("MatMul")
def _matmul(g: Gen, type_: str) -> Case:
    ba, bb = g.broadcastable(2, max_dims=2)
    m, k, n = g.int(1, 4), g.int(1, 4), g.int(1, 4)
    ta, tb = g.draw(st.booleans()), g.draw(st.booleans())
    dtype = g.pick(FLOATS)
    sa = ba + ((k, m) if ta else (m, k))
    sb = bb + ((n, k) if tb else (k, n))

    def ref(a, b):
        return np.matmul(np.swapaxes(a, -1, -2) if ta else a, np.swapaxes(b, -1, -2) if tb else b)
    return Case([(g.declare(sa), g.floats(sa, dtype)), (g.declare(sb), g.floats(sb, dtype))],
                lambda a, b: rg.matmul(a, b, transpose_x=ta, transpose_y=tb), ref, rtol=1e-4)


@case("AddN")
def _add_n(g: Gen, type_: str) -> Case:
    shapes = g.broadcastable(g.int(1, 3))
    dtype = g.pick(FLOATS)
    return Case([(g.declare(s), g.floats(s, dtype)) for s in shapes], lambda *xs: rg.add_n(xs),
                lambda *xs: np.asarray(sum(xs[1:], xs[0])))


def _reduced_like(g: Gen, big: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to ``big``: a suffix of it with some sizes set to 1."""
    suffix = big[g.int(0, len(big)):]
    return tuple(1 if g.draw(st.booleans()) else d for d in suffix)


@case("SumTo")
def _sum_to(g: Gen, type_: str) -> Case:
    sx, dtype = g.shape(), g.pick(FLOATS)
    sl = _reduced_like(g, sx)

    def ref(x, like):
        lead = x.ndim - like.ndim
        axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(like.shape) if d == 1)
        return np.sum(x, axis=axes).reshape(like.shape) if axes else x
    return Case([(g.declare(sx), g.floats(sx, dtype)), (g.declare(sl), g.floats(sl, dtype))],
                ops_math.sum_to, ref)


@case("ExpandAs")
def _expand_as(g: Gen, type_: str) -> Case:
    sl, dtype = g.shape(min_dims=1), g.pick(FLOATS)
    axes = sorted(i for i in range(len(sl)) if g.draw(st.booleans()))
    mean_axes = sorted(i for i in range(len(sl)) if g.draw(st.booleans()))
    sx = tuple(1 if g.draw(st.booleans()) else d for i, d in enumerate(sl) if i not in axes)

    def ref(x, like):
        out = np.broadcast_to(np.expand_dims(x, tuple(axes)), like.shape)
        count = math.prod(like.shape[a] for a in mean_axes)
        return out / count if count != 1 else out
    return Case([(g.declare(sx), g.floats(sx, dtype)), (g.declare(sl), g.floats(sl, dtype))],
                lambda x, like: ops_math.expand_as(x, like, axes, mean_axes), ref)


# --- Reductions ------------------------------------------------------------------------------

@case("Sum", "Mean")
def _reduce(g: Gen, type_: str) -> Case:
    s, dtype = g.shape(), g.pick(FLOATS)
    ndim = len(s)
    axis = g.pick([None] + ([g.int(-ndim, ndim - 1),
                             sorted({g.int(0, ndim - 1) for _ in range(g.int(1, ndim))})] if ndim else []))
    keepdims = g.draw(st.booleans())
    builder, fn = (rg.sum, np.sum) if type_ == "Sum" else (rg.mean, np.mean)
    np_axis = tuple(axis) if isinstance(axis, list) else axis
    return Case([(g.declare(s), g.floats(s, dtype))], lambda x: builder(x, axis, keepdims),
                lambda x: np.asarray(fn(x, axis=np_axis, keepdims=keepdims), dtype=x.dtype), rtol=1e-5)


# --- Creation ----------------------------------------------------------------------------------

@case("Constant")
def _constant(g: Gen, type_: str) -> Case:
    s = g.shape()
    dtype = g.pick(["float32", "float64", "int64", "int32", "bool"])
    value = g.ints(s, -5, 6).astype(dtype)
    return Case([], lambda: rg.constant(value, dtype), lambda: value)


@case("Fill")
def _fill(g: Gen, type_: str) -> Case:
    s = g.shape()
    dtype = g.pick(["float32", "float64", "int64"])
    value = g.pick([0, 1, -2.5 if dtype.startswith("float") else -2])
    return Case([], lambda: rg.fill(s, value, dtype), lambda: np.full(s, value, dtype))


@case("FillLike")
def _fill_like(g: Gen, type_: str) -> Case:
    s = g.shape()
    dtype = g.pick([None, "float64", "int64"])
    return Case([(g.declare(s), g.floats(s, "float32"))], lambda x: rg.fill_like(x, 3, dtype),
                lambda x: np.full(x.shape, 3, dtype or x.dtype))


@case("ShapeStandIn")
def _shape_stand_in(g: Gen, type_: str) -> Case:
    s = g.shape()
    return Case([(g.declare(s), g.floats(s, g.pick(FLOATS)))], shape_stand_in, np.zeros_like)


@case("Assign")
def _assign(g: Gen, type_: str) -> Case:
    s = g.shape()
    return Case([(g.declare(s), g.floats(s, g.pick(FLOATS)))], rg.assign, lambda x: x.copy())


# --- Tensor ops ---------------------------------------------------------------------------------

def _regroup(g: Gen, shape) -> list[int]:
    """Another shape of the same size: the dims shuffled, neighbours multiplied, 1s inserted."""
    dims = list(shape)
    g.rng.shuffle(dims)
    out = []
    for d in dims:
        if out and g.draw(st.booleans()):
            out[-1] *= d
        else:
            out.append(d)
    if g.draw(st.booleans()):
        out.insert(g.int(0, len(out)), 1)
    return out


@case("Reshape")
def _reshape(g: Gen, type_: str) -> Case:
    s = g.shape()
    target = _regroup(g, s)
    if target and g.draw(st.booleans()):
        target[g.int(0, len(target) - 1)] = -1
    return Case([(g.declare(s), g.floats(s))], lambda x: rg.reshape(x, target),
                lambda x: x.reshape(target))


@case("ReshapeAs")
def _reshape_as(g: Gen, type_: str) -> Case:
    s = g.shape()
    target = _regroup(g, s)
    return Case([(g.declare(s), g.floats(s)), (g.declare(target), g.ints(target, 0, 3))],
                ops_tensor.reshape_as, lambda x, like: x.reshape(like.shape))


@case("Transpose")
def _transpose(g: Gen, type_: str) -> Case:
    s = g.shape()
    perm = list(g.rng.permutation(len(s)))
    perm = [int(p) - len(s) if g.draw(st.booleans()) else int(p) for p in perm]
    perm = g.pick([perm, None])
    return Case([(g.declare(s), g.floats(s, g.pick(FLOATS)))], lambda x: rg.transpose(x, perm),
                lambda x: np.transpose(x, perm))


@case("Concat")
def _concat(g: Gen, type_: str) -> Case:
    base = g.shape(min_dims=1)
    axis = g.int(-len(base), len(base) - 1)
    shapes = [base[:axis % len(base)] + (g.int(0, 3),) + base[axis % len(base) + 1:]
              for _ in range(g.int(1, 3))]
    dtype = g.pick(FLOATS + ("int64",))
    return Case([(g.declare(s), g.ints(s, -9, 9).astype(dtype)) for s in shapes],
                lambda *xs: rg.concat(xs, axis), lambda *xs: np.concatenate(xs, axis))


@case("SplitLike")
def _split_like(g: Gen, type_: str) -> Case:
    base = g.shape(min_dims=1)
    axis = g.int(-len(base), len(base) - 1)
    a = axis % len(base)
    sizes = [g.int(0, 3) for _ in range(g.int(1, 3))]
    sx = base[:a] + (sum(sizes),) + base[a + 1:]
    likes = [base[:a] + (n,) + base[a + 1:] for n in sizes]
    return Case([(g.declare(sx), g.floats(sx))] + [(g.declare(s), g.ints(s, 0, 2)) for s in likes],
                lambda x, *ls: ops_tensor.split_like(x, ls, axis),
                lambda x, *ls: np.split(x, np.cumsum(sizes)[:-1], axis))


@case("Split")
def _split(g: Gen, type_: str) -> Case:
    base = g.shape(min_dims=1)
    axis = g.int(-len(base), len(base) - 1)
    a = axis % len(base)
    if g.draw(st.booleans()):
        num = g.int(1, 3)
        dim = num * g.int(0, 2)
        arg, sizes = num, [dim // num] * num
    else:
        sizes = [g.int(0, 3) for _ in range(g.int(1, 3))]
        dim = sum(sizes)
        arg = list(sizes)
        if g.draw(st.booleans()):
            arg[g.int(0, len(arg) - 1)] = -1
    s = base[:a] + (dim,) + base[a + 1:]
    return Case([(g.declare(s), g.floats(s))], lambda x: rg.split(x, arg, axis),
                lambda x: np.split(x, np.cumsum(sizes)[:-1], axis))


BOUNDS = [-2**31, -6, -3, -2, -1, 0, 1, 2, 3, 5, 2**31]


def _slice_args(g: Gen, ndim: int):
    axes = [a for a in range(ndim) if g.draw(st.booleans())] or [0]
    starts = [g.pick(BOUNDS) for _ in axes]
    ends = [g.pick(BOUNDS) for _ in axes]
    index = [slice(None)] * ndim
    for a, lo, hi in zip(axes, starts, ends):
        index[a] = slice(lo, hi)
    axes = [a - ndim if g.draw(st.booleans()) else a for a in axes]
    return axes, starts, ends, tuple(index)


@case("Slice")
def _slice(g: Gen, type_: str) -> Case:
    s = g.shape(min_dims=1, max_side=5)
    axes, starts, ends, index = _slice_args(g, len(s))
    return Case([(g.declare(s), g.floats(s))], lambda x: rg.slice(x, axes, starts, ends),
                lambda x: x[index])


@case("SliceGrad")
def _slice_grad(g: Gen, type_: str) -> Case:
    s = g.shape(min_dims=1, max_side=5)
    axes, starts, ends, index = _slice_args(g, len(s))
    ds = np.zeros(s)[index].shape
    dtype = g.pick(FLOATS)

    def ref(dy, x):
        out = np.zeros(x.shape, dy.dtype)
        out[index] = dy
        return out
    return Case([(g.declare(ds), g.floats(ds, dtype)), (g.declare(s), g.ints(s, 0, 2))],
                lambda dy, x: ops_tensor.slice_grad(dy, x, {"axes": axes, "starts": starts, "ends": ends}),
                ref)


@case("Gather")
def _gather(g: Gen, type_: str) -> Case:
    sx = g.shape(min_dims=1)
    si = g.shape(max_dims=2)
    ids = g.ints(si, 0, sx[0], g.pick(["int64", "int32"]))
    dtype = g.pick(FLOATS + ("int64",))
    return Case([(g.declare(sx), g.ints(sx, -9, 9).astype(dtype)), (g.declare(si), ids)], rg.gather,
                lambda x, i: x[i])


@case("GatherGrad")
def _gather_grad(g: Gen, type_: str) -> Case:
    sx = g.shape(min_dims=1)
    si = g.shape(max_dims=2)
    ids = g.ints(si, 0, sx[0])           # small vocabularies: repeated ids are common
    dtype = g.pick(FLOATS)
    sd = si + sx[1:]

    def ref(dy, i, x):
        out = np.zeros(x.shape, dy.dtype)
        np.add.at(out, i.reshape(-1), dy.reshape((-1,) + x.shape[1:]))
        return out
    return Case([(g.declare(sd), g.floats(sd, dtype)), (g.declare(si), ids), (g.declare(sx), g.floats(sx))],
                ops_tensor.gather_grad, ref)


@case("Cast")
def _cast(g: Gen, type_: str) -> Case:
    s = g.shape()
    src, dst = (g.pick(["float32", "float64", "int64", "int32", "bool"]) for _ in range(2))
    x = g.floats(s, "float64", -3, 3).astype(src)
    return Case([(g.declare(s), x)], lambda v: rg.cast(v, dst), lambda v: v.astype(dst))


@case("Unsqueeze")
def _unsqueeze(g: Gen, type_: str) -> Case:
    s = g.shape()
    rank = len(s) + g.int(1, 2)
    positions = sorted(g.rng.choice(rank, size=rank - len(s), replace=False).tolist())
    axes = [p - rank if g.draw(st.booleans()) else p for p in positions]
    axis = axes[0] if len(axes) == 1 and g.draw(st.booleans()) else axes
    return Case([(g.declare(s), g.floats(s))], lambda x: rg.unsqueeze(x, axis),
                lambda x: np.expand_dims(x, tuple(axes)))


@case("Squeeze")
def _squeeze(g: Gen, type_: str) -> Case:
    s = tuple(1 if g.draw(st.booleans()) else d for d in g.shape(min_dims=1))
    ones = [i for i, d in enumerate(s) if d == 1]
    decl = g.declare(s)
    if g.draw(st.booleans()) or not ones:
        axis, axes = None, tuple(i for i, d in enumerate(decl) if d == 1)
    else:
        axes = tuple(sorted({g.pick(ones) for _ in range(g.int(1, len(ones)))}))
        axis = list(axes) if len(axes) > 1 else axes[0] - len(s)
    return Case([(decl, g.floats(s))], lambda x: rg.squeeze(x, axis), lambda x: np.squeeze(x, axes))


@case("StopGradient")
def _stop_gradient(g: Gen, type_: str) -> Case:
    s = g.shape()
    return Case([(g.declare(s), g.floats(s))], rg.stop_gradient, lambda x: x)


# --- NN ops -----------------------------------------------------------------------------------------

def _np_log_softmax(x, axis):
    x64 = x.astype(np.float64)
    shifted = x64 - x64.max(axis=axis, keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))).astype(x.dtype)


@case("Softmax", "LogSoftmax")
def _softmax(g: Gen, type_: str) -> Case:
    s, dtype = g.shape(min_dims=1), g.pick(FLOATS)
    axis = g.int(-len(s), len(s) - 1)
    x = g.floats(s, dtype, -100.0, 100.0)      # naive exp would overflow
    if type_ == "Softmax":
        return Case([(g.declare(s), x)], lambda v: rg.softmax(v, axis),
                    lambda v: np.exp(_np_log_softmax(v, axis).astype(np.float64)).astype(v.dtype), rtol=1e-5)
    return Case([(g.declare(s), x)], lambda v: rg.log_softmax(v, axis),
                lambda v: _np_log_softmax(v, axis), rtol=1e-5)


@case("OneHot")
def _one_hot(g: Gen, type_: str) -> Case:
    si, depth = g.shape(max_dims=2), g.int(1, 5)
    dtype = g.pick(["float32", "float64", "int64"])
    ids = g.ints(si, 0, depth, g.pick(["int64", "int32"]))
    return Case([(g.declare(si), ids)], lambda i: rg.one_hot(i, depth, dtype),
                lambda i: np.eye(depth, dtype=dtype)[i])


@case("OneHotLike")
def _one_hot_like(g: Gen, type_: str) -> Case:
    s, dtype = g.shape(min_dims=1), g.pick(FLOATS)
    labels = g.ints(s[:-1], 0, s[-1])
    return Case([(g.declare(s[:-1]), labels), (g.declare(s), g.floats(s, dtype))], ops_nn.one_hot_like,
                lambda i, like: np.eye(s[-1], dtype=dtype)[i])


@case("SoftmaxCrossEntropy")
def _xent(g: Gen, type_: str) -> Case:
    s, dtype = g.shape(min_dims=1), g.pick(FLOATS)
    labels = g.ints(s[:-1], 0, s[-1], g.pick(["int64", "int32"]))

    def ref(logits, lab):
        logp = _np_log_softmax(logits, -1).astype(np.float64)
        return -np.take_along_axis(logp, lab[..., None].astype(np.int64), -1)[..., 0].astype(logits.dtype)
    return Case([(g.declare(s), g.floats(s, dtype, -100.0, 100.0)), (g.declare(s[:-1]), labels)],
                rg.softmax_cross_entropy, ref, rtol=1e-5)



@case("SoftmaxCrossEntropyGrad")
def _xent_grad(g: Gen, type_: str) -> Case:
    s, dtype = g.shape(min_dims=1), g.pick(FLOATS)
    labels = g.ints(s[:-1], 0, s[-1], g.pick(["int64", "int32"]))

    def ref(logits, lab, dloss):
        probs = np.exp(_np_log_softmax(logits, -1).astype(np.float64))
        hot = np.eye(s[-1])[lab] if s[-1] else np.zeros(s)
        return ((probs - hot) * dloss.astype(np.float64)[..., None]).astype(logits.dtype)
    return Case([(g.declare(s), g.floats(s, dtype, -100.0, 100.0)), (g.declare(s[:-1]), labels),
                 (g.declare(s[:-1]), g.floats(s[:-1], dtype))],
                ops_nn.softmax_cross_entropy_grad, ref, rtol=1e-5)

# --- Activations, special functions, extrema, cumulative ops (issue 19) -------------------------------

def _np_erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)).astype(x.dtype)


def _np_gelu(approximate):
    def gelu(x):
        v = x.astype(np.float64)
        if approximate == "tanh":
            out = 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))
        else:
            out = 0.5 * v * (1.0 + _np_erf(v / math.sqrt(2.0)))
        return out.astype(x.dtype)
    return gelu


def _np_float64(fn):
    return lambda x: fn(x.astype(np.float64)).astype(x.dtype)


ACTIVATION = {
    "Silu": (rg.silu, _np_float64(lambda v: v / (1.0 + np.exp(-v)))),
    "LeakyRelu": (lambda x: rg.leaky_relu(x, 0.2), lambda x: np.where(x > 0, x, x * np.asarray(0.2, x.dtype))),
    "Elu": (lambda x: rg.elu(x, 1.5), _np_float64(lambda v: np.where(v > 0, v, 1.5 * np.expm1(v)))),
    "Softplus": (rg.softplus, _np_float64(lambda v: np.where(v > 20, v, np.log1p(np.exp(np.minimum(v, 20)))))),
    "Erf": (rg.erf, _np_erf),
    "Log1p": (rg.log1p, np.log1p),
    "Expm1": (rg.expm1, np.expm1),
    "Rsqrt": (rg.rsqrt, lambda x: (1.0 / np.sqrt(x.astype(np.float64))).astype(x.dtype)),
}


@case(*ACTIVATION)
def _activation(g: Gen, type_: str) -> Case:
    builder, fn = ACTIVATION[type_]
    s, dtype = g.shape(), g.pick(FLOATS)
    x = g.floats(s, dtype, 0.1, 5.0) if type_ in ("Log1p", "Rsqrt") else g.floats(s, dtype, -25.0, 25.0)
    return Case([(g.declare(s), x)], builder, fn, rtol=1e-5)


@case("Gelu")
def _gelu(g: Gen, type_: str) -> Case:
    s, dtype, approximate = g.shape(), g.pick(FLOATS), g.pick(["none", "tanh"])
    return Case([(g.declare(s), g.floats(s, dtype, -6.0, 6.0))], lambda x: rg.gelu(x, approximate),
                _np_gelu(approximate), rtol=1e-5)


@case("GeluGrad")
def _gelu_grad(g: Gen, type_: str) -> Case:
    from retrograd.ops.math.activation import gelu_grad
    s, dtype, approximate = g.shape(), g.pick(FLOATS), g.pick(["none", "tanh"])

    def ref(x, dy):
        v = x.astype(np.float64)
        if approximate == "tanh":
            c = math.sqrt(2.0 / math.pi)
            t = np.tanh(c * (v + 0.044715 * v ** 3))
            slope = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * 0.044715 * v * v)
        else:
            slope = 0.5 * (1 + _np_erf(v / math.sqrt(2.0))) + v * np.exp(-0.5 * v * v) / math.sqrt(2 * math.pi)
        return (dy * slope).astype(x.dtype)
    return Case([(g.declare(s), g.floats(s, dtype, -6.0, 6.0)), (g.declare(s), g.floats(s, dtype))],
                lambda x, dy: gelu_grad(x, dy, approximate), ref, rtol=1e-5)


@case("ReluGrad")
def _relu_grad(g: Gen, type_: str) -> Case:
    from retrograd.ops.math.elementwise import relu_grad
    s, dtype = g.shape(), g.pick(FLOATS)
    y = np.maximum(g.floats(s, dtype), 0).astype(dtype)      # Relu's output: zeros and positives
    return Case([(g.declare(s), y), (g.declare(s), g.floats(s, dtype))], relu_grad,
                lambda y, dy: np.where(y > 0, dy, 0).astype(dy.dtype))


@case("LogicalOr")
def _logical_or(g: Gen, type_: str) -> Case:
    sa, sb = g.broadcastable(2)
    return Case([(g.declare(sa), g.bools(sa)), (g.declare(sb), g.bools(sb))], rg.logical_or, np.logical_or)


@case("NotEqual")
def _not_equal(g: Gen, type_: str) -> Case:
    sa, sb = g.broadcastable(2)
    dtype = g.pick(FLOATS + ("int64",))
    a, b = g.ints(sa, 0, 3).astype(dtype), g.ints(sb, 0, 3).astype(dtype)
    return Case([(g.declare(sa), a), (g.declare(sb), b)], rg.not_equal, np.not_equal)


def _axis_choice(g: Gen, ndim: int):
    return g.pick([None] + ([g.int(-ndim, ndim - 1),
                             sorted({g.int(0, ndim - 1) for _ in range(g.int(1, ndim))})] if ndim else []))


@case("Max", "Min", "LogSumExp", "Prod")
def _reduce_more(g: Gen, type_: str) -> Case:
    s, dtype = g.shape(), g.pick(FLOATS)
    axis, keepdims = _axis_choice(g, len(s)), g.draw(st.booleans())
    np_axis = tuple(axis) if isinstance(axis, list) else axis
    x = g.ints(s, -2, 3).astype(dtype) if type_ in ("Max", "Min") else g.floats(s, dtype, -2.0, 2.0)

    def lse(v, axis, keepdims):
        v64 = v.astype(np.float64)
        top = np.max(v64, axis=axis, keepdims=True) if v.size else 0.0
        return np.log(np.sum(np.exp(v64 - top), axis=axis, keepdims=True)) + top
    builder, fn = {"Max": (rg.max, np.max), "Min": (rg.min, np.min), "Prod": (rg.prod, np.prod),
                   "LogSumExp": (rg.logsumexp, None)}[type_]

    def ref(v):
        if type_ == "LogSumExp":
            out = lse(v, np_axis, True)
            if not keepdims:
                out = np.squeeze(out, axis=np_axis if np_axis is not None else tuple(range(v.ndim)))
            return np.asarray(out, dtype=v.dtype)
        return np.asarray(fn(v, axis=np_axis, keepdims=keepdims), dtype=v.dtype)
    return Case([(g.declare(s), x)], lambda v: builder(v, axis, keepdims), ref, rtol=1e-5)


@case("ArgMax", "ArgMin")
def _arg(g: Gen, type_: str) -> Case:
    s = g.shape(min_dims=1)
    axis = g.pick([None, g.int(-len(s), len(s) - 1)])
    keepdims = g.draw(st.booleans())
    x = g.ints(s, -2, 3).astype(g.pick(FLOATS + ("int64",)))          # ties: the first index
    builder, fn = (rg.argmax, np.argmax) if type_ == "ArgMax" else (rg.argmin, np.argmin)
    return Case([(g.declare(s), x)], lambda v: builder(v, axis, keepdims),
                lambda v: np.asarray(fn(v, axis=axis, keepdims=keepdims), dtype=np.int64))


@case("FirstExtremeMask")
def _first_extreme_mask(g: Gen, type_: str) -> Case:
    from retrograd.ops.reduce.extrema import first_extreme_mask
    s, dtype, mode = g.shape(min_dims=1), g.pick(FLOATS), g.pick(["Max", "Min"])
    axes = sorted({g.int(0, len(s) - 1) for _ in range(g.int(1, len(s)))})

    def ref(v):
        moved = np.moveaxis(v, axes, list(range(v.ndim - len(axes), v.ndim)))
        rows = moved.reshape(moved.shape[:v.ndim - len(axes)] + (-1,))
        pick = (np.argmax if mode == "Max" else np.argmin)(rows, axis=-1)[..., None]
        mask = (np.arange(rows.shape[-1]) == pick).astype(v.dtype).reshape(moved.shape)
        return np.moveaxis(mask, list(range(v.ndim - len(axes), v.ndim)), axes)
    return Case([(g.declare(s), g.ints(s, -1, 2).astype(dtype))], lambda v: first_extreme_mask(v, axes, mode), ref)


@case("TopK")
def _topk(g: Gen, type_: str) -> Case:
    s = g.shape(min_dims=1)
    axis = g.int(-len(s), len(s) - 1)
    k = g.int(0, s[axis])
    x = g.ints(s, -2, 3).astype(g.pick(FLOATS + ("int64",)))          # ties: in index order

    def ref(v):
        order = np.argsort(-v.astype(np.float64), axis=axis, kind="stable")
        idx = np.take(order, np.arange(k), axis=axis)
        return [np.take_along_axis(v, idx, axis), idx.astype(np.int64)]
    return Case([(g.declare(s), x)], lambda v: list(rg.topk(v, k, axis)), ref)


@case("TakeAlongAxis", "PutAlongAxis")
def _along_axis(g: Gen, type_: str) -> Case:
    from retrograd.ops.reduce.extrema import put_along_axis, take_along_axis
    s, dtype = g.shape(min_dims=1), g.pick(FLOATS)
    axis = g.int(-len(s), len(s) - 1)
    k = g.int(0, s[axis])
    idx = np.take(np.argsort(g.rng.random(s), axis=axis), np.arange(k), axis=axis).astype(np.int64)
    if type_ == "TakeAlongAxis":
        return Case([(g.declare(s), g.floats(s, dtype)), (g.declare(idx.shape), idx)],
                    lambda x, i: take_along_axis(x, i, axis), lambda x, i: np.take_along_axis(x, i, axis))

    def ref(v, i, like):
        out = np.zeros(like.shape, v.dtype)
        np.put_along_axis(out, i, v, axis)
        return out
    return Case([(g.declare(idx.shape), g.floats(idx.shape, dtype)), (g.declare(idx.shape), idx),
                 (g.declare(s), g.floats(s))], lambda v, i, like: put_along_axis(v, i, like, axis), ref)


@case("CumSum", "CumProd")
def _cumulative(g: Gen, type_: str) -> Case:
    s = g.shape(min_dims=1, min_side=0)
    axis, reverse = g.int(-len(s), len(s) - 1), g.draw(st.booleans())
    dtype = g.pick(FLOATS + ("int64",))
    x = g.ints(s, -2, 3).astype(dtype) if dtype == "int64" else g.floats(s, dtype, -1.5, 1.5)
    builder, fn = (rg.cumsum, np.cumsum) if type_ == "CumSum" else (rg.cumprod, np.cumprod)

    def ref(v):
        v = np.flip(v, axis) if reverse else v
        out = fn(v, axis=axis, dtype=v.dtype)
        return np.flip(out, axis) if reverse else out
    return Case([(g.declare(s), x)], lambda v: builder(v, axis, reverse=reverse), ref, rtol=1e-5)


# --- The table test ---------------------------------------------------------------------------------

def test_every_op_has_a_case():
    ours = {t for t, d in rg.OPS.items() if d.kernel.__module__.rsplit(".", 1)[-1] in FAMILIES}
    missing = sorted(ours - set(CASES) - RANDOM_OPS)
    assert not missing, f"ops without a forward case in tests/ops/test_forward.py: {missing}"


@pytest.mark.parametrize("op_type", sorted(CASES))
@SETTINGS
@given(data=st.data())
def test_forward_matches_numpy(op_type, data):
    check(CASES[op_type](Gen(data.draw)))


SHAPE_ONLY = sorted(t for t in CASES if rg.OPS[t].extra.get("shape_only"))


@pytest.mark.parametrize("op_type", SHAPE_ONLY)
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_shape_only_inputs_may_be_zero_stride_stand_ins(op_type, data):
    """Inputs marked ``shape_only`` are read for their shape (and dtype) alone."""
    case_ = CASES[op_type](Gen(data.draw))
    positions = rg.OPS[op_type].extra["shape_only"]
    stand_ins = [(decl, np.broadcast_to(np.zeros((), a.dtype), a.shape) if i in positions else a)
                 for i, (decl, a) in enumerate(case_.inputs)]
    want = case_.ref(*[a for _, a in case_.inputs])
    check(Case(stand_ins, case_.build, lambda *_: want, case_.rtol))


# --- One program, several batch sizes -----------------------------------------------------------------

RERUN = {
    "add": (lambda x: x + rg.fill([1, 3], 2.0), lambda x: x + 2.0),
    "matmul": (lambda x: x @ rg.constant(np.arange(6.0).reshape(3, 2), "float32"),
               lambda x: x @ np.arange(6.0, dtype="float32").reshape(3, 2)),
    "sum": (lambda x: rg.sum(x, axis=0), lambda x: x.sum(0)),
    "mean": (lambda x: rg.mean(x), lambda x: np.asarray(x.mean(), "float32")),
    "reshape": (lambda x: rg.reshape(x, [-1]), lambda x: x.reshape(-1)),
    "transpose": (lambda x: rg.transpose(x, [1, 0]), lambda x: x.T),
    "concat": (lambda x: rg.concat([x, x * 2.0], 0), lambda x: np.concatenate([x, x * 2], 0)),
    "split": (lambda x: rg.split(x, [1, -1], 0)[1], lambda x: x[1:]),
    "slice": (lambda x: rg.slice(x, [0], [-2], [2**31]), lambda x: x[-2:]),
    "gather": (lambda x: rg.gather(x, rg.constant([1, 0, 1])), lambda x: x[[1, 0, 1]]),
    "softmax": (lambda x: rg.softmax(x, 0), lambda x: np.exp(x) / np.exp(x).sum(0)),
    "xent": (lambda x: rg.softmax_cross_entropy(x, rg.fill_like(rg.sum(x, 1), 2, "int64")),
             lambda x: np.log(np.exp(x).sum(1)) - x[:, 2]),
    "unsqueeze": (lambda x: rg.squeeze(rg.unsqueeze(x, 0), 0), lambda x: x),
}


@pytest.mark.parametrize("name", sorted(RERUN))
def test_same_program_runs_at_several_batch_sizes(name):
    build, ref = RERUN[name]
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        out = build(x)
    exe = rg.Executor()
    for n in (2, 5, 3):
        xb = np.random.default_rng(n).standard_normal((n, 3)).astype("float32")
        got, = exe.run(main, feed={"x": xb}, fetch_list=[out])
        np.testing.assert_allclose(got, ref(xb), rtol=1e-5, atol=1e-6)


# --- Random ops: properties instead of formulas ---------------------------------------------------------

def _run_random(op_type: str, attrs: dict, xp=np):
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        out = append_op(op_type, [], attrs)[0]
    return backend.to_numpy(rg.Executor(xp=xp).run(main, fetch_list=[out])[0])


@pytest.mark.parametrize("dtype", FLOATS)
def test_uniform_random_is_in_range_and_reproducible(dtype):
    attrs = {"shape": [200, 50], "dtype": dtype, "low": -0.5, "high": 2.0, "seed": 11}
    a = _run_random("UniformRandom", attrs)
    assert a.shape == (200, 50) and a.dtype == dtype
    assert a.min() >= -0.5 and a.max() <= 2.0 and abs(a.mean() - 0.75) < 0.05
    for xp in BACKENDS[1:]:                   # keyed draws: the same numbers on every backend
        np.testing.assert_array_equal(a, _run_random("UniformRandom", attrs, xp))
    assert not np.array_equal(a, _run_random("UniformRandom", {**attrs, "seed": 12}))


@pytest.mark.parametrize("dtype", FLOATS)
def test_gaussian_random_moments_and_reproducible(dtype):
    attrs = {"shape": [400, 50], "dtype": dtype, "mean": 1.5, "std": 0.5, "seed": 3}
    a = _run_random("GaussianRandom", attrs)
    assert a.shape == (400, 50) and a.dtype == dtype
    assert abs(a.mean() - 1.5) < 0.02 and abs(a.std() - 0.5) < 0.02
    for xp in BACKENDS[1:]:
        np.testing.assert_array_equal(a, _run_random("GaussianRandom", attrs, xp))


def _dropout_program(p, dtype="float32", seed=None, twice=False):
    main = rg.Program(random_seed=5)
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, 33], dtype)
        outs = [rg.dropout(x, p, seed=seed)]
        if twice:   # the same op replayed (as recompute does): same seed attr
            outs.append(rg.dropout(x, p, seed=main.global_block().ops[0].attrs["seed"]))
    return main, outs


@SETTINGS
@given(p=st.sampled_from([0.1, 0.5, 0.9]), dtype=st.sampled_from(FLOATS), xp=st.sampled_from(BACKENDS))
def test_dropout_keeps_and_scales(p, dtype, xp):
    main, (out,) = _dropout_program(p, dtype)
    mask_name = main.global_block().ops[0].outputs[1]
    x = np.random.default_rng(0).uniform(0.5, 1.5, (64, 33)).astype(dtype)
    got, mask = (backend.to_numpy(a) for a in rg.Executor(xp=xp).run(main, feed={"x": x},
                                                                       fetch_list=[out, mask_name]))
    assert got.dtype == dtype and mask.dtype == dtype
    scale = float(np.asarray(1.0 / (1.0 - p), dtype))
    assert set(np.unique(mask).tolist()) <= {0.0, scale}
    np.testing.assert_allclose(got, x * mask, rtol=1e-6)
    kept = (mask != 0).mean()
    assert abs(kept - (1 - p)) < 0.06


def test_dropout_draws_a_new_mask_each_run_and_replays_within_a_run():
    main, (a, b) = _dropout_program(0.5, twice=True)
    x = np.ones((64, 33), "float32")
    exe = rg.Executor()
    a1, b1 = exe.run(main, feed={"x": x}, fetch_list=[a, b])
    a2, = exe.run(main, feed={"x": x}, fetch_list=[a])
    np.testing.assert_array_equal(a1, b1)           # replay in the same run: bit-identical
    assert not np.array_equal(a1, a2)                # a new run: a new mask
    other = rg.Executor()                            # the same program and run number: same mask
    np.testing.assert_array_equal(other.run(main, feed={"x": x}, fetch_list=[a])[0], a1)


def test_dropout_seed_comes_from_the_program_and_p0_is_a_copy():
    main, _ = _dropout_program(0.3)
    again, _ = _dropout_program(0.3)
    assert main.global_block().ops[0].attrs["seed"] == again.global_block().ops[0].attrs["seed"]
    main, (out,) = _dropout_program(0.0)
    assert [op.type for op in main.global_block().ops] == ["Assign"]
    x = np.arange(66.0, dtype="float32").reshape(2, 33)
    np.testing.assert_array_equal(rg.Executor().run(main, feed={"x": x}, fetch_list=[out])[0], x)
