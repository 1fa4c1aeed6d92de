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
     ``low + (high - low) * u`` in float64, rounded once to the dtype;
   * normal(mean, std): Box-Muller in float64 from two hashes (key words
     ``k0 ^ 0x5bd1e995`` for the second): ``u1 = (h1 + 0.5) * 2**-32``,
     ``z = sqrt(-2 log u1) * cos(2 pi h2 * 2**-32)``, ``mean + std * z``,
     rounded once to the dtype.

Integer draws and uniform/keep-mask draws are exact on every backend (integer
ops, and IEEE-rounded float64 ``+``/``*``). Normal draws use the library's
float64 ``log``/``cos``, which different libraries compute to within one unit
in the last place; rounded to float32 they agree bit for bit unless a value
falls within 1e-16 of a float32 rounding boundary (about one element in 10**8),
and float64 normals agree to 1 ulp.
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
    """Uniform [low, high) values of ``dtype`` (a dtype object of ``xp``)."""
    u = xp.astype(hash_bits(xp, key, shape, device=device), xp.float64) * 2.0 ** -32
    return xp.astype(low + (high - low) * u, dtype)


def normal(xp, key, shape, mean: float, std: float, dtype, *, device=None):
    """Normal(mean, std) values of ``dtype`` by Box-Muller in float64."""
    h1 = xp.astype(hash_bits(xp, key, shape, device=device), xp.float64)
    h2 = xp.astype(hash_bits(xp, key, shape, device=device, salt=0x5BD1E995), xp.float64)
    radius = xp.sqrt(-2.0 * xp.log((h1 + 0.5) * 2.0 ** -32))
    z = radius * xp.cos((2.0 * math.pi * 2.0 ** -32) * h2)
    return xp.astype(mean + std * z, dtype)
