"""The NumPy backend's float32 erf / GELU (backends/numpy_erf.py) against math.erf in float64:
error bounds, chunk edges, odd shapes and layouts, special values, and which dtypes take it."""
from __future__ import annotations

import math

import numpy as np
import pytest

from retrograd.backends import numpy_erf
from retrograd.backends.numpy_backend import NumpyBackend

ERF = np.vectorize(math.erf, otypes=[np.float64])
# Past the float32 rounding of 1 (|u| >= 3.92) and both clamps, on a grid that is not chunk-aligned.
U = np.linspace(-12.0, 12.0, 3 * numpy_erf.CHUNK + 7).astype(np.float32)


def _phi(x):
    return 0.5 * (1.0 + ERF(x / math.sqrt(2.0)))


def test_float32_erf_is_within_its_documented_error():
    got = numpy_erf.erf(U)
    assert got.dtype == np.float32 and got.shape == U.shape
    np.testing.assert_allclose(got, ERF(U.astype(np.float64)), rtol=0, atol=4e-7)
    np.testing.assert_array_equal(got, -numpy_erf.erf(-U))          # odd
    assert np.all(got[np.abs(U) >= 4.0] == np.sign(U[np.abs(U) >= 4.0]))


def test_erf_stays_in_its_range_and_gelu_keeps_its_sign():
    """Regression: float32 rounding took the rational form to 1.0000002 near u = 3.7, which made
    Phi negative in the far left tail (gelu(x) > 0 for x < 0) and gelu(x) > x on the right."""
    u = np.linspace(-6.0, 6.0, 2_000_001).astype(np.float32)
    assert np.abs(numpy_erf.erf(u)).max() <= 1.0
    x = u * 2
    g = numpy_erf.gelu(x)
    assert np.all(g[x < 0] <= 0) and np.all(g[x > 0] <= x[x > 0]) and np.all(g >= -0.2)


def test_float32_erf_of_small_and_special_values():
    tiny = np.array([0.0, -0.0, 1e-30, -3e-20, 1e-8], np.float32)
    np.testing.assert_allclose(numpy_erf.erf(tiny), ERF(tiny.astype(np.float64)), rtol=2e-7, atol=0)
    special = numpy_erf.erf(np.array([np.inf, -np.inf, np.nan], np.float32))
    assert special[0] == 1.0 and special[1] == -1.0 and np.isnan(special[2])


def test_gelu_and_its_gradient_match_float64_formulas():
    x = U.astype(np.float64)
    dy = np.random.default_rng(0).standard_normal(U.shape).astype(np.float32)
    np.testing.assert_allclose(numpy_erf.gelu(U), x * _phi(x), rtol=1e-6, atol=2e-6)
    slope = _phi(x) + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    np.testing.assert_allclose(numpy_erf.gelu_grad(U, dy), dy * slope, rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (7, 5, 3)])
def test_any_shape_and_layout(shape):
    r = np.random.default_rng(1)
    x = (r.standard_normal(shape) * 3).astype(np.float32)
    dy = r.standard_normal(shape).astype(np.float32)
    for got, want in ((numpy_erf.erf(x), ERF(x.astype(np.float64))),
                      (numpy_erf.gelu(x), x * _phi(x.astype(np.float64)))):
        assert got.shape == x.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=2e-6)
    assert numpy_erf.gelu_grad(x, dy).shape == x.shape
    if x.ndim == 3:                         # a transposed (non-contiguous) view gives the same numbers
        np.testing.assert_array_equal(numpy_erf.gelu(x.T), numpy_erf.gelu(np.ascontiguousarray(x.T)))


def test_the_backend_takes_the_float32_path_only_for_float32_exact_gelu(monkeypatch):
    backend = NumpyBackend()
    calls = []
    for name in ("erf", "gelu", "gelu_grad"):
        original = getattr(numpy_erf, name)
        monkeypatch.setattr(numpy_erf, name, lambda *a, _o=original, _n=name: calls.append(_n) or _o(*a))
    x32 = np.linspace(-3, 3, 11, dtype=np.float32)
    backend.erf(x32), backend.gelu(x32), backend.gelu_grad(x32, x32)
    assert calls == ["erf", "gelu", "gelu_grad"]
    calls.clear()
    x64 = x32.astype(np.float64)
    backend.gelu(x64), backend.gelu_grad(x64, x64)
    backend.gelu(x32, "tanh"), backend.gelu_grad(x32, x32, "tanh")
    assert calls == []
    np.testing.assert_allclose(backend.gelu(x64), x64 * _phi(x64), rtol=1e-14)
