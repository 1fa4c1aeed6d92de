"""NumPy arrays (and NumPy scalars) as operands of every operator and binary builder, reflected forms
too: they become constants, weakly typed like Python scalars (issue 19: ``x + np.ones(8)`` was
refused while ``x / np.sqrt(8.0)`` worked, because ``scalar_like`` took numbers only)."""
from __future__ import annotations

import operator

import numpy as np
import pytest

import retrograd as rg

pytestmark = pytest.mark.engine

X = np.linspace(0.5, 4.0, 8).reshape(1, 8).repeat(3, 0).astype("float32")
W = np.linspace(1.0, 2.0, 8)        # float64: the float32 Var's dtype wins

OPERATORS = [operator.add, operator.sub, operator.mul, operator.truediv, operator.pow, operator.floordiv,
             operator.mod, operator.lt, operator.le, operator.gt, operator.ge]


def _run(backend, build, feed):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        fetch = build()
    return fetch, backend.executor().run(main, feed=feed, fetch_list=fetch)


@pytest.mark.parametrize("op", OPERATORS, ids=[op.__name__ for op in OPERATORS])
def test_numpy_array_operand_was_refused_while_numpy_scalar_worked(backend, op):
    def build():
        x = rg.data("x", [-1, 8])
        return [op(x, W), op(W, x), op(x, np.sqrt(8.0)), op(np.float32(2.0), x), op(x, W[None, :])]
    outs, got = _run(backend, build, {"x": X})
    wants = [op(X, W.astype("float32")), op(W.astype("float32"), X), op(X, np.float32(np.sqrt(8.0))),
             op(np.float32(2.0), X), op(X, W[None, :].astype("float32"))]
    for var, ours, want in zip(outs, got, wants):
        assert var.dtype == want.dtype.name == ours.dtype.name     # weakly typed: the Var's float32
        np.testing.assert_allclose(ours, want, rtol=2e-6)


def test_every_binary_builder_takes_numpy_arrays(backend):
    ids = np.array([1, 0, 2])

    def build():
        x = rg.data("x", [-1, 8])
        i = rg.data("i", [3], "int64")
        return [rg.maximum(x, W), rg.minimum(W, x), rg.equal(i, ids), rg.add(ids, i), x @ np.ones((8, 2)),
                np.ones((2, 3)) @ x, rg.where(ids > 0, i, np.zeros(3, "int64")),
                rg.logical_and(i > 0, np.array([True, False, True])), rg.matmul(np.eye(3), x)]
    outs, got = _run(backend, build, {"x": X, "i": ids})
    xf, wf = X, W.astype("float32")
    wants = [np.maximum(xf, wf), np.minimum(wf, xf), ids == ids, ids + ids, xf @ np.ones((8, 2), "float32"),
             np.ones((2, 3), "float32") @ xf, np.where(ids > 0, ids, 0), (ids > 0) & [True, False, True],
             np.eye(3, dtype="float32") @ xf]
    for var, ours, want in zip(outs, got, wants):
        assert var.dtype == want.dtype.name, var
        np.testing.assert_allclose(ours, want, rtol=2e-6)


def test_integer_and_float_arrays_beside_integer_vars_keep_numpys_kinds():
    with rg.program_guard(rg.Program(), rg.Program()):
        i = rg.data("i", [3], "int64")
        assert (i + np.arange(3, dtype=np.int32)).dtype == "int64"
        assert (i * np.ones(3)).dtype == "float64"                 # a float array keeps its dtype
        assert (i * np.ones(3, np.float32)).dtype == "float64"     # int64 with float32: NumPy's float64
        assert (rg.data("h", [3], "float64") + np.ones(3, np.float32)).dtype == "float64"


def test_arrays_that_are_not_numbers_are_refused():
    with rg.program_guard(rg.Program(), rg.Program()):
        x = rg.data("x", [2])
        with pytest.raises(rg.ProgramError, match="cannot combine a NumPy array of dtype <U1"):
            x + np.array(["a", "b"])
        with pytest.raises(rg.ProgramError, match="cannot combine list"):
            x + [1.0, 2.0]
        with pytest.raises(rg.ShapeError, match="does not broadcast|do not broadcast"):
            x + np.ones(3)
