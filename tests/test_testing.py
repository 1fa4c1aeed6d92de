"""rg.testing.check_gradients: passes right gradients, catches wrong ones, names the element."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.ops.core.registry import OPS, append_op, defop
from retrograd.ops.core.shapes import same_as_first
from retrograd.testing import GradientCheckError, check_gradients


def test_right_gradients_pass_with_a_small_error_per_input():
    r = np.random.default_rng(0)
    report = check_gradients(lambda x, w: rg.tanh(x @ w), {"x": r.standard_normal((3, 4)),
                                                           "w": r.standard_normal((4, 2))})
    assert set(report) == {"x", "w"} and all(0 <= e < 1e-6 for e in report.values())


@pytest.fixture
def wrong_cube():
    """x ** 3 registered with the gradient 2 x^2 (should be 3 x^2)."""
    @defop("TestWrongCube", infer=same_as_first, grad=lambda g: [g.dy * 2.0 * g.x[0] * g.x[0]])
    def _kernel(k, x):
        return x * x * x
    try:
        yield lambda x: append_op("TestWrongCube", [x])[0]
    finally:
        del OPS["TestWrongCube"]


def test_a_wrong_gradient_fails_and_names_the_worst_element(wrong_cube):
    x = np.array([0.5, -1.0, 2.0])
    with pytest.raises(GradientCheckError, match=r"x: worst at index \[2\]: analytic .*numeric"):
        check_gradients(wrong_cube, {"x": x})
    report = check_gradients(wrong_cube, {"x": x}, raise_on_failure=False)
    assert report["x"] == pytest.approx(1 / 3, rel=1e-6)     # |2x^2 - 3x^2| / 3x^2


def test_integer_inputs_are_not_differentiated_and_dropout_is_replayed():
    ids = np.array([2, 0, 2])
    report = check_gradients(lambda t, i: rg.dropout(rg.gather(t, i), 0.5, seed=1),
                             {"t": np.random.default_rng(1).standard_normal((3, 2)), "i": ids})
    assert set(report) == {"t"} and report["t"] < 1e-6


def test_inputs_as_a_list_are_named_after_fn_parameters():
    r = np.random.default_rng(3)
    report = check_gradients(lambda x, w: rg.tanh(x @ w), [r.standard_normal((3, 4)), r.standard_normal((4, 2))])
    assert set(report) == {"x", "w"} and max(report.values()) < 1e-6
    report = check_gradients(lambda *xs: xs[0] * xs[1], (r.standard_normal(3), r.standard_normal(3)))
    assert set(report) == {"input0", "input1"}
    assert set(check_gradients(rg.exp, r.standard_normal(4))) == {"x"}


def test_check_gradients_replays_random_draws_on_the_onnxruntime_engine():
    """The engine counts its runs itself: check_gradients reset only the NumPy executor's count,
    so each finite-difference run on the engine drew new numbers (huge numeric gradients)."""
    pytest.importorskip("onnxruntime", reason="the onnxruntime engine needs onnxruntime")
    x = np.random.default_rng(0).standard_normal((3, 4))
    rg.testing.check_gradients(lambda x: rg.dropout(x, 0.5) * rg.randn_like(x), {"x": x}, backend="onnxruntime")
