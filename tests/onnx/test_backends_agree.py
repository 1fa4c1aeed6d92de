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
