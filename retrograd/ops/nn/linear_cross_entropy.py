"""``linear_cross_entropy``: the loss of an output layer without materialising all of its logits.

``softmax_cross_entropy(h @ w + b, labels)`` per row holds ``[N, V]`` logits,
their softmax and their gradient at once; with a large vocabulary ``V`` that
is the largest tensor of a language model's step. Here the forward and the
backward run over chunks of ``chunk_rows`` rows: each chunk's logits are
made, reduced and dropped. The forward keeps only each row's log-sum-exp
(``[N]``); the backward makes each chunk's logits again and accumulates the
gradients of ``w`` and ``b`` over chunks (what the forward saves in memory it
pays in one more ``h @ w`` GEMM).

ONNX: a ``Loop`` over chunks (rows padded to whole chunks; the padding is
dropped again), so an exported model holds one chunk's logits at a time too.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import ProgramError, ShapeError
from ...ir.program import Var
from ..core.lowering import lowers
from ..core.registry import append_op, defop
from ..core.shapes import require_float
from ..array.tensor import INT_DTYPES, check_ids, checked_ids_onnx

# The automatic chunk: as many rows as make this many bytes of logits, and at least MIN_ROWS rows:
# the weight gradient's GEMM sums over a chunk's rows, and a few dozen rows (4 MB of logits at
# V = 32768) leave it memory-bound on [H, V] partial sums (3x slower than the materialised loss).
CHUNK_BYTES = 32 << 20
MIN_ROWS = 256


def _rule(ins, attrs):
    h, w, labels = ins[0], ins[1], ins[-1]
    require_float(h, "h")
    if w.ndim != 2 or h.ndim < 1 or w.dtype != h.dtype:
        raise ShapeError(f"h must be [..., H] and w [H, V] of h's dtype, got h {h.type_str()} and "
                         f"w {w.type_str()}")
    if h.shape[-1] >= 0 and w.shape[0] >= 0 and h.shape[-1] != w.shape[0]:
        raise ShapeError(f"h {h.type_str()} and w {w.type_str()} do not chain: H differs")
    if len(ins) == 4:
        b = ins[2]
        if b.ndim != 1 or b.dtype != h.dtype or (b.shape[0] >= 0 and w.shape[1] >= 0 and b.shape[0] != w.shape[1]):
            raise ShapeError(f"b must be [V] = [{w.shape[1]}] of h's dtype, got {b.type_str()}")
    if labels.dtype not in INT_DTYPES or labels.ndim != h.ndim - 1:
        raise ShapeError(f"labels must be int64 [...] with h's leading shape, got {labels.type_str()} "
                         f"for h {h.type_str()}")
    for a, c in zip(h.shape[:-1], labels.shape):
        if a >= 0 and c >= 0 and a != c:
            raise ShapeError(f"labels {labels.type_str()} do not match h {h.type_str()}")
    rows = tuple(a if a >= 0 else c for a, c in zip(h.shape[:-1], labels.shape))
    return [(rows, h.dtype), (rows, h.dtype)]


def _chunks(n: int, size: int):
    return [(start, min(start + size, n)) for start in range(0, n, size)]


def _flat(xp, h, labels):
    rows = math.prod(h.shape[:-1])           # (not -1: with hidden size 0, h has no elements)
    return xp.reshape(h, (rows, h.shape[-1])), xp.reshape(labels, (rows,))


def _chunk_logits(k, h_c, w, b):
    logits = k.backend.matmul(h_c, w)
    return logits if b is None else logits + b


def _picked(xp, logits, labels_c):
    """``logits[i, labels_c[i]]`` per row (a one-hot mask: every backend has it)."""
    hot = xp.arange(logits.shape[-1], dtype=labels_c.dtype) == xp.expand_dims(labels_c, axis=-1)
    return xp.sum(xp.where(hot, logits, xp.zeros_like(logits)), axis=-1), hot


def _split(ins):
    """(h, w, b or None, labels) of the forward op's inputs."""
    return (ins[0], ins[1], ins[2], ins[3]) if len(ins) == 4 else (ins[0], ins[1], None, ins[2])


def _grad(g):
    h, w, b, labels = _split(g.x)
    ins = [h, w] + ([b] if b is not None else []) + [labels, g.out[1], g.dy]
    outs = append_op("LinearCrossEntropyGrad", ins, dict(g.attrs), name="linear_xent_grad")
    return outs + [None] if b is not None else [outs[0], outs[1], None]


@defop("LinearCrossEntropy", inputs=("h", "w", "b?", "labels"), outputs=("loss", "lse"), infer=_rule,
       grad=_grad, nondiff=(3,), row_wise=(0, -1),
       flops=lambda ins, outs, attrs: 2 * math.prod(ins[0]) * ins[1][-1])
def _linear_cross_entropy(k, *ins):
    """Per row ``logsumexp(h @ w + b) - (h @ w + b)[label]``, ``chunk_rows`` rows at a time."""
    xp = k.xp
    h, w, b, labels = _split(ins)
    flat_h, flat_labels = _flat(xp, h, labels)
    check_ids(xp, flat_labels, w.shape[1], "label", k)
    losses, lses = [], []
    for start, stop in _chunks(flat_h.shape[0], k.attrs["chunk_rows"]):
        logits = _chunk_logits(k, flat_h[start:stop], w, b)
        top = xp.max(logits, axis=-1, keepdims=True)
        lse = xp.log(xp.sum(xp.exp(logits - top), axis=-1)) + top[:, 0]
        picked, _ = _picked(xp, logits, flat_labels[start:stop])
        losses.append(lse - picked)
        lses.append(lse)
    shape = tuple(labels.shape)
    if not losses:
        empty = xp.zeros(shape, dtype=h.dtype)
        return empty, xp.zeros(shape, dtype=h.dtype)
    return xp.reshape(xp.concat(losses), shape), xp.reshape(xp.concat(lses), shape)


def _grad_rule(ins, attrs):
    h, w = ins[0], ins[1]
    specs = [(h.shape, h.dtype), (w.shape, w.dtype)]
    return specs + [(ins[2].shape, ins[2].dtype)] if len(ins) == 6 else specs


@defop("LinearCrossEntropyGrad", inputs=("h", "w", "b?", "labels", "lse", "dloss"),
       outputs=("dh", "dw", "db?"), infer=_grad_rule)
def _linear_cross_entropy_grad(k, *ins):
    """Per chunk ``p = softmax(h @ w + b) - onehot(label)`` scaled by ``dloss``: ``dh = p @ w.T``,
    ``dw += h.T @ p``, ``db += sum(p)``."""
    xp = k.xp
    (h, w, b, labels), lse, dloss = _split(ins[:-2]), ins[-2], ins[-1]
    flat_h, flat_labels = _flat(xp, h, labels)
    flat_lse, flat_dloss = xp.reshape(lse, (-1,)), xp.reshape(dloss, (-1,))
    dw = xp.zeros(tuple(w.shape), dtype=w.dtype)
    db = None if b is None else xp.zeros(tuple(b.shape), dtype=b.dtype)
    dh = []
    # dw and db are this kernel's own buffers: summed in place (a [H, V] array per chunk otherwise)
    for start, stop in _chunks(flat_h.shape[0], k.attrs["chunk_rows"]):
        h_c = flat_h[start:stop]
        logits = _chunk_logits(k, h_c, w, b)
        _, hot = _picked(xp, logits, flat_labels[start:stop])
        p = xp.exp(logits - xp.expand_dims(flat_lse[start:stop], axis=-1))
        p = (p - xp.astype(hot, p.dtype)) * xp.expand_dims(flat_dloss[start:stop], axis=-1)
        dh.append(k.backend.matmul(p, w, transpose_y=True))
        dw += k.backend.matmul(h_c, p, transpose_x=True)
        if db is not None:
            db += xp.sum(p, axis=0)
    dh = xp.reshape(xp.concat(dh), tuple(h.shape)) if dh else xp.zeros(tuple(h.shape), dtype=h.dtype)
    return (dh, dw) if db is None else (dh, dw, db)


def linear_cross_entropy(h: Var, w: Var, b: Var | None, labels: Var, chunk_rows: int | None = None) -> Var:
    """Per-row ``softmax_cross_entropy(h @ w + b, labels)`` without materialising all the logits.

    Forward and backward run ``chunk_rows`` rows at a time, so the peak holds
    one chunk's ``[chunk_rows, V]`` logits instead of ``[N, V]``; the backward
    makes each chunk's logits again. Gradients flow to ``h``, ``w`` and ``b``
    (first order).

    Args:
        h: A float Var ``[..., H]`` (the last hidden layer).
        w: The output weights ``[H, V]``.
        b: The output bias ``[V]``, or None.
        labels: int64 ``[...]``.
        chunk_rows: Rows per chunk; None: as many rows as make about 32 MB of
            logits, 256 at least.

    Returns:
        The loss per row ``[...]``.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            h = rg.data("h", [-1, 4])
            w = rg.data("w", [4, 10])
            labels = rg.data("labels", [-1], dtype="int64")
            loss = rg.linear_cross_entropy(h, w, None, labels, chunk_rows=2)
            reference = rg.softmax_cross_entropy(h @ w, labels)
        feed = {"h": np.random.rand(5, 4).astype("float32"), "w": np.random.rand(4, 10).astype("float32"),
                "labels": np.array([0, 1, 2, 3, 9])}
        a, b = rg.Executor().run(main, feed=feed, fetch_list=[loss, reference])
        assert np.allclose(a, b, atol=1e-5)
        ```
    """
    for name, var in (("h", h), ("w", w), ("labels", labels)) + ((("b", b),) if b is not None else ()):
        if not isinstance(var, Var):
            raise ProgramError(f"linear_cross_entropy: {name} must be a Var, got {type(var).__name__}")
    if w.ndim != 2 or w.shape[1] < 1:
        raise ShapeError(f"linear_cross_entropy: w must be [H, V] with V known, got {w.type_str()}")
    if chunk_rows is None:
        chunk_rows = max(MIN_ROWS, CHUNK_BYTES // (w.shape[1] * np.dtype(w.dtype).itemsize))
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise ProgramError(f"linear_cross_entropy: chunk_rows must be a positive int, got {chunk_rows!r}")
    ins = [h, w] + ([b] if b is not None else []) + [labels]
    return append_op("LinearCrossEntropy", ins, {"chunk_rows": int(chunk_rows)}, name="linear_xent")[0]


# --- ONNX: a Loop over chunks -------------------------------------------------------------------

def _padded_rows(g, value: str, rows: str, padded: str, width: list[int]) -> str:
    """``value`` reshaped to ``[rows, *width]`` and padded with zero rows to ``padded`` rows."""
    flat = g.node("Reshape", [value, g.node("Concat", [g.node("Unsqueeze", [rows, g.const([0], "int64")]),
                                                       g.const(width, "int64")], axis=0)], allowzero=1) \
        if width else g.node("Reshape", [value, g.node("Unsqueeze", [rows, g.const([0], "int64")])])
    extra = g.node("Sub", [padded, rows])
    pads = g.node("Concat", [g.const([0] * (1 + len(width)), "int64"),
                             g.node("Unsqueeze", [extra, g.const([0], "int64")]),
                             g.const([0] * len(width), "int64")], axis=0)
    return g.node("Pad", [flat, pads])


def _loop_setup(g, h: str, h_var: Var):
    """(rows, chunk, count, padded rows) as int64 scalars for ``h [..., H]``."""
    chunk = g.const(g.attrs["chunk_rows"], "int64")
    rows = g.node("ReduceProd", [g.node("Slice", [g.shape(h), g.const([0], "int64"), g.const([-1], "int64")])],
                  keepdims=0) if h_var.ndim > 1 else g.const(1, "int64")
    count = g.node("Div", [g.node("Add", [rows, g.node("Sub", [chunk, g.const(1, "int64")])]), chunk])
    return rows, chunk, count, g.node("Mul", [count, chunk])


def _body_rows(body, value: str, i: str, chunk: str) -> str:
    start = body.node("Mul", [i, chunk])
    return body.node("Slice", [value, body.node("Unsqueeze", [start, body.const([0], "int64")]),
                               body.node("Unsqueeze", [body.node("Add", [start, chunk]), body.const([0], "int64")]),
                               body.const([0], "int64")])


def _body_logits(body, h_c: str, w: str, b: str | None) -> str:
    logits = body.node("MatMul", [h_c, w])
    return logits if b is None else body.node("Add", [logits, b])


def _body_hot(body, logits: str, labels_c: str, dtype: str) -> str:
    classes = body.node("Range", [body.const(0, "int64"), body.node("Squeeze", [body.node(
        "Slice", [body.shape(logits), body.const([-1], "int64"), body.const([2], "int64")]), body.const([0], "int64")]),
        body.const(1, "int64")])
    return body.cast(body.node("Equal", [body.node("Unsqueeze", [labels_c, body.const([-1], "int64")]), classes]),
                     dtype)


@lowers("LinearCrossEntropy")
def _linear_cross_entropy_onnx(g):
    h_var, w_var = g.in_vars[0], g.in_vars[1]
    dtype, has_b = h_var.dtype, len(g.ins) == 4
    w, b = g.ins[1], (g.ins[2] if has_b else None)
    labels = checked_ids_onnx(g, len(g.ins) - 1, g.scalar_dim(w, 1), "label")
    rows, chunk, count, padded = _loop_setup(g, g.ins[0], h_var)
    h = _padded_rows(g, g.ins[0], rows, padded, [w_var.shape[0]])
    labels = _padded_rows(g, labels, rows, padded, [])
    body = g.child()
    i = body.input("i", "int64", [])
    cond = body.input("cond", "bool", [])
    logits = _body_logits(body, _body_rows(body, h, i, chunk), w, b)
    top = body.node("ReduceMax", [logits, body.const([-1], "int64")], keepdims=1)
    lse = body.node("Add", [body.node("Log", [body.node("ReduceSum", [body.node("Exp", [body.node("Sub", [logits, top])]),
                                                                      body.const([-1], "int64")], keepdims=0)]),
                            body.node("Squeeze", [top, body.const([-1], "int64")])])
    hot = _body_hot(body, logits, _body_rows(body, labels, i, chunk), dtype)
    picked = body.node("ReduceSum", [body.node("Mul", [logits, hot]), body.const([-1], "int64")], keepdims=0)
    loss = body.node("Sub", [lse, picked])
    graph = body.finish("linear_xent_chunk", [(body.node("Identity", [cond]), "bool", []),
                                              (loss, dtype, [None]), (lse, dtype, [None])])
    loss_all, lse_all = g.node("Loop", [count, g.const(True, "bool")], n_out=2, body=graph)
    shape = g.node("Slice", [g.shape(g.ins[0]), g.const([0], "int64"), g.const([-1], "int64")])
    return [_unpadded(g, stacked, rows, shape) for stacked in (loss_all, lse_all)]


def _unpadded(g, stacked: str, rows: str, shape: str, width: list[int] = ()) -> str:
    """A Loop's stacked ``[count, chunk, *width]`` output as the first ``rows`` rows, in ``shape``."""
    total = g.node("ReduceProd", [g.node("Shape", [stacked], end=2)], keepdims=1)    # (width may be 0)
    flat = g.node("Reshape", [stacked, g.node("Concat", [total, g.const(list(width), "int64")], axis=0)],
                  allowzero=1)
    kept = g.node("Slice", [flat, g.const([0], "int64"), g.node("Unsqueeze", [rows, g.const([0], "int64")]),
                            g.const([0], "int64")])
    return g.node("Reshape", [kept, shape], allowzero=1)


@lowers("LinearCrossEntropyGrad")
def _linear_cross_entropy_grad_onnx(g):
    h_var, w_var = g.in_vars[0], g.in_vars[1]
    dtype, has_b = h_var.dtype, len(g.ins) == 6
    w, b = g.ins[1], (g.ins[2] if has_b else None)
    labels_i = 3 if has_b else 2
    rows, chunk, count, padded = _loop_setup(g, g.ins[0], h_var)
    hidden = w_var.shape[0]
    h = _padded_rows(g, g.ins[0], rows, padded, [hidden])
    labels, lse, dloss = (_padded_rows(g, g.ins[j], rows, padded, []) for j in (labels_i, labels_i + 1, labels_i + 2))
    body = g.child()
    i = body.input("i", "int64", [])
    cond = body.input("cond", "bool", [])
    dw_in = body.input("dw", dtype, list(w_var.shape))
    db_in = body.input("db", dtype, [w_var.shape[1]]) if has_b else None
    h_c = _body_rows(body, h, i, chunk)
    logits = _body_logits(body, h_c, w, b)
    p = body.node("Exp", [body.node("Sub", [logits, body.node("Unsqueeze", [_body_rows(body, lse, i, chunk),
                                                                            body.const([-1], "int64")])])])
    p = body.node("Sub", [p, _body_hot(body, logits, _body_rows(body, labels, i, chunk), dtype)])
    p = body.node("Mul", [p, body.node("Unsqueeze", [_body_rows(body, dloss, i, chunk), body.const([-1], "int64")])])
    dh = body.node("MatMul", [p, body.node("Transpose", [w], perm=[1, 0])])
    dw = body.node("Add", [dw_in, body.node("MatMul", [body.node("Transpose", [h_c], perm=[1, 0]), p])])
    outs = [(body.node("Identity", [cond]), "bool", []), (dw, dtype, list(w_var.shape))]
    if has_b:
        outs.append((body.node("Add", [db_in, body.node("ReduceSum", [p, body.const([0], "int64")], keepdims=0)]),
                     dtype, [w_var.shape[1]]))
    outs.append((dh, dtype, [None, hidden]))
    graph = body.finish("linear_xent_grad_chunk", outs)
    zeros = [g.fill(g.shape(w), 0.0, dtype)] + ([g.fill(g.shape(b), 0.0, dtype)] if has_b else [])
    results = g.nodes("Loop", [count, g.const(True, "bool"), *zeros], n_out=len(zeros) + 1, body=graph)
    dh_all = _unpadded(g, results[-1], rows, g.shape(g.ins[0]), [hidden])
    return [dh_all, *results[:-1]]
