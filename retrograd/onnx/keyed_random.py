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

import math
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
    return g.node("Reshape", [h, shape], allowzero=1)      # (a 0 in shape is a size, not a copy)


# --- normal draws: Box-Muller with + - * / only, as backends/keyed_random.py ----------------------

_LN2 = math.log(2.0)


def normal(g, h1: str, h2: str) -> str:
    """float64 standard normals from two hash arrays, operation for operation as the backends'
    ``normal`` (so the values are the same bit for bit)."""
    radius = _sqrt(g, g.node("Mul", [g.const(-2.0, "float64"), _log_of_hash(g, h1)]))
    u = g.node("Mul", [g.cast(h2, "float64"), g.const(2.0 ** -32, "float64")])
    return g.node("Mul", [radius, _cos_2pi(g, u)])


def _f(g, value: float) -> str:
    return g.const(value, "float64")


def _shift_left_of_one(g, e: str) -> str:
    """``1 << e`` (int64 e >= 0) as float64."""
    one = g.fill(g.shape(e), 1, "uint64")
    return g.cast(g.node("BitShift", [one, g.cast(e, "uint64")], direction="LEFT"), "float64")


def _log_of_hash(g, h: str) -> str:
    e = g.fill(g.shape(h), 0, "int64")
    hu = g.cast(h, "uint64")
    for step in (16, 8, 4, 2, 1):                     # e = floor(log2 h) (0 for h = 0)
        shifted = g.node("BitShift", [hu, g.cast(g.node("Add", [e, g.const(step, "int64")]), "uint64")],
                         direction="RIGHT")
        above = g.cast(g.node("Greater", [shifted, g.const(0, "uint64")]), "int64")
        e = g.node("Add", [e, g.node("Mul", [above, g.const(step, "int64")])])
    m = g.node("Div", [g.node("Add", [g.cast(h, "float64"), _f(g, 0.5)]), _shift_left_of_one(g, e)])
    e = g.cast(e, "float64")
    high = g.node("Greater", [m, _f(g, math.sqrt(2.0))])
    low = g.node("Less", [m, _f(g, math.sqrt(0.5))])
    m = g.node("Where", [high, g.node("Mul", [m, _f(g, 0.5)]),
                         g.node("Where", [low, g.node("Mul", [m, _f(g, 2.0)]), m])])
    e = g.node("Where", [high, g.node("Add", [e, _f(g, 1.0)]),
                         g.node("Where", [low, g.node("Sub", [e, _f(g, 1.0)]), e])])
    s = g.node("Div", [g.node("Sub", [m, _f(g, 1.0)]), g.node("Add", [m, _f(g, 1.0)])])
    z = g.node("Mul", [s, s])
    series = g.node("Add", [g.node("Mul", [s, _f(g, 0.0)]), _f(g, 1.0 / 23.0)])
    for n in range(21, 0, -2):                        # 1 + z/3 + z**2/5 + ... + z**11/23
        series = g.node("Add", [g.node("Mul", [series, z]), _f(g, 1.0 / n)])
    return g.node("Add", [g.node("Mul", [g.node("Mul", [_f(g, 2.0), s]), series]),
                          g.node("Mul", [g.node("Sub", [e, _f(g, 32.0)]), _f(g, _LN2)])])


def _sqrt(g, r: str) -> str:
    q = g.node("Mul", [r, _f(g, 4.0 ** 20)])
    k = g.node("Mul", [q, _f(g, 0.0)])
    for step in (32, 16, 8, 4, 2, 1):
        big = g.node("GreaterOrEqual", [q, _f(g, 4.0 ** step)])
        q = g.node("Where", [big, g.node("Mul", [q, _f(g, 4.0 ** -step)]), q])
        k = g.node("Add", [k, g.node("Mul", [g.cast(big, "float64"), _f(g, float(step))])])
    y = g.node("Add", [_f(g, 0.5), g.node("Mul", [_f(g, 0.375), q])])
    for _ in range(6):
        y = g.node("Mul", [_f(g, 0.5), g.node("Add", [y, g.node("Div", [q, y])])])
    scale = _shift_left_of_one(g, g.cast(k, "int64"))
    return g.node("Mul", [g.node("Mul", [y, scale]), _f(g, 2.0 ** -20)])


def _cos_2pi(g, u: str) -> str:
    a = g.node("Abs", [g.node("Sub", [u, g.node("Floor", [g.node("Add", [u, _f(g, 0.5)])])])])
    flip = g.node("Greater", [a, _f(g, 0.25)])
    a = g.node("Where", [flip, g.node("Sub", [_f(g, 0.5), a]), a])
    x = g.node("Mul", [_f(g, 2.0 * math.pi), a])
    x2 = g.node("Mul", [x, x])
    minus_x2 = g.node("Neg", [x2])
    series = g.node("Add", [g.node("Mul", [x, _f(g, 0.0)]), _f(g, 1.0 / math.factorial(24))])
    for n in range(22, -1, -2):
        series = g.node("Add", [g.node("Mul", [series, minus_x2]), _f(g, 1.0 / math.factorial(n))])
    return g.node("Where", [flip, g.node("Neg", [series]), series])
