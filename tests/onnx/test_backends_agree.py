"""Issue 25: every backend gives the NumPy executor's answer, and an exported model loads and runs
in a plain ``onnxruntime.InferenceSession`` (default options) with the same numbers.

Each test pins one failure class the differential fuzz found; each program runs on NumPy,
torch-CPU, the onnxruntime engine and ``rg.onnx.export`` + a default session
(``tests/autodiff/differential.py``), and all four must agree.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import retrograd as rg

pytest.importorskip("torch", reason="the differential tests run the torch backend too")
pytest.importorskip("onnxruntime", reason="the differential tests run onnxruntime")

pytestmark = pytest.mark.filterwarnings("ignore:.*(empty slice|invalid value|divide by zero):RuntimeWarning")

sys.path.insert(0, str(Path(__file__).parents[1] / "autodiff"))
import differential as diff  # noqa: E402  (a helper module of the tests, not a package)


def _agree(build, feed: dict, allow=("agree",)):
    main, startup, fetch = diff.program(build)
    return diff.assert_backends_agree(main, startup, feed, fetch, allow=allow)


# --- 1. 0-d values ------------------------------------------------------------------------------

def test_zero_d_values_keep_shape_zero_d_on_the_engine():
    """The engine fed 0-d arrays through np.ascontiguousarray, which makes them (1,)."""
    def build():
        k = rg.data("k", [], dtype="float64", stop_gradient=False)
        y = k * 2.0
        return [y, rg.gradients(rg.sum(y * k), [k])[0]]
    verdict = _agree(build, {"k": np.array(3.0)})
    assert all(np.shape(out.values[0]) == () for out in verdict.outcomes.values())


@pytest.mark.parametrize("trips", [0, 1, 3])
def test_zero_d_trip_count_second_order_while_gradient(trips):
    """The knock-on failures of 0-d values as (1,): a second-order while-loop gradient (Pad,
    SplitLike and SumTo nodes failed inside onnxruntime)."""
    def build():
        x = rg.data("x", [3, 3], dtype="float64", stop_gradient=False)
        k = rg.data("k", [], dtype="float64", stop_gradient=False)
        n = rg.data("n", [], dtype="int64")
        a, b = rg.split(x, [1, 2], 0)
        _, h = rg.while_loop(lambda i, h: i < n, lambda i, h: [i + 1, rg.tanh(h * k + a)],
                             [rg.constant(0, dtype="int64"), b])
        loss = rg.sum(h * h) * k
        dx, dk = rg.gradients(loss, [x, k])
        second = rg.gradients(rg.sum(dx * dx) + dk * dk, [x, k])
        return [loss, dx, dk] + list(second)
    rng = np.random.default_rng(0)
    _agree(build, {"x": rng.uniform(-1, 1, (3, 3)), "k": np.array(0.7), "n": np.array(trips)})


# --- 2. reductions over empty axes -------------------------------------------------------------

def test_mean_of_an_empty_batch_is_nan_on_every_backend_and_in_exported_models():
    """ONNX ReduceMean of an empty tensor is 0; NumPy's and torch's mean is NaN."""
    def build():
        x = rg.data("x", [-1, 3], dtype="float64", stop_gradient=False)
        whole, per_column = rg.mean(x), rg.mean(x, axis=0)
        rows = rg.mean(x, axis=1, keepdims=True)
        return [whole, per_column, rows, rg.gradients(rg.sum(rows) + rg.sum(x), [x])[0]]
    verdict = _agree(build, {"x": np.zeros((0, 3))})
    for out in verdict.outcomes.values():
        assert np.isnan(out.values[0]) and np.isnan(out.values[1]).all()


def test_mean_of_an_empty_batch_in_a_while_condition_gives_the_same_trip_count():
    """mean() of an empty batch in the condition: NaN > 0 is false (0 iterations), where the
    engine's 0.0 made it 2."""
    def build():
        x = rg.data("x", [-1, 3], dtype="float64")
        i, h = rg.while_loop(lambda i, h: rg.logical_and(i < 2, rg.mean(h) < 10.0),
                             lambda i, h: [i + 1, h * 2.0], [rg.constant(0, dtype="int64"), x])
        return [i, h, rg.mean(x) > -1.0]
    for rows in (0, 2):
        _agree(build, {"x": np.ones((rows, 3))})


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_over_an_empty_axis_is_empty_on_every_backend(op):
    """NumPy's and torch's max over an empty axis raised; onnxruntime's Softmax gives the empty
    result, which is what the softmax of nothing is."""
    def build():
        x = rg.data("x", [-1, -1], dtype="float64", stop_gradient=False)
        y = getattr(rg, op)(x, axis=-1)
        return [y, rg.gradients(rg.sum(y * y), [x])[0]]
    _agree(build, {"x": np.zeros((2, 0))})
    _agree(build, {"x": np.zeros((0, 3))})


# --- 5. onnxruntime's GemmSumFusion ---------------------------------------------------------------

def test_gemm_sum_fusion_weight_gradient_of_a_third_split_part_loads_in_a_default_session():
    """x^T dy as Gemm(transA=1) reading a Split's third output, summed with one other gradient
    part: onnxruntime's GemmSumFusion failed at session build (``src_arg_index < 2``)."""
    def build():
        x = rg.data("x", [4, 3], dtype="float64", stop_gradient=False)
        w = rg.data("w", [3, 3], dtype="float64", stop_gradient=False)
        a, b, c = rg.split(x, [1, 1, 2], 0)
        loss = rg.sum(c @ w) + rg.sum(rg.tanh(w))
        return [loss] + rg.gradients(loss, [w, x])
    rng = np.random.default_rng(1)
    _agree(build, {"x": rng.standard_normal((4, 3)), "w": rng.standard_normal((3, 3))})


# --- 3. a cond in a loop body whose branches keep different values for the backward --------------

def _i64(value):
    return rg.constant(value, dtype="int64")


def _cond_step(i, h):
    """The branch taken changes every iteration; each keeps other values for its backward."""
    return rg.cond(rg.equal(i % 2, _i64(0)), lambda: rg.tanh(rg.tanh(h) * 1.5), lambda: h * 0.5)


def _inner_while(h, trips):
    """v <- tanh(0.9 v + h) ``trips`` times (a run-time count)."""
    _, v = rg.while_loop(lambda j, v: j < trips, lambda j, v: [j + 1, rg.tanh(v * 0.9 + h)], [_i64(0), h])
    return v


def _data_while(xt, h):
    """v <- tanh(0.9 v + xt) from h while sum(v) > 0 (at most 3 times): the count depends on the
    values, so it changes from step to step."""
    _, v = rg.while_loop(lambda j, v: rg.logical_and(j < 3, rg.sum(v) > 0.0),
                         lambda j, v: [j + 1, rg.tanh(v * 0.9 + xt)], [_i64(0), h])
    return v


def _while_program(step, recompute=None, second=False):
    def build():
        x = rg.data("x", [2], dtype="float64", stop_gradient=False)
        _, h = rg.while_loop(lambda i, h: i < 3, lambda i, h: [i + 1, step(i, h)], [_i64(0), x],
                             recompute=recompute)
        dx, = rg.gradients(rg.sum(h * h), [x])
        return [h, dx] + (rg.gradients(rg.sum(dx * dx), [x]) if second else [])
    return build


def _recurrent_program(step, recompute=None, second=False):
    def build():
        s = rg.data("s", [-1, 2, 3], dtype="float64", stop_gradient=False)
        x = rg.data("x", [2, 3], dtype="float64", stop_gradient=False)
        alls, lasts = rg.recurrent(lambda xs, hs: [rg.tanh(step(xs[0], hs[0]) + xs[0])], [s], [x],
                                   recompute=recompute)
        loss = rg.sum(lasts[0]) + rg.sum(alls[0]) * 0.5
        ds, dx = rg.gradients(loss, [s, x])
        return [loss, ds, dx] + (rg.gradients(rg.sum(dx * dx), [s, x]) if second else [])
    return build


def _recurrent_feed(steps: int) -> dict:
    rng = np.random.default_rng(3)
    return {"s": rng.uniform(-1, 1, (steps, 2, 3)), "x": rng.uniform(-1, 1, (2, 3))}


@pytest.mark.parametrize("recompute,second", [(None, False), (None, True), (1 << 12, False)],
                         ids=["first", "second", "budget"])
def test_cond_in_a_while_body_keeping_other_values_per_branch(recompute, second):
    """The untaken branch's empty stand-in for a value the loop stacks: "Inconsistent shape in
    loop output ... Expected:{2} Got:{0}"."""
    _agree(_while_program(_cond_step, recompute, second), {"x": np.array([0.3, -0.7])})


def _cond_on_input(xt, h):
    return rg.cond(rg.sum(xt) > 0.0, lambda: rg.tanh(rg.tanh(h) * 1.5 + xt), lambda: h * 0.5)


@pytest.mark.parametrize("recompute,second", [(None, False), (None, True), ("steps", False), (1 << 12, False)],
                         ids=["first", "second", "steps", "budget"])
@pytest.mark.parametrize("steps", [0, 1, 4])
def test_cond_in_a_recurrent_step_keeping_other_values_per_branch(recompute, second, steps):
    """"output 'cond_0__3' ... has shape {1,2} but the computed output shape for this run is
    {0,0}" (the engine's Scan form) and the same in exported Loops."""
    _agree(_recurrent_program(_cond_on_input, recompute, second), _recurrent_feed(steps))


# --- 4. an inner while_loop whose trip count changes between outer iterations --------------------

@pytest.mark.parametrize("recompute,second", [(None, False), (None, True), (1 << 12, False)],
                         ids=["first", "second", "budget"])
def test_inner_while_trip_count_changing_between_outer_iterations(recompute, second):
    """The inner loop runs i times in outer iteration i: its per-iteration record for the
    backward is ragged ("Inconsistent shape in loop output ... Expected:{0,2} Got:{1,2}")."""
    _agree(_while_program(lambda i, h: rg.tanh(_inner_while(h, i) * 1.1), recompute, second),
           {"x": np.array([0.3, -0.7])})


@pytest.mark.parametrize("recompute,second", [(None, False), (None, True), ("steps", False), (1 << 12, False)],
                         ids=["first", "second", "steps", "budget"])
@pytest.mark.parametrize("steps", [0, 1, 4])
def test_inner_while_trip_count_changing_between_recurrent_steps(recompute, second, steps):
    _agree(_recurrent_program(_data_while, recompute, second), _recurrent_feed(steps))


# --- found by the differential fuzz -----------------------------------------------------------------

@pytest.mark.parametrize("order", ["product first", "value first"])
def test_a_fetched_value_added_to_a_transposed_product_loads_in_a_default_session(order):
    """``x @ w^T + c`` with ``c`` fetched too: outputs were Identities of the values, and
    onnxruntime's basic optimisations (IdentityElimination with the MatMul + Add fusion) left the
    fused node reading the eliminated Identity's input, so the session did not build ("Node input
    'mul_0__2' is not a graph input, initializer, or output of a previous node")."""
    def build():
        x, y, w = (rg.data(name, [2, 2], dtype="float32") for name in "xyw")
        k = rg.data("k", [], dtype="float32")
        c = y * k
        product = rg.matmul(x, w, transpose_y=True)
        out = product + c if order == "product first" else c + product
        return [out, c]
    rng = np.random.default_rng(5)
    feed = {name: rng.standard_normal((2, 2)).astype(np.float32) for name in "xyw"}
    _agree(build, {**feed, "k": np.array(2.0, dtype=np.float32)})
