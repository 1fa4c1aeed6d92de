"""The keyed random generator (``retrograd/backends/keyed_random.py``) as ONNX integer ops.

Same algorithm, same numbers: a key ``(seed, run id, loop key, iteration,
...)`` is folded into two 32-bit words with ``lowbias32`` and element ``i``
gets ``mix(mix(low32(i) ^ k0) ^ k1 ^ high32(i))``. The parts of the key known
when exporting (the op's seed, loop keys) are folded on the host; the run id
(a model input) and loop iterations are folded in the graph. Everything runs
in int64 on values below 2**32, so ``>>`` is a division by a power of two
and the products stay below 2**63, as in the backends.
"""
from __future__ import annotations

from typing import Sequence

from ..backends.keyed_random import mix_int

MASK = 0xFFFFFFFF
M1 = 0x7FEB352D
M2 = 0x846CA68B - (1 << 32)
START = 0x243F6A88
FINAL = 0x9E3779B9


def mix(g, x: str) -> str:
    """``lowbias32`` of an int64 value holding 32-bit words."""
    def xorshift(v, bits):
        return g.node("BitwiseXor", [v, g.node("Div", [v, g.const(1 << bits, "int64")])])

    def times(v, c):
        return g.node("BitwiseAnd", [g.node("Mul", [v, g.const(c, "int64")]), g.const(MASK, "int64")])
    return xorshift(times(xorshift(times(xorshift(x, 16), M1), 15), M2), 16)


def _xor(g, a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a ^ b
    return g.node("BitwiseXor", [g.const(a, "int64") if isinstance(a, int) else a,
                                 g.const(b, "int64") if isinstance(b, int) else b])


def _mix_any(g, x):
    return mix_int(x) if isinstance(x, int) else mix(g, x)


def fold(g, key: Sequence) -> tuple:
    """(k0, k1) of a key whose items are ints or ONNX int64 scalars (>= 0): ints or ONNX values."""
    s = START
    for value in key:
        if isinstance(value, int):
            value &= (1 << 64) - 1
            low, high = value & MASK, value >> 32
        else:
            low = g.node("BitwiseAnd", [value, g.const(MASK, "int64")])
            high = g.node("Div", [value, g.const(1 << 32, "int64")])
        s = _mix_any(g, _xor(g, s, low))
        s = _mix_any(g, _xor(g, s, high))
    return s, _mix_any(g, _xor(g, s, FINAL))


def hash_bits(g, key: Sequence, shape: str, salt: int = 0) -> str:
    """int64 32-bit hashes of every element index, shaped by the int64 1-D ONNX value ``shape``."""
    k0, k1 = fold(g, key)
    k0 = _xor(g, k0, salt) if salt else k0
    count = g.node("ReduceProd", [shape], keepdims=0)
    i = g.node("Range", [g.const(0, "int64"), count, g.const(1, "int64")])
    low = g.node("BitwiseAnd", [i, g.const(MASK, "int64")])
    high = g.node("Div", [i, g.const(1 << 32, "int64")])
    h = mix(g, _xor(g, _xor(g, mix(g, _xor(g, low, k0)), k1), high))
    return g.node("Reshape", [h, shape])
