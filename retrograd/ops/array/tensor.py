"""Ops that move data without arithmetic: reshape, transpose, concat, split,
slice, gather, cast, unsqueeze/squeeze and stop_gradient.

Their gradients are the same kind of op run the other way (concat <-> split,
slice <-> place-into-zeros, gather <-> scatter-add), each with a gradient
maker of its own, so gradients of gradients work. The "...Like"/"...As" ops
take a second input only for its run-time shape: that is how a gradient
recovers a size declared as ``-1``.
"""
from __future__ import annotations

import builtins
import math
from typing import Sequence

from ...backends import dtype_name, dtype_of
from ...errors import ProgramError, ShapeError, kernel_failure
from ...ir.dtypes import canonical, is_float
from ...ir.program import Var, as_int, as_ints, as_list
from .creation import zeros_like
from ..core.registry import append_op, defop
from ..core.lowering import lowers
from ..core.shapes import normalize_axis, require_same_dtype

_py_slice = builtins.slice
INT_DTYPES = ("int64", "int32")


def _outputs(arrays: list):
    """A kernel returns one array for one output, a tuple for several."""
    return arrays[0] if len(arrays) == 1 else tuple(arrays)


def _merge_dims(dims: Sequence[int], what: str) -> int:
    """Dimensions that must agree: the known value, or -1 if none is known."""
    known = {d for d in dims if d >= 0}
    if len(known) > 1:
        raise ShapeError(f"{what} differ: {', '.join(str(d) for d in dims)}")
    return known.pop() if known else -1


# --- Reshape ---------------------------------------------------------------------

def _reshape_target(x_shape: Sequence[int], shape: Sequence[int]) -> tuple[int, ...]:
    """The output shape: the one -1 resolved when ``x_shape`` is fully known."""
    shape = list(shape)
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise ShapeError(f"reshape target {shape} may hold one -1 and otherwise sizes >= 0")
    fixed = math.prod(d for d in shape if d != -1)
    known = math.prod(d for d in x_shape if d >= 0)
    if all(d >= 0 for d in x_shape):
        if -1 in shape:
            if fixed == 0 or known % fixed:
                raise ShapeError(f"cannot reshape {list(x_shape)} ({known} elements) to {shape}")
            shape[shape.index(-1)] = known // fixed
        elif known != fixed:
            raise ShapeError(f"cannot reshape {list(x_shape)} ({known} elements) to {shape} ({fixed})")
    elif -1 not in shape and known and fixed % known:
        raise ShapeError(f"cannot reshape {list(x_shape)} (a multiple of {known} elements) to {shape}")
    return tuple(shape)


def _reshape_rule(ins, attrs):
    return [(_reshape_target(ins[0].shape, attrs["shape"]), ins[0].dtype)]


def _reshape_batch_axis(axis: int, shape, declared, attrs):
    """Micro-batches (``memory/micro_batches.py``): a reshape folding the fixed axes before the batch
    axis into its rows (``[T, N, V] -> [-1, V]``) keeps each batch element's rows apart, ordered
    (front, batch): ``(0, T)``; any other reshape may mix elements (None)."""
    target = list(attrs["shape"])
    front, rest = declared[:axis], list(shape[axis + 1:])
    if target[:1] != [-1] or target[1:] != rest or any(d < 0 for d in front):
        return None
    return 0, math.prod(front)


@defop("Reshape", infer=_reshape_rule, grad=lambda g: [reshape_as(g.dy, g.x[0])],
       batch_axis=_reshape_batch_axis)
def _reshape(k, x):
    return k.xp.reshape(x, tuple(k.attrs["shape"]))


@lowers("Reshape")
def _reshape_onnx(g):
    shape = list(g.attrs["shape"])
    allowzero = int(0 in shape and -1 not in shape)    # ONNX reads 0 as "copy" unless told
    return [g.node("Reshape", [g.ins[0], g.const(shape, "int64")], allowzero=allowzero)]


def _reshape_as_rule(ins, attrs):
    x, like = ins
    if all(d >= 0 for d in x.shape + like.shape) and math.prod(x.shape) != math.prod(like.shape):
        raise ShapeError(f"cannot reshape {list(x.shape)} to {list(like.shape)}")
    return [(like.shape, x.dtype)]


@defop("ReshapeAs", inputs=("x", "like"), infer=_reshape_as_rule, nondiff=(1,), shape_only=(1,),
       grad=lambda g: [reshape_as(g.dy, g.x[0]), None])
def _reshape_as(k, x, like):
    """``x`` reshaped to ``like``'s run-time shape (the gradient of Reshape)."""
    return k.xp.reshape(x, tuple(like.shape))


@lowers("ReshapeAs")
def _reshape_as_onnx(g):
    return [g.node("Reshape", [g.ins[0], g.shape(g.ins[1])], allowzero=1)]


def reshape(x: Var, shape: Sequence[int]) -> Var:
    """``x`` with a new shape of the same size; one dimension may be -1 (inferred).

    Args:
        x: A Var.
        shape: The new shape; one entry may be -1 (or None), inferred at run time.

    Returns:
        A Var of ``shape`` and ``x``'s dtype.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [-1, 8, 8])
            flat = rg.reshape(x, [-1, 8 * 8])          # [N, 8, 8] -> [N, 64]
        (out,) = rg.Executor().run(main, feed={"x": np.zeros((2, 8, 8), "float32")}, fetch_list=[flat])
        assert out.shape == (2, 64)
        ```
    """
    shape = [-1 if d is None else as_int(d, "reshape: a dimension") for d in as_list(shape, "reshape: shape")]
    return append_op("Reshape", [x], {"shape": shape})[0]


def reshape_as(x: Var, like: Var) -> Var:
    """``x`` reshaped to ``like``'s shape at run time (sizes must match)."""
    return append_op("ReshapeAs", [x, like])[0]


# --- Transpose ---------------------------------------------------------------------

def _perm(perm, ndim: int) -> list[int]:
    if perm is None:
        return list(range(ndim))[::-1]
    normalized = [normalize_axis(as_int(p, "transpose: perm"), ndim) for p in perm]
    if sorted(normalized) != list(range(ndim)):
        raise ShapeError(f"perm {list(perm)} is not a permutation of the {ndim} axes")
    return normalized


def _transpose_rule(ins, attrs):
    x = ins[0]
    perm = _perm(attrs["perm"], x.ndim)
    return [(tuple(x.shape[p] for p in perm), x.dtype)]


def _transpose_grad(g):
    perm = _perm(g.attrs["perm"], g.x[0].ndim)
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return [transpose(g.dy, inverse)]


@defop("Transpose", infer=_transpose_rule, grad=_transpose_grad,
       batch_axis=lambda axis, shape, declared, attrs: (_perm(attrs["perm"], len(shape)).index(axis), 1))
def _transpose(k, x):
    return k.xp.permute_dims(x, tuple(_perm(k.attrs["perm"], x.ndim)))


@lowers("Transpose")
def _transpose_onnx(g):
    return [g.node("Transpose", g.ins, perm=_perm(g.attrs["perm"], g.in_vars[0].ndim))]


def transpose(x: Var, perm: Sequence[int] | None = None) -> Var:
    """Permute the axes of ``x``: output axis i is input axis ``perm[i]``.

    Args:
        x: A Var.
        perm: A permutation of ``range(x.ndim)``; None reverses the axes (``x.T``).

    Returns:
        A Var with the permuted shape.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [5, 2, 3])
            xt = rg.transpose(x, [1, 0, 2])            # [T, N, D] -> [N, T, D]
        xv = np.random.rand(5, 2, 3).astype("float32")
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[xt])
        assert np.array_equal(out, xv.transpose(1, 0, 2))
        ```
    """
    return append_op("Transpose", [x], {"perm": None if perm is None else as_ints(perm, "transpose: perm")})[0]


# --- Concat and its inverses ---------------------------------------------------------

def _concat_rule(ins, attrs):
    if not ins:
        raise ShapeError("concat needs at least one input")
    dtype = require_same_dtype(ins)
    rank = ins[0].ndim
    if any(v.ndim != rank for v in ins) or rank == 0:
        raise ShapeError(f"inputs must share one rank >= 1, got ranks {[v.ndim for v in ins]}")
    axis = normalize_axis(attrs["axis"], rank)
    shape = []
    for i in range(rank):
        dims = [v.shape[i] for v in ins]
        if i == axis:
            shape.append(-1 if any(d < 0 for d in dims) else builtins.sum(dims))
        else:
            shape.append(_merge_dims(dims, f"sizes of axis {i} (not the concat axis)"))
    return [(tuple(shape), dtype)]


def _concat_grad(g):
    return split_like(g.dy, g.x, g.attrs["axis"])


@defop("Concat", inputs=("xs*",), infer=_concat_rule, grad=_concat_grad)
def _concat(k, *xs):
    """Join the inputs along ``axis``; takes any number of inputs."""
    return k.xp.concat(list(xs), axis=k.attrs["axis"])


@lowers("Concat")
def _concat_onnx(g):
    return [g.node("Concat", g.ins, axis=normalize_axis(g.attrs["axis"], g.in_vars[0].ndim))]


def _split_like_rule(ins, attrs):
    x, likes = ins[0], ins[1:]
    axis = normalize_axis(attrs["axis"], x.ndim)
    specs = []
    for like in likes:
        if like.ndim != x.ndim:
            raise ShapeError(f"'{like.name}' has rank {like.ndim}, '{x.name}' has rank {x.ndim}")
        shape = tuple(like.shape[i] if i == axis else _merge_dims((x.shape[i], like.shape[i]), f"sizes of axis {i}")
                      for i in range(x.ndim))
        specs.append((shape, x.dtype))
    return specs


def _split_like_grad(g):
    parts = [d if d is not None else zeros_like(o) for d, o in zip(g.dout, g.out)]
    return [concat(parts, g.attrs["axis"])] + [None] * (len(g.x) - 1)


# shape_only lists positions; SplitLike is variadic, so its likes are listed up to a
# generous bound (a Concat of more inputs still works, its extra likes are simply kept).
@defop("SplitLike", inputs=("x", "likes*"), infer=_split_like_rule, grad=_split_like_grad,
       shape_only=tuple(range(1, 256)))
def _split_like(k, x, *likes):
    """Cut ``x`` along ``axis`` into pieces as long as each ``like`` is there (Concat's gradient)."""
    axis = k.attrs["axis"] % x.ndim
    return _outputs(_cut(x, axis, [like.shape[axis] for like in likes]))


@lowers("SplitLike")
def _split_like_onnx(g):
    axis = normalize_axis(g.attrs["axis"], g.in_vars[0].ndim)
    sizes = [g.dim(like, axis) for like in g.ins[1:]]
    sizes = sizes[0] if len(sizes) == 1 else g.node("Concat", sizes, axis=0)
    return _split_onnx_parts(g, axis, sizes, len(g.ins) - 1)


def _split_onnx_parts(g, axis: int, sizes: str, count: int) -> list[str]:
    if count == 1:
        return [g.node("Identity", [g.ins[0]])]
    return g.node("Split", [g.ins[0], sizes], n_out=count, axis=axis)


def _cut(x, axis: int, sizes: Sequence[int]) -> list:
    if builtins.sum(sizes) != x.shape[axis]:
        raise ValueError(f"pieces of sizes {list(sizes)} do not add up to {x.shape[axis]} along axis {axis}")
    pieces, start = [], 0
    lead = (_py_slice(None),) * axis
    for size in sizes:
        pieces.append(x[lead + (_py_slice(start, start + size), ...)])
        start += size
    return pieces


def split_like(x: Var, likes: Sequence[Var], axis: int) -> list[Var]:
    """Cut ``x`` along ``axis`` into one piece per ``like``, sized like it at run time."""
    return append_op("SplitLike", [x, *likes], {"axis": as_int(axis, "split: axis")})


def _split_sizes(dim: int, attrs) -> list[int]:
    """Run-time (or build-time, when ``dim`` is known) sizes of the pieces."""
    if attrs["sections"] is None:
        num = attrs["num"]
        if dim % num:
            raise ShapeError(f"size {dim} does not split into {num} equal pieces")
        return [dim // num] * num
    sizes = list(attrs["sections"])
    if -1 in sizes:
        rest = dim - builtins.sum(s for s in sizes if s != -1)
        if rest < 0:
            raise ShapeError(f"sections {sizes} exceed size {dim}")
        sizes[sizes.index(-1)] = rest
    if builtins.sum(sizes) != dim:
        raise ShapeError(f"sections {sizes} do not add up to size {dim}")
    return sizes


def _split_rule(ins, attrs):
    x = ins[0]
    axis = normalize_axis(attrs["axis"], x.ndim)
    dim = x.shape[axis]
    if dim >= 0:
        sizes = _split_sizes(dim, attrs)
    elif attrs["sections"] is None:
        sizes = [-1] * attrs["num"]
    else:
        sizes = list(attrs["sections"])
    return [(x.shape[:axis] + (size,) + x.shape[axis + 1:], x.dtype) for size in sizes]


def _split_grad(g):
    parts = [d if d is not None else zeros_like(o) for d, o in zip(g.dout, g.out)]
    return [concat(parts, g.attrs["axis"])]


@defop("Split", infer=_split_rule, grad=_split_grad)
def _split(k, x):
    axis = k.attrs["axis"] % x.ndim
    try:
        sizes = _split_sizes(x.shape[axis], k.attrs)
    except ShapeError as exc:
        raise ValueError(str(exc)) from None
    return _outputs(_cut(x, axis, sizes))


@lowers("Split")
def _split_onnx(g):
    x = g.in_vars[0]
    axis = normalize_axis(g.attrs["axis"], x.ndim)
    count = len(g.out_vars)
    if x.shape[axis] >= 0:
        return _split_onnx_parts(g, axis, g.const(_split_sizes(x.shape[axis], g.attrs), "int64"), count)
    if g.attrs["sections"] is None:     # equal pieces of a size known at run time
        piece = g.node("Div", [g.dim(g.ins[0], axis), g.const([count], "int64")])
        return _split_onnx_parts(g, axis, g.node("Expand", [piece, g.const([count], "int64")]), count)
    sizes = list(g.attrs["sections"])
    if -1 in sizes:                     # the rest: the axis' run-time size minus the others
        rest = g.node("Sub", [g.dim(g.ins[0], axis), g.const([builtins.sum(s for s in sizes if s != -1)], "int64")])
        parts = [g.const([s], "int64") if s != -1 else rest for s in sizes]
        return _split_onnx_parts(g, axis, g.node("Concat", parts, axis=0), count)
    return _split_onnx_parts(g, axis, g.const(sizes, "int64"), count)


def concat(xs: Sequence[Var], axis: int = 0) -> Var:
    """Join Vars along ``axis``; their other sizes must agree.

    Args:
        xs: The Vars (one dtype).
        axis: The axis to join along (negative counts from the end).

    Returns:
        A Var whose size along ``axis`` is the sum of theirs.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            a = rg.data("a", [-1, 2])
            b = rg.data("b", [-1, 3])
            both = rg.concat([a, b], axis=-1)          # [N, 2] + [N, 3] -> [N, 5]
        feed = {"a": np.zeros((4, 2), "float32"), "b": np.ones((4, 3), "float32")}
        (out,) = rg.Executor().run(main, feed=feed, fetch_list=[both])
        assert out.shape == (4, 5) and out[:, 2:].all()
        ```
    """
    xs = list(xs)
    return append_op("Concat", xs, {"axis": as_int(axis, "concat: axis")})[0]


def split(x: Var, num_or_sizes, axis: int = 0) -> list[Var]:
    """Cut ``x`` along ``axis`` into ``num`` equal pieces, or into pieces of the given sizes.

    Args:
        x: A Var.
        num_or_sizes: An int (the number of equal pieces) or a list of sizes,
            one of which may be -1 (the rest).
        axis: The axis to cut along.

    Returns:
        A list of Vars.

    Raises:
        ProgramError: A count below 1, or sizes below -1 or with more than one -1.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            gates = rg.data("gates", [2, 8])
            i, f, g, o = rg.split(gates, 4, axis=1)    # [N, 4H] -> 4 x [N, H]
            head, tail = rg.split(gates, [1, -1], axis=0)
        gv = np.arange(16, dtype="float32").reshape(2, 8)
        outs = rg.Executor().run(main, feed={"gates": gv}, fetch_list=[o, tail])
        assert np.array_equal(outs[0], gv[:, 6:]) and np.array_equal(outs[1], gv[1:])
        ```
    """
    if isinstance(num_or_sizes, int):
        if num_or_sizes < 1:
            raise ProgramError(f"split of '{x.name}' into {num_or_sizes} pieces: need at least 1")
        attrs = {"axis": as_int(axis, "split: axis"), "num": num_or_sizes, "sections": None}
    else:
        sizes = as_ints(num_or_sizes, "split: num_or_sizes (a count or a list of sizes)")
        if not sizes or sizes.count(-1) > 1 or any(s < -1 for s in sizes):
            raise ProgramError(f"split of '{x.name}': sizes {sizes} must be >= 0 with at most one -1")
        attrs = {"axis": as_int(axis, "split: axis"), "num": None, "sections": sizes}
    return append_op("Split", [x], attrs)


# --- Slice -------------------------------------------------------------------------------

def _slice_axes(attrs, ndim: int) -> list[int]:
    axes = [normalize_axis(a, ndim) for a in attrs["axes"]]
    if len(set(axes)) != len(axes):
        raise ShapeError(f"axes {attrs['axes']} repeat an axis")
    if not len(axes) == len(attrs["starts"]) == len(attrs["ends"]):
        raise ShapeError(f"axes, starts and ends differ in length: {attrs['axes']}, "
                         f"{attrs['starts']}, {attrs['ends']}")
    return axes


def _clamped(start: int, end: int, dim: int) -> tuple[int, int]:
    """NumPy's reading of ``start:end`` on a size-``dim`` axis, as 0 <= start <= end <= dim."""
    start, end, _ = _py_slice(start, end).indices(dim)
    return start, builtins.max(start, end)


def _slice_index(attrs, shape: Sequence[int]) -> tuple:
    """The index tuple for an array of (run-time) ``shape``; bounds already clamped,
    because the Array API leaves out-of-range slice bounds unspecified."""
    index = [_py_slice(None)] * len(shape)
    for axis, start, end in zip(_slice_axes(attrs, len(shape)), attrs["starts"], attrs["ends"]):
        index[axis] = _py_slice(*_clamped(start, end, shape[axis]))
    return tuple(index)


def _slice_rule(ins, attrs):
    x = ins[0]
    shape = list(x.shape)
    for axis, start, end in zip(_slice_axes(attrs, x.ndim), attrs["starts"], attrs["ends"]):
        if shape[axis] >= 0:
            low, high = _clamped(start, end, shape[axis])
            shape[axis] = high - low
    return [(tuple(shape), x.dtype)]


@defop("Slice", infer=_slice_rule, grad=lambda g: [slice_grad(g.dy, g.x[0], g.attrs)])
def _slice(k, x):
    """``x[starts:ends]`` along ``axes``, with NumPy's negative and clamped indices."""
    return x[_slice_index(k.attrs, x.shape)]


@lowers("Slice")
def _slice_onnx(g):
    a = g.attrs
    axes = _slice_axes(a, g.in_vars[0].ndim)
    return [g.node("Slice", [g.ins[0], g.const(a["starts"], "int64"), g.const(a["ends"], "int64"),
                             g.const(axes, "int64")])]


def _slice_grad_rule(ins, attrs):
    dy, x = ins
    return [(x.shape, dy.dtype)]


@defop("SliceGrad", inputs=("dy", "x"), infer=_slice_grad_rule, nondiff=(1,), shape_only=(1,),
       grad=lambda g: [slice(g.dy, g.attrs["axes"], g.attrs["starts"], g.attrs["ends"]), None])
def _slice_grad(k, dy, x):
    """Zeros shaped like ``x`` with ``dy`` written where Slice read (Slice's gradient)."""
    out = k.xp.zeros(x.shape, dtype=dy.dtype)
    out[_slice_index(k.attrs, x.shape)] = dy
    return out


@lowers("SliceGrad")
def _slice_grad_onnx(g):
    """Pad ``dy`` with zeros: before each sliced axis the clamped start, after it the rest."""
    a, ndim = g.attrs, g.in_vars[1].ndim
    zero = g.const([0], "int64")
    before, after = [zero] * ndim, [zero] * ndim
    for axis, start in zip(_slice_axes(a, ndim), a["starts"]):
        size = g.dim(g.ins[1], axis)
        if start >= 0:
            begin = g.node("Min", [g.const([start], "int64"), size])
        else:
            begin = g.node("Max", [g.node("Add", [size, g.const([start], "int64")]), zero])
        before[axis] = begin
        after[axis] = g.node("Sub", [g.node("Sub", [size, begin]), g.dim(g.ins[0], axis)])
    pads = g.node("Concat", before + after, axis=0) if ndim else g.const([], "int64")
    return [g.node("Pad", [g.ins[0], pads], mode="constant")]


def slice_grad(dy: Var, x: Var, attrs: dict) -> Var:
    keep = {key: list(attrs[key]) for key in ("axes", "starts", "ends")}
    return append_op("SliceGrad", [dy, x], keep)[0]


def slice(x: Var, axes: Sequence[int], starts: Sequence[int], ends: Sequence[int]) -> Var:
    """``x[starts[i]:ends[i]]`` along each ``axes[i]``.

    Negative and out-of-range indices behave as in NumPy. ``x[...]`` (``rg.getitem``)
    is the general form, with steps too.

    Args:
        x: A Var.
        axes: The axes to slice.
        starts: One start per axis.
        ends: One end per axis (a large number means "to the end").

    Returns:
        The sliced Var.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [-1, 3])
            last = rg.slice(x, axes=[0], starts=[-1], ends=[2**31])   # x[-1:]
        xv = np.arange(6, dtype="float32").reshape(2, 3)
        (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[last])
        assert np.array_equal(out, xv[-1:])
        ```
    """
    attrs = {"axes": as_ints(axes, "slice: axes"), "starts": as_ints(starts, "slice: starts"),
             "ends": as_ints(ends, "slice: ends")}
    return append_op("Slice", [x], attrs)[0]


# --- Gather (embedding lookup) -------------------------------------------------------------

def _require_int(var: Var, what: str) -> None:
    if var.dtype not in INT_DTYPES:
        raise ShapeError(f"{what} '{var.name}' must be int64 or int32, got {var.dtype}")


def _gather_rule(ins, attrs):
    x, ids = ins
    _require_int(ids, "ids")
    if x.ndim < 1:
        raise ShapeError(f"cannot gather rows of scalar '{x.name}'")
    return [(ids.shape + x.shape[1:], x.dtype)]


def check_ids(xp, ids, n: int, what: str = "id", k=None):
    """``ids``, after raising IndexError unless every entry lies in ``[0, n)``.

    While a device graph is captured (``k.run.deferred_checks`` is a list) the host may not
    read the device: the range goes into that list, checked after each replay
    (runtime/graphs.py), and the ids are clipped so that a bad one cannot make the graph read
    outside ``[0, n)``."""
    if math.prod(ids.shape) == 0:
        return ids
    checks = None if k is None else k.run.deferred_checks
    if checks is not None:
        checks.append((k.op, xp.min(ids), xp.max(ids), n, what))
        return _clipped(ids, n)
    check_id_range(int(xp.min(ids)), int(xp.max(ids)), n, what)
    return ids


def _clipped(ids, n: int):
    """``ids`` clipped into ``[0, n)`` on the device. Operators with Python numbers, not clip:
    array_api_compat's CuPy clip indexes by a mask (a host read), and torch would copy its
    bounds from the host."""
    ids = ids * (ids >= 0)
    return ids - (ids >= n) * (ids - (n - 1))


def check_id_range(low: int, high: int, n: int, what: str = "id", negative: bool = False) -> None:
    """Raise IndexError unless ``[low, high]`` lies in ``[0, n)`` (``negative``: in ``[-n, n)``)."""
    first = -n if negative else 0
    if low < first or high >= n:
        bad = low if low < first else high
        raise IndexError(f"{what} {bad} is out of range [{first}, {n})")


def wrap_ids(xp, ids, n: int, what: str = "id", k=None):
    """``ids`` in ``[-n, n)`` as positions in ``[0, n)``: a negative id counts from the end, as
    NumPy reads it; IndexError for one outside (deferred while a device graph is captured,
    as ``check_ids``)."""
    if math.prod(ids.shape) == 0:
        return ids
    if k is None or k.run.deferred_checks is None:
        check_id_range(int(xp.min(ids)), int(xp.max(ids)), n, what, negative=True)
        return from_end(xp, ids, n)
    k.run.deferred_checks.append((k.op, xp.min(ids), xp.max(ids), n, what, True))    # checked after the replay
    return _clipped(from_end(xp, ids, n), n)


def from_end(xp, ids, n: int):
    """``ids`` with ``n`` added to the negative ones."""
    return xp.where(ids < 0, ids + n, ids)


@defop("Gather", inputs=("x", "ids"), infer=_gather_rule, nondiff=(1,),
       grad=lambda g: [gather_grad(g.dy, g.x[1], g.x[0]), None], batch_rows=(1,))
def _gather(k, x, ids):
    """Rows of ``x`` picked by ``ids`` (any shape; negative: from the end): out = ids.shape + x.shape[1:]."""
    xp = k.xp
    ids = wrap_ids(xp, ids, x.shape[0], k=k)
    rows = xp.take(x, xp.reshape(ids, (-1,)), axis=0)
    return xp.reshape(rows, tuple(ids.shape) + tuple(x.shape[1:]))


def checked_ids_onnx(g, i: int, n: str, what: str = "id", negative: bool = False) -> str:
    """The op's input ``i`` (ids) as int64, guarded by ``check_ids`` as a run-time check of the
    model (``g.check``): an entry outside [0, n) (``n``: an int64 scalar) fails the run with the
    kernel's IndexError, worded as the executor words it. Unchecked, ONNX Gather would wrap
    negative ids, and a one-hot by comparison would give a row of zeros. With ``negative``
    (``wrap_ids``), ids in [-n, n) pass and come back as positions in [0, n)."""
    ids = g.ins[i] if g.in_vars[i].dtype == "int64" else g.cast(g.ins[i], "int64")
    flat = g.node("Reshape", [ids, g.const([-1], "int64")])
    low = g.node("ReduceMin", [flat], keepdims=0)     # no ids: the identities, int64 max and min
    high = g.node("ReduceMax", [flat], keepdims=0)
    first = g.node("Neg", [n]) if negative else g.const(0, "int64")
    failed = g.node("Or", [g.node("Less", [low, first]), g.node("GreaterOrEqual", [high, n])])
    shapes = [g.shape(value) for value in g.ins]
    op, dtypes = g.op, [var.dtype for var in g.in_vars]

    def verify(low, high, n, *shapes):      # called only when the check failed: ids are not empty
        import numpy as np
        try:
            check_id_range(int(low), int(high), int(n), what, negative)
        except IndexError as exc:
            stand_ins = [np.broadcast_to(np.zeros((), dtype=dtype), tuple(int(d) for d in shape))
                         for dtype, shape in zip(dtypes, shapes)]
            raise kernel_failure(op.where(), exc, zip(op.inputs, stand_ins)) from None

    ok = g.check(failed, f"{what}s must lie in [{'-n' if negative else 0}, n)", verify, [low, high, n, *shapes])
    ids = g.node("Where", [ok, ids, ids])
    return wrapped_ids_onnx(g, ids, n) if negative else ids


def wrapped_ids_onnx(g, ids: str, n: str) -> str:
    """int64 ``ids`` in [-n, n) as positions in [0, n) (``wrap_ids``)."""
    return g.node("Where", [g.node("Less", [ids, g.const(0, "int64")]), g.node("Add", [ids, n]), ids])


@lowers("Gather")
def _gather_onnx(g):
    x = g.ins[0]
    return [g.node("Gather", [x, checked_ids_onnx(g, 1, g.scalar_dim(x, 0), negative=True)], axis=0)]


def _gather_grad_rule(ins, attrs):
    dy, ids, x = ins
    return [(x.shape, dy.dtype)]


@defop("GatherGrad", inputs=("dy", "ids", "x"), infer=_gather_grad_rule, nondiff=(1, 2), shape_only=(2,),
       grad=lambda g: [gather(g.dy, g.x[1]), None, None])
def _gather_grad(k, dy, ids, x):
    """Zeros shaped like ``x`` with each row of ``dy`` added into row ``ids[i]`` (repeats add up)."""
    if k.run.deferred_checks is not None:     # capturing a graph: the forward's check is deferred
        ids = wrap_ids(k.xp, ids, x.shape[0], k=k)
    else:                                     # checked by the forward: from the end where negative
        ids = from_end(k.xp, ids, x.shape[0])
    return k.backend.scatter_add_rows(x.shape, dtype_name(dy.dtype), ids, dy)


@lowers("GatherGrad")
def _gather_grad_onnx(g):
    dy, ids, x = g.ins
    zeros = g.fill(g.shape(x), 0, g.in_vars[0].dtype)
    ids = wrapped_ids_onnx(g, g.cast(ids, "int64"), g.scalar_dim(x, 0))
    index = g.node("Unsqueeze", [ids, g.const([-1], "int64")])
    return [g.node("ScatterND", [zeros, index, dy], reduction="add")]


def gather_grad(dy: Var, ids: Var, x: Var) -> Var:
    return append_op("GatherGrad", [dy, ids, x])[0]


def gather(x: Var, ids, axis: int = 0) -> Var:
    """Slices of ``x`` along ``axis`` picked by integer ``ids`` of any shape (an embedding lookup on axis 0).

    As ``numpy.take``, ``torch.index_select`` and ONNX Gather.

    The result has shape ``x.shape[:axis] + ids.shape + x.shape[axis+1:]``. A
    negative id counts from the end, as in NumPy. The gradient adds up over
    repeated ids.

    Args:
        x: A Var.
        ids: Integers of any shape (a Var, a list or a NumPy array), entries in
            ``[-n, n)`` for ``n = x.shape[axis]``.

        axis: The axis the ids pick along (another axis than 0 moves it to the
            front around the one Gather op).

    Returns:
        A Var of shape ``x.shape[:axis] + ids.shape + x.shape[axis+1:]``.

    Raises:
        ExecutionError: An id lies outside ``[-n, n)``, ``n = x.shape[axis]`` (at run time).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            table = rg.data("table", [5, 2])
            word_ids = rg.data("ids", [-1, 3], dtype="int64")
            vecs = rg.gather(table, word_ids)          # [V, D], ids [T, N] -> [T, N, D]
            cols = rg.gather(table, [0, -1], axis=1)   # the first and last columns: [5, 2]
        tv = np.arange(10, dtype="float32").reshape(5, 2)
        ids = np.array([[0, 4, -1]])
        out, c = rg.Executor().run(main, feed={"table": tv, "ids": ids}, fetch_list=[vecs, cols])
        assert out.shape == (1, 3, 2) and np.array_equal(out[0], tv[[0, 4, 4]])
        assert np.array_equal(c, tv[:, [0, 1]])
        ```
    """
    if not isinstance(ids, Var):
        from .creation import constant
        ids = constant(_id_array(ids, "gather"), "int64")
    axis = normalize_axis(as_int(axis, "gather: axis"), builtins.max(x.ndim, 1))
    if axis == 0:
        return append_op("Gather", [x, ids])[0]
    # Another axis: that axis moved to the front, its rows gathered, the id axes moved to it.
    front = [axis] + [a for a in range(x.ndim) if a != axis]
    rows = append_op("Gather", [transpose(x, front), ids])[0]
    r = ids.ndim
    return transpose(rows, list(range(r, r + axis)) + list(range(r)) + list(range(r + axis, rows.ndim)))


def _id_array(ids, what: str):
    import numpy as np
    array = np.asarray(ids)
    if array.dtype.kind not in "iu" and array.size:
        raise ProgramError(f"{what}: ids must be integers, got {array.dtype} {ids!r:.60}")
    return array.astype("int64")


# --- Cast ----------------------------------------------------------------------------------

def _cast_rule(ins, attrs):
    return [(ins[0].shape, attrs["dtype"])]


def _cast_grad(g):
    x = g.x[0]
    if is_float(x.dtype) and is_float(g.attrs["dtype"]):
        return [cast(g.dy, x.dtype)]
    return [None]


@defop("Cast", infer=_cast_rule, grad=_cast_grad)
def _cast(k, x):
    return k.xp.astype(x, dtype_of(k.xp, k.attrs["dtype"]))


@lowers("Cast")
def _cast_onnx(g):
    return [g.cast(g.ins[0], g.attrs["dtype"])]


def cast(x: Var, dtype: str) -> Var:
    """``x`` converted to ``dtype``; the gradient flows only between float dtypes.

    Args:
        x: A Var.
        dtype: The target dtype (``"float32"``, ``"int64"``, ``"bool"``...).

    Returns:
        A Var of ``x``'s shape and ``dtype``.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            lengths = rg.data("lengths", [3], dtype="int64")
            mask = rg.cast(lengths > 1, "float32")
        (out,) = rg.Executor().run(main, feed={"lengths": np.array([1, 2, 3])}, fetch_list=[mask])
        assert out.dtype == np.float32 and out.tolist() == [0.0, 1.0, 1.0]
        ```
    """
    return append_op("Cast", [x], {"dtype": canonical(dtype)})[0]


# --- Unsqueeze / squeeze -------------------------------------------------------------------

def _axes_list(axis) -> list[int]:
    return [as_int(axis, "axis")] if isinstance(axis, int) else as_ints(axis, "axes")


def _unsqueeze_axes(axes, ndim: int) -> list[int]:
    """Positions of the new axes in the output (rank ``ndim + len(axes)``), sorted."""
    rank = ndim + len(axes)
    result = sorted({normalize_axis(a, rank) for a in axes})
    if len(result) != len(axes):
        raise ShapeError(f"axes {list(axes)} repeat an axis")
    return result


def _unsqueeze_rule(ins, attrs):
    x = ins[0]
    shape = list(x.shape)
    for axis in _unsqueeze_axes(attrs["axes"], x.ndim):
        shape.insert(axis, 1)
    return [(tuple(shape), x.dtype)]


def _unsqueeze_grad(g):
    return [squeeze(g.dy, _unsqueeze_axes(g.attrs["axes"], g.x[0].ndim))]


@defop("Unsqueeze", infer=_unsqueeze_rule, grad=_unsqueeze_grad)
def _unsqueeze(k, x):
    for axis in _unsqueeze_axes(k.attrs["axes"], x.ndim):
        x = k.xp.expand_dims(x, axis=axis)
    return x


@lowers("Unsqueeze")
def _unsqueeze_onnx(g):
    axes = _unsqueeze_axes(g.attrs["axes"], g.in_vars[0].ndim)
    return [g.node("Unsqueeze", [g.ins[0], g.const(axes, "int64")])]


def _squeeze_axes(axes, ndim: int) -> list[int]:
    result = sorted({normalize_axis(a, ndim) for a in axes})
    if len(result) != len(axes):
        raise ShapeError(f"axes {list(axes)} repeat an axis")
    return result


def _squeeze_rule(ins, attrs):
    x = ins[0]
    axes = _squeeze_axes(attrs["axes"], x.ndim)
    wrong = [a for a in axes if x.shape[a] not in (1, -1)]
    if wrong:
        raise ShapeError(f"cannot squeeze axes {wrong} of size {[x.shape[a] for a in wrong]} (must be 1)")
    return [(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)]


def _squeeze_grad(g):
    return [unsqueeze(g.dy, _squeeze_axes(g.attrs["axes"], g.x[0].ndim))]


@defop("Squeeze", infer=_squeeze_rule, grad=_squeeze_grad)
def _squeeze(k, x):
    return k.xp.squeeze(x, axis=tuple(_squeeze_axes(k.attrs["axes"], x.ndim)))


@lowers("Squeeze")
def _squeeze_onnx(g):
    axes = _squeeze_axes(g.attrs["axes"], g.in_vars[0].ndim)
    if not axes:
        return [g.node("Identity", g.ins)]
    return [g.node("Squeeze", [g.ins[0], g.const(axes, "int64")])]


def unsqueeze(x: Var, axis) -> Var:
    """Insert size-1 axes into ``x``.

    Args:
        x: A Var.
        axis: An int or a list of ints: positions in the result.

    Returns:
        A Var with the new axes.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            v = rg.data("v", [-1])
            col = rg.unsqueeze(v, -1)                  # [N] -> [N, 1]
        (out,) = rg.Executor().run(main, feed={"v": np.ones(3, "float32")}, fetch_list=[col])
        assert out.shape == (3, 1)
        ```
    """
    return append_op("Unsqueeze", [x], {"axes": _axes_list(axis)})[0]


def squeeze(x: Var, axis=None) -> Var:
    """Remove size-1 axes from ``x``.

    Args:
        x: A Var.
        axis: An int or a list of ints; None removes every axis declared with
            size 1 (axes declared -1 are kept).

    Returns:
        A Var without those axes.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            col = rg.data("col", [-1, 1])
            v = rg.squeeze(col, 1)                     # [N, 1] -> [N]
        (out,) = rg.Executor().run(main, feed={"col": np.ones((3, 1), "float32")}, fetch_list=[v])
        assert out.shape == (3,)
        ```
    """
    axes = [i for i, d in enumerate(x.shape) if d == 1] if axis is None else _axes_list(axis)
    return append_op("Squeeze", [x], {"axes": axes})[0]


# --- StopGradient --------------------------------------------------------------------------

def _stop_gradient_rule(ins, attrs):
    return [(ins[0].shape, ins[0].dtype)]


@defop("StopGradient", infer=_stop_gradient_rule)
def _stop_gradient(k, x):
    """The input itself, under a name that autodiff treats as a constant."""
    return x


@lowers("StopGradient")
def _stop_gradient_onnx(g):
    return [g.node("Identity", g.ins)]


def stop_gradient(x: Var) -> Var:
    """The value of ``x`` as a constant for autodiff.

    The output Var has ``stop_gradient=True`` and the op has no gradient
    maker: no gradient propagates through it to ``x``, though ``x`` may still
    get gradients along other paths.

    Args:
        x: A Var.

    Returns:
        A Var with ``x``'s value.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [2], dtype="float64", stop_gradient=False)
            y = rg.sum(x * rg.stop_gradient(x))        # d/dx = x, not 2x
            (dx,) = rg.gradients(y, x)
        (out,) = rg.Executor().run(main, feed={"x": np.array([1.0, 3.0])}, fetch_list=[dx])
        assert out.tolist() == [1.0, 3.0]
        ```
    """
    out = append_op("StopGradient", [x])[0]
    out.stop_gradient = True
    return out


# --- Dim: one run-time size ---------------------------------------------------------------

def _dim_rule(ins, attrs):
    normalize_axis(attrs["axis"], ins[0].ndim)     # ShapeError for an axis the input lacks
    return [((), "int64")]


def _dim_size_values(shapes, values, attrs):
    shape = shapes[0]
    size = shape[normalize_axis(attrs["axis"], len(shape))]
    return None, [size if size >= 0 else None]


@defop("Dim", infer=_dim_rule, nondiff=(0,), shape_only=(0,), size_values=_dim_size_values)
def _dim(k, x):
    return k.xp.asarray(x.shape[normalize_axis(k.attrs["axis"], x.ndim)], dtype=dtype_of(k.xp, "int64"))


@lowers("Dim")
def _dim_onnx(g):
    return [g.scalar_dim(g.ins[0], normalize_axis(g.attrs["axis"], g.in_vars[0].ndim))]


def dim(x: Var, axis: int) -> Var:
    """The run-time size of ``x`` along ``axis``, an int64 scalar (a trip count for a loop).

    Example::

        steps = rg.ops.tensor.dim(seq, 0)        # T of a [T, N, D] sequence
    """
    return append_op("Dim", [x], {"axis": int(axis)})[0]


@defop("Shape", infer=lambda ins, attrs: [((ins[0].ndim,), "int64")], nondiff=(0,), shape_only=(0,))
def _shape(k, x):
    return k.xp.asarray(tuple(x.shape), dtype=dtype_of(k.xp, "int64"))


@lowers("Shape")
def _shape_onnx(g):
    return [g.shape(g.ins[0])]


def shape(x: Var) -> Var:
    """The run-time shape of ``x``, an int64 ``[rank]`` vector."""
    return append_op("Shape", [x])[0]
