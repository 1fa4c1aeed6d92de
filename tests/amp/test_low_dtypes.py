"""bfloat16 and float16 as dtypes everywhere: rg.data, rg.cast, feeds, fetches, kernels,
save_params/load_params and JSON, on every backend. NumPy's bfloat16 is ml_dtypes'."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends import to_numpy

ml_dtypes = pytest.importorskip("ml_dtypes", reason="NumPy's bfloat16 is ml_dtypes' (pip install ml_dtypes)")

pytestmark = pytest.mark.engine
NP = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}


def _skip_engine_bfloat16(backend, dtype):
    if backend.name == "onnxruntime" and dtype == "bfloat16":
        pytest.skip("onnxruntime's CPU kernels lack bfloat16 MatMul/Tanh (tests/amp/test_amp.py checks the error)")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_feed_kernel_and_fetch_in_low_precision(backend, dtype):
    _skip_engine_bfloat16(backend, dtype)
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8], dtype=dtype)
        w = rg.data("w", [8, 4], dtype=dtype)
        y = rg.tanh(x @ w) * 2.0
        up = rg.cast(y, "float32")
    rng = np.random.default_rng(0)
    xb, wb = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal((8, 4)).astype(np.float32)
    exe = backend.executor()
    got, got_up = exe.run(main, feed={"x": xb, "w": wb.astype(NP[dtype])}, fetch_list=[y, up])  # f32 fed: cast
    assert got.dtype == NP[dtype] and got_up.dtype == np.float32
    xr, wr = xb.astype(NP[dtype]).astype(np.float32), wb.astype(NP[dtype]).astype(np.float32)
    expected = (np.tanh((xr @ wr).astype(NP[dtype]).astype(np.float32)) * 2.0)
    eps = {"bfloat16": 2 ** -7, "float16": 2 ** -10}[dtype]
    np.testing.assert_allclose(got.astype(np.float32), expected, rtol=4 * eps, atol=4 * eps)
    np.testing.assert_array_equal(got_up, got.astype(np.float32))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_parameters_save_and_load_bit_exactly(backend, dtype, tmp_path):
    _skip_engine_bfloat16(backend, dtype)
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        rg.create_parameter("w", [5, 3], dtype=dtype)
    exe = backend.executor()
    exe.run(startup)
    rg.save_params(exe.scope, tmp_path / "p.npz", main)
    saved = to_numpy(exe.scope.get("w"))
    assert saved.dtype == NP[dtype]
    loaded = rg.read_params(tmp_path / "p.npz")["w"]
    assert loaded.dtype == NP[dtype] and loaded.tobytes() == saved.tobytes()
    fresh = backend.executor()
    rg.load_params(fresh.scope, tmp_path / "p.npz", main)
    assert to_numpy(fresh.scope.get("w")).tobytes() == saved.tobytes()


def test_programs_with_low_precision_round_trip_through_json():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [2], dtype="bfloat16")
        rg.cast(rg.cast(x, "float16"), "float32")
    text = main.to_json()
    assert str(rg.Program.from_json(text)) == str(main) and "bfloat16" in str(main)


def test_a_namespace_without_bfloat16_says_so():
    from retrograd.backends.namespace_backend import NamespaceBackend
    strict = pytest.importorskip("array_api_strict", reason="pip install array-api-strict")
    with pytest.raises(rg.BackendError, match="has no dtype bfloat16"):
        NamespaceBackend(strict).dtype_of("bfloat16")
