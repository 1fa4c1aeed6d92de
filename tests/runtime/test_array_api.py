"""Kernels are portable: programs run on ``array_api_strict`` give NumPy's results.

``array_api_strict`` implements only the Array API standard and rejects
everything else (NumPy-only functions, implicit conversions, mixed dtypes), so a
kernel that reaches past ``k.xp`` fails here. Each case is built once and run
on both executors; forward and backward programs alike.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends import to_numpy
from retrograd.ir.program import Program

xps = pytest.importorskip("array_api_strict")

RNG = np.random.default_rng(42)
CASES: dict[str, tuple[tuple[str, ...], Callable]] = {}


def case(*needs: str):
    """Register a program builder; it is skipped while a builder it needs does not exist."""
    def register(fn):
        CASES[fn.__name__] = (needs, fn)
        return fn
    return register


def f32(*shape, positive=False):
    a = RNG.standard_normal(shape).astype("float32")
    return np.abs(a) + 0.1 if positive else a


@case("add", "sub", "mul", "div")
def arithmetic_with_broadcasting(x, feed):
    y = rg.data("y", [3])
    feed["y"] = f32(3, positive=True)
    return [x + y, x - y, rg.mul(x, y), x / y, 2.0 * x - 1.0, 1.0 / (rg.abs(x) + 1.0), -x]


@case("exp", "log", "tanh", "sigmoid", "relu", "square", "sqrt", "abs", "sign", "pow")
def unary(x, feed):
    p = rg.abs(x) + 0.5
    return [rg.exp(x), rg.log(p), rg.tanh(x), rg.sigmoid(x * 30.0), rg.relu(x), rg.square(x),
            rg.sqrt(p), rg.abs(x), rg.sign(x), rg.pow(p, 1.5), p ** 2.0]


@case("maximum", "minimum", "clip")
def min_max_clip(x, feed):
    return [rg.maximum(x, 0.1), rg.minimum(x, x * 0.5), rg.clip(x, -0.5, 0.5), rg.clip(x, None, 0.0)]


@case("matmul")
def matmul(x, feed):
    w = rg.data("w", [3, 5])
    v = rg.data("v", [2, 3])
    u = rg.data("u", [-1, 5])
    feed["w"], feed["v"], feed["u"] = f32(3, 5), f32(2, 3), f32(4, 5)
    return [rg.matmul(x, w), x @ w, rg.matmul(x, v, transpose_y=True), rg.matmul(x, u, transpose_x=True)]


@case("sum", "mean")
def reductions(x, feed):
    return [rg.sum(x), rg.mean(x), rg.sum(x, axis=0), rg.mean(x, axis=1, keepdims=True),
            rg.sum(x, axis=[0, 1], keepdims=True), rg.mean(x, axis=-1)]


@case("where", "less", "less_equal", "greater", "greater_equal", "equal", "logical_not", "logical_and")
def comparisons_and_where(x, feed):
    z = rg.data("z", [-1, 3])
    feed["z"] = np.where(RNG.random((4, 3)) < 0.5, feed["x"], f32(4, 3))
    pos = x > 0.0
    return [x < z, x <= z, rg.greater(x, z), x >= z, rg.equal(x, z), rg.logical_not(pos),
            rg.logical_and(pos, x < 1.0), rg.where(pos, x, z), rg.where(x < z, x, 0.0)]


@case("fill", "fill_like", "zeros_like", "ones_like", "constant", "assign")
def creation(x, feed):
    return [rg.fill([2, 3], 1.5), rg.fill([2], 7, dtype="int64"), rg.fill_like(x, 2.0),
            rg.zeros_like(x), rg.ones_like(x), rg.constant([[1.0, 2.0]]), rg.constant(3),
            rg.assign(x) + rg.constant(np.arange(3, dtype="float32"))]


@case("create_parameter")
def parameters_from_a_seeded_startup(x, feed):
    w = rg.create_parameter("p.w", [3, 3], init=("uniform", -1.0, 1.0))
    u = rg.create_parameter("p.u", [3], init=("normal", 0.0, 2.0))
    b = rg.create_parameter("p.b", [3], init="ones")
    return [w * 1.0, u * 1.0, rg.matmul(x, w) + b]


@case("softmax", "log_softmax", "softmax_cross_entropy")
def softmax_family(x, feed):
    labels = rg.data("labels", [-1], dtype="int64")
    feed["labels"] = np.array([0, 2, 1, 2], "int64")
    return [rg.softmax(x), rg.log_softmax(x, axis=0), rg.softmax_cross_entropy(x, labels)]


@case("one_hot")
def one_hot(x, feed):
    labels = rg.data("labels", [-1], dtype="int64")
    feed["labels"] = np.array([0, 2, 1, 2], "int64")
    return [rg.one_hot(labels, 3)]


@case("reshape", "transpose", "concat", "split", "slice", "unsqueeze", "squeeze", "cast")
def tensor_ops(x, feed):
    parts = rg.split(x, [1, 2], axis=1)
    return [rg.reshape(x, [-1]), rg.reshape(x, [2, -1]), rg.transpose(x, [1, 0]),
            rg.concat([x, x * 2.0], axis=0), parts[0], parts[1],
            rg.slice(x, axes=[0, 1], starts=[1, 0], ends=[3, 2]),
            rg.squeeze(rg.unsqueeze(x, 0), 0), rg.cast(x > 0.0, "float32"), rg.cast(x, "float64")]


@case("gather")
def gather(x, feed):
    ids = rg.data("ids", [-1], dtype="int64")
    feed["ids"] = np.array([3, 0, 0, 2], "int64")
    return [rg.gather(x, ids)]


@case("dropout")
def dropout_replays_the_seeded_mask(x, feed):
    return [rg.dropout(x, 0.5, seed=11)]


@case("append_backward", "matmul", "tanh", "mean")
def backward_of_an_mlp(x, feed):
    w = rg.create_parameter("m.w", [3, 4])
    b = rg.create_parameter("m.b", [4], init=0.1)
    h = rg.tanh(rg.matmul(x, w) + b)
    loss = rg.mean(rg.sum(h * h, axis=1))
    grads = [g for _, g in rg.append_backward(loss)]
    return [loss] + grads


@case("gradients", "softmax_cross_entropy", "gather", "concat", "slice", "maximum")
def backward_through_tensor_and_nn_ops(x, feed):
    ids = rg.data("ids", [-1], dtype="int64")
    labels = rg.data("labels", [-1], dtype="int64")
    feed["ids"] = np.array([3, 0, 0, 2], "int64")
    feed["labels"] = np.array([0, 2, 1, 2], "int64")
    x.stop_gradient = False
    rows = rg.gather(x, ids)
    both = rg.concat([rows, rg.slice(x, axes=[0], starts=[0], ends=[4])], axis=1)
    logits = rg.maximum(both, -0.5)
    loss = rg.mean(rg.softmax_cross_entropy(logits, labels))
    return [loss] + [g for g in rg.gradients([loss], [x]) if g is not None]


@case("cond", "sum")
def cond_takes_the_branch_that_holds(x, feed):
    pos = rg.cond(rg.sum(x) > -100.0, lambda: x * 2.0, lambda: x - 1.0)
    neg = rg.cond(rg.sum(x) > 100.0, lambda: x * 2.0, lambda: x - 1.0)
    return [pos, neg]


@case("while_loop", "append_backward")
def while_loop_and_its_backward(x, feed):
    n = rg.data("n", [], dtype="int64")
    feed["n"] = np.array(3, "int64")
    w = rg.create_parameter("loop.w", [3], init=0.5)
    i, h = rg.while_loop(lambda i, h: i < n, lambda i, h: [i + 1, rg.tanh(h * w + 0.1)],
                         [rg.constant(0), x])
    loss = rg.mean(h * h)
    return [i, h, loss] + [g for _, g in rg.append_backward(loss)]


@case("recurrent", "append_backward")
def recurrent_network_and_its_backward(x, feed):
    seq = rg.data("seq", [-1, -1, 3])
    feed["seq"] = f32(5, 2, 3)
    w = rg.create_parameter("rnn.w", [3, 3])
    h0 = rg.fill([2, 3], 0.0)
    all_h, last_h = rg.recurrent(lambda xs, hs: [rg.tanh(xs[0] + rg.matmul(hs[0], w))], [seq], [h0])
    loss = rg.mean(all_h[0])
    return [all_h[0], last_h[0], loss] + [g for _, g in rg.append_backward(loss)]


def _build(fn):
    main, startup = Program(random_seed=9), Program(random_seed=9)
    feed = {"x": f32(4, 3)}
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        fetch = fn(x, feed)
    return main, startup, fetch, feed


def _run(xp, main, startup, fetch, feed):
    exe = rg.Executor(xp=xp)
    exe.run(startup)
    return [to_numpy(v) for v in exe.run(main, feed=feed, fetch_list=fetch)]


# Kernels known not to be portable yet, and why; the cases run (xfail) so a fix shows up as XPASS.
NOT_PORTABLE: dict[str, str] = {}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=NOT_PORTABLE[n]))
                                  if n in NOT_PORTABLE else n for n in sorted(CASES)])
def test_array_api_strict_gives_numpy_results(name):
    needs, fn = CASES[name]
    missing = [n for n in needs if not hasattr(rg, n)]
    if missing:
        pytest.skip(f"not built yet: rg.{', rg.'.join(missing)}")
    main, startup, fetch, feed = _build(fn)
    expected = _run(np, main, startup, fetch, feed)
    got = _run(xps, main, startup, fetch, feed)
    for var, e, g in zip(fetch, expected, got):
        assert g.dtype == e.dtype, f"{var.name}: {g.dtype} vs {e.dtype}"
        assert g.shape == e.shape, f"{var.name}: {g.shape} vs {e.shape}"
        np.testing.assert_allclose(g, e, rtol=2e-6, atol=1e-7, err_msg=var.name)


def test_fetched_values_are_arrays_of_the_executors_namespace_with_return_numpy_false():
    main, startup, fetch, feed = _build(lambda x, feed: [rg.tanh(x)])
    exe = rg.Executor(xp=xps)
    out, = exe.run(main, feed=feed, fetch_list=fetch, return_numpy=False)
    assert type(out).__module__.startswith("array_api_strict")
    host, = exe.run(main, feed=feed, fetch_list=fetch)
    assert isinstance(host, np.ndarray)
    np.testing.assert_array_equal(host, np.tanh(feed["x"]))
    assert exe.last_stats.peak_bytes > 0


def test_feeds_are_checked_and_cast_on_any_namespace():
    main = Program()
    with rg.program_guard(main, Program()):
        x = rg.data("x", [-1])
        y = x * rg.constant(np.ones(2, "float32"))
    exe = rg.Executor(xp=xps)
    out, = exe.run(main, feed={"x": np.ones(2)}, fetch_list=[y])     # float64 into float32: cast
    assert to_numpy(out).dtype == np.float32
    with pytest.raises(rg.FeedError, match=r"feed 'ids'"):
        ids = main.global_block().create_var("ids", [-1], "int64", is_data=True)
        exe.run(main, feed={"x": np.ones(2, "float32"), ids.name: np.array([1.5])}, fetch_list=[y])
