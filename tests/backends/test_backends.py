"""The backend lookup and each backend's own operations, against NumPy written here."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends import get_backend, to_numpy


def _backend_of(param):
    return get_backend(param.name, param.device)


# --- lookup and errors ---------------------------------------------------------------------

def test_default_backend_is_numpy_on_the_cpu():
    exe = rg.Executor()
    assert exe.backend.name == "numpy" and exe.backend.device == "cpu" and exe.xp is np


@pytest.mark.parametrize("name,device,match", [
    ("jax", None, r"unknown backend 'jax': choose one of 'numpy', 'torch', 'cupy', 'onnxruntime'"),
    ("numpy", "cuda", r'backend "numpy" runs on device "cpu" only'),
    ("torch", "tpu", r'backend "torch" has no device \'tpu\''),
    ("torch", "cuda:x", r'backend "torch" has no device'),
    ("cupy", "cpu", r'backend "cupy" has no device \'cpu\''),
    ("onnxruntime", "tpu", r'backend "onnxruntime" runs on "cpu" or "cuda\[:N\]", not \'tpu\''),
])
def test_unknown_backend_or_device_is_a_backend_error(name, device, match):
    if name in ("torch", "onnxruntime"):      # the library is loaded before the device is read
        pytest.importorskip(name)
    with pytest.raises(rg.BackendError, match=match):
        rg.Executor(backend=name, device=device)


def test_backend_error_is_a_retrograd_error():
    assert issubclass(rg.BackendError, rg.RetrogradError)


def test_torch_cuda_without_a_gpu_says_so():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    with pytest.raises(rg.BackendError, match="sees no CUDA GPU"):
        rg.Executor(backend="torch", device="cuda")


def test_missing_library_names_the_pip_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)           # import torch now raises ImportError
    with pytest.raises(rg.BackendError, match=r'pip install "retrograd\[torch\]"'):
        rg.Executor(backend="torch")
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(rg.BackendError, match=r'pip install "retrograd\[cupy\]"'):
        rg.Executor(backend="cupy")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(rg.BackendError, match=r'pip install "retrograd\[onnx\]"'):
        rg.Executor(backend="onnxruntime")


def test_xp_and_backend_together_are_refused():
    with pytest.raises(rg.BackendError, match="either backend= or xp="):
        rg.Executor(xp=np, backend="torch")


def test_xp_torch_is_the_torch_backend():
    torch = pytest.importorskip("torch")
    exe = rg.Executor(xp=torch)
    assert exe.backend.name == "torch" and exe.backend.device == "cpu"
    assert exe.xp.isdtype(exe.xp.float32, "real floating")     # torch itself lacks isdtype


# --- what the Array API lacks, per backend ------------------------------------------------------

def test_transfers_round_trip(backend):
    be = _backend_of(backend)
    host = np.arange(12, dtype="float32").reshape(3, 4)
    dev = be.from_numpy(host)
    assert be.owns(dev) and be.device_of(dev) == be.device
    back = be.to_numpy(dev)
    assert isinstance(back, np.ndarray)
    np.testing.assert_array_equal(back, host)
    np.testing.assert_array_equal(to_numpy(dev), host)
    scalar = be.from_numpy(np.asarray(2.5))
    assert tuple(scalar.shape) == () and float(be.to_numpy(scalar)) == 2.5


def test_scatter_add_rows_accumulates_repeated_ids(backend):
    be = _backend_of(backend)
    rng = np.random.default_rng(0)
    ids = np.array([[3, 0], [3, 3], [1, 0]], dtype="int64")
    rows = rng.standard_normal((3, 2, 5))
    expected = np.zeros((6, 5))
    np.add.at(expected, ids.reshape(-1), rows.reshape(-1, 5))     # the unbuffered NumPy reference
    got = be.scatter_add_rows((6, 5), "float64", be.from_numpy(ids), be.from_numpy(rows))
    np.testing.assert_allclose(be.to_numpy(got), expected, rtol=1e-15)
    empty = be.scatter_add_rows((4, 5), "float64", be.from_numpy(np.zeros(0, "int64")),
                                be.from_numpy(np.zeros((0, 5))))
    np.testing.assert_array_equal(be.to_numpy(empty), np.zeros((4, 5)))


@pytest.mark.parametrize("rows", [3, 64, 65, 200])    # around NumPy's SMALL_ROWS (written another way)
@pytest.mark.parametrize("tx, ty", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_with_transposed_operands(backend, rows, tx, ty):
    be = _backend_of(backend)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((rows, 7) if not tx else (7, rows)).astype(np.float32)
    y = rng.standard_normal((7, 9) if not ty else (9, 7)).astype(np.float32)
    expected = (x.T if tx else x).astype(np.float64) @ (y.T if ty else y).astype(np.float64)
    got = be.to_numpy(be.matmul(be.from_numpy(x), be.from_numpy(y), tx, ty))
    assert got.shape == (rows, 9) and got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_views_share_a_buffer_and_copies_do_not(backend):
    be = _backend_of(backend)
    a = be.from_numpy(np.zeros((4, 6)))
    view = be.xp.reshape(a, (6, 4))
    part = a[1:3, ...]
    copy = a + 1.0
    key, nbytes = be.buffer_of(a)
    assert nbytes == 4 * 6 * 8
    assert be.buffer_of(view)[0] == key and be.buffer_of(part)[0] == key
    assert be.buffer_of(copy)[0] != key


def test_dtype_names_map_to_the_namespace(backend):
    be = _backend_of(backend)
    for name in ("float32", "float64", "int64", "int32", "bool"):
        array = be.xp.zeros((2,), dtype=be.dtype_of(name))
        assert be.to_numpy(array).dtype == np.dtype(name)


def test_device_memory_is_none_on_the_host_and_counts_on_a_gpu(backend):
    be = _backend_of(backend)
    if be.device == "cpu":
        assert be.device_memory() is None
    else:
        before = be.device_memory()
        keep = be.from_numpy(np.zeros(1 << 20, "float32"))
        assert be.device_memory() >= before + keep.nbytes


# --- keyed random draws ---------------------------------------------------------------------------

def _lowbias32(x: int) -> int:
    """The mixer, written out again with Python ints (the reference for the vectorised one)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _reference_hashes(key: list[int], count: int) -> np.ndarray:
    s = 0x243F6A88
    for v in key:
        v &= (1 << 64) - 1
        s = _lowbias32(s ^ (v & 0xFFFFFFFF))
        s = _lowbias32(s ^ (v >> 32))
    k0, k1 = s, _lowbias32(s ^ 0x9E3779B9)
    return np.array([_lowbias32(_lowbias32((i & 0xFFFFFFFF) ^ k0) ^ k1 ^ (i >> 32)) for i in range(count)])


def test_keep_mask_and_uniform_follow_the_documented_algorithm(backend):
    be = _backend_of(backend)
    key = [7, 2, -5, 1 << 40]
    h = _reference_hashes(key, 300)
    mask = be.to_numpy(be.random_keep_mask(key, (20, 15), 0.3))
    np.testing.assert_array_equal(mask.reshape(-1), h < int(0.3 * 2**32))
    u = be.to_numpy(be.random_uniform(key, (300,), -2.0, 3.0, "float64"))
    np.testing.assert_array_equal(u, -2.0 + 5.0 * (h * 2.0**-32))


def test_keyed_draws_are_identical_on_every_backend(backend):
    be, ref = _backend_of(backend), get_backend("numpy")
    key = [123, 4, 17, 3]
    for dtype in ("float32", "float64"):
        for draw, args in (("random_uniform", (-0.5, 2.0)), ("random_normal", (1.0, 3.0))):
            got = be.to_numpy(getattr(be, draw)(key, (64, 33), *args, dtype))
            want = getattr(ref, draw)(key, (64, 33), *args, dtype)
            assert got.dtype == dtype
            np.testing.assert_array_equal(got, want, err_msg=f"{draw} {dtype}")
    np.testing.assert_array_equal(be.to_numpy(be.random_keep_mask(key, (1000,), 0.9)),
                                  ref.random_keep_mask(key, (1000,), 0.9))


def test_normal_draws_are_standard_normal():
    z = get_backend("numpy").random_normal([5], (200_000,), 0.0, 1.0, "float64")
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01
    # the tails follow the normal distribution: P(|z| > 2) = 0.0455, P(|z| > 3) = 0.0027
    assert abs(np.mean(np.abs(z) > 2.0) - 0.0455) < 0.002
    assert abs(np.mean(np.abs(z) > 3.0) - 0.0027) < 0.0006
    # and agree with NumPy's own log/sqrt/cos Box-Muller on the same hashes to rounding
    from retrograd.backends import keyed_random
    h1 = keyed_random.hash_bits(np, [5], (1000,)).astype(np.float64)
    h2 = keyed_random.hash_bits(np, [5], (1000,), salt=0x5BD1E995).astype(np.float64)
    expected = np.sqrt(-2.0 * np.log((h1 + 0.5) * 2.0**-32)) * np.cos(2 * np.pi * h2 * 2.0**-32)
    np.testing.assert_allclose(z[:1000], expected, rtol=1e-13, atol=1e-14)


def test_different_keys_give_independent_draws():
    be = get_backend("numpy")
    a = be.random_uniform([1, 0], (10_000,), 0.0, 1.0, "float64")
    b = be.random_uniform([1, 1], (10_000,), 0.0, 1.0, "float64")
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.03
    assert abs(a.mean() - 0.5) < 0.01 and abs(a.var() - 1 / 12) < 0.005


def test_dtype_of_gives_each_namespaces_dtype():
    """What the deleted ``retrograd.backend`` shim offered kernels, from ``retrograd.backends``."""
    torch = pytest.importorskip("torch")
    from retrograd.backends import dtype_name, dtype_of
    assert dtype_of(np, "float32") is np.float32 and dtype_of(torch, "float64") is torch.float64
    assert dtype_of(torch, np.dtype("int64")) is torch.int64 and dtype_name(torch.int64) == "int64"
