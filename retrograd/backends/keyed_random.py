"""Keyed random draws that give the same numbers on every backend.

A random op draws from a *key*: a tuple of Python ints (the op's seed, the
run's id, the loop iterations it runs in; see ``ops/streams.py``). The numbers
are a pure function of (key, element index), computed on the device with the
array namespace's integer operations, so NumPy, PyTorch (CPU or CUDA), CuPy and
array-api-strict produce them bit for bit alike, and no host-side generator
state exists to keep in sync.

The algorithm (simple enough to write as ONNX integer ops later):

1. The key is folded on the host into two 32-bit words ``k0, k1``::

       s = 0x243F6A88
       for each int v of the key (taken modulo 2**64, low word first):
           s = mix(s ^ low32(v)); s = mix(s ^ high32(v))
       k0 = s; k1 = mix(s ^ 0x9E3779B9)

2. Element ``i`` (row-major index, an int64 ``arange``) gets the 32-bit hash::

       h(i) = mix(mix(low32(i) ^ k0) ^ k1 ^ high32(i))

   where ``mix`` is Chris Wellons' ``lowbias32`` integer hash
   (``x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16``,
   all modulo 2**32), a bijection of 32-bit words with good avalanche.
   Everything runs in int64: a multiplier ``c >= 2**31`` is used as
   ``c - 2**32`` (the same modulo 2**32), so no product leaves the int64 range
   (|x * c| < 2**63) and masking with ``0xFFFFFFFF`` gives the 32-bit result
   on every library without relying on overflow behaviour.
3. Draws from the hash:

   * keep mask (dropout): ``h < floor(keep_prob * 2**32)``: exact integer compare;
   * uniform(low, high): ``u = h * 2**-32`` in [0, 1) (exact in float64), then
     ``low + (high - low) * u`` in float64, rounded once to the dtype (a float32
     value can round up to ``high`` itself);
   * normal(mean, std): Box-Muller in float64 from two hashes (key words
     ``k0 ^ 0x5bd1e995`` for the second): ``u1 = (h1 + 0.5) * 2**-32``,
     ``z = sqrt(-2 log u1) * cos(2 pi h2 * 2**-32)``, ``mean + std * z``,
     rounded once to the dtype. ``log``, ``sqrt`` and ``cos`` are computed
     here with ``+ - * /`` and exact scalings by powers of two (libraries'
     own float64 ``sqrt``/``cos`` differ in the last bit: torch's CPU ``sqrt``
     is not correctly rounded), so that every backend gets the same bits:

     - ``log v`` for ``v = h1 + 0.5``: ``v = m * 2**e`` with the exponent found
       by integer shifts, ``m`` folded into [sqrt(1/2), sqrt 2], then
       ``log m = 2 atanh(s)``, ``s = (m - 1)/(m + 1)``, by its series to s**23;
     - ``sqrt r``: ``r = q * 4**k`` with ``q`` in [1, 4) (exact scalings by
       powers of 4), six Newton steps ``y = (y + q/y)/2`` from a linear guess;
     - ``cos(2 pi u)``: ``u`` is reduced exactly to ``a`` in [0, 1/4] with the
       sign of the quadrant, then the Taylor series of cos to x**24.

Integer draws and uniform/keep-mask draws are exact on every backend (integer
ops, and IEEE-rounded float64 ``+``/``*``); normal draws use only IEEE-rounded
``+ - * /`` too, each a separate elementwise op (no fused multiply-add), so
they agree bit for bit as well.
"""
from __future__ import annotations

import math

_MASK = 0xFFFFFFFF
_M1 = 0x7FEB352D
_M2 = 0x846CA68B - (1 << 32)   # 0x846ca68b as a negative int64: same product modulo 2**32


def mix_int(x: int) -> int:
    """``lowbias32`` on a Python int (the host half: folding the key)."""
    x &= _MASK
    x ^= x >> 16
    x = (x * _M1) & _MASK
    x ^= x >> 15
    x = (x * _M2) & _MASK
    x ^= x >> 16
    return x


def key_words(key) -> tuple[int, int]:
    """Fold a key (an int or a sequence of ints) into two 32-bit words."""
    values = [key] if isinstance(key, int) else list(key)
    s = 0x243F6A88
    for value in values:
        value = int(value) & ((1 << 64) - 1)
        s = mix_int(s ^ (value & _MASK))
        s = mix_int(s ^ (value >> 32))
    return s, mix_int(s ^ 0x9E3779B9)


def _mix(x):
    """``lowbias32`` on an int64 array holding 32-bit values (any namespace)."""
    x = x ^ (x >> 16)
    x = (x * _M1) & _MASK
    x = x ^ (x >> 15)
    x = (x * _M2) & _MASK
    return x ^ (x >> 16)


def hash_bits(xp, key, shape, *, device=None, salt: int = 0):
    """32-bit hashes (int64 array of ``shape``) of every element index under ``key``."""
    k0, k1 = key_words(key)
    k0 ^= salt
    count = math.prod(shape)
    kwargs = {} if device is None else {"device": device}
    i = xp.arange(count, dtype=xp.int64, **kwargs)
    h = _mix(_mix((i & _MASK) ^ k0) ^ k1 ^ (i >> 32))
    return xp.reshape(h, tuple(shape))


def keep_mask(xp, key, shape, keep_prob: float, *, device=None):
    """Bernoulli(keep_prob) as a bool array."""
    threshold = min(int(math.floor(keep_prob * 2.0 ** 32)), 1 << 32)
    return hash_bits(xp, key, shape, device=device) < threshold


def uniform(xp, key, shape, low: float, high: float, dtype, *, device=None):
    """Uniform values in [low, high) of ``dtype`` (a dtype object of ``xp``; float32 rounding
    can give ``high``)."""
    u = xp.astype(hash_bits(xp, key, shape, device=device), xp.float64) * 2.0 ** -32
    return xp.astype(low + (high - low) * u, dtype)


def normal(xp, key, shape, mean: float, std: float, dtype, *, device=None):
    """Normal(mean, std) values of ``dtype`` by Box-Muller in float64 (exact arithmetic only)."""
    h1 = hash_bits(xp, key, shape, device=device)
    h2 = hash_bits(xp, key, shape, device=device, salt=0x5BD1E995)
    radius = _sqrt(xp, -2.0 * _log_of_hash(xp, h1))
    z = radius * _cos_2pi(xp, xp.astype(h2, xp.float64) * 2.0 ** -32)
    return xp.astype(mean + std * z, dtype)


_LN2 = math.log(2.0)


def _log_of_hash(xp, h):
    """log((h + 0.5) * 2**-32) for 32-bit hashes ``h``: a log of a value in (0, 1)."""
    e = xp.zeros_like(h)
    for step in (16, 8, 4, 2, 1):                     # e = floor(log2 h) (0 for h = 0)
        e = e + xp.astype((h >> (e + step)) > 0, xp.int64) * step
    m = (xp.astype(h, xp.float64) + 0.5) / xp.astype(xp.ones_like(h) << e, xp.float64)   # in [0.5, 2)
    e = xp.astype(e, xp.float64)
    high, low = m > math.sqrt(2.0), m < math.sqrt(0.5)
    m = xp.where(high, m * 0.5, xp.where(low, m * 2.0, m))
    e = xp.where(high, e + 1.0, xp.where(low, e - 1.0, e))
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    series = xp.zeros_like(s) + 1.0 / 23.0
    for n in range(21, 0, -2):                        # 1 + z/3 + z**2/5 + ... + z**11/23
        series = series * z + 1.0 / n
    return 2.0 * s * series + (e - 32.0) * _LN2


def _sqrt(xp, r):
    """sqrt(r) for r in (1e-10, 100): r = q * 4**k, q in [1, 4), Newton on q."""
    q = r * 4.0 ** 20                                 # >= 1 for every r this module makes
    k = xp.zeros_like(q)
    for step in (32, 16, 8, 4, 2, 1):
        big = q >= 4.0 ** step
        q = xp.where(big, q * 4.0 ** -step, q)
        k = k + xp.astype(big, xp.float64) * float(step)
    y = 0.5 + 0.375 * q                               # within 15% of sqrt(q) on [1, 4)
    for _ in range(6):
        y = 0.5 * (y + q / y)
    scale = xp.astype(xp.ones_like(xp.astype(k, xp.int64)) << xp.astype(k, xp.int64), xp.float64)
    return y * scale * 2.0 ** -20


def _cos_2pi(xp, u):
    """cos(2 pi u) for u in [0, 1): exact reduction to [0, 1/4], then Taylor to x**24."""
    a = xp.abs(u - xp.floor(u + 0.5))                # in [0, 1/2]: cos is even and 1-periodic
    flip = a > 0.25                                   # cos(2 pi a) = -cos(2 pi (1/2 - a))
    a = xp.where(flip, 0.5 - a, a)
    x = (2.0 * math.pi) * a
    x2 = x * x
    series = xp.zeros_like(x) + 1.0 / math.factorial(24)
    for n in range(22, -1, -2):
        series = series * (-x2) + 1.0 / math.factorial(n)
    return xp.where(flip, -series, series)


def integers(xp, key, shape, low: int, high: int, *, device=None):
    """int64 values uniform in [low, high) (``high - low <= 2**31``): ``low + (h * n) >> 32``,
    exact integer arithmetic (the product stays below 2**63)."""
    h = hash_bits(xp, key, shape, device=device)
    return low + ((h * (high - low)) >> 32)


def categorical(xp, key, logits, *, device=None):
    """int64 [N]: row i's category drawn with probabilities softmax(logits[i]) by inverting the
    cumulative sum of ``exp(logits - max)`` (float64) at ``u = h * 2**-32``: the number of
    categories whose cumulative weight is at most ``u`` times the row's total."""
    rows, count = logits.shape
    u = xp.astype(hash_bits(xp, key, (rows,), device=device), xp.float64) * 2.0 ** -32
    weights = xp.astype(logits, xp.float64)
    weights = xp.exp(weights - xp.max(weights, axis=1, keepdims=True))
    cumulative_sum = getattr(xp, "cumulative_sum", None) or xp.cumsum    # NumPy 1.26's namespace
    cdf = cumulative_sum(weights, axis=1)
    below = cdf <= xp.reshape(u, (rows, 1)) * cdf[:, count - 1:]
    return xp.minimum(xp.sum(xp.astype(below, xp.int64), axis=1), count - 1)
