"""Indexing: ``x[...]`` (``Index`` and its gradient ``IndexGrad``), ``scatter`` and ``update_slice``.

``x[key]`` is one ``Index`` op whatever the key holds. The key is kept as one
token per position (``attrs["items"]``, printed as written), read into items::

    token         item
    3             ["int", 3]                 an integer: picks one position, drops the axis
    "1::-2"       ["slice", 1, None, -2]     a slice (any nonzero step)
    "$"           ["var"]                    an int64 0-d Var (the op's next input): as an int
    None          ["new"]                    a new axis of size 1

``...`` is expanded when the op is built (ranks are static), and items for the
axes the key leaves out are full slices, so every axis of ``x`` has an item.
Kernels and lowerings work "rank-preserving" first (every picked axis kept as
size 1, negative steps read forwards and flipped) and reshape at the end.
"""
from __future__ import annotations

import builtins
import functools
import math
from typing import Sequence

import numpy as np

from ...backends import dtype_name, dtype_of
from ...errors import ProgramError, ShapeError, kernel_failure
from ...ir.location import here
from ...ir.program import OPERATORS, Var, as_int
from .creation import constant, zeros_like
from ..core.lowering import lowers
from ..math.elementwise import where
from ..core.registry import append_op, defop
from ..core.shapes import normalize_axis
from .tensor import (check_ids, checked_ids_onnx, from_end, gather, transpose, unsqueeze, wrap_ids,
                     wrapped_ids_onnx)

_py_slice = builtins.slice
INT_DTYPES = ("int64", "int32")
INT64_MAX, INT64_MIN = 2**63 - 1, -2**63
MAX_INDEX_INPUTS = 64          # variadic index Vars: positions listed for nondiff/shape_only


# --- The key --------------------------------------------------------------------------------

def key_items(key, x: Var) -> tuple[list, list[Var]]:
    """The Index op's form of ``x[key]``: its items (one per position, ``...`` expanded) and
    the index Vars, in order."""
    key = key if isinstance(key, tuple) else (key,)
    ellipses = builtins.sum(1 for k in key if k is Ellipsis)
    if ellipses > 1:
        raise ProgramError(f"x[...] of '{x.name}': an index may hold one '...', got {ellipses}")
    consumed = builtins.sum(1 for k in key if k is not None and k is not Ellipsis)
    if consumed > x.ndim:
        raise ShapeError(f"too many indices for '{x.name}' ({x.type_str()}): {consumed} for {x.ndim} axes")
    items, index_vars = [], []
    for k in key:
        if k is Ellipsis:
            items += [["slice", None, None, 1] for _ in range(x.ndim - consumed)]
        elif k is None:
            items.append(["new"])
        elif isinstance(k, _py_slice):
            items.append(_slice_item(k, x))
        elif isinstance(k, Var):
            if k.ndim != 0 or k.dtype not in INT_DTYPES:
                raise ProgramError(f"x[...] of '{x.name}': a Var index must be an int64 or int32 0-d "
                                   f"Var, got '{k.name}' {k.type_str()} (use rg.gather for id arrays)")
            items.append(["var"])
            index_vars.append(k)
        elif _is_int(k):
            items.append(["int", int(k)])
        else:
            raise ProgramError(f"x[...] of '{x.name}': cannot index with {type(k).__name__} {k!r:.40}; "
                               "use ints, slices, None, ... or int64 0-d Vars (rg.gather for id arrays)")
    if not builtins.any(k is Ellipsis for k in key):
        items += [["slice", None, None, 1] for _ in range(x.ndim - consumed)]
    return [_token(item) for item in items], index_vars


def _token(item) -> int | str | None:
    """An item as its token (what the op's attribute holds)."""
    if item[0] == "int":
        return item[1]
    if item[0] == "new":
        return None
    if item[0] == "var":
        return "$"
    start, stop, step = ("" if v is None else str(v) for v in item[1:])
    return f"{start}:{stop}" + ("" if step == "1" else f":{step}")


@functools.lru_cache(maxsize=1024)
def _decoded(tokens: tuple) -> tuple:
    items = []
    for token in tokens:
        if token is None:
            items.append(("new",))
        elif token == "$":
            items.append(("var",))
        elif isinstance(token, str):
            parts = [int(p) if p else None for p in token.split(":")] + [None]
            items.append(("slice", parts[0], parts[1], parts[2] or 1))
        else:
            items.append(("int", int(token)))
    return tuple(items)


def _items(attrs) -> tuple:
    """The op's items (see the module's docstring) from its tokens."""
    tokens = attrs["items"]
    if not isinstance(tokens, (list, tuple)) or not all(
            t is None or isinstance(t, (int, str)) and not isinstance(t, bool) for t in tokens):
        raise ShapeError(f"items must be a list of ints, slice strings, '$' and None, got {tokens!r:.80}")
    try:
        return _decoded(tuple(tokens))
    except ValueError:
        raise ShapeError(f"items {tokens!r:.80} hold a token that is no int, slice, '$' or None") from None


def _is_int(value) -> bool:
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _slice_item(k: slice, x: Var) -> list:
    bounds = []
    for name, value in (("start", k.start), ("stop", k.stop), ("step", k.step)):
        if value is not None and not _is_int(value):
            raise ProgramError(f"x[...] of '{x.name}': slice {name} must be an int or None, got "
                               f"{type(value).__name__} {value!r:.40} (a Var picks one position: "
                               "x[i]; rg.gather picks rows by an id array)")
        bounds.append(None if value is None else int(value))
    if bounds[2] == 0:
        raise ProgramError(f"x[...] of '{x.name}': slice step cannot be zero")
    return ["slice", bounds[0], bounds[1], 1 if bounds[2] is None else bounds[2]]


def _axis_items(items) -> list[tuple[int, list]]:
    """(axis of x, item) for every item that reads an axis of x (all but ``new``)."""
    found, axis = [], 0
    for item in items:
        if item[0] != "new":
            found.append((axis, item))
            axis += 1
    return found


def _is_full(item) -> bool:
    return item[0] == "slice" and item[1] is None and item[2] is None and item[3] == 1


def index_error(index: int, axis: int, n: int) -> IndexError:
    return IndexError(f"index {index} is out of range for axis {axis} of size {n}")


def check_index(index: int, axis: int, n: int) -> None:
    """Raise IndexError unless ``index`` lies in ``[-n, n)`` (NumPy's rule for an integer index)."""
    if not -n <= index < n:
        raise index_error(index, axis, n)


# --- Shapes ---------------------------------------------------------------------------------

def _slice_length(item, n: int) -> int:
    return len(range(*_py_slice(*item[1:]).indices(n))) if n >= 0 else -1


def _index_rule(ins, attrs):
    x, index_vars = ins[0], ins[1:]
    items = _items(attrs)
    if builtins.sum(1 for item in items if item[0] == "var") != len(index_vars):
        raise ShapeError(f"the key has {len(items)} items but {len(index_vars)} index inputs")
    for var in index_vars:
        if var.ndim != 0 or var.dtype not in INT_DTYPES:
            raise ShapeError(f"index '{var.name}' must be an int64 or int32 0-d Var, got {var.type_str()}")
    if len(_axis_items(items)) != x.ndim:
        raise ShapeError(f"the key indexes {len(_axis_items(items))} axes of a rank-{x.ndim} input")
    shape = []
    axes = iter(_axis_items(items))
    for item in items:
        if item[0] == "new":
            shape.append(1)
            continue
        axis, _ = next(axes)
        n = x.shape[axis]
        if item[0] == "int" and n >= 0:
            try:
                check_index(item[1], axis, n)
            except IndexError as exc:
                raise ShapeError(str(exc)) from None
        elif item[0] == "slice":
            shape.append(_slice_length(item, n))
    return [(tuple(shape), x.dtype)]


def _kept_shape(items, x_shape) -> tuple[int, ...]:
    """The rank-preserving result's shape: picked axes kept as size 1, no new axes."""
    return tuple(_slice_length(item, x_shape[axis]) if item[0] == "slice" else 1
                 for axis, item in _axis_items(items))


def _out_shape(items, kept: Sequence[int]) -> tuple[int, ...]:
    """The result's shape from the rank-preserving one: picked axes dropped, new axes added."""
    shape, axes = [], iter(range(len(kept)))
    for item in items:
        if item[0] == "new":
            shape.append(1)
        elif item[0] == "slice":
            shape.append(kept[next(axes)])
        else:
            next(axes)
    return tuple(shape)


# --- Kernels --------------------------------------------------------------------------------

def _forward_slice(item, n: int) -> tuple[slice, bool]:
    """The positions ``item`` picks on a size-``n`` axis as a slice with a positive step, and
    whether they must be flipped (a negative step)."""
    start, stop, step = _py_slice(*item[1:]).indices(n)
    if step > 0:
        return _py_slice(start, builtins.max(start, stop), step), False
    count = len(range(start, stop, step))
    if count == 0:
        return _py_slice(0, 0, 1), False
    last = start + (count - 1) * step
    return _py_slice(last, start + 1, -step), True


def _position(k, value, axis: int, n: int):
    """A Var index's position in ``[0, n)``: a Python int, or (while a device graph is captured,
    when the host may not read the device) a 1-element array checked after each replay."""
    xp = k.xp
    if k.run.deferred_checks is None:
        index = int(value)
        check_index(index, axis, n)
        return index % n
    position = xp.reshape(value + xp.astype(value < 0, value.dtype) * n, (1,))
    return check_ids(xp, position, n, "index", k=k)


def _plan(k, items, shape, values):
    """(basic index with positive steps, axes to flip, [(axis, position array)]) for x of ``shape``."""
    basic, flips, takes = [], [], []
    values = iter(values)
    for axis, item in _axis_items(items):
        n = shape[axis]
        if item[0] == "int":
            check_index(item[1], axis, n)
            index = item[1] % n
            basic.append(_py_slice(index, index + 1))
        elif item[0] == "var":
            position = _position(k, next(values), axis, n)
            if isinstance(position, int):
                basic.append(_py_slice(position, position + 1))
            else:
                basic.append(_py_slice(None))
                takes.append((axis, position))
        else:
            piece, flipped = _forward_slice(item, n)
            basic.append(piece)
            if flipped:
                flips.append(axis)
    return tuple(basic), tuple(flips), takes


def _index_grad(g):
    return [index_grad(g.dy, g.x[0], g.attrs["items"], g.x[1:])] + [None] * (len(g.x) - 1)


@defop("Index", inputs=("x", "indices*"), infer=_index_rule, grad=_index_grad,
       nondiff=tuple(range(1, MAX_INDEX_INPUTS)))
def _index(k, x, *indices):
    """``x[key]``: ints, slices (any step), new axes and 0-d index arrays, as NumPy reads them."""
    xp, items = k.xp, _items(k.attrs)
    basic, flips, takes = _plan(k, items, x.shape, indices)
    y = x[basic]
    if flips:
        y = xp.flip(y, axis=flips)
    for axis, position in takes:
        y = xp.take(y, position, axis=axis)
    return xp.reshape(y, _out_shape(items, y.shape))


def _index_grad_rule(ins, attrs):
    dy, x = ins[:2]
    return [(x.shape, dy.dtype)]


def _index_grad_grad(g):
    return [append_op("Index", [g.dy, *g.x[2:]], {"items": g.attrs["items"]})[0]] + [None] * (len(g.x) - 1)


@defop("IndexGrad", inputs=("dy", "x", "indices*"), infer=_index_grad_rule, grad=_index_grad_grad,
       nondiff=tuple(range(1, MAX_INDEX_INPUTS)), shape_only=(1,))
def _index_grad_kernel(k, dy, x, *indices):
    """Zeros shaped like ``x`` with ``dy`` written where ``Index`` read (its gradient)."""
    xp, items = k.xp, _items(k.attrs)
    kept = xp.reshape(dy, _kept_shape(items, x.shape))
    basic, flips, takes = _plan(k, items, x.shape, indices)
    if flips:
        kept = xp.flip(kept, axis=flips)
    for axis, position in takes:       # a size-1 axis spread over n, dy at the position
        n = x.shape[axis]
        at = xp.reshape(xp.arange(n, dtype=position.dtype) == position,
                        tuple(n if a == axis else 1 for a in range(x.ndim)))
        kept = xp.where(at, kept, xp.zeros((), dtype=kept.dtype))
    out = xp.zeros(tuple(x.shape), dtype=dy.dtype)
    out[basic] = kept
    return out


def index_grad(dy: Var, x: Var, items, index_vars: Sequence[Var]) -> Var:
    """Zeros shaped like ``x`` with ``dy`` where ``x[key]`` read (the gradient of ``x[key]``).

    Example::

        items, index_vars = key_items((slice(None), -1), x)
        dx = index_grad(dy, x, items, index_vars)       # dy [N] into zeros [N, T]
    """
    return append_op("IndexGrad", [dy, x, *index_vars], {"items": items})[0]


def getitem(x: Var, key) -> Var:
    """``x[key]`` (``Var.__getitem__``): NumPy's basic indexing, plus int64 0-d Vars as indices.

    Ints (negative from the end), slices with any step (negative too), None
    (a new axis), ``...`` and int64/int32 0-d Vars (read as ints at run time).
    Arrays of ids are ``rg.gather``'s job.

    Args:
        x: A Var.
        key: An index, a slice, None, ``...``, an int 0-d Var, or a tuple of them.

    Returns:
        The indexed Var (a view's value; its gradient fills the rest with zeros).

    Raises:
        ShapeError: An int out of range on a known dimension (when built).
        ExecutionError: An index out of range on a dimension known only at run
            time, or a Var index out of range (when run).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [3, 4])
            i = rg.data("i", [], dtype="int64")
            last = x[-1]                                   # [4]
            every_other = x[:, ::2, None]                  # [3, 2, 1]
            row = x[i]                                     # i: an int64 0-d Var
        xv = np.arange(12, dtype="float32").reshape(3, 4)
        a, b, c = rg.Executor().run(main, feed={"x": xv, "i": np.array(1)}, fetch_list=[last, every_other, row])
        assert np.array_equal(a, xv[-1]) and np.array_equal(b, xv[:, ::2, None]) and np.array_equal(c, xv[1])
        ```
    """
    try:
        items, index_vars = key_items(key, x)
    except ProgramError as exc:         # the user's line first, as for an op's shape rule
        location = here()
        raise type(exc)(f"{location}: {exc}" if location else str(exc)) from None
    return append_op("Index", [x, *index_vars], {"items": items})[0]


# --- ONNX -----------------------------------------------------------------------------------

def _checked_position_onnx(g, value: str, axis: int, x: str) -> str:
    """``value`` (an int64 scalar index) as a position in [0, n) on ``axis`` of ``x``, guarded by
    ``check_index`` as a run-time check of the model."""
    n = g.scalar_dim(x, axis)
    failed = g.node("Or", [g.node("Less", [value, g.node("Neg", [n])]), g.node("GreaterOrEqual", [value, n])])
    op, dtypes = g.op, [var.dtype for var in g.in_vars]
    shapes = [g.shape(v) for v in g.ins]

    def verify(index, n, *shapes):
        try:
            check_index(int(np.reshape(index, -1)[0]), axis, int(np.reshape(n, -1)[0]))
        except IndexError as exc:
            stand_ins = [np.broadcast_to(np.zeros((), dtype=dtype), tuple(int(d) for d in shape))
                         for dtype, shape in zip(dtypes, shapes)]
            raise kernel_failure(op.where(), exc, zip(op.inputs, stand_ins)) from None

    ok = g.check(failed, f"index into axis {axis} must lie in [-n, n)", verify, [value, n, *shapes])
    position = _wrapped(g, value, n)
    return g.node("Where", [ok, position, position])


def _wrapped(g, value: str, n: str) -> str:
    """``value + n`` where ``value`` is negative (an int64 scalar or 1-element tensor)."""
    negative = g.cast(g.node("Less", [value, g.const(0, "int64")]), "int64")
    return g.node("Add", [value, g.node("Mul", [negative, n])])


def _slice_args_onnx(g, x: str, axis: int, item, n: int) -> tuple[str, str, int]:
    """ONNX Slice's (start, end) 1-element values and step for a slice item on ``axis``."""
    _, start, stop, step = item
    if n >= 0:                       # Python's own reading, exact
        begin, end, _ = _py_slice(start, stop, step).indices(n)
        if not range(begin, end, step):
            begin = end = 0
        end = INT64_MIN if step < 0 and end < 0 else end
        return g.const([begin], "int64"), g.const([end], "int64"), step
    begin = (0 if step > 0 else INT64_MAX) if start is None else start
    end = (INT64_MAX if step > 0 else INT64_MIN) if stop is None else stop
    begin_c, end_c = g.const([begin], "int64"), g.const([end], "int64")
    if step < 0 and start is not None and start < 0:
        # Python reads a start before the first element as "nothing"; ONNX would clamp it to
        # the first element: end there instead (an empty slice).
        before = g.node("Less", [g.node("Add", [begin_c, g.dim(x, axis)]), g.const([0], "int64")])
        end_c = g.node("Where", [before, g.const([0], "int64"), end_c])
    return begin_c, end_c, step


def _int_position_onnx(g, x: str, axis: int, index: int, n: int) -> str:
    """An int item's position as an int64 scalar (checked at run time where n is unknown)."""
    if n >= 0:
        return g.const(index % n, "int64")
    return _checked_position_onnx(g, g.const(index, "int64"), axis, x)


def _var_position_onnx(g, i: int, axis: int, x: str) -> str:
    value = g.ins[i] if g.in_vars[i].dtype == "int64" else g.cast(g.ins[i], "int64")
    return _checked_position_onnx(g, value, axis, x)


@lowers("Index")
def _index_onnx(g):
    x, shape, items = g.ins[0], g.in_vars[0].shape, _items(g.attrs)
    starts, ends, axes, steps, picks, dropped = [], [], [], [], [], []
    next_input = iter(range(1, len(g.ins)))
    for axis, item in _axis_items(items):
        if item[0] == "slice":
            if not _is_full(item):
                begin, end, step = _slice_args_onnx(g, x, axis, item, shape[axis])
                starts.append(begin), ends.append(end), axes.append(axis), steps.append(step)
            continue
        if item[0] == "int":
            position = _int_position_onnx(g, x, axis, item[1], shape[axis])
        else:
            position = _var_position_onnx(g, next(next_input), axis, x)
        picks.append((axis, g.node("Reshape", [position, g.const([1], "int64")])))
        dropped.append(axis)
    y = x
    if axes:
        y = g.node("Slice", [y, g.node("Concat", starts, axis=0), g.node("Concat", ends, axis=0),
                             g.const(axes, "int64"), g.const(steps, "int64")])
    for axis, position in picks:
        y = g.node("Gather", [y, position], axis=axis)
    if dropped:
        y = g.node("Squeeze", [y, g.const(dropped, "int64")])
    new_axes = _new_axes_out(items)
    if new_axes:
        y = g.node("Unsqueeze", [y, g.const(new_axes, "int64")])
    return [y if y != x else g.node("Identity", [x])]


def _new_axes_out(items) -> list[int]:
    """Positions of the new axes in the result."""
    found, out_axis = [], 0
    for item in items:
        if item[0] in ("new", "slice"):
            if item[0] == "new":
                found.append(out_axis)
            out_axis += 1
    return found


def grid_indices_onnx(g, positions: list[str], lead_shape: str) -> str:
    """ScatterND indices ``[*lead, k]`` from one 1-D position vector per leading axis
    (``lead_shape``: their lengths, an int64 1-D value): entry ``[j0, .., jk-1]`` holds
    ``(positions[0][j0], ..., positions[k-1][jk-1])``."""
    depth = len(positions)
    grid = g.node("Concat", [lead_shape, g.const([1], "int64")], axis=0)
    columns = []
    for axis, position in enumerate(positions):
        shape = [1] * axis + [-1] + [1] * (depth - axis - 1) + [1]
        columns.append(g.node("Expand", [g.node("Reshape", [position, g.const(shape, "int64")]), grid]))
    return columns[0] if depth == 1 else g.node("Concat", columns, axis=-1)


@lowers("IndexGrad")
def _index_grad_onnx(g):
    """ScatterND of ``dy`` (made rank-preserving) into zeros at the positions Index read; only
    the leading axes up to the last one the key narrows need positions."""
    dy, x = g.ins[:2]
    items, shape = _items(g.attrs), g.in_vars[1].shape
    new_in_dy = _new_axes_out(items)
    y = g.node("Squeeze", [dy, g.const(new_in_dy, "int64")]) if new_in_dy else dy
    picked = [axis for axis, item in _axis_items(items) if item[0] in ("int", "var")]
    if picked:
        y = g.node("Unsqueeze", [y, g.const(picked, "int64")])
    narrowed = [axis for axis, item in _axis_items(items) if not _is_full(item)]
    if not narrowed:
        return [g.node("Identity", [y])]
    next_input = iter(range(2, len(g.ins)))
    positions = []
    for axis, item in _axis_items(items)[:narrowed[-1] + 1]:
        if item[0] == "slice":
            every = g.node("Range", [g.const(0, "int64"), g.scalar_dim(x, axis), g.const(1, "int64")])
            if _is_full(item):
                positions.append(every)
                continue
            begin, end, step = _slice_args_onnx(g, x, axis, item, shape[axis])
            positions.append(g.node("Slice", [every, begin, end, g.const([0], "int64"), g.const([step], "int64")]))
            continue
        if item[0] == "int":
            position = _int_position_onnx(g, x, axis, item[1], shape[axis])
        else:
            position = _var_position_onnx(g, next(next_input), axis, x)
        positions.append(g.node("Reshape", [position, g.const([1], "int64")]))
    lead = g.node("Slice", [g.shape(y), g.const([0], "int64"), g.const([len(positions)], "int64")])
    zeros = g.fill(g.shape(x), 0, g.in_vars[0].dtype)
    return [g.node("ScatterND", [zeros, grid_indices_onnx(g, positions, lead), y])]


# --- Scatter: rows of x replaced (or added to) -------------------------------------------------
#
# With repeated ids and overwrite=True the LAST update of a row wins (NumPy's x[ids] = u in
# practice, made a rule here on every backend: a stable sort finds each row's last writer),
# and only that update gets a gradient; the others are overwritten, so theirs is zero.

def _scatter_rule(ins, attrs):
    x, ids, updates = ins
    if ids.dtype not in INT_DTYPES:
        raise ShapeError(f"ids '{ids.name}' must be int64 or int32, got {ids.dtype}")
    if x.ndim < 1:
        raise ShapeError(f"cannot scatter rows into scalar '{x.name}'")
    if updates.dtype != x.dtype:
        raise ShapeError(f"updates '{updates.name}' must have x's dtype {x.dtype}, got {updates.dtype}")
    want = ids.shape + x.shape[1:]
    if updates.ndim != len(want) or any(a >= 0 and b >= 0 and a != b for a, b in zip(updates.shape, want)):
        raise ShapeError(f"updates must have shape ids.shape + x.shape[1:] = "
                         f"{[d if d >= 0 else '?' for d in want]}, got {updates.type_str()}")
    return [(x.shape, x.dtype)]


def _scatter_grad(g):
    x, ids, updates = g.x
    rows = gather(g.dy, ids)
    if not g.attrs["overwrite"]:
        return [g.dy, None, rows]
    dx = scatter(g.dy, ids, zeros_like(updates))
    won = append_op("LastWrites", [ids, x])[0]          # the updates that were not overwritten
    if updates.ndim > ids.ndim:
        won = unsqueeze(won, list(range(ids.ndim, updates.ndim)))
    return [dx, None, where(won, rows, zeros_like(rows))]


def _last_writers(k, ids, n: int):
    """int64 [n]: for each row, the position in ``ids`` (flat) of its last write, -1 if none."""
    xp = k.xp
    order = xp.argsort(ids, stable=True)
    ordered = xp.take(ids, order)
    last_of_run = xp.concat([ordered[1:] != ordered[:-1], xp.ones((1,), dtype=xp.bool)])
    winners = xp.where(last_of_run, xp.astype(order, dtype_of(xp, "int64")) + 1,
                       xp.zeros((), dtype=dtype_of(xp, "int64")))
    return k.backend.scatter_add_rows((n,), "int64", ordered, winners) - 1


@defop("Scatter", inputs=("x", "ids", "updates"), infer=_scatter_rule, grad=_scatter_grad, nondiff=(1,))
def _scatter(k, x, ids, updates):
    """``x`` with rows ``ids`` replaced by (or, ``overwrite=False``, added to by) ``updates``."""
    xp, n = k.xp, x.shape[0]
    ids = xp.reshape(wrap_ids(xp, ids, n, k=k), (-1,))
    rows = xp.reshape(updates, (ids.shape[0],) + tuple(x.shape[1:]))
    if not k.attrs["overwrite"]:
        return x + k.backend.scatter_add_rows(x.shape, dtype_name(x.dtype), ids, rows)
    if ids.shape[0] == 0:
        return xp.asarray(x, copy=True)
    last = _last_writers(k, ids, n)
    hit = last >= 0
    picked = xp.take(rows, xp.where(hit, last, xp.zeros_like(last)), axis=0)
    return xp.where(xp.reshape(hit, (n,) + (1,) * (x.ndim - 1)), picked, x)


def _last_writers_onnx(g, ids: str, x: str) -> str:
    """ONNX: int64 [n], each row's last writer (ScatterND with reduction max), -1 if none."""
    flat = g.node("Reshape", [ids, g.const([-1], "int64")])
    count = g.node("Shape", [flat])
    positions = g.node("Range", [g.const(0, "int64"), g.node("Squeeze", [count]), g.const(1, "int64")])
    none = g.fill(g.dim(x, 0), -1, "int64")
    index = g.node("Unsqueeze", [flat, g.const([-1], "int64")])
    return g.node("ScatterND", [none, index, positions], reduction="max")


@lowers("Scatter")
def _scatter_onnx(g):
    x, _, updates = g.ins
    ids = checked_ids_onnx(g, 1, g.scalar_dim(x, 0), negative=True)
    if not g.attrs["overwrite"]:
        index = g.node("Unsqueeze", [ids, g.const([-1], "int64")])
        return [g.node("ScatterND", [x, index, updates], reduction="add")]
    last = _last_writers_onnx(g, ids, x)
    row_shape = g.node("Slice", [g.shape(x), g.const([1], "int64"), g.const([INT64_MAX], "int64")])
    count = g.node("Shape", [g.node("Reshape", [ids, g.const([-1], "int64")])])   # not -1: rows may be empty
    rows = g.node("Reshape", [updates, g.node("Concat", [count, row_shape], axis=0)], allowzero=1)
    spare = g.fill(g.node("Concat", [g.const([1], "int64"), row_shape], axis=0), 0, g.in_vars[0].dtype)
    rows = g.node("Concat", [rows, spare], axis=0)        # a row to read where nothing was written
    hit = g.node("GreaterOrEqual", [last, g.const(0, "int64")])
    spare_row = g.node("Sub", [g.dim(rows, 0), g.const([1], "int64")])
    picked = g.node("Gather", [rows, g.node("Where", [hit, last, spare_row])], axis=0)
    axes = list(range(1, g.in_vars[0].ndim))
    hit = g.node("Unsqueeze", [hit, g.const(axes, "int64")]) if axes else hit
    return [g.node("Where", [hit, picked, x])]


def _last_writes_rule(ins, attrs):
    return [(ins[0].shape, "bool")]


@defop("LastWrites", inputs=("ids", "x"), infer=_last_writes_rule, nondiff=(0, 1), shape_only=(1,))
def _last_writes(k, ids, x):
    """bool, shaped like ``ids``: True where the entry is its row's last write (Scatter's winner)."""
    xp = k.xp
    flat = xp.reshape(ids, (-1,))
    if flat.shape[0] == 0:
        return xp.zeros(tuple(ids.shape), dtype=xp.bool)
    flat = from_end(xp, flat, x.shape[0])              # checked by the Scatter
    last = _last_writers(k, flat, x.shape[0])
    mine = xp.arange(flat.shape[0], dtype=last.dtype)
    return xp.reshape(xp.take(last, flat) == mine, tuple(ids.shape))


@lowers("LastWrites")
def _last_writes_onnx(g):
    ids = g.ins[0] if g.in_vars[0].dtype == "int64" else g.cast(g.ins[0], "int64")
    ids = wrapped_ids_onnx(g, ids, g.scalar_dim(g.ins[1], 0))
    last = _last_writers_onnx(g, ids, g.ins[1])
    flat = g.node("Reshape", [ids, g.const([-1], "int64")])
    mine = g.node("Range", [g.const(0, "int64"), g.node("Squeeze", [g.shape(flat)]), g.const(1, "int64")])
    won = g.node("Equal", [g.node("Gather", [last, flat], axis=0), mine])
    return [g.node("Reshape", [won, g.shape(ids)], allowzero=1)]


def scatter(x: Var, ids: Var, updates, overwrite: bool = True, axis: int = 0) -> Var:
    """``x`` with slices along ``axis`` replaced: ``x[ids] = updates`` on axis 0 (or ``+=``).

    ``overwrite=False`` adds instead (``torch.index_add``).

    With repeated ids, ``overwrite=True`` keeps the last update of a slice (as
    NumPy's ``x[ids] = updates``) and only that update receives a gradient;
    ``overwrite=False`` adds them all.

    Args:
        x: A Var.
        ids: int64 or int32 ids of any shape (a Var, a list or an array), picking
            slices of ``x`` along ``axis``; negative ones count from the end.
        updates: A Var (or array) of shape ``x.shape[:axis] + ids.shape +
            x.shape[axis+1:]`` (``rg.gather``'s result).
        overwrite: Replace rows (True) or add to them (False).

        axis: The axis the ids pick slices along.

    Returns:
        A new Var of ``x``'s shape (``x`` itself is unchanged).

    Raises:
        ExecutionError: An id lies outside ``[-n, n)``, ``n = x.shape[axis]`` (at run time).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            cache = rg.data("cache", [3, 2])
            slot_ids = rg.data("ids", [-1], dtype="int64")
            rows = rg.data("rows", [-1, 2])
            replaced = rg.scatter(cache, slot_ids, rows)
            added = rg.scatter(cache, slot_ids, rows, overwrite=False)
            last_col = rg.scatter(cache, [-1], rg.fill([3, 1], 5.0), axis=1)   # the last column
        feed = {"cache": np.zeros((3, 2), "float32"), "ids": np.array([2, -1]), "rows": np.ones((2, 2), "float32")}
        r, a, c = rg.Executor().run(main, feed=feed, fetch_list=[replaced, added, last_col])
        assert r[2].tolist() == [1.0, 1.0] and a[2].tolist() == [2.0, 2.0] and not a[:2].any()
        assert c[:, 1].tolist() == [5.0, 5.0, 5.0] and not c[:, 0].any()
        ```
    """
    if not isinstance(ids, Var):
        ids = constant(np.asarray(ids), "int64")
    if not isinstance(updates, Var):
        updates = constant(np.asarray(updates), x.dtype)
    axis = normalize_axis(as_int(axis, "scatter: axis"), builtins.max(x.ndim, 1))
    attrs = {"overwrite": bool(overwrite)}
    if axis == 0:
        return append_op("Scatter", [x, ids, updates], attrs)[0]
    # Another axis: it and the updates' id axes moved to the front, scattered, moved back.
    front = [axis] + [a for a in range(x.ndim) if a != axis]
    r = ids.ndim
    if updates.ndim != x.ndim - 1 + r:
        raise ShapeError(f"scatter: updates must have shape x.shape[:axis] + ids.shape + x.shape[axis+1:] "
                         f"(rank {x.ndim - 1 + r}), got '{updates.name}' {updates.type_str()}")
    ids_first = list(range(axis, axis + r)) + list(range(axis)) + list(range(axis + r, updates.ndim))
    out = append_op("Scatter", [transpose(x, front), ids, transpose(updates, ids_first)], attrs)[0]
    return transpose(out, [front.index(a) for a in range(x.ndim)])


# --- Element-wise gather and scatter along an axis (torch.gather / scatter / scatter_add) ------------
#
# ids have x's rank; out[i][j][k] = x[i][ids[i][j][k]][k] on axis 1 (GatherElements) and the
# transpose, x[i][ids[i][j][k]][k] = updates[i][j][k] (ScatterElements). As in torch, ids may be
# smaller than x on the other axes (they cover its leading corner). Negative ids count from the end
# (ONNX's rule). With repeated ids, reduction="none" keeps the last update (the order of ids,
# row-major), as Scatter does; every update's gradient is dy at the place it wrote (torch's rule).

def _elements_rule(x: Var, ids: Var, axis: int, what: str) -> int:
    if ids.dtype not in INT_DTYPES:
        raise ShapeError(f"ids '{ids.name}' must be int64 or int32, got {ids.dtype}")
    if x.ndim < 1 or ids.ndim != x.ndim:
        raise ShapeError(f"{what} needs ids of x's rank ({x.ndim}, at least 1), got '{ids.name}' {ids.type_str()}")
    axis = normalize_axis(axis, x.ndim)
    for d, (n, m) in enumerate(zip(x.shape, ids.shape)):
        if d != axis and n >= 0 and m > n:
            raise ShapeError(f"ids '{ids.name}' {ids.type_str()} are larger than x {x.type_str()} on axis {d}")
    return axis


def _gather_elements_rule(ins, attrs):
    x, ids = ins
    _elements_rule(x, ids, attrs["axis"], "gather_elements")
    return [(ids.shape, x.dtype)]


def _check_corner(x_shape, ids_shape, axis: int) -> None:
    """ValueError unless ``ids`` fit in ``x`` on every axis but ``axis`` (known only when run)."""
    for d, (n, m) in enumerate(zip(x_shape, ids_shape)):
        if d != axis and m > n:
            raise ValueError(f"ids of shape {list(ids_shape)} are larger than x {list(x_shape)} on axis {d}")


def _corner(x, ids_shape, axis: int):
    """``x``'s leading corner of ``ids_shape`` on every axis but ``axis``."""
    return x[tuple(_py_slice(None) if d == axis else _py_slice(0, m) for d, m in enumerate(ids_shape))]


@defop("GatherElements", inputs=("x", "ids"), infer=_gather_elements_rule, nondiff=(1,),
       grad=lambda g: [scatter_elements(zeros_like(g.x[0]), g.x[1], g.dy, g.attrs["axis"], "add"), None])
def _gather_elements(k, x, ids):
    """``out[..., i, ...] = x[..., ids[..., i, ...], ...]`` along ``axis`` (``torch.gather``)."""
    xp, axis = k.xp, k.attrs["axis"] % x.ndim
    _check_corner(x.shape, ids.shape, axis)
    ids = wrap_ids(xp, ids, x.shape[axis], k=k)
    picked = k.backend.take_along_axis(_corner(x, ids.shape, axis), xp.astype(ids, xp.int64), axis)
    return xp.reshape(picked, tuple(ids.shape))


def _fits_onnx_guard(g, x: str, ids: str, axis: int, others: list[int]) -> str:
    """ONNX: a bool scalar, true when ``ids`` fit in ``x`` on the ``others`` axes (a guard node
    fails the run with ``_check_corner``'s error where they do not)."""
    fits = g.node("Less", [g.shape(x), g.shape(ids)])
    failed = g.node("ReduceMax", [g.cast(g.node("Gather", [fits, g.const(others, "int64")], axis=0), "int64")],
                    keepdims=0)
    op = g.op

    def verify(x_shape, ids_shape):
        try:
            _check_corner([int(d) for d in x_shape], [int(d) for d in ids_shape], axis)
        except ValueError as exc:
            raise kernel_failure(op.where(), exc) from None
    return g.check(g.cast(failed, "bool"), "ids must fit in x", verify, [g.shape(x), g.shape(ids)])


def _corner_onnx(g, x: str, ids: str, axis: int) -> str:
    """ONNX: ``x``'s leading corner of ``ids``' shape on the other axes (guarded: they fit)."""
    others = [d for d in range(g.in_vars[0].ndim) if d != axis]
    if not others:
        return x
    ok = _fits_onnx_guard(g, x, ids, axis, others)
    ends = g.node("Gather", [g.shape(ids), g.const(others, "int64")], axis=0)
    corner = g.node("Slice", [x, g.const([0] * len(others), "int64"), ends, g.const(others, "int64")])
    return g.node("Where", [ok, corner, corner])


@lowers("GatherElements")
def _gather_elements_onnx(g):
    x, axis = g.ins[0], g.attrs["axis"] % g.ndim(0)
    ids = checked_ids_onnx(g, 1, g.scalar_dim(x, axis), negative=True)
    return [g.node("GatherElements", [_corner_onnx(g, x, ids, axis), ids], axis=axis)]


def _scatter_elements_rule(ins, attrs):
    x, ids, updates = ins
    _elements_rule(x, ids, attrs["axis"], "scatter_elements")
    if updates.dtype != x.dtype:
        raise ShapeError(f"updates '{updates.name}' must have x's dtype {x.dtype}, got {updates.dtype}")
    if updates.ndim != ids.ndim or any(a >= 0 and b >= 0 and a != b for a, b in zip(updates.shape, ids.shape)):
        raise ShapeError(f"updates '{updates.name}' {updates.type_str()} must have the shape of ids {ids.type_str()}")
    if attrs["reduction"] not in ("none", "add"):
        raise ShapeError(f"reduction must be 'none' or 'add', got {attrs['reduction']!r}")
    return [(x.shape, x.dtype)]


def _scatter_elements_grad(g):
    x, ids, updates = g.x
    axis, reduction = g.attrs["axis"], g.attrs["reduction"]
    dupdates = gather_elements(g.dy, ids, axis)
    if reduction == "add":
        return [g.dy, None, dupdates]
    return [scatter_elements(g.dy, ids, zeros_like(updates), axis, "none"), None, dupdates]


def _flat_positions(xp, ids, x_shape, axis: int):
    """int64, shaped like ``ids``: the flat (row-major) position in ``x`` each entry addresses."""
    flat = xp.astype(ids, xp.int64) * math.prod(x_shape[axis + 1:])
    for d in range(len(x_shape)):
        if d != axis:
            along = xp.arange(ids.shape[d], dtype=xp.int64) * math.prod(x_shape[d + 1:])
            flat = flat + xp.reshape(along, tuple(-1 if a == d else 1 for a in range(len(x_shape))))
    return xp.reshape(flat, (-1,))


@defop("ScatterElements", inputs=("x", "ids", "updates"), infer=_scatter_elements_rule, nondiff=(1,),
       grad=_scatter_elements_grad)
def _scatter_elements(k, x, ids, updates):
    """``x`` with ``updates`` written (or added, ``reduction="add"``) at ``ids`` along ``axis``."""
    xp, axis = k.xp, k.attrs["axis"] % x.ndim
    _check_corner(x.shape, ids.shape, axis)
    ids = wrap_ids(xp, ids, x.shape[axis], k=k)
    size = math.prod(x.shape)
    positions, values = _flat_positions(xp, ids, x.shape, axis), xp.reshape(updates, (-1,))
    flat_x = xp.reshape(x, (size,))
    if k.attrs["reduction"] == "add":
        added = k.backend.scatter_add_rows((size,), dtype_name(x.dtype), positions, values)
        return xp.reshape(flat_x + added, tuple(x.shape))
    if positions.shape[0] == 0:
        return xp.asarray(x, copy=True)
    last = _last_writers(k, positions, size)
    hit = last >= 0
    picked = xp.take(values, xp.where(hit, last, xp.zeros_like(last)))
    return xp.reshape(xp.where(hit, picked, flat_x), tuple(x.shape))


@lowers("ScatterElements")
def _scatter_elements_onnx(g):
    x, _, updates = g.ins
    axis, reduction = g.attrs["axis"] % g.ndim(0), g.attrs["reduction"]
    ids = checked_ids_onnx(g, 1, g.scalar_dim(x, axis), negative=True)
    others = [d for d in range(g.in_vars[0].ndim) if d != axis]
    if others:
        ok = _fits_onnx_guard(g, x, ids, axis, others)
        x = g.node("Where", [ok, x, x])
    return [g.node("ScatterElements", [x, ids, updates], axis=axis, reduction=reduction)]


def gather_elements(x: Var, ids, axis: int) -> Var:
    """``torch.gather(x, axis, ids)``: ``out[i][j] = x[i][ids[i][j]]`` on axis 1, shaped like ``ids``.

    ONNX GatherElements and ``numpy.take_along_axis``. ``ids`` may be smaller
    than ``x`` on the other axes (they read ``x``'s leading corner there). The
    gradient adds up over repeated ids.

    Args:
        x: A Var.
        ids: int64 or int32 ids of ``x``'s rank (a Var, a list or an array);
            negative ones count from the end.
        axis: The axis the ids pick along.

    Returns:
        A Var of ``ids``' shape and ``x``'s dtype.

    Raises:
        ShapeError: ``ids`` has another rank, or is larger than ``x`` on another axis.
        ExecutionError: An id lies outside ``[-n, n)``, ``n = x.shape[axis]`` (at run time).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            logits = rg.data("logits", [-1, 3])
            labels = rg.data("labels", [-1, 1], dtype="int64")
            picked = rg.gather_elements(logits, labels, axis=1)    # [N, C] -> [N, 1]
        lv = np.array([[0.1, 0.2, 0.7], [0.5, 0.3, 0.2]], "float32")
        (out,) = rg.Executor().run(main, feed={"logits": lv, "labels": np.array([[2], [-3]])}, fetch_list=[picked])
        assert np.allclose(out, [[0.7], [0.5]])
        ```
    """
    if not isinstance(ids, Var):
        ids = constant(np.asarray(ids), "int64")
    return append_op("GatherElements", [x, ids], {"axis": as_int(axis, "gather_elements: axis")})[0]


def scatter_elements(x: Var, ids, updates, axis: int, reduction: str = "none") -> Var:
    """``x`` with ``updates`` written (or added) at ``ids`` along ``axis``: ``torch.scatter``/``scatter_add``.

    ONNX ScatterElements. ``updates`` has the shape of ``ids``, which have
    ``x``'s rank (smaller on the other axes is allowed: they address ``x``'s
    leading corner). With repeated ids and ``reduction="none"`` the last
    update (in the row-major order of ``ids``) wins. Gradients: ``x`` gets
    ``dy`` where it was not overwritten, each update ``dy`` at the place it
    wrote (torch's rule).

    Args:
        x: A Var.
        ids: int64 or int32 ids of ``x``'s rank (a Var, a list or an array);
            negative ones count from the end.
        updates: A Var (or array) of ``ids``' shape and ``x``'s dtype.
        axis: The axis the ids address.
        reduction: ``"none"`` (write) or ``"add"``.

    Returns:
        A new Var of ``x``'s shape (``x`` itself is unchanged).

    Raises:
        ProgramError: ``reduction`` is neither ``"none"`` nor ``"add"``.
        ShapeError: ``ids`` or ``updates`` do not fit ``x``.
        ExecutionError: An id lies outside ``[-n, n)``, ``n = x.shape[axis]`` (at run time).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            zeros = rg.fill([2, 3], 0.0)
            ids = rg.data("ids", [2, 4], dtype="int64")
            counts = rg.scatter_elements(zeros, ids, rg.fill([2, 4], 1.0), axis=1, reduction="add")
        (out,) = rg.Executor().run(main, feed={"ids": np.array([[0, 0, 2, -1], [1, 1, 1, 0]])}, fetch_list=[counts])
        assert out.tolist() == [[2.0, 0.0, 2.0], [1.0, 3.0, 0.0]]                 # a histogram per row
        ```
    """
    if reduction not in ("none", "add"):
        raise ProgramError(f"scatter_elements: reduction must be 'none' or 'add', got {reduction!r}")
    if not isinstance(ids, Var):
        ids = constant(np.asarray(ids), "int64")
    if not isinstance(updates, Var):
        updates = constant(np.asarray(updates), x.dtype)
    attrs = {"axis": as_int(axis, "scatter_elements: axis"), "reduction": reduction}
    return append_op("ScatterElements", [x, ids, updates], attrs)[0]


# --- update_slice / dynamic slice ------------------------------------------------------------
#
# starts are read as jax.lax.dynamic_update_slice reads them (its default,
# allow_negative_indices=True): a negative start counts from the end (start + n), then every
# start is clamped into [0, n - size], so the block always fits (one past the end slides back).

def _starts_rule(x, starts, sizes_from) -> None:
    if len(starts) != x.ndim:
        raise ShapeError(f"needs one start per axis of '{x.name}' ({x.ndim}), got {len(starts)}")
    for start in starts:
        if start.ndim != 0 or start.dtype not in INT_DTYPES:
            raise ShapeError(f"start '{start.name}' must be an int64 or int32 0-d Var, got {start.type_str()}")
    if sizes_from.ndim != x.ndim:
        raise ShapeError(f"'{sizes_from.name}' {sizes_from.type_str()} must have the rank of "
                         f"'{x.name}' {x.type_str()}")
    for axis, (n, size) in enumerate(zip(x.shape, sizes_from.shape)):
        if n >= 0 and size > n:
            raise ShapeError(f"'{sizes_from.name}' {sizes_from.type_str()} does not fit in "
                             f"'{x.name}' {x.type_str()} (axis {axis})")


def _update_slice_rule(ins, attrs):
    x, update, starts = ins[0], ins[1], ins[2:]
    if update.dtype != x.dtype:
        raise ShapeError(f"update '{update.name}' must have x's dtype {x.dtype}, got {update.dtype}")
    _starts_rule(x, starts, update)
    return [(x.shape, x.dtype)]


def _clamped_block(x_shape, sizes, starts) -> tuple[slice, ...]:
    """The index of the block of ``sizes`` at ``starts`` (0-d arrays), read as JAX reads them."""
    block = []
    for axis, (n, size, start) in enumerate(zip(x_shape, sizes, starts)):
        if size > n:
            raise ValueError(f"a block of size {size} does not fit axis {axis} of size {n}")
        begin = int(start)
        begin = begin + n if begin < 0 else begin
        begin = builtins.min(builtins.max(begin, 0), n - size)
        block.append(_py_slice(begin, begin + size))
    return tuple(block)


def _update_slice_grad(g):
    x, update, starts = g.x[0], g.x[1], g.x[2:]
    dx = update_slice(g.dy, zeros_like(update), starts)
    dupdate = dynamic_slice(g.dy, update, starts)
    return [dx, dupdate] + [None] * len(starts)


@defop("UpdateSlice", inputs=("x", "update", "starts*"), infer=_update_slice_rule,
       grad=_update_slice_grad, nondiff=tuple(range(2, MAX_INDEX_INPUTS)))
def _update_slice(k, x, update, *starts):
    """``x`` with the block at ``starts`` (clamped so that it fits) replaced by ``update``."""
    out = k.xp.asarray(x, copy=True)
    out[_clamped_block(x.shape, update.shape, starts)] = update
    return out


def _dynamic_slice_rule(ins, attrs):
    x, like, starts = ins[0], ins[1], ins[2:]
    _starts_rule(x, starts, like)
    return [(like.shape, x.dtype)]


def _dynamic_slice_grad(g):
    x, like, starts = g.x[0], g.x[1], g.x[2:]
    return [update_slice(zeros_like(x), g.dy, starts), None] + [None] * len(starts)


@defop("DynamicSlice", inputs=("x", "like", "starts*"), infer=_dynamic_slice_rule, grad=_dynamic_slice_grad,
       nondiff=tuple(range(1, MAX_INDEX_INPUTS)), shape_only=(1,))
def _dynamic_slice(k, x, like, *starts):
    """The block of ``like``'s shape at ``starts`` (clamped as in UpdateSlice): its gradient."""
    return x[_clamped_block(x.shape, like.shape, starts)]


def _clamped_starts_onnx(g, x: str, sizes: str) -> str:
    """int64 [rank]: the op's starts (negative ones + n) clamped into [0, shape(x) - shape(sizes)]."""
    starts = [g.node("Reshape", [v if var.dtype == "int64" else g.cast(v, "int64"), g.const([1], "int64")])
              for v, var in zip(g.ins[2:], g.in_vars[2:])]
    starts = _wrapped(g, g.node("Concat", starts, axis=0), g.shape(x))
    room = g.node("Sub", [g.shape(x), g.shape(sizes)])
    if any(n < 0 or d < 0 for n, d in zip(g.in_vars[0].shape, g.in_vars[1].shape)):
        room = _fits_onnx(g, x, sizes, room)
    return g.node("Min", [g.node("Max", [starts, g.const([0], "int64")]), room])


def _fits_onnx(g, x: str, sizes: str, room: str) -> str:
    """``room``, guarded: a block bigger than x on some axis fails the run as the kernel does."""
    failed = g.node("Less", [g.node("ReduceMin", [room], keepdims=0), g.const(0, "int64")])
    op = g.op

    def verify(x_shape, block_shape):
        try:
            _clamped_block([int(d) for d in x_shape], [int(d) for d in block_shape], [0] * len(x_shape))
        except ValueError as exc:
            raise kernel_failure(op.where(), exc) from None
    ok = g.check(failed, "the block must fit in x", verify, [g.shape(x), g.shape(sizes)])
    return g.node("Where", [ok, room, room])


@lowers("UpdateSlice")
def _update_slice_onnx(g):
    """ScatterND of ``update`` at the clamped block (positions only for the leading axes up to the
    last one the block may not cover whole)."""
    x, update = g.ins[:2]
    x_shape, u_shape = g.in_vars[0].shape, g.in_vars[1].shape
    begins = _clamped_starts_onnx(g, x, update)
    partial = [a for a, (n, size) in enumerate(zip(x_shape, u_shape)) if n < 0 or n != size]
    if not partial:
        return [g.node("Identity", [update])]
    positions = []
    for axis in range(partial[-1] + 1):
        begin = g.node("Gather", [begins, g.const(axis, "int64")], axis=0)
        end = g.node("Add", [begin, g.scalar_dim(update, axis)])
        positions.append(g.node("Range", [begin, end, g.const(1, "int64")]))
    lead = g.node("Slice", [g.shape(update), g.const([0], "int64"), g.const([len(positions)], "int64")])
    return [g.node("ScatterND", [x, grid_indices_onnx(g, positions, lead), update])]


@lowers("DynamicSlice")
def _dynamic_slice_onnx(g):
    x, like = g.ins[:2]
    begins = _clamped_starts_onnx(g, x, like)
    ends = g.node("Add", [begins, g.shape(like)])
    return [g.node("Slice", [x, begins, ends])]


def update_slice(x: Var, update, starts) -> Var:
    """``x`` with the block at ``starts`` replaced by ``update`` (``jax.lax.dynamic_update_slice``).

    As in JAX, a negative start counts from the end (``start + n``) and every
    start is then clamped into ``[0, n - size]``, so the block always fits.
    Gradients flow to ``x`` (zero inside the block) and to ``update``.

    Args:
        x: A Var.
        update: A Var (or array) of ``x``'s rank.
        starts: One start per axis: ints or int64 0-d Vars.

    Returns:
        A new Var of ``x``'s shape.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            cache = rg.data("cache", [2, 4])
            k_t = rg.data("k_t", [2, 1])
            t = rg.data("t", [], dtype="int64")
            new_cache = rg.update_slice(cache, k_t, [0, t])    # write column t
        feed = {"cache": np.zeros((2, 4), "float32"), "k_t": np.ones((2, 1), "float32"), "t": np.array(2)}
        (out,) = rg.Executor().run(main, feed=feed, fetch_list=[new_cache])
        assert out.tolist() == [[0, 0, 1, 0], [0, 0, 1, 0]]
        ```
    """
    if not isinstance(update, Var):
        update = constant(np.asarray(update), x.dtype)
    starts = [start if isinstance(start, Var) else constant(as_int(start, "update_slice: a start"), "int64")
              for start in starts]
    return append_op("UpdateSlice", [x, update, *starts])[0]


def dynamic_slice(x: Var, like: Var, starts) -> Var:
    """The block of ``like``'s (run-time) shape at ``starts`` in ``x`` (read as update_slice reads
    them): ``jax.lax.dynamic_slice``, the gradient of update_slice.

    Example::

        k_t = dynamic_slice(cache, k_new, [0, 0, t, 0])   # the [N, H, 1, E] block at step t
    """
    starts = [start if isinstance(start, Var) else constant(as_int(start, "dynamic_slice: a start"), "int64")
              for start in starts]
    return append_op("DynamicSlice", [x, like, *starts])[0]


OPERATORS.update(getitem=getitem, transpose=transpose)
