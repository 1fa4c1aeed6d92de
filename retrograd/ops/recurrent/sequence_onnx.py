"""ONNX helpers the whole-layer sequence ops (``LSTMSequence``, ``GRUSequence``) share: time-major
``[T, N, ...]`` values read row by row, flipped in time, and shaped."""
from __future__ import annotations


def time_major_shape(g, x: str, width: int) -> str:
    """``[T, N, width]`` for ``x [T, N, D]``, as an ONNX shape value."""
    return g.node("Concat", [g.node("Slice", [g.shape(x), g.const([0], "int64"), g.const([2], "int64")]),
                             g.const([width], "int64")], axis=0)


def rows_at(g, values: str, t: str) -> str:
    """Row ``t`` (a 0-d int64 value) of ``values`` along time."""
    return g.node("Gather", [values, t], axis=0)


def flip_time(g, value: str) -> str:
    """``value`` with its first (time) axis reversed."""
    big = 2 ** 62
    return g.node("Slice", [value, g.const([-1], "int64"), g.const([-big], "int64"), g.const([0], "int64"),
                            g.const([-1], "int64")])


def input_projection(g, x: str, w: str, b: str | None, reverse: bool) -> tuple[str, str]:
    """(``x`` in processing order, its projection ``x @ w (+ b)`` for every step at once): what a
    recurrent layer's ``Loop`` reads row by row."""
    if reverse:
        x = flip_time(g, x)
    proj = g.node("MatMul", [x, w])
    return x, (proj if b is None else g.node("Add", [proj, b]))
