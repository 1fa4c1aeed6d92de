"""``TensorArray``: a list of same-shaped tensors that grows as it is written, as a value.

A TensorArray is a Var whose value is the stacked elements, ``[size, *element_shape]``;
``write`` returns a new array (functional, so it is a loop var like any other), ``read``
is a row, ``stack`` the value itself and ``size`` its first dimension (``Dim``). Ops::

    TensorArrayNew(; element_shape, dtype)     -> [0, *element_shape] (unknown sizes: 0)
    TensorArrayWrite(arr, i, x)                -> arr with row i set to x (i == size appends), size
    TensorArrayRead(arr, i)                    -> arr[i] (i outside [0, size): ExecutionError), size
    TensorArrayReadGrad(dy, rows, i)           -> zeros [rows, *dy.shape] with row i = dy
    TensorArrayWriteGrad(d, rows, i, d_rows)   -> d cut (or zero-padded) to ``rows`` rows, row i
                                                  zeroed (d_rows: d's rows, for its own gradient)

Write and read also output the array's size (before the write): their gradients read that
int64 scalar, never the array, so a backward keeps nothing of the array (in a loop, in a
branch).

Appends cost O(1) amortised: the kernel writes into a spare row of a capacity-doubling
backing array and returns a view of its first ``size + 1`` rows. Views never see rows past
their size, so sharing the backing is safe; a backing remembers how many rows have been
handed out, and an append to an older (shorter) view, or an overwrite (i < size), copies.
In ONNX a write is ``Concat`` + ``ScatterND`` + ``Slice`` on the stacked value (a copy per
write: onnxruntime has no aliasing), so the exported model needs no sequence types.

Gradients are built from these ops (linear in their first input), so they differentiate
again. In a ``while_loop`` an array's size changes every iteration: ``while_loop`` declares
its shape invariant ``[-1, *element_shape]`` by itself.
"""
from __future__ import annotations

import threading
import weakref
from typing import Sequence

import numpy as np

from ...backends import dtype_of
from ...errors import ExecutionError, ProgramError, ShapeError
from ...ir.dtypes import canonical
from ...ir.program import Var
from ..array.creation import constant
from ..core.lowering import lowers
from ..math.elementwise import maximum
from ..array.tensor import dim
from ..core.registry import append_op, defop
from ..core.subblocks import merge_shapes, shapes_compatible
from .empty_arrays import unresolved


# --- Shape rules -------------------------------------------------------------------------------

def _check_index(var: Var) -> None:
    if var.dtype not in ("int32", "int64") or var.shape not in ((), (1,)):
        raise ShapeError(f"the index '{var.name}' must be an integer scalar, got {var.type_str()}")


def _check_array(var: Var) -> None:
    if var.ndim < 1:
        raise ShapeError(f"'{var.name}' {var.type_str()} is not a TensorArray value [size, ...]")


def _new_rule(ins, attrs):
    return [((0,) + tuple(attrs["element_shape"]), attrs["dtype"])]


def _write_rule(ins, attrs):
    arr, i, x = ins
    _check_array(arr)
    _check_index(i)
    if x.dtype != arr.dtype or not shapes_compatible(arr.shape[1:], x.shape):
        raise ShapeError(f"cannot write '{x.name}' {x.type_str()} into a TensorArray of {arr.dtype} "
                         f"elements shaped {list(arr.shape[1:])}")
    return [((-1,) + merge_shapes(arr.shape[1:], x.shape), arr.dtype), ((), "int64")]


def _read_rule(ins, attrs):
    arr, i = ins
    _check_array(arr)
    _check_index(i)
    return [(arr.shape[1:], arr.dtype), ((), "int64")]


def _read_grad_rule(ins, attrs):
    dy, rows, i = ins
    _check_index(rows)
    _check_index(i)
    return [((-1,) + dy.shape, dy.dtype)]


def _write_grad_rule(ins, attrs):
    d, rows, i, d_rows = ins
    _check_array(d)
    for var in (rows, i, d_rows):
        _check_index(var)
    return [((-1,) + d.shape[1:], d.dtype)]


# --- Kernels -------------------------------------------------------------------------------------

class _Backings:
    """Which backing array (and how many of its rows are handed out) each appended view shares.

    Keyed by the view's id, with a weak reference to tell a live view from a reused id;
    correctness never depends on this table, only the cost of an append does.
    """

    def __init__(self):
        self.views: dict[int, tuple] = {}
        self.lock = threading.Lock()

    def append(self, xp, arr, x):
        n = arr.shape[0]
        with self.lock:
            entry = self.views.get(id(arr))
            if entry is not None and entry[0]() is arr:
                backing, used = entry[1], entry[2]
                if used[0] == n and n < backing.shape[0]:
                    backing[n, ...] = x
                    used[0] = n + 1
                    return self._track(backing[:n + 1], backing, used)
            backing = xp.empty((max(4, 2 * (n + 1)),) + tuple(x.shape), dtype=x.dtype)
            if n:
                backing[:n, ...] = arr
            backing[n, ...] = x
            return self._track(backing[:n + 1], backing, [n + 1])

    def _track(self, view, backing, used):
        key = id(view)
        try:
            ref = weakref.ref(view, lambda _, key=key: self._forget(key))
        except TypeError:        # a library whose arrays take no weak references: every append copies
            return view
        self.views[key] = (ref, backing, used)
        return view

    def _forget(self, key: int) -> None:
        entry = self.views.get(key)
        if entry is not None and entry[0]() is None:
            self.views.pop(key, None)


_BACKINGS = _Backings()


def _index(xp, i) -> int:
    return int(xp.reshape(i, ()))


def write_error(op, i: int, n: int) -> ExecutionError:
    return ExecutionError(f"{op.where()}: write at index {i} of a TensorArray of size {n}; an index must "
                          f"lie in [0, size] (size appends)")


def read_error(op, i: int, n: int) -> ExecutionError:
    return ExecutionError(f"{op.where()}: read at index {i} of a TensorArray of size {n}; an index must "
                          "lie in [0, size)")


def _element_error(op, arr_shape, x_shape) -> ExecutionError:
    return ExecutionError(f"{op.where()}: cannot write an element shaped {list(x_shape)} into a TensorArray "
                          f"whose elements are shaped {list(arr_shape[1:])}")


@defop("TensorArrayNew", inputs=(), infer=_new_rule)
def _tensor_array_new(k):
    """An empty array: [0, *element_shape], unknown sizes 0 (the first write sets them)."""
    shape = (0,) + tuple(max(d, 0) for d in k.attrs["element_shape"])
    return k.xp.zeros(shape, dtype=dtype_of(k.xp, k.attrs["dtype"]))


@lowers("TensorArrayNew")
def _tensor_array_new_onnx(g):
    shape = [0] + [max(d, 0) for d in g.attrs["element_shape"]]
    return [g.fill(g.const(shape, "int64"), 0, g.attrs["dtype"])]


def _write_grad(g):
    _, i, _ = g.x
    rows = g.out[1]
    return [write_grad(g.dy, rows, i, maximum(rows, i + 1)), None, read(g.dy, i)]


@defop("TensorArrayWrite", inputs=("arr", "i", "x"), outputs=("out", "size"), infer=_write_rule, nondiff=(1,),
       grad=_write_grad)
def _tensor_array_write(k, arr, i, x):
    """``arr`` with row i set to x: i == size appends (O(1) amortised), i < size copies."""
    xp = k.xp
    n, i = arr.shape[0], _index(xp, i)
    if not 0 <= i <= n:
        raise write_error(k.op, i, n)
    if n and tuple(arr.shape[1:]) != tuple(x.shape):
        raise _element_error(k.op, arr.shape, x.shape)
    size = xp.asarray(n, dtype=dtype_of(xp, "int64"))
    if i == n:
        return _BACKINGS.append(xp, arr, x), size
    out = xp.asarray(arr, copy=True)
    out[i, ...] = x
    return out, size


@lowers("TensorArrayWrite")
def _tensor_array_write_onnx(g):
    """Concat the element as a last row, ScatterND it into row i, keep max(size, i + 1) rows;
    an empty array first takes the element's sizes (Pad)."""
    arr, x = g.ins[0], g.ins[2]
    n = g.scalar_dim(arr, 0)
    i = _scalar_index_onnx(g, 1)
    rank = g.in_vars[0].ndim
    elem = g.node("Slice", [g.shape(arr), g.const([1], "int64"), g.const([rank], "int64")])
    grow = g.node("Max", [g.node("Sub", [g.shape(x), elem]), g.const([0] * (rank - 1), "int64")])
    if rank > 1:     # an element shaped unlike the (non-empty) array's elements
        differs = g.cast(g.node("Not", [g.node("Equal", [elem, g.shape(x)])]), "int64")
        mismatch = g.node("Greater", [g.node("ReduceMax", [differs], keepdims=0), g.const(0, "int64")])
    else:
        mismatch = g.const(False, "bool")
    failed = g.node("Or", [g.node("Or", [g.node("Less", [i, g.const(0, "int64")]),
                                         g.node("Greater", [i, n])]),
                           g.node("And", [g.node("Greater", [n, g.const(0, "int64")]), mismatch])])
    op = g.op

    def verify(i_value, n_value):
        if not 0 <= int(i_value) <= int(n_value):
            raise write_error(op, int(i_value), int(n_value))
        raise ExecutionError(f"{op.where()}: the element's shape differs from the TensorArray's elements")

    ok = g.check(failed, "write index in [0, size] and element shape", verify, [i, n])
    i = g.node("Where", [ok, i, i])
    pads = g.node("Concat", [g.const([0] * rank, "int64"), g.const([0], "int64"), grow], axis=0)
    base = g.node("Pad", [arr, pads])
    row = g.node("Unsqueeze", [x, g.const([0], "int64")])
    padded = g.node("Concat", [base, row], axis=0)
    scattered = g.node("ScatterND", [padded, g.node("Reshape", [i, g.const([1, 1], "int64")]), row])
    rows = g.node("Max", [n, g.node("Add", [i, g.const(1, "int64")])])
    return [g.node("Slice", [scattered, g.const([0], "int64"), g.node("Reshape", [rows, g.const([1], "int64")]),
                             g.const([0], "int64")]), n]


def _scalar_index_onnx(g, position: int) -> str:
    """The op's input ``position`` (an integer index) as an int64 scalar."""
    value = g.ins[position]
    value = g.cast(value, "int64") if g.in_vars[position].dtype != "int64" else value
    return g.node("Reshape", [value, g.const([], "int64")])


@defop("TensorArrayRead", inputs=("arr", "i"), outputs=("out", "size"), infer=_read_rule, nondiff=(1,),
       grad=lambda g: [read_grad(g.dy, g.out[1], g.x[1]), None])
def _tensor_array_read(k, arr, i):
    """Row i of the array (ExecutionError outside [0, size))."""
    n, i = arr.shape[0], _index(k.xp, i)
    if not 0 <= i < n:
        raise read_error(k.op, i, n)
    return arr[i, ...], k.xp.asarray(n, dtype=dtype_of(k.xp, "int64"))


@lowers("TensorArrayRead")
def _tensor_array_read_onnx(g):
    arr = g.ins[0]
    n = g.scalar_dim(arr, 0)
    i = _scalar_index_onnx(g, 1)
    op = g.op

    def verify(i_value, n_value):
        raise read_error(op, int(i_value), int(n_value))

    failed = g.node("Or", [g.node("Less", [i, g.const(0, "int64")]), g.node("GreaterOrEqual", [i, n])])
    ok = g.check(failed, "read index in [0, size)", verify, [i, n])
    return [g.node("Gather", [arr, g.node("Where", [ok, i, i])], axis=0), n]


@defop("TensorArrayReadGrad", inputs=("dy", "rows", "i"), infer=_read_grad_rule, nondiff=(1, 2),
       grad=lambda g: [read(g.dy, g.x[2]), None, None])
def _tensor_array_read_grad(k, dy, rows, i):
    """Zeros ``[rows, *dy.shape]`` with row i = dy: the gradient reaching an array a read read."""
    out = k.xp.zeros((_index(k.xp, rows),) + tuple(dy.shape), dtype=dy.dtype)
    out[_index(k.xp, i), ...] = dy
    return out


@lowers("TensorArrayReadGrad")
def _tensor_array_read_grad_onnx(g):
    dy = g.ins[0]
    rows = g.node("Reshape", [_scalar_index_onnx(g, 1), g.const([1], "int64")])
    zeros = g.fill(g.node("Concat", [rows, g.shape(dy)], axis=0), 0, g.in_vars[0].dtype)
    i = _scalar_index_onnx(g, 2)
    row = g.node("Unsqueeze", [dy, g.const([0], "int64")])
    return [g.node("ScatterND", [zeros, g.node("Reshape", [i, g.const([1, 1], "int64")]), row])]


@defop("TensorArrayWriteGrad", inputs=("d", "rows", "i", "d_rows"), infer=_write_grad_rule, nondiff=(1, 2, 3),
       grad=lambda g: [write_grad(g.dy, g.x[3], g.x[2], g.x[1]), None, None, None])
def _tensor_array_write_grad(k, d, rows, i, d_rows):
    """``d`` cut (or zero-padded) to ``rows`` rows, row i zeroed when it lies inside: the
    gradient reaching the array a write replaced a row of. An append's is a view of ``d``."""
    xp = k.xp
    rows, i = _index(xp, rows), _index(xp, i)
    if d.shape[0] >= rows:
        out = d[:rows, ...]
        if i >= rows:
            return out
        out = xp.asarray(out, copy=True)
    else:
        out = xp.zeros((rows,) + tuple(d.shape[1:]), dtype=d.dtype)
        out[:d.shape[0], ...] = d
    if 0 <= i < rows:
        out[i, ...] = 0
    return out


@lowers("TensorArrayWriteGrad")
def _tensor_array_write_grad_onnx(g):
    d = g.ins[0]
    rank = g.in_vars[0].ndim
    rows = g.node("Reshape", [_scalar_index_onnx(g, 1), g.const([1], "int64")])
    cut = g.node("Slice", [d, g.const([0], "int64"), rows, g.const([0], "int64")])
    more = g.node("Max", [g.node("Sub", [rows, g.dim(cut, 0)]), g.const([0], "int64")])
    fitted = g.node("Pad", [cut, g.node("Concat", [g.const([0] * rank, "int64"), more,
                                                    g.const([0] * (rank - 1), "int64")], axis=0)])
    i = _scalar_index_onnx(g, 2)
    indices = g.node("Range", [g.const(0, "int64"), _scalar_index_onnx(g, 1), g.const(1, "int64")])
    keep = g.node("Reshape", [g.node("Not", [g.node("Equal", [indices, i])]),
                              g.const([-1] + [1] * (rank - 1), "int64")])
    return [g.node("Where", [keep, fitted, g.const(0, g.in_vars[0].dtype)])]


@defop("TensorArrayStack", inputs=("arr",), infer=lambda ins, attrs: [(ins[0].shape, ins[0].dtype)],
       grad=lambda g: [g.dy])
def _tensor_array_stack(k, arr):
    """The array itself; ExecutionError when it is empty: its element sizes are then unknown
    (a while_loop's array that no iteration wrote, ``empty_arrays.unresolved``)."""
    if arr.shape[0] == 0:
        raise ExecutionError(f"{k.op.where()}: stack of an empty TensorArray: {k.attrs['why']}")
    return arr


@lowers("TensorArrayStack")
def _tensor_array_stack_onnx(g):
    op, arr = g.op, g.ins[0]
    empty = g.node("Equal", [g.scalar_dim(arr, 0), g.const(0, "int64")])

    def verify():
        raise ExecutionError(f"{op.where()}: stack of an empty TensorArray: {op.attrs['why']}")

    ok = g.check(empty, "stack of a TensorArray written by no iteration", verify)
    return [g.node("Where", [ok, arr, arr])]


# --- Builders used by the gradient makers -------------------------------------------------------

def write_grad(d: Var, rows: Var, i: Var, d_rows: Var) -> Var:
    return append_op("TensorArrayWriteGrad", [d, rows, i, d_rows])[0]


def read_grad(dy: Var, rows: Var, i: Var) -> Var:
    return append_op("TensorArrayReadGrad", [dy, rows, i])[0]


def read(arr: Var, i: Var) -> Var:
    """Row i of a stacked array (a gradient array, say)."""
    return append_op("TensorArrayRead", [arr, i])[0]


# --- The front end ------------------------------------------------------------------------------

def _as_index(i) -> Var:
    if isinstance(i, Var):
        return i
    if isinstance(i, int) and not isinstance(i, bool):
        return constant(i, dtype="int64")
    raise ProgramError(f"a TensorArray index must be an int or an integer scalar Var, got {i!r}")


_VAR_FIELDS = frozenset(("block", "name", "shape", "dtype", "persistable", "trainable", "stop_gradient",
                         "is_parameter", "is_data"))


class TensorArray(Var):
    """A growable list of tensors of one dtype and element shape, as a value.

    ``write`` returns a new array (the old one is unchanged), so arrays are
    loop vars of ``rg.while_loop`` like any Var (their shape invariant
    ``[-1, *element_shape]`` is declared for you), branch results of
    ``rg.cond`` and values inside ``rg.recurrent`` steps. ``write(i, x)``
    with ``i == size()`` appends (O(1) amortised), with ``i < size()``
    replaces; ``read(i)`` outside ``[0, size())`` and ``write`` past the end
    are ExecutionErrors naming the op. ``stack()`` is ``[size,
    *element_shape]``. Reads, writes and stacks differentiate (to any order),
    also with run-time trip counts.

    Without ``element_shape`` the first write (``write``, ``unstack``,
    ``scatter``, ``split``) sets it; such an array must be written before it
    becomes a loop var of ``while_loop``/``scan`` or a branch result (their
    variables need a rank when built). TF's TensorArray API is here too:
    ``unstack``, ``scatter``, ``gather``, ``concat`` and ``split`` (unequal
    lengths give a ``RaggedTensorArray``: read and concat, no stack).

    Args:
        dtype: The elements' dtype.
        element_shape: The elements' shape, -1 where unknown; None (the
            default): from the first write.

    Raises:
        ProgramError: ``element_shape`` is not a list of sizes >= -1.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            h0 = rg.data("h0", [3], dtype="float64", stop_gradient=False)
            n = rg.data("n", [], dtype="int64")
            arr = rg.TensorArray(dtype="float64", element_shape=[3])

            def body(i, h, arr):
                h = h * 0.5
                return i + 1, h, arr.write(i, h)
            _, h, arr = rg.while_loop(lambda i, h, arr: i < n, body, [rg.constant(0), h0, arr])
            hs = arr.stack()                           # [n, 3]
            (dh0,) = rg.gradients(rg.sum(hs), h0)
        feed = {"h0": np.ones(3), "n": np.array(2)}
        hv, dv = rg.Executor().run(main, feed=feed, fetch_list=[hs, dh0])
        assert hv.tolist() == [[0.5] * 3, [0.25] * 3] and dv.tolist() == [0.75] * 3
        ```
    """

    def __init__(self, dtype="float32", element_shape=None):
        if element_shape is None:          # no Var until the first write gives the element shape
            self.__dict__.update(_unshaped_dtype=canonical(dtype), element_shape=None)
            return
        if not isinstance(element_shape, (list, tuple)) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in element_shape):
            raise ProgramError(f"TensorArray: element_shape must be a list of sizes (-1 where unknown), "
                               f"got {element_shape!r}")
        out = append_op("TensorArrayNew", [], {"element_shape": [int(d) for d in element_shape],
                                               "dtype": canonical(dtype)},
                        name="tensor_array")[0]
        self.__dict__.update(out.__dict__)
        self.element_shape = tuple(int(d) for d in element_shape)

    def __getattr__(self, attr):
        # Only reached for missing attributes: the Var fields of an array not written yet.
        if attr in _VAR_FIELDS and "_unshaped_dtype" in self.__dict__:
            raise ProgramError(f"a TensorArray({self.__dict__['_unshaped_dtype']}) without element_shape has "
                               "no value until its first write (write, unstack, scatter, split): write it "
                               "first, or pass element_shape=, before using it as a Var (a loop var of "
                               "while_loop or scan, a branch result, an op input)")
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{attr}'")

    @property
    def _unshaped(self) -> bool:
        return "_unshaped_dtype" in self.__dict__

    def _check_fits(self, element_shape, x: Var) -> None:
        """ShapeError unless elements ``element_shape`` of ``x``'s dtype fit this array."""
        if self._unshaped:
            dtype, fits = self.__dict__["_unshaped_dtype"], True
        else:
            dtype, fits = self.dtype, shapes_compatible(self.shape[1:], tuple(element_shape))
        if x.dtype != dtype or not fits:
            shaped = "" if self._unshaped else f" shaped {list(self.shape[1:])}"
            raise ShapeError(f"cannot write '{x.name}' {x.type_str()} into a TensorArray of {dtype} elements{shaped}")

    def _shaped(self, element_shape, x: Var) -> "TensorArray":
        """This array, created now with ``element_shape`` if it had none; ``x`` must fit it."""
        self._check_fits(element_shape, x)
        return TensorArray(self.__dict__["_unshaped_dtype"], list(element_shape)) if self._unshaped else self

    def _fresh_with_unknown_elements(self, base: "TensorArray") -> bool:
        """``base`` (this array, or the one ``_shaped`` made of it) is a new, empty array whose
        element shape holds a size known only at run time (its value is ``[0, 0, ...]`` there)."""
        if all(d >= 0 for d in base.element_shape):
            return False
        producer = next((op for op in reversed(base.block.ops) if base.name in op.outputs), None)
        return producer is not None and producer.type == "TensorArrayNew"

    @classmethod
    def of(cls, var: Var, element_shape: Sequence[int] | None = None) -> "TensorArray":
        """The Var ``var`` (a stacked value ``[size, ...]``) seen as a TensorArray.

        Args:
            var: A Var ``[size, *element_shape]``.
            element_shape: The elements' shape; ``var.shape[1:]`` by default.

        Returns:
            A TensorArray sharing ``var``'s name and value.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                rows = rg.data("rows", [-1, 2])
                arr = rg.TensorArray.of(rows)
                second = arr.read(1)
            (out,) = rg.Executor().run(main, feed={"rows": np.eye(2, dtype="float32")}, fetch_list=[second])
            assert out.tolist() == [0.0, 1.0]
            ```
        """
        array = cls.__new__(cls)
        array.__dict__.update(var.__dict__)
        array.element_shape = tuple(var.shape[1:] if element_shape is None else element_shape)
        return array

    def write(self, i, x: Var) -> "TensorArray":
        """A new array with element ``i`` set to ``x`` (``i == size()`` appends).

        Args:
            i: An int or an int64 scalar Var.
            x: A Var of the array's dtype and element shape.

        Returns:
            The new TensorArray (this one is unchanged).

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [2])
                arr = rg.TensorArray(element_shape=[2]).write(0, x).write(1, x * 2.0)
                stacked = arr.stack()
            (out,) = rg.Executor().run(main, feed={"x": np.ones(2, "float32")}, fetch_list=[stacked])
            assert out.tolist() == [[1.0, 1.0], [2.0, 2.0]]
            ```
        """
        base = self._shaped(x.shape, x) if self._unshaped else self
        out = append_op("TensorArrayWrite", [base, _as_index(i), x], name="tensor_array")[0]
        return TensorArray.of(out)

    def read(self, i) -> Var:
        """Element ``i`` of the array (an ExecutionError at run time outside ``[0, size())``).

        Args:
            i: An int or an int64 scalar Var.

        Returns:
            A Var of the element shape.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [2])
                arr = rg.TensorArray(element_shape=[2]).write(0, x).write(1, -x)
                last = arr.read(arr.size() - 1)
            (out,) = rg.Executor().run(main, feed={"x": np.ones(2, "float32")}, fetch_list=[last])
            assert out.tolist() == [-1.0, -1.0]
            ```
        """
        return read(self, _as_index(i))

    def stack(self) -> Var:
        """The elements stacked: ``[size, *element_shape]``.

        An array a ``while_loop`` wrote nothing into has the -1 element sizes the
        loop inputs' shapes give (``empty_arrays.py``); where none gives them, the
        stack of the empty array is an ExecutionError naming it and the loop.

        Returns:
            A Var ``[size, *element_shape]``.

        Raises:
            ShapeError: The array is never written and has -1 element sizes.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [3])
                stacked = rg.TensorArray(element_shape=[3]).write(0, x).stack()
            (out,) = rg.Executor().run(main, feed={"x": np.zeros(3, "float32")}, fetch_list=[stacked])
            assert out.shape == (1, 3)
            ```
        """
        _check_written(self)
        why = unresolved(self.block, self.name)
        if why is not None:     # empty after a while_loop, its element sizes are unknown: checked
            return append_op("TensorArrayStack", [self.block.var(self.name)], {"why": why})[0]
        return self.block.var(self.name)

    def size(self) -> Var:
        """The number of elements, an int64 scalar Var.

        Returns:
            An int64 Var of shape ``[]``.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [3])
                n = rg.TensorArray(element_shape=[3]).write(0, x).write(1, x).size()
            (out,) = rg.Executor().run(main, feed={"x": np.zeros(3, "float32")}, fetch_list=[n])
            assert out == 2
            ```
        """
        if self._unshaped:
            return constant(0, "int64")
        return dim(self, 0)

    def unstack(self, x: Var) -> "TensorArray":
        """An array whose elements are the rows of ``x`` (``tf.TensorArray.unstack``).

        Its ``stack()`` is ``x``; gradients flow to ``x`` directly.

        Args:
            x: A Var ``[n, *element_shape]`` of the array's dtype.

        Returns:
            The new TensorArray (this one is unchanged).

        Raises:
            ShapeError: ``x``'s rows do not fit the array's dtype or element shape.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [3, 2])
                arr = rg.TensorArray().unstack(x)          # element shape [2], from x
                second, n = arr.read(1), arr.size()
            s, size = rg.Executor().run(main, feed={"x": np.eye(3, 2, dtype="float32")}, fetch_list=[second, n])
            assert s.tolist() == [0.0, 1.0] and size == 3
            ```
        """
        _check_rows(x, "unstack")
        self._check_fits(x.shape[1:], x)
        return TensorArray.of(x)

    def scatter(self, ids, x: Var) -> "TensorArray":
        """A new array with row ``j`` of ``x`` as element ``ids[j]`` (``tf.TensorArray.scatter``).

        The array grows with zero elements up to ``max(ids) + 1`` where it is
        shorter; with repeated ids the last row wins (``rg.scatter``).

        Args:
            ids: 1-d int64 or int32 element indices (a Var, a list or an array).
            x: A Var ``[len(ids), *element_shape]`` of the array's dtype.

        Returns:
            The new TensorArray (this one is unchanged).

        Raises:
            ShapeError: ``ids`` is not 1-d integers, or ``x``'s rows do not fit the array.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [2, 2])
                arr = rg.TensorArray().scatter([3, 0], x)    # elements 1 and 2: zeros
                stacked = arr.stack()
            (out,) = rg.Executor().run(main, feed={"x": np.ones((2, 2), "float32")}, fetch_list=[stacked])
            assert out.tolist() == [[1, 1], [0, 0], [0, 0], [1, 1]]
            ```
        """
        from ..array.indexing import scatter
        from ..array.tensor import concat
        from ..reduce.extrema import max as reduce_max
        _check_rows(x, "scatter")
        base = self._shaped(x.shape[1:], x)
        if self._fresh_with_unknown_elements(base):    # its 0 rows would say 0 for the unknown sizes
            base = TensorArray.of(x[:0], base.element_shape)
        ids = ids if isinstance(ids, Var) else constant(np.asarray(ids, dtype=np.int64), "int64")
        if ids.ndim != 1 or ids.dtype not in ("int64", "int32"):
            raise ShapeError(f"TensorArray.scatter: ids must be a 1-d int64 or int32 array, got {ids.type_str()}")
        ids = cast_to_int64(ids)
        end = reduce_max(concat([ids, constant([-1], "int64")])) + 1        # no ids: no growth
        rows = maximum(base.size(), end)
        grown = write_grad(base, rows, rows, base.size())     # zero-padded to ``rows`` rows (i = rows: none zeroed)
        return TensorArray.of(scatter(grown, ids, x))

    def gather(self, ids) -> Var:
        """Elements ``ids`` stacked: ``[len(ids), *element_shape]`` (``tf.TensorArray.gather``).

        Args:
            ids: Integer element indices of any shape (a Var, a list or an array).

        Returns:
            A Var ``[*ids.shape, *element_shape]``.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [3, 2])
                picked = rg.TensorArray().unstack(x).gather([2, 0])
            xv = np.arange(6, dtype="float32").reshape(3, 2)
            (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[picked])
            assert out.tolist() == [[4.0, 5.0], [0.0, 1.0]]
            ```
        """
        from ..array.tensor import gather
        ids = ids if isinstance(ids, Var) else constant(np.asarray(ids, dtype=np.int64), "int64")
        return gather(self.stack(), ids)

    def concat(self) -> Var:
        """The elements joined along their first axis (``tf.TensorArray.concat``).

        Returns:
            A Var ``[size * n, *rest]`` for elements ``[n, *rest]``.

        Raises:
            ShapeError: The elements have no axis, or axes after the first unknown when built.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [4, 3])
                pieces = rg.TensorArray().split(x, [2, 2])      # two elements [2, 3]
                joined = pieces.concat()                        # [4, 3] again
            xv = np.arange(12, dtype="float32").reshape(4, 3)
            (out,) = rg.Executor().run(main, feed={"x": xv}, fetch_list=[joined])
            assert np.array_equal(out, xv)
            ```
        """
        from ..array.tensor import reshape
        shape = self.shape
        if len(shape) < 2:
            raise ShapeError(f"TensorArray.concat: elements must have an axis to join along, got {list(shape[1:])}")
        if shape[0] >= 0 and shape[1] >= 0:
            return reshape(self.stack(), [shape[0] * shape[1]] + list(shape[2:]))
        if all(d >= 0 for d in shape[2:]):
            return reshape(self.stack(), [-1] + list(shape[2:]))
        raise ShapeError(f"TensorArray.concat: elements {list(shape[1:])} need their axes after the first "
                         "known when the program is built")

    def split(self, x: Var, lengths) -> "TensorArray":
        """An array whose elements are the pieces of ``x`` along axis 0 (``tf.TensorArray.split``).

        With unequal lengths the pieces cannot share one stacked value: the
        result is then a ``RaggedTensorArray`` (``read(i)`` with an int,
        ``concat()``, ``size()``; no ``stack``, as in TF).

        Args:
            x: A Var whose rows are cut into the elements.
            lengths: The pieces' lengths (ints summing to ``x``'s rows).

        Returns:
            The new TensorArray (a ``RaggedTensorArray`` for unequal lengths).

        Raises:
            ProgramError: ``lengths`` is empty, negative or a Var.
            ShapeError: The lengths do not sum to ``x``'s rows.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main = rg.Program()
            with rg.program_guard(main):
                x = rg.data("x", [5, 2])
                even = rg.TensorArray().split(x[:4], [2, 2])   # elements [2, 2]
                ragged = rg.TensorArray().split(x, [2, 3])     # read and concat only
                first, rest = even.read(1), ragged.read(1)
            xv = np.arange(10, dtype="float32").reshape(5, 2)
            a, b = rg.Executor().run(main, feed={"x": xv}, fetch_list=[first, rest])
            assert np.array_equal(a, xv[2:4]) and np.array_equal(b, xv[2:])
            ```
        """
        from ..array.tensor import reshape
        lengths = [int(n) for n in np.asarray(lengths).reshape(-1)] if not isinstance(lengths, Var) else None
        if lengths is None:
            raise ProgramError("TensorArray.split: lengths must be ints (a list or a NumPy array), not a Var")
        if not lengths or min(lengths) < 0:
            raise ProgramError(f"TensorArray.split: lengths must be ints >= 0 (at least one), got {lengths}")
        _check_rows(x, "split")
        if x.shape[0] >= 0 and x.shape[0] != sum(lengths):
            raise ShapeError(f"TensorArray.split: lengths {lengths} sum to {sum(lengths)}, but '{x.name}' "
                             f"{x.type_str()} has {x.shape[0]} rows")
        if len(set(lengths)) != 1:
            self._check_fits(x.shape if self._unshaped else self.shape[1:], x)
            return RaggedTensorArray(x, lengths)
        rest = list(x.shape[1:])
        if rest.count(-1) > 1:
            raise ShapeError(f"TensorArray.split: '{x.name}' {x.type_str()} may have one unknown axis after the first")
        pieces = reshape(x, [len(lengths), lengths[0]] + rest)
        self._check_fits(pieces.shape[1:], pieces)
        return TensorArray.of(pieces)

    def __repr__(self) -> str:
        if self._unshaped:
            return f"TensorArray({self.__dict__['_unshaped_dtype']}, element_shape unknown until written)"
        return f"TensorArray({self.name}: {self.dtype}[size, {', '.join(map(str, self.element_shape))}])"


class RaggedTensorArray:
    """The pieces of ``x`` along axis 0 of unequal ``lengths`` (``TensorArray.split``'s result
    then): elements of different lengths have no stacked value, so this array reads its
    elements (``read(i)``, ``i`` an int) as slices of ``x`` and ``concat()`` is ``x``.

    Example::

        pieces = rg.TensorArray("float32").split(x, [2, 3])   # x [5, D]
        first, rest = pieces.read(0), pieces.read(1)           # [2, D], [3, D]
    """

    def __init__(self, x: Var, lengths: list[int]):
        self.x, self.lengths, self.dtype = x, list(lengths), x.dtype
        self.offsets = [sum(lengths[:i]) for i in range(len(lengths) + 1)]

    def size(self) -> Var:
        return constant(len(self.lengths), "int64")

    def read(self, i) -> Var:
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
            raise ProgramError(f"a RaggedTensorArray (lengths {self.lengths}) reads elements by int index, got {i!r}")
        if not -len(self.lengths) <= i < len(self.lengths):
            raise ProgramError(f"read at index {i} of a RaggedTensorArray of size {len(self.lengths)}")
        i = int(i) % len(self.lengths)
        return self.x[self.offsets[i]:self.offsets[i + 1]]

    def concat(self) -> Var:
        return self.x

    def __getattr__(self, attr):
        if attr in ("stack", "gather", "write", "scatter", "unstack", "split"):
            raise ProgramError(f"the elements of this TensorArray have different lengths ({self.lengths}): "
                               f"{attr} needs elements of one shape (TF's TensorArray refuses it too); "
                               "read(i) and concat() work")
        raise AttributeError(f"'RaggedTensorArray' object has no attribute '{attr}'")

    def __repr__(self) -> str:
        return f"RaggedTensorArray({self.x.name}: lengths {self.lengths})"


def _check_written(array: TensorArray) -> None:
    """ShapeError for the stack of an array no write reaches whose element sizes are partly -1:
    nothing gives them (TensorFlow refuses to stack such an empty list; NumPy's stack of no
    arrays too)."""
    if array._unshaped:
        return
    made = next((op for op in reversed(array.block.ops) if array.name in op.outputs), None)
    if made is not None and made.type == "TensorArrayNew" and any(d < 0 for d in made.attrs["element_shape"]):
        raise ShapeError(f"{made.where()}: the TensorArray '{array.name}' (element_shape "
                         f"{list(made.attrs['element_shape'])}) is never written, so the sizes declared -1 are "
                         "unknown and its stack has no shape; declare them in element_shape")


def _check_rows(x: Var, what: str) -> None:
    if not isinstance(x, Var) or x.ndim < 1:
        raise ShapeError(f"TensorArray.{what}: needs a Var with an axis of rows, got {x!r:.60}")


def cast_to_int64(ids: Var) -> Var:
    from ..array.tensor import cast
    return ids if ids.dtype == "int64" else cast(ids, "int64")
