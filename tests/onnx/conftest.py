"""Shared checks for the ONNX tests: export a program, run it in onnxruntime, compare with NumPy."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

onnx = pytest.importorskip("onnx", reason="ONNX export needs onnx (pip install \"retrograd[onnx]\")")
ort = pytest.importorskip("onnxruntime", reason="the ONNX tests run models in onnxruntime")

RUN_ID = "retrograd.run_id"
TOLERANCE = {"float32": 1e-5, "float64": 1e-10}


def assert_close(got, want, what: str) -> None:
    """onnxruntime's value equals the NumPy executor's: same shape and dtype, float32 within
    1e-5, float64 within 1e-10 (relative to the larger of 1 and the value), others exactly."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, NumPy executor {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, NumPy executor {want.dtype}"
    tol = TOLERANCE.get(want.dtype.name)
    if tol is None:
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True, err_msg=what)


class OrtCheck:
    """Export ``program`` (parameters as initializers from ``exe.scope``), run it, compare."""

    def session(self, model):
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    def __call__(self, program, exe, feed: dict, fetch: list, scope=True):
        model = rg.onnx.export(program, None, fetch, scope=exe.scope if scope else None)
        sess = self.session(model)
        names = [f.name if isinstance(f, rg.Var) else f for f in fetch]
        inputs = {i.name for i in sess.get_inputs()}
        feed = dict(feed)
        if RUN_ID in inputs:      # random ops: the run id the executor's next run draws with
            feed[RUN_ID] = np.array(exe._run.run_id + 1)
        got = sess.run(names, {k: v for k, v in feed.items() if k in inputs})
        feed.pop(RUN_ID, None)
        want = exe.run(program, feed=feed, fetch_list=fetch)
        for name, g, w in zip(names, got, want):
            assert_close(g, w, name)
        return model, got


@pytest.fixture
def ort_check() -> OrtCheck:
    return OrtCheck()
