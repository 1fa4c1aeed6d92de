"""One rule for a fed value (or scope value) whose dtype is not the declared one, on every backend:
float64 <-> float32 and int32 -> int64 are cast; every other cast (float -> int, int -> float,
anything <-> bool, int64 -> int32) is a FeedError naming both dtypes.

Issue 23: float64 fed to float32 data was cast while float32 fed to int64 labels was refused, and
int64 -> int32 or int -> float were cast silently.
"""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends import to_numpy
from retrograd.runtime.executor import FEED_CASTS

pytestmark = pytest.mark.engine

DTYPES = ("float32", "float64", "int32", "int64", "bool")
VALUES = {"float32": [1.0, 2.5], "float64": [1.0, 2.5], "int32": [1, 2], "int64": [1, 2],
          "bool": [True, False]}


def _identity(declared: str):
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [2], dtype=declared)
        y = rg.assign(x)
    return main, y


@pytest.mark.parametrize("fed", DTYPES)
@pytest.mark.parametrize("declared", DTYPES)
def test_feed_dtypes_follow_one_rule(backend, fed, declared):
    main, y = _identity(declared)
    exe = backend.executor()
    value = np.array(VALUES[fed], dtype=fed)
    if fed == declared or (fed, declared) in FEED_CASTS:
        got, = exe.run(main, feed={"x": value}, fetch_list=[y])
        assert got.dtype == np.dtype(declared)
        np.testing.assert_array_equal(got, value.astype(declared))
    else:
        with pytest.raises(rg.FeedError, match=rf"feed 'x' has dtype {fed}, the program declares "
                                               rf"{declared}; only float64 <-> float32 and int32 -> "
                                               r"int64 are cast"):
            exe.run(main, feed={"x": value}, fetch_list=[y])


def test_the_casts_are_exactly_float_to_float_and_int32_to_int64():
    assert FEED_CASTS == {("float64", "float32"), ("float32", "float64"), ("int32", "int64")}


def test_labels_of_float_dtype_are_refused_and_float64_data_is_rounded(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        labels = rg.data("labels", [-1], dtype="int64")
        loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(x, 3, name="fc"), labels))
    exe = backend.executor()
    exe.run(startup)
    xb = np.random.default_rng(0).standard_normal((4, 3))                  # float64
    want, = exe.run(main, feed={"x": xb.astype("float32"), "labels": np.array([0, 1, 2, 0])},
                    fetch_list=[loss])
    got, = exe.run(main, feed={"x": xb, "labels": np.array([0, 1, 2, 0])}, fetch_list=[loss])
    assert got == want
    with pytest.raises(rg.FeedError, match="feed 'labels' has dtype float32, the program declares int64"):
        exe.run(main, feed={"x": xb, "labels": np.array([0, 1, 2, 0], "float32")}, fetch_list=[loss])


def test_backend_arrays_and_scope_values_follow_the_same_rule(backend):
    if backend.name == "onnxruntime":
        pytest.skip("the engine takes NumPy arrays: the feed tests above cover it")
    main, y = _identity("float32")
    exe = backend.executor()
    got, = exe.run(main, feed={"x": exe.backend.from_numpy(np.array([1.0, 2.5]))}, fetch_list=[y])
    assert got.dtype == np.float32
    with pytest.raises(rg.FeedError, match="feed 'x' has dtype int64, the program declares float32"):
        exe.run(main, feed={"x": exe.backend.from_numpy(np.array([1, 2]))}, fetch_list=[y])
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        w = rg.create_parameter("w", [2])
        out = w * 2.0
    exe.scope.set("w", np.array([1.0, 2.0], "float64"))
    got, = exe.run(main, fetch_list=[out])
    np.testing.assert_array_equal(got, [2.0, 4.0])
    assert to_numpy(exe.scope.get("w")).dtype == np.float32          # cast once, stored back
    exe.scope.set("w", np.array([1, 2], "int64"))
    with pytest.raises(rg.FeedError, match="scope value 'w' has dtype int64, the program declares float32"):
        exe.run(main, fetch_list=[out])
