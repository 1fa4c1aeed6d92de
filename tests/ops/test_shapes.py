"""Shape rules: broadcasting with -1, and the errors for shapes that cannot work.

Build-time faults raise ``ShapeError`` (a ``ProgramError``) naming the op, the
block and the inputs; faults only visible at run time (a -1 dimension that
turns out wrong, an id out of range) raise ``ExecutionError`` naming the op.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import retrograd as rg
from retrograd.ops.core.shapes import broadcast_shapes

SETTINGS = settings(max_examples=50, deadline=None)


@st.composite
def declared_broadcastable(draw, n=2):
    """Concrete shapes that broadcast, and the same shapes with some sizes declared -1."""
    shapes = draw(hnp.mutually_broadcastable_shapes(num_shapes=n, max_dims=4, max_side=4))
    declared = [tuple(-1 if draw(st.booleans()) else d for d in s) for s in shapes.input_shapes]
    return shapes.input_shapes, declared, shapes.result_shape


@SETTINGS
@given(declared_broadcastable(n=2) | declared_broadcastable(n=3))
def test_broadcast_with_unknown_dims_agrees_with_numpy(case):
    concrete, declared, result = case
    assert broadcast_shapes(*concrete) == tuple(np.broadcast_shapes(*concrete))
    got = broadcast_shapes(*declared)
    assert len(got) == len(result)
    for g, r in zip(got, result):
        assert g == -1 or g == r, f"{declared} gave {got}, but {concrete} broadcast to {result}"


@SETTINGS
@given(declared_broadcastable(n=2))
def test_broadcast_is_known_where_any_input_fixes_the_size(case):
    _, declared, _ = case
    got = broadcast_shapes(*declared)
    rank = len(got)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in declared]
    for i, g in enumerate(got):
        sizes = [s[i] for s in padded]
        if any(d > 1 for d in sizes):
            assert g == max(sizes)
        elif all(d == 1 for d in sizes):
            assert g == 1


@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=5), data=st.data())
def test_incompatible_known_sizes_raise_naming_op_and_inputs(shape, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    size = data.draw(st.integers(2, 5))
    other_size = data.draw(st.integers(2, 6).filter(lambda d: d != size))
    a = list(shape)
    a[axis] = size
    b = [-1 if data.draw(st.booleans()) and i != axis else d for i, d in enumerate(a)]
    b[axis] = other_size
    builder, type_ = data.draw(st.sampled_from([(rg.add, "Add"), (rg.mul, "Mul"), (rg.maximum, "Maximum"),
                                                (rg.less, "Less"), (rg.equal, "Equal")]))
    with rg.program_guard(rg.Program(), rg.Program()):
        x, y = rg.data("lhs", a), rg.data("rhs", b)
        with pytest.raises(rg.ShapeError) as info:
            builder(x, y)
    message = str(info.value)
    assert isinstance(info.value, rg.ProgramError)
    for part in (type_, "block 0", "lhs", "rhs", str(size), str(other_size)):
        assert part in message


def test_python_scalars_follow_the_var_dtype():
    with rg.program_guard(rg.Program(), rg.Program()):
        f64 = rg.data("f64", [-1], "float64")
        i64 = rg.data("i64", [-1], "int64")
        f32 = rg.data("f32", [2, -1])
        assert (f64 + 1.0).dtype == "float64"
        assert (f32 * 2).dtype == "float32"
        assert (2.0 - f32).shape == (2, -1)
        assert (i64 + 2).dtype == "int64"
        assert (f32 < 0.5).dtype == "bool"


# --- Build-time errors of each op family ---------------------------------------------------

def _vars():
    return dict(x=rg.data("x", [-1, 3, 4]), m=rg.data("m", [2, 3]), v=rg.data("v", [5]),
                ids=rg.data("ids", [-1], "int64"), f64=rg.data("f64", [2, 3], "float64"),
                b=rg.data("b", [2, 3], "bool"))


BAD = {
    "reshape size": (lambda x, m, **_: rg.reshape(m, [4, 2]), "Reshape", "m"),
    "reshape two -1": (lambda x, **_: rg.reshape(x, [-1, -1]), "Reshape", "x"),
    "reshape unknown not divisible": (lambda x, **_: rg.reshape(x, [5, 5]), "Reshape", "x"),
    "transpose perm": (lambda x, **_: rg.transpose(x, [0, 0, 1]), "Transpose", "x"),
    "transpose rank": (lambda m, **_: rg.transpose(m, [0, 1, 2]), "Transpose", "m"),
    "concat sizes": (lambda x, m, **_: rg.concat([m, rg.fill([2, 4], 0.0)], 0), "Concat", "m"),
    "concat ranks": (lambda x, m, **_: rg.concat([x, m], 0), "Concat", "x"),
    "concat dtypes": (lambda m, f64, **_: rg.concat([m, f64], 0), "Concat", "f64"),
    "concat axis": (lambda m, **_: rg.concat([m, m], 2), "Concat", "m"),
    "split unequal": (lambda m, **_: rg.split(m, 2, axis=1), "Split", "m"),
    "split sizes": (lambda m, **_: rg.split(m, [1, 1], axis=1), "Split", "m"),
    "slice axis": (lambda m, **_: rg.slice(m, [2], [0], [1]), "Slice", "m"),
    "slice repeated axis": (lambda m, **_: rg.slice(m, [0, -2], [0, 0], [1, 1]), "Slice", "m"),
    "gather float ids": (lambda m, f64, **_: rg.gather(m, f64), "Gather", "f64"),
    "gather scalar": (lambda ids, **_: rg.gather(rg.constant(1.0), ids), "Gather", "ids"),
    "cast dtype": (lambda m, **_: rg.cast(m, "complex64"), None, "complex64"),
    "squeeze size": (lambda m, **_: rg.squeeze(m, 1), "Squeeze", "m"),
    "unsqueeze axis": (lambda m, **_: rg.unsqueeze(m, 4), "Unsqueeze", "m"),
    "softmax int": (lambda ids, **_: rg.softmax(ids), "Softmax", "ids"),
    "softmax axis": (lambda m, **_: rg.log_softmax(m, 2), "LogSoftmax", "m"),
    "xent label rank": (lambda m, **_: rg.softmax_cross_entropy(m, rg.data("l2", [2, 2], "int64")),
                        "SoftmaxCrossEntropy", "l2"),
    "xent label size": (lambda m, **_: rg.softmax_cross_entropy(m, rg.data("l3", [3], "int64")),
                        "SoftmaxCrossEntropy", "l3"),
    "xent float labels": (lambda m, v, **_: rg.softmax_cross_entropy(m, v), "SoftmaxCrossEntropy", "v"),
    "one_hot float": (lambda v, **_: rg.one_hot(v, 3), "OneHot", "v"),
    "matmul inner": (lambda m, **_: rg.matmul(m, m), "MatMul", "m"),
    "where cond": (lambda m, **_: rg.where(m, m, m), "Where", "m"),
    "where dtypes": (lambda m, b, f64, **_: rg.where(b, m, f64), "Where", "f64"),
    "sum axis": (lambda m, **_: rg.sum(m, axis=3), "Sum", "m"),
    "dropout p": (lambda m, **_: rg.dropout(m, 1.5), None, "m"),
    "dropout int": (lambda ids, **_: rg.dropout(ids, 0.5), "Dropout", "ids"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_shapes_raise_naming_op_and_input(name):
    build, op_type, var_name = BAD[name]
    with rg.program_guard(rg.Program(), rg.Program()):
        vars_ = _vars()
        with pytest.raises(rg.ProgramError) as info:
            build(**vars_)
    message = str(info.value)
    assert var_name in message
    if op_type is not None:
        assert op_type in message and "block 0" in message


# --- Run-time errors name the op ----------------------------------------------------------------

RUNTIME = {
    "add": (lambda a, b, ids: a + b, "Add", {"a": np.ones(3), "b": np.ones(4)}),
    "concat": (lambda a, b, ids: rg.concat([rg.unsqueeze(a, 0), rg.unsqueeze(b, 0)], 0), "Concat",
               {"a": np.ones(3), "b": np.ones(4)}),
    "split": (lambda a, b, ids: rg.split(a, 2)[0], "Split", {"a": np.ones(3)}),
    "reshape": (lambda a, b, ids: rg.reshape(a, [2, -1]), "Reshape", {"a": np.ones(3)}),
    "squeeze": (lambda a, b, ids: rg.squeeze(a, 0), "Squeeze", {"a": np.ones(3)}),
    "gather high": (lambda a, b, ids: rg.gather(a, ids), "Gather", {"a": np.ones(3), "ids": np.array([0, 3])}),
    "gather negative": (lambda a, b, ids: rg.gather(a, ids), "Gather", {"a": np.ones(3), "ids": np.array([-4])}),
    "xent label": (lambda a, b, ids: rg.softmax_cross_entropy(rg.unsqueeze(a, 0), rg.slice(ids, [0], [0], [1])),
                   "SoftmaxCrossEntropy", {"a": np.ones(3), "ids": np.array([3])}),
    "one_hot label": (lambda a, b, ids: rg.one_hot(ids, 2), "OneHot", {"ids": np.array([0, 2])}),
}


@pytest.mark.parametrize("name", sorted(RUNTIME))
def test_run_time_shape_faults_name_the_op(name):
    build, op_type, feed = RUNTIME[name]
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        a, b = rg.data("a", [-1]), rg.data("b", [-1])
        ids = rg.data("ids", [-1], "int64")
        out = build(a, b, ids)
    with pytest.raises(rg.ExecutionError, match=op_type):
        rg.Executor().run(main, feed=feed, fetch_list=[out])


# --- Programs using these ops survive the JSON round trip -------------------------------------------

def test_tensor_and_nn_ops_round_trip_through_json():
    main = rg.Program(random_seed=3)
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, 4])
        ids = rg.data("ids", [-1], "int64")
        parts = rg.split(rg.transpose(rg.reshape(x, [-1, 2, 2]), [0, 2, 1]), [1, -1], axis=1)
        y = rg.concat([rg.squeeze(parts[0], 1), rg.slice(x, [1], [-2], [2**31])], axis=1)
        z = rg.softmax_cross_entropy(rg.gather(y, ids), ids)
        out = rg.unsqueeze(rg.cast(rg.stop_gradient(z), "float64"), [0])
        d = rg.dropout(rg.log_softmax(y), 0.5)
    loaded = rg.Program.from_json(main.to_json())
    feed = {"x": np.random.default_rng(0).standard_normal((3, 4)).astype("float32"), "ids": np.array([2, 0])}
    want = rg.Executor().run(main, feed=feed, fetch_list=[out.name, d.name])
    got = rg.Executor().run(loaded, feed=feed, fetch_list=[out.name, d.name])
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("axis", [[1, 1], [1, -1], [0, -2, 1]])
def test_repeated_axes_in_reductions_are_shape_errors(reduce, axis):
    """Regression (issue #10): repeated axes were silently reduced once (NumPy refuses them)."""
    with rg.program_guard(rg.Program(), rg.Program()):
        x = rg.data("x", [2, 3])
        with pytest.raises(rg.ShapeError, match=rf"{reduce.title()} in block 0: axis .* repeats an axis"):
            getattr(rg, reduce)(x, axis=axis)
        assert getattr(rg, reduce)(x, axis=[0, -1]).shape == ()
