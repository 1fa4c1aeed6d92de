"""One table-driven gradient test for every registered differentiable op.

``CASES`` maps each op type whose ``OpDef.grad`` is set to builders of test
cases: ``builder(rng) -> [(fn, inputs), ...]``. Each case is checked against
central finite differences in float64 with ``rg.testing.check_gradients``;
the core set is also checked for double backward (the gradient of a function
that itself calls ``rg.gradients``). ``test_every_differentiable_op_has_a_case``
fails as soon as an op is registered with a gradient maker and no entry here.

Inputs stay away from kinks and singularities: log/sqrt/div see positive or
bounded-away values, abs/relu/sign stay away from 0, maximum/minimum away
from ties, clip away from its bounds.
"""
from __future__ import annotations

import importlib
import pkgutil

import numpy as np
import pytest

import retrograd as rg
from retrograd.ops.math.elementwise import expand_as, sum_to
from retrograd.ops.nn.softmax_dropout import one_hot_like
from retrograd.ops.nn.softmax_dropout import softmax_cross_entropy_grad
from retrograd.ops.nn.batch_norm import batch_norm_grad
from retrograd.ops.nn.norm import layer_norm_grad, rms_norm_grad
from retrograd.ops.core.registry import append_op
from retrograd.ops.recurrent.cells import gru_unit_grad, lstm_unit_grad
from retrograd.ops.array.tensor import gather_grad, reshape_as, slice_grad, split_like
from retrograd.testing import check_gradients
from retrograd.ops.array.indexing import dynamic_slice, index_grad, key_items
from retrograd.ops.array.shape_ops import tile_grad


# --- input helpers ----------------------------------------------------------------------------

def normal(r, *shape):
    return r.standard_normal(shape)


def positive(r, *shape):
    return r.uniform(0.5, 2.0, shape)


def away_from_zero(r, *shape, margin=0.2):
    return r.choice([-1.0, 1.0], shape) * r.uniform(margin, 1.5, shape)


def apart_from(r, a, margin=0.2):
    """Values differing from ``a`` by at least ``margin`` elementwise (no ties)."""
    return a + away_from_zero(r, *np.shape(a), margin=margin)


def dims(r, count, low=2, high=5):
    return [int(d) for d in r.integers(low, high, count)]


def away_from_bounds(r, shape, lo=-0.5, hi=0.5, margin=0.15):
    """Values inside (lo, hi) or outside it, never within ``margin`` of a bound."""
    pieces = [(lo - 1.0, lo - margin), (lo + margin, hi - margin), (hi + margin, hi + 1.0)]
    which = r.integers(0, 3, shape)
    lows = np.array([p[0] for p in pieces])[which]
    highs = np.array([p[1] for p in pieces])[which]
    return r.uniform(lows, highs)


# --- the table ----------------------------------------------------------------------------------

def _unary(fn, make=normal):
    def cases(r):
        m, n = dims(r, 2)
        return [(fn, {"x": make(r, m, n)}), (fn, {"x": make(r, 3)}), (fn, {"x": make(r)})]
    return cases


def _binary(fn, make_a=normal, make_b=normal):
    """Same shapes, the broadcasting cases [3,4]+[4], [3,1]*[1,4], and scalar operands."""
    def cases(r):
        m, n = dims(r, 2)
        return [
            (fn, {"a": make_a(r, m, n), "b": make_b(r, m, n)}),
            (fn, {"a": make_a(r, 3, 4), "b": make_b(r, 4)}),
            (fn, {"a": make_a(r, 3, 1), "b": make_b(r, 1, 4)}),
            (fn, {"a": make_a(r, 2, 3), "b": make_b(r)}),
            (fn, {"a": make_a(r), "b": make_b(r, 2, 3)}),
            (fn, {"a": make_a(r, 2, 1, 3), "b": make_b(r, 4, 1)}),
        ]
    return cases


def _minmax(fn):
    def cases(r):
        a = normal(r, 3, 4)
        a_row = normal(r, 4)
        return [
            (fn, {"a": a, "b": apart_from(r, a)}),
            (fn, {"a": a, "b": apart_from(r, a_row * np.ones((3, 4)))[0]}),   # [3,4] vs [4]
            (fn, {"a": apart_from(r, np.full((2, 3), 0.3)), "b": np.array(0.3)}),
        ]
    return cases


def _matmul(r):
    m, k, n = dims(r, 3)
    return [
        (rg.matmul, {"a": normal(r, m, k), "b": normal(r, k, n)}),
        (lambda a, b: rg.matmul(a, b, transpose_x=True), {"a": normal(r, k, m), "b": normal(r, k, n)}),
        (lambda a, b: rg.matmul(a, b, transpose_y=True), {"a": normal(r, m, k), "b": normal(r, n, k)}),
        (lambda a, b: rg.matmul(a, b, transpose_x=True, transpose_y=True),
         {"a": normal(r, k, m), "b": normal(r, n, k)}),
        (rg.matmul, {"a": normal(r, 2, m, k), "b": normal(r, k, n)}),          # batch broadcast
        (rg.matmul, {"a": normal(r, 2, 1, 2, 3), "b": normal(r, 3, 3, 2)}),    # both broadcast
    ]


def _reduce(fn):
    def cases(r):
        a, b, c = dims(r, 3)
        x = normal(r, a, b, c)
        return [
            (lambda x: fn(x), {"x": x}),
            (lambda x: fn(x, axis=1), {"x": x}),
            (lambda x: fn(x, axis=[0, 2], keepdims=True), {"x": x}),
            (lambda x: fn(x, axis=-1, keepdims=False), {"x": x}),
            (lambda x: fn(x), {"x": normal(r)}),
        ]
    return cases


def _where(r):
    m, n = dims(r, 2)
    cond = r.random((m, n)) > 0.5
    return [
        (lambda c, a, b: rg.where(c, a, b), {"c": cond, "a": normal(r, m, n), "b": normal(r, m, n)}),
        (lambda c, a, b: rg.where(c, a, b), {"c": r.random((3, 1)) > 0.5, "a": normal(r, 4),
                                             "b": normal(r, 3, 4)}),
        (lambda c, a: rg.where(c, a, 0.0), {"c": cond, "a": normal(r, m, n)}),
    ]


def _clip(r):
    m, n = dims(r, 2)
    x = away_from_bounds(r, (m, n))
    return [
        (lambda x: rg.clip(x, -0.5, 0.5), {"x": x}),
        (lambda x: rg.clip(x, None, 0.5), {"x": x}),
        (lambda x: rg.clip(x, -0.5, None), {"x": x}),
    ]


def _pow(r):
    m, n = dims(r, 2)
    return [
        (rg.pow, {"a": positive(r, m, n), "b": normal(r, m, n)}),
        (rg.pow, {"a": positive(r, 3, 4), "b": normal(r, 4)}),
        (lambda a: rg.pow(a, 3.0), {"a": normal(r, 2, 3)}),
        (lambda a: rg.pow(a, 0.5), {"a": positive(r, 2, 3)}),
    ]


def _add_n(r):
    return [(lambda a, b, c: rg.add_n([a, b, c]), {"a": normal(r, 3, 4), "b": normal(r, 4),
                                                    "c": normal(r, 1, 4)}),
            (lambda a: rg.add_n([a, a]), {"a": normal(r, 2, 3)})]


def _cast(r):
    return [
        (lambda x: rg.cast(x, "float64"), {"x": normal(r, 2, 3)}),
        (lambda x, i: rg.cast(i, "float64") * x, {"x": normal(r, 2, 3), "i": r.integers(-3, 3, (2, 3))}),
        # through float32 and back: linear, so a large step is exact up to float32 rounding
        (lambda x: rg.cast(rg.cast(x, "float32"), "float64"), {"x": normal(r, 2, 3)},
         {"eps": 1e-2, "rtol": 1e-3, "atol": 1e-4}),
    ]


def _concat(r):
    return [
        (lambda a, b: rg.concat([a, b], 0), {"a": normal(r, 2, 3), "b": normal(r, 1, 3)}),
        (lambda a, b, c: rg.concat([a, b, c], axis=-1),
         {"a": normal(r, 2, 1), "b": normal(r, 2, 3), "c": normal(r, 2, 2)}),
        (lambda a: rg.concat([a, a * 2.0], 1), {"a": normal(r, 2, 2)}),
    ]


def _split(r):
    return [
        (lambda x: rg.split(x, 3, axis=0), {"x": normal(r, 6, 2)}),
        (lambda x: rg.split(x, [1, -1], axis=1), {"x": normal(r, 2, 4)}),
        (lambda x: rg.split(x, 2, axis=1)[1], {"x": normal(r, 3, 4)}),      # one piece unused
    ]


def _split_like(r):
    return [(lambda x, a, b: split_like(x, [a, b], 0),
             {"x": normal(r, 5, 3), "a": normal(r, 2, 3), "b": normal(r, 3, 3)})]


def _slice(r):
    return [
        (lambda x: rg.slice(x, [0], [1], [3]), {"x": normal(r, 4, 3)}),
        (lambda x: rg.slice(x, [1, 0], [-2, 0], [2**31, 2]), {"x": normal(r, 3, 5)}),
        (lambda x: rg.slice(x, [-1], [1], [-1]), {"x": normal(r, 2, 2, 4)}),
    ]


def _slice_grad(r):
    attrs = {"axes": [0], "starts": [1], "ends": [3]}
    return [(lambda dy, x: slice_grad(dy, x, attrs), {"dy": normal(r, 2, 3), "x": normal(r, 4, 3)})]


def _gather(r):
    return [
        (lambda x, ids: rg.gather(x, ids), {"x": normal(r, 5, 3), "ids": np.array([0, 2, 2, 4, 0])}),
        (lambda x, ids: rg.gather(x, ids), {"x": normal(r, 4, 2, 2), "ids": r.integers(0, 4, (2, 3))}),
    ]


def _gather_grad(r):
    return [(lambda dy, ids, x: gather_grad(dy, ids, x),
             {"dy": normal(r, 4, 3), "ids": np.array([1, 3, 1, 0]), "x": normal(r, 5, 3)})]


def _reshape(r):
    return [
        (lambda x: rg.reshape(x, [-1, 6]), {"x": normal(r, 2, 3, 2)}),
        (lambda x: rg.reshape(x, [12]), {"x": normal(r, 3, 4)}),
        (lambda x: rg.reshape(x, [1, 3, 1]), {"x": normal(r, 3)}),
    ]


def _transpose(r):
    return [
        (lambda x: rg.transpose(x, [1, 0]), {"x": normal(r, 2, 3)}),
        (lambda x: rg.transpose(x, [2, 0, 1]), {"x": normal(r, 2, 3, 4)}),
        (lambda x: rg.transpose(x), {"x": normal(r, 2, 1, 3)}),
    ]


def _softmax(fn):
    def cases(r):
        n, c = dims(r, 2)
        return [(lambda x: fn(x), {"x": normal(r, n, c)}),
                (lambda x: fn(x, axis=0), {"x": normal(r, n, c)}),
                (lambda x: fn(x, axis=1), {"x": normal(r, 2, 3, 2) * 3.0})]
    return cases


def _xent(r):
    n, c = dims(r, 2)
    return [
        (rg.softmax_cross_entropy, {"logits": normal(r, n, c), "labels": r.integers(0, c, n)}),
        (rg.softmax_cross_entropy, {"logits": normal(r, 2, 3, 4) * 4.0, "labels": r.integers(0, 4, (2, 3))}),
    ]


def _one_hot_like(r):
    return [(lambda labels, like: one_hot_like(labels, like) * like,
             {"labels": np.array([0, 2, 1]), "like": normal(r, 3, 4)})]


def _one_hot(r):
    return [(lambda labels, x: rg.one_hot(labels, 4, dtype="float64") * x,
             {"labels": np.array([3, 0, 1]), "x": normal(r, 3, 4)})]


def _dropout(r):
    # check_gradients replays the same mask in every run, so the function is smooth.
    return [(lambda x: rg.dropout(x, 0.4, seed=7), {"x": normal(r, 4, 5)}),
            (lambda x: rg.dropout(x * x, 0.5), {"x": normal(r, 3, 3)})]


def _expand_as(r):
    return [
        (lambda x, like: expand_as(x, like), {"x": normal(r, 3), "like": normal(r, 2, 3)}),
        (lambda x, like: expand_as(x, like, axes=[1]), {"x": normal(r, 3), "like": normal(r, 3, 4)}),
        (lambda x, like: expand_as(x, like, axes=[0], mean_axes=[0, 1]),
         {"x": normal(r, 1), "like": normal(r, 2, 1)}),
    ]


def _sum_to(r):
    return [(lambda x, like: sum_to(x, like), {"x": normal(r, 2, 3, 4), "like": normal(r, 3, 1)}),
            (lambda x, like: sum_to(x, like), {"x": normal(r, 3, 4), "like": normal(r, 3, 4)})]


def _all_reduce(r):
    # One process: the mean (sum) over the ranks is the identity; on 2 ranks the gradient is
    # checked in tests/distributed/test_ops.py.
    return [(lambda x: rg.distributed.all_reduce([x * x])[0], {"x": normal(r, 3, 4)}),
            (lambda x, y: rg.distributed.all_reduce([x, y * x], "sum")[1],
             {"x": normal(r, 2, 3), "y": normal(r, 2, 3)})]


def _squeeze(r):
    return [(lambda x: rg.squeeze(x, 1), {"x": normal(r, 3, 1, 2)}),
            (lambda x: rg.squeeze(x), {"x": normal(r, 1, 2, 1)})]


def _unsqueeze(r):
    return [(lambda x: rg.unsqueeze(x, -1), {"x": normal(r, 3, 2)}),
            (lambda x: rg.unsqueeze(x, [0, 2]), {"x": normal(r, 3)})]


def _rnn_cells(r):
    """The fused recurrent cells (gates [N, 4H] / projections [N, 3H]) and their fused gradients."""
    n, h = 2, 3
    return {
        "LSTMUnit": [(lambda g, c: list(rg.lstm_unit(g, c, 0.5)), {"g": normal(r, n, 4 * h), "c": normal(r, n, h)}),
                     (lambda g, c, u: list(rg.lstm_unit(g, c, 0.5, h_gates=u)),
                      {"g": normal(r, n, 4 * h), "c": normal(r, n, h), "u": normal(r, n, 4 * h)})],
        "LSTMUnitGrad": [(lstm_unit_grad, {"acts": r.uniform(0.05, 0.95, (n, 4 * h)),
                                           **{k: normal(r, n, h) for k in ("cp", "c", "dh", "dc")}})],
        "GRUUnit": [(rg.gru_unit, {"x": normal(r, n, 3 * h), "u": normal(r, n, 3 * h), "h": normal(r, n, h)})],
        "GRUUnitGrad": [(gru_unit_grad, {"x": normal(r, n, 3 * h), "u": normal(r, n, 3 * h),
                                         "h": normal(r, n, h), "dh": normal(r, n, h)})],
        "SeqLinear": [(lambda x, w, b: rg.seq_linear(x, w, b), {"x": normal(r, 3, 2, 4), "w": normal(r, 4, 5),
                                                                 "b": normal(r, 5)}),
                      (lambda x, w: rg.seq_linear(x, w, transpose_w=True), {"x": normal(r, 3, 4),
                                                                           "w": normal(r, 5, 4)})],
    }


def _norm_stats(op_type: str, x, **attrs):
    """The statistics outputs of a LayerNorm / RMSNorm of ``x`` (no weight), built directly."""
    outs = append_op(op_type, [x], {"eps": 1e-5, "has_weight": False, "has_bias": False, **attrs})
    return outs[1:]


def _layer_norm(r):
    return [(lambda x, w, b: rg.layer_norm(x, w, b), {"x": normal(r, 3, 5), "w": normal(r, 5), "b": normal(r, 5)}),
            (lambda x: rg.layer_norm(x * x, eps=0.1), {"x": normal(r, 2, 3, 4)}),
            (lambda x, w: rg.layer_norm(x, w), {"x": normal(r, 4), "w": normal(r, 4)})]


def _layer_norm_grad(r):
    def fused(dy, x, w):
        mean, rstd = _norm_stats("LayerNorm", x)
        return layer_norm_grad(dy, x, mean, rstd, w, 1e-5, want_weight=True, want_bias=True)

    def plain(dy, x):
        return layer_norm_grad(dy, x, *_norm_stats("LayerNorm", x), None, 1e-5)
    return [(fused, {"dy": normal(r, 3, 4), "x": normal(r, 3, 4), "w": normal(r, 4)}),
            (plain, {"dy": normal(r, 2, 2, 3), "x": normal(r, 2, 2, 3)})]


def _rms_norm(r):
    return [(lambda x, w: rg.rms_norm(x, w), {"x": normal(r, 3, 5), "w": normal(r, 5)}),
            (lambda x: rg.rms_norm(x, eps=0.1), {"x": normal(r, 2, 3, 4)})]


def _rms_norm_grad(r):
    def fused(dy, x, w):
        [rstd] = _norm_stats("RMSNorm", x)
        return rms_norm_grad(dy, x, rstd, w, 1e-5, want_weight=True)

    def plain(dy, x):
        return rms_norm_grad(dy, x, *_norm_stats("RMSNorm", x), None, 1e-5)
    return [(fused, {"dy": normal(r, 3, 4), "x": normal(r, 3, 4), "w": normal(r, 4)}),
            (plain, {"dy": normal(r, 2, 2, 3), "x": normal(r, 2, 2, 3)})]


def _batch_norm(r):
    """Training (batch statistics) on [N, C] and [N, C, L], evaluation with running statistics."""
    mean, var = normal(r, 3), positive(r, 3)

    def running(like):
        c = like.shape[1]
        return rg.constant(mean[:c], dtype=like.dtype), rg.constant(var[:c], dtype=like.dtype)
    return [(lambda x, w, b: rg.batch_norm(x, *running(x), w, b), {"x": normal(r, 4, 3), "w": normal(r, 3),
                                                                   "b": normal(r, 3)}),
            (lambda x: rg.batch_norm(x * x, *running(x), eps=0.1), {"x": normal(r, 3, 2, 4)}),
            (lambda x, w: rg.batch_norm(x, *running(x), w, training=False), {"x": normal(r, 2, 3, 2),
                                                                            "w": normal(r, 3)})]


def _batch_norm_grad(r):
    """Training: the statistics of x itself (BatchNorm's outputs); evaluation: fixed ones."""
    def batch_stats(x):
        c = x.shape[1]
        running = [rg.constant(np.zeros(c), dtype=x.dtype), rg.constant(np.ones(c), dtype=x.dtype)]
        attrs = {"eps": 1e-5, "training": True, "has_weight": False, "has_bias": False}
        return append_op("BatchNorm", [x, *running], attrs)[1:]

    def training(dy, x, w):
        return batch_norm_grad(dy, x, *batch_stats(x), w, 1e-5, True, want_weight=True, want_bias=True)

    def evaluation(dy, x, w):
        mean, var = rg.constant(normal(r, 3), dtype=x.dtype), rg.constant(positive(r, 3), dtype=x.dtype)
        return batch_norm_grad(dy, x, mean, var, w, 1e-5, False, want_weight=True, want_bias=True)
    return [(training, {"dy": normal(r, 4, 3, 2), "x": normal(r, 4, 3, 2), "w": normal(r, 3)}),
            (lambda dy, x: batch_norm_grad(dy, x, *batch_stats(x), None, 1e-5, True)[0],
             {"dy": normal(r, 5, 3), "x": normal(r, 5, 3)}),
            (evaluation, {"dy": normal(r, 2, 3, 2), "x": normal(r, 2, 3, 2), "w": normal(r, 3)})]


def _bce_with_logits(r):
    return [(rg.binary_cross_entropy_with_logits, {"x": normal(r, 3, 4) * 3.0, "t": r.uniform(0, 1, (3, 4))})]


def _nll_loss(r):
    return [(rg.nll_loss, {"log_probs": normal(r, 4, 3), "labels": np.array([2, 0, 1, 2])})]


def _if(r):
    def branchy(x, w):
        return rg.cond(rg.sum(x) > 0.0, lambda: rg.tanh(x * w), lambda: x - w * w)
    x = normal(r, 2, 3)
    positive_sum, negative_sum = x - x.mean() + 0.5, x - x.mean() - 0.5
    return [(branchy, {"x": positive_sum, "w": normal(r, 3)}),
            (branchy, {"x": negative_sum, "w": normal(r, 3)})]


def _do(r):
    return [(lambda x, w: list(rg.do(lambda a, b: (rg.tanh(a @ b), a * 2.0), x, w)),
             {"x": normal(r, 2, 3), "w": normal(r, 3, 3)})]


def _loop(x, w):
    """Three iterations of y = tanh(y @ w), the trip count decided at run time."""
    i, y = rg.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, rg.tanh(y @ w)), [rg.constant(0), x])
    return y


def _while(r):
    return [(_loop, {"x": normal(r, 2, 3), "w": normal(r, 3, 3) * 0.7})]


def _scan(r):
    # A Scan is what the gradient of a While builds; differentiating that is double backward.
    return [(lambda x, w: rg.gradients(rg.sum(_loop(x, w) * x), [x, w]),
             {"x": normal(r, 2, 3), "w": normal(r, 3, 3) * 0.7})]


def _recurrent(r):
    from retrograd.ops.recurrent.network import recurrent

    def rnn(x, h0, w, u):
        (h_all,), (h_last,) = recurrent(lambda xs, hs: [rg.tanh(xs[0] @ w + hs[0] @ u)], [x], [h0])
        return [h_all, h_last]
    return [(rnn, {"x": normal(r, 3, 2, 2), "h0": normal(r, 2, 3), "w": normal(r, 2, 3),
                   "u": normal(r, 3, 3) * 0.5})]


def _rounding(fn):
    """a / b at least 0.2 away from an integer, so finite differences never cross a jump."""
    def cases(r):
        def pair(a_shape, b_shape):
            b = away_from_zero(r, *b_shape)
            return {"a": b * (r.integers(-3, 3, a_shape) + r.uniform(0.2, 0.8, a_shape)), "b": b}
        return [(fn, pair((3, 4), (3, 4))), (fn, pair((3, 4), (4,))), (fn, pair((2, 3), ()))]
    return cases


def _recurrent_grad(r):
    """The first-order gradients of a recurrent op (a RecurrentNetworkGrad), differentiated again."""
    from retrograd.ops.recurrent.network import recurrent

    def rnn_grads(x, h0, w, u):
        (h_all,), (h_last,) = recurrent(lambda xs, hs: [rg.tanh(xs[0] @ w + hs[0] @ u)], [x], [h0])
        return rg.gradients(rg.sum(h_all * h_all) + rg.sum(rg.sin(h_last)), [x, h0, w, u])
    return [(rnn_grads, {"x": normal(r, 3, 2, 2), "h0": normal(r, 2, 3), "w": normal(r, 2, 3),
                         "u": normal(r, 3, 3) * 0.5})]


def _reverse_sequence(r):
    return [(rg.reverse_sequence, {"x": normal(r, 4, 3, 2)}),
            (rg.reverse_sequence, {"x": normal(r, 4, 3, 2), "lengths": np.array([4, 0, 2], dtype=np.int64)})]


def _linear_xent(r):
    """Chunks of 2 rows over 5 (a short last chunk), with and without a bias, leading axes too."""
    return [
        (lambda h, w, b, labels: rg.linear_cross_entropy(h, w, b, labels, chunk_rows=2),
         {"h": normal(r, 5, 3), "w": normal(r, 3, 4), "b": normal(r, 4), "labels": r.integers(0, 4, 5)}),
        (lambda h, w, labels: rg.linear_cross_entropy(h, w, None, labels),
         {"h": normal(r, 2, 3, 3), "w": normal(r, 3, 4), "labels": r.integers(0, 4, (2, 3))}),
    ]


def _conv(r):
    return [
        (lambda x, w: rg.conv2d(x, w), {"x": normal(r, 2, 3, 5, 4), "w": normal(r, 4, 3, 3, 2)}),
        (lambda x, w, b: rg.conv2d(x, w, b, stride=2, padding=1, dilation=(1, 2)),
         {"x": normal(r, 1, 2, 6, 7), "w": normal(r, 3, 2, 2, 3), "b": normal(r, 3)}),
        (lambda x, w: rg.conv2d(x, w, padding=((1, 0), (2, 1)), groups=2),
         {"x": normal(r, 2, 4, 4, 4), "w": normal(r, 6, 2, 3, 3)}),
        (lambda x, w, b: rg.conv1d(x, w, b, stride=2, padding=(2, 1), dilation=2),
         {"x": normal(r, 2, 3, 9), "w": normal(r, 2, 3, 3), "b": normal(r, 2)}),
    ]


def _conv_grad_ops(r):
    """ConvInputGrad / ConvWeightGrad with strides, pads, dilations and groups (second order)."""
    from retrograd.ops.nn.conv import conv_input_grad, conv_weight_grad
    attrs = {"strides": [2, 1], "pads": [1, 0, 0, 2], "dilations": [1, 2], "groups": 2}
    x, w, dy = normal(r, 2, 4, 5, 5), normal(r, 6, 2, 2, 3), normal(r, 2, 6, 3, 3)
    return {"ConvInputGrad": [(lambda dy, w, x: conv_input_grad(dy, w, x, attrs), {"dy": dy, "w": w, "x": x})],
            "ConvWeightGrad": [(lambda x, dy, w: conv_weight_grad(x, dy, w, attrs), {"x": x, "dy": dy, "w": w})]}


def _conv_bias(r):
    """ConvBias (what passes.fuse_conv_bias builds) with strides, pads, dilations and groups."""
    from retrograd.ops.core.registry import append_op
    attrs = {"strides": [2, 1], "pads": [1, 0, 0, 2], "dilations": [1, 2], "groups": 2}
    return [(lambda x, w, b: append_op("ConvBias", [x, w, b], dict(attrs))[0],
             {"x": normal(r, 2, 4, 5, 5), "w": normal(r, 6, 2, 2, 3), "b": normal(r, 6)})]


def _distinct(r, *shape):
    """Values 0.1 apart at least (no ties inside a pooling window, whatever the step)."""
    return r.permutation(np.arange(np.prod(shape))).reshape(shape) * 0.1 - 1.0


def _max_pool(r):
    return [(lambda x: rg.max_pool2d(x, 2), {"x": _distinct(r, 2, 3, 4, 6)}),
            (lambda x: rg.max_pool2d(x, (3, 2), stride=1, padding=(1, 0)), {"x": _distinct(r, 1, 2, 5, 4)})]


def _window_indices(r, x_shape, out_shape, attrs):
    """Random flat indices a MaxPool could return: each inside its own window (cuDNN/CUDA's max-pool
    backward gathers per input position, so an index outside its window is dropped there)."""
    axes = []
    for size, out, k, s, p in zip(x_shape[2:], out_shape[2:], attrs["kernel"], attrs["strides"], attrs["pads"]):
        start = np.arange(out) * s - p
        low, high = np.maximum(start, 0), np.minimum(start + k, size)
        axes.append(r.integers(low, high, (*out_shape[:2], out)))
    rows, cols = axes
    return rows[..., :, None] * x_shape[3] + cols[..., None, :]


def _pool_grad_ops(r):
    from retrograd.ops.nn.pool import avg_pool_grad, max_pool_gather, max_pool_grad
    attrs = {"kernel": [3, 3], "strides": [2, 1], "pads": [1, 1, 1, 1]}
    x, dy = normal(r, 2, 2, 5, 4), normal(r, 2, 2, 3, 4)
    ids = _window_indices(r, x.shape, dy.shape, attrs)
    return {"MaxPoolGrad": [(lambda dy, i, x: max_pool_grad(dy, i, x, attrs), {"dy": dy, "i": ids, "x": x})],
            "MaxPoolGather": [(lambda v, i: max_pool_gather(v, i, attrs), {"v": x, "i": ids})],
            "AvgPoolGrad": [(lambda dy, x: avg_pool_grad(dy, x, attrs), {"dy": dy, "x": x})]}


def _avg_pool(r):
    return [(lambda x: rg.avg_pool2d(x, 2), {"x": normal(r, 2, 3, 4, 6)}),
            (lambda x: rg.avg_pool2d(x, 3, stride=(2, 1), padding=1), {"x": normal(r, 1, 2, 5, 4)})]


def _lstm_sequence(r):
    """A whole LSTM layer as one op, both directions, with and without a bias."""
    n, d, h = 2, 3, 2
    base = {"x": normal(r, 3, n, d), "w_ih": normal(r, d, 4 * h) * 0.5, "w_hh": normal(r, h, 4 * h) * 0.5,
            "h0": normal(r, n, h), "c0": normal(r, n, h)}
    return [
        (lambda x, w_ih, w_hh, b, h0, c0: list(rg.lstm_sequence(x, w_ih, w_hh, b, h0, c0, 0.5)),
         {"x": base["x"], "w_ih": base["w_ih"], "w_hh": base["w_hh"], "b": normal(r, 4 * h),
          "h0": base["h0"], "c0": base["c0"]}),
        (lambda x, w_ih, w_hh, h0, c0: list(rg.lstm_sequence(x, w_ih, w_hh, None, h0, c0, reverse=True,
                                                             keep="cells")), base),
    ]
def _gru_sequence(r):
    """A whole GRU layer as one op, both directions, with and without the biases."""
    n, d, h = 2, 3, 2
    base = {"x": normal(r, 3, n, d), "w_ih": normal(r, d, 3 * h) * 0.5, "w_hh": normal(r, h, 3 * h) * 0.5,
            "h0": normal(r, n, h)}
    return [
        (lambda x, w_ih, w_hh, b_ih, b_hh, h0: list(rg.gru_sequence(x, w_ih, w_hh, b_ih, b_hh, h0)),
         {"x": base["x"], "w_ih": base["w_ih"], "w_hh": base["w_hh"], "b_ih": normal(r, 3 * h),
          "b_hh": normal(r, 3 * h), "h0": base["h0"]}),
        (lambda x, w_ih, w_hh, h0: list(rg.gru_sequence(x, w_ih, w_hh, None, None, h0, reverse=True)), base),
    ]


def _tensor_array_write(r):
    def writes(a, x):
        arr = rg.TensorArray(dtype="float64", element_shape=[3]).write(0, a).write(1, x * a)
        return arr.write(0, rg.sin(x)).write(2, a).stack()            # an overwrite, then an append
    return [(writes, {"a": normal(r, 3), "x": normal(r, 3)})]


def _tensor_array_read(r):
    def reads(a, x):
        arr = rg.TensorArray(dtype="float64", element_shape=[-1, 2]).write(0, a).write(1, x)
        return arr.read(1) * arr.read(rg.constant(0)) + arr.read(0)
    return [(reads, {"a": normal(r, 3, 2), "x": normal(r, 3, 2)})]


def _tensor_array_stack(r):
    """The checked stack of a while_loop's array whose element size no input shape gives (an
    arange to a Var): the array itself, written twice."""
    def stacked(a):
        def body(i, arr):
            ramp = rg.cast(rg.arange(rg.constant(2, dtype="int64")), "float64")
            return i + 1, arr.write(i, ramp * a[0] + a[1] * rg.cast(i + 1, "float64"))
        _, arr = rg.while_loop(lambda i, arr: i < 2, body,
                               [rg.constant(0), rg.TensorArray(dtype="float64", element_shape=[-1])])
        return arr.stack()
    return [(stacked, {"a": normal(r, 3)})]


def _tensor_array_grads(r):
    from retrograd.ops.control.tensor_array import read_grad, write_grad
    i64 = lambda v: rg.constant(v, dtype="int64")  # noqa: E731
    return {
        "TensorArrayReadGrad": [(lambda dy: read_grad(dy, i64(4), i64(2)), {"dy": normal(r, 3)})],
        "TensorArrayWriteGrad": [
            (lambda d: write_grad(d, i64(3), i64(1), i64(4)), {"d": normal(r, 4, 2)}),     # overwrite
            (lambda d: write_grad(d, i64(2), i64(2), i64(3)), {"d": normal(r, 3, 2)}),     # append
            (lambda d: write_grad(d, i64(5), i64(0), i64(3)), {"d": normal(r, 3, 2)})],    # padded
    }


def _custom_gradient(r):
    true_grad = rg.custom_gradient(lambda x, w: rg.tanh(x @ w),            # grad_fn = the true gradient
                                   lambda xs, ys, dys: [(dys[0] * (1.0 - ys[0] * ys[0])) @ rg.transpose(xs[1], [1, 0]),
                                                        rg.transpose(xs[0], [1, 0]) @ (dys[0] * (1.0 - ys[0] * ys[0]))])
    return [(lambda x, w: true_grad(x, w), {"x": normal(r, 2, 3), "w": normal(r, 3, 4)})]
# --- activations, special functions, extrema, reductions, cumulative ops (issue 19) ----------------

def distinct(r, *shape, gap=0.1):
    """Values at least ``gap`` apart from each other (no ties for max/min/topk)."""
    count = int(np.prod(shape)) if shape else 1
    return (r.permutation(count) * gap + r.uniform(0, 0.3 * gap, count) - count * gap / 2).reshape(shape)


def _extreme(fn):
    def cases(r):
        return [
            (lambda x: fn(x), {"x": distinct(r, 3, 4)}),
            (lambda x: fn(x, axis=1), {"x": distinct(r, 3, 4)}),
            (lambda x: fn(x, axis=[0, 2], keepdims=True), {"x": distinct(r, 2, 3, 2)}),
            (lambda x: fn(x, axis=-1) * fn(x, axis=0, keepdims=True), {"x": distinct(r, 3, 3)}),
        ]
    return cases


def _topk(r):
    return [
        (lambda x: rg.topk(x, 2)[0], {"x": distinct(r, 3, 4)}),
        (lambda x: rg.topk(x, 3, axis=0)[0], {"x": distinct(r, 4, 2)}),
        (lambda x: rg.topk(x, rg.constant(2, "int64"), axis=1)[0], {"x": distinct(r, 2, 3, 2)}),
    ]


def _along(r):
    from retrograd.ops.reduce.extrema import put_along_axis, take_along_axis
    idx = np.argsort(r.random((3, 4)), axis=1)[:, :2]
    return {
        "TakeAlongAxis": [(lambda x, i: take_along_axis(x, i, 1), {"x": normal(r, 3, 4), "i": idx})],
        "PutAlongAxis": [(lambda v, i, like: put_along_axis(v * v, i, like, 1) * like,
                          {"v": normal(r, 3, 2), "i": idx, "like": normal(r, 3, 4)})],
    }


def _with_zeros(r, *shape):
    x = normal(r, *shape)
    x.reshape(-1)[r.choice(x.size, 2, replace=False)] = 0.0
    return x


def _prod(r):
    return [
        (lambda x: rg.prod(x, axis=1), {"x": normal(r, 3, 4)}),
        (lambda x: rg.prod(x), {"x": normal(r, 2, 3)}),
        (lambda x: rg.prod(x, axis=[0, 2], keepdims=True), {"x": normal(r, 2, 2, 3)}),
        (lambda x: rg.prod(x, axis=1), {"x": np.array([[0.0, 2.0, 3.0], [1.5, 0.0, 2.0], [0.5, -2.0, 1.2]])}),
    ]


def _cumulative(fn):
    def cases(r):
        return [
            (lambda x: fn(x, 1), {"x": normal(r, 3, 4)}),
            (lambda x: fn(x, 0, reverse=True), {"x": normal(r, 3, 2)}),
            (lambda x: fn(x, -1), {"x": _with_zeros(r, 2, 5)}),
            (lambda x: fn(x, 1, reverse=True), {"x": _with_zeros(r, 2, 5)}),
        ]
    return cases


def _logsumexp(r):
    return [
        (lambda x: rg.logsumexp(x, axis=1), {"x": normal(r, 3, 4)}),
        (lambda x: rg.logsumexp(x * 30.0), {"x": normal(r, 2, 3)}),
        (lambda x: rg.logsumexp(x, axis=[0, 2], keepdims=True), {"x": normal(r, 2, 2, 3)}),
    ]


def _gelu(r):
    return [(rg.gelu, {"x": normal(r, 3, 4) * 2.0}),
            (lambda x: rg.gelu(x, approximate="tanh"), {"x": normal(r, 3, 4) * 2.0})]


def _gelu_grad(r):
    from retrograd.ops.math.activation import gelu_grad
    return [(lambda x, dy: gelu_grad(x, dy), {"x": normal(r, 3, 4) * 2.0, "dy": normal(r, 3, 4)}),
            (lambda x, dy: gelu_grad(x, dy, "tanh"), {"x": normal(r, 3, 4) * 2.0, "dy": normal(r, 3, 4)})]


def _relu_grad(r):
    from retrograd.ops.math.elementwise import relu_grad
    # y away from 0, where ReluGrad jumps (it is constant in y elsewhere)
    return [(lambda y, dy: relu_grad(y, dy), {"y": away_from_zero(r, 3, 4), "dy": normal(r, 3, 4)})]


def _softplus(r):
    return [(rg.softplus, {"x": normal(r, 3, 4) * 3.0}),
            (rg.softplus, {"x": np.array([-30.0, 19.5, 20.5, 25.0])})]


def _attention(r):
    """Attention with no mask, causal (L > S), a bool mask with a fully masked row, a float mask
    (differentiated), a custom scale and batch axes that broadcast."""
    q, k, v = normal(r, 2, 2, 3, 2), normal(r, 2, 2, 4, 2), normal(r, 2, 2, 4, 3)
    keep = r.random((3, 4)) > 0.3
    keep[:, 0], keep[2] = True, False
    sdpa = rg.scaled_dot_product_attention
    return [
        (sdpa, {"q": q, "k": k, "v": v}),
        (lambda q, k, v: sdpa(q, k, v, causal=True), {"q": normal(r, 2, 4, 2), "k": normal(r, 2, 3, 2),
                                                      "v": normal(r, 2, 3, 2)}),
        (lambda q, k, v, m: sdpa(q, k, v, m), {"q": q, "k": k, "v": v, "m": keep}),
        (lambda q, k, v, m: sdpa(q, k, v, m, scale=0.7), {"q": q, "k": k, "v": v, "m": normal(r, 2, 1, 3, 4)}),
        (lambda q, k, v: sdpa(q, k, v, causal=True), {"q": q, "k": normal(r, 2, 1, 4, 2), "v": normal(r, 4, 3)}),
    ]


def _attention_grad(r):
    """The gradient op (reached through rg.gradients with a fed output gradient), differentiated."""
    def first(q, k, v, m, dout):
        out = rg.scaled_dot_product_attention(q, k, v, m, causal=True)
        return rg.gradients(out, [q, k, v, m], target_gradients=[dout])
    return [(first, {"q": normal(r, 2, 3, 2), "k": normal(r, 2, 4, 2), "v": normal(r, 2, 4, 3),
                     "m": normal(r, 3, 4), "dout": normal(r, 2, 3, 3)})]


def _heads(r):
    from retrograd.ops.nn.heads import merge_heads, split_heads
    return {"SplitHeads": [(lambda x: split_heads(x, 2), {"x": normal(r, 2, 3, 4)}),
                           (lambda x: split_heads(x, 3), {"x": normal(r, 4, 3)})],
            "MergeHeads": [(merge_heads, {"x": normal(r, 2, 3, 4, 2)}), (merge_heads, {"x": normal(r, 2, 3, 4)})]}


CASES = {
    # elementwise binary (broadcasting)
    "Add": _binary(rg.add),
    "Sub": _binary(rg.sub),
    "Mul": _binary(rg.mul),
    "Div": _binary(rg.div, make_b=away_from_zero),
    "Pow": _pow,
    "Maximum": _minmax(rg.maximum),
    "Minimum": _minmax(rg.minimum),
    "FloorDivide": _rounding(lambda a, b: rg.floor_divide(a, b) * a),
    "Mod": _rounding(rg.mod),
    "AddN": _add_n,
    "Where": _where,
    # elementwise unary
    "Neg": _unary(rg.neg),
    "Exp": _unary(rg.exp),
    "Log": _unary(rg.log, positive),
    "Tanh": _unary(rg.tanh),
    "Sigmoid": _unary(lambda x: rg.sigmoid(x * 3.0)),
    "Relu": _unary(rg.relu, away_from_zero),
    "Square": _unary(rg.square),
    "Sqrt": _unary(rg.sqrt, positive),
    "Abs": _unary(rg.abs, away_from_zero),
    "Sign": _unary(lambda x: rg.sign(x) * x, away_from_zero),
    "Sin": _unary(rg.sin),
    "Cos": _unary(rg.cos),
    "Clip": _clip,
    "Assign": _unary(rg.assign),
    "Cast": _cast,
    "FillLike": _unary(lambda x: rg.fill_like(x, 2.0) * x),
    # linear algebra and reductions
    "MatMul": _matmul,
    "Sum": _reduce(rg.sum),
    "Mean": _reduce(rg.mean),
    "SumTo": _sum_to,
    "ExpandAs": _expand_as,
    # data movement
    "Reshape": _reshape,
    "ReshapeAs": lambda r: [(reshape_as, {"x": normal(r, 2, 6), "like": normal(r, 3, 4)})],
    "Transpose": _transpose,
    "Concat": _concat,
    "Split": _split,
    "SplitLike": _split_like,
    "Slice": _slice,
    "SliceGrad": _slice_grad,
    "Gather": _gather,
    "GatherGrad": _gather_grad,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    # neural-network ops
    "Softmax": _softmax(rg.softmax),
    "LogSoftmax": _softmax(rg.log_softmax),
    "SoftmaxCrossEntropy": _xent,
    "LinearCrossEntropy": _linear_xent,
    "LSTMSequence": _lstm_sequence,
    "GRUSequence": _gru_sequence,
    "OneHot": _one_hot,
    "OneHotLike": _one_hot_like,
    "Dropout": _dropout,
    # fused recurrent cells
    **{op_type: (lambda r, t=op_type: _rnn_cells(r)[t]) for op_type in
       ("LSTMUnit", "LSTMUnitGrad", "GRUUnit", "GRUUnitGrad", "SeqLinear")},
    # control flow
    "If": _if,
    "Do": _do,
    "While": _while,
    "Scan": _scan,
    "RecurrentNetwork": _recurrent,
    "RecurrentNetworkGrad": _recurrent_grad,
    "ReverseSequence": _reverse_sequence,
    # collectives (data parallelism)
    "AllReduce": _all_reduce,
    # convolution and pooling
    "Conv": _conv,
    "ConvBias": _conv_bias,
    **{op_type: (lambda r, t=op_type: _conv_grad_ops(r)[t]) for op_type in ("ConvInputGrad", "ConvWeightGrad")},
    "MaxPool": _max_pool,
    "AvgPool": _avg_pool,
    **{op_type: (lambda r, t=op_type: _pool_grad_ops(r)[t])
       for op_type in ("MaxPoolGrad", "MaxPoolGather", "AvgPoolGrad")},
    # attention
    "ScaledDotProductAttention": _attention,
    "ScaledDotProductAttentionGrad": _attention_grad,
    "SplitHeads": lambda r: _heads(r)["SplitHeads"],
    "MergeHeads": lambda r: _heads(r)["MergeHeads"],
    # TensorArray
    "TensorArrayWrite": _tensor_array_write,
    "TensorArrayRead": _tensor_array_read,
    "TensorArrayStack": _tensor_array_stack,
    "TensorArrayReadGrad": lambda r: _tensor_array_grads(r)["TensorArrayReadGrad"],
    "TensorArrayWriteGrad": lambda r: _tensor_array_grads(r)["TensorArrayWriteGrad"],
    "CustomGradient": _custom_gradient,
    # activations and special functions (issue 19)
    "Gelu": _gelu,
    "GeluGrad": _gelu_grad,
    "ReluGrad": _relu_grad,
    "Silu": _unary(rg.silu),
    "LeakyRelu": _unary(lambda x: rg.leaky_relu(x, 0.1), away_from_zero),
    "Elu": _unary(lambda x: rg.elu(x, 1.5), away_from_zero),
    "Softplus": _softplus,
    "Erf": _unary(rg.erf),
    "Log1p": _unary(rg.log1p, positive),
    "Expm1": _unary(rg.expm1),
    "Rsqrt": _unary(rg.rsqrt, positive),
    # extrema, reductions, cumulative ops (issue 19)
    "Max": _extreme(rg.max),
    "Min": _extreme(rg.min),
    "TopK": _topk,
    "TakeAlongAxis": lambda r: _along(r)["TakeAlongAxis"],
    "PutAlongAxis": lambda r: _along(r)["PutAlongAxis"],
    "LogSumExp": _logsumexp,
    "Prod": _prod,
    "CumSum": _cumulative(rg.cumsum),
    "CumProd": _cumulative(rg.cumprod),
}

CASES.update({     # normalization and losses (ops/norm.py, ops/losses.py)
    "LayerNorm": _layer_norm, "LayerNormGrad": _layer_norm_grad, "RMSNorm": _rms_norm,
    "RMSNormGrad": _rms_norm_grad, "BatchNorm": _batch_norm, "BatchNormGrad": _batch_norm_grad,
    "BinaryCrossEntropyWithLogits": _bce_with_logits, "NLLLoss": _nll_loss,
})

# The core set whose gradients are themselves differentiable (issue 3).
DOUBLE_BACKWARD = ["MatMul", "Add", "Sub", "Mul", "Div", "Neg", "Exp", "Log", "Tanh", "Sigmoid",
                   "Relu", "Square", "Sqrt", "Pow", "Sum", "Mean", "Reshape", "Transpose", "Concat",
                   "Split", "Slice", "Gather", "Where", "Maximum", "Minimum", "Clip", "Softmax",
                   "LogSoftmax", "SoftmaxCrossEntropy", "LSTMUnit", "GRUUnit", "SeqLinear",
                   "If", "Do", "While", "Sin", "Cos", "Mod", "RecurrentNetwork"]
DOUBLE_BACKWARD += ["LayerNorm", "LayerNormGrad", "RMSNorm", "RMSNormGrad", "BatchNorm", "BatchNormGrad",
                    "BinaryCrossEntropyWithLogits", "NLLLoss"]


# --- indexing, shape ops and einsum (issue 19) ---------------------------------------------------

def _index(r):
    return [
        (lambda x: x[1], {"x": normal(r, 3, 4)}),
        (lambda x: x[:, ::-2, None], {"x": normal(r, 2, 5)}),
        (lambda x, i: x[..., i], {"x": normal(r, 2, 3, 4), "i": np.array(-2)}),
        (lambda x: x[-1:0:-1, 1:].T, {"x": normal(r, 4, 3)}),
    ]


def _index_grad(r):
    def fn(dy, x):
        items, _ = key_items((slice(None, None, -2), 1), x)
        return index_grad(dy, x, items, [])
    return [(fn, {"dy": normal(r, 2), "x": normal(r, 4, 3)})]


def _scatter(r):
    ids = np.array([1, 3, 1, 0])         # row 1 written twice: the last update wins
    return [
        (lambda x, ids, u: rg.scatter(x, ids, u), {"x": normal(r, 5, 3), "ids": ids, "u": normal(r, 4, 3)}),
        (lambda x, ids, u: rg.scatter(x, ids, u, overwrite=False),
         {"x": normal(r, 5, 3), "ids": ids, "u": normal(r, 4, 3)}),
        (lambda x, ids, u: rg.scatter(x * x, ids, u * 2.0),
         {"x": normal(r, 4, 2), "ids": np.array([[0, 2], [2, 2]]), "u": normal(r, 2, 2, 2)}),
    ]


def _update_slice(r):
    return [
        (lambda x, u, t: rg.update_slice(x, u, [t, 1]), {"x": normal(r, 4, 5), "u": normal(r, 2, 3), "t": np.array(1)}),
        (lambda x, u: rg.update_slice(x * x, u, [9, -3]), {"x": normal(r, 3, 4), "u": normal(r, 2, 2)}),  # clamped
    ]


def _dynamic_slice(r):
    return [(lambda x, like, t: dynamic_slice(x, like, [t, 0]),
             {"x": normal(r, 4, 3), "like": normal(r, 2, 2), "t": np.array(3)})]


def _einsum(r):
    return [
        (lambda a, b: rg.einsum("ij,jk->ik", a, b), {"a": normal(r, 2, 3), "b": normal(r, 3, 4)}),
        (lambda a, b, c: rg.einsum("bij,bjk,k", a, b, c),
         {"a": normal(r, 2, 2, 3), "b": normal(r, 2, 3, 2), "c": normal(r, 2)}),
        (lambda m: rg.einsum("ii->i", m), {"m": normal(r, 3, 3)}),
        (lambda a: rg.einsum("ij->", a * a), {"a": normal(r, 2, 3)}),
        (lambda a, b: rg.einsum("...j,j->...", a, b), {"a": normal(r, 2, 2, 3), "b": normal(r, 3)}),
    ]


CASES.update({
    "Index": _index,
    "IndexGrad": _index_grad,
    "Scatter": _scatter,
    "UpdateSlice": _update_slice,
    "DynamicSlice": _dynamic_slice,
    "Stack": lambda r: [(lambda a, b: rg.stack([a, b], 1), {"a": normal(r, 2, 3), "b": normal(r, 2, 3)}),
                        (lambda a: rg.stack([a, a * a, a], -1), {"a": normal(r, 3)})],
    "BroadcastTo": lambda r: [(lambda x: rg.broadcast_to(x, [2, 3, 4]), {"x": normal(r, 3, 1)}),
                              (lambda x: rg.broadcast_to(x, [2, -1]), {"x": normal(r, 3)})],
    "Tile": lambda r: [(lambda x: rg.tile(x, [2, 1, 3]), {"x": normal(r, 2, 3)}),
                       (lambda x: rg.tile(x, 2), {"x": normal(r, 2, 2)})],
    "TileGrad": lambda r: [(lambda dy, x: tile_grad(dy, x, [3, 1]), {"dy": normal(r, 6, 4), "x": normal(r, 2, 4)})],
    "Pad": lambda r: [(lambda x: rg.pad(x, [(1, 0), (2, 1)], 0.5), {"x": normal(r, 2, 3)}),
                      (lambda x: rg.pad(x * x, 1), {"x": normal(r, 3)})],
    "Einsum": _einsum,
})
DOUBLE_BACKWARD += ["Index", "Scatter", "UpdateSlice", "Stack", "BroadcastTo", "Tile", "Pad", "Einsum"]
DOUBLE_BACKWARD += ["Conv", "ConvBias", "ConvInputGrad", "ConvWeightGrad", "MaxPool", "AvgPool"]



def _xent_grad(r):
    """The cross-entropy backward as one op (issue 22): its own gradient is second order's."""
    n, c = dims(r, 2)
    return [(softmax_cross_entropy_grad, {"logits": normal(r, n, c), "labels": r.integers(0, c, n),
                                          "dloss": normal(r, n)}),
            (softmax_cross_entropy_grad, {"logits": normal(r, 2, 3, 4) * 4.0,
                                          "labels": r.integers(0, 4, (2, 3)).astype("int32"),
                                          "dloss": normal(r, 2, 3)})]


CASES.update({"SoftmaxCrossEntropyGrad": _xent_grad})


def _elements(r):
    """gather_elements / scatter_elements (issue 32): repeated and negative ids, ids smaller than x."""
    ids = np.array([[0, 2, -1], [1, 1, 0]])
    return {
        "GatherElements": [(lambda x, i: rg.gather_elements(x * x, i, 1), {"x": normal(r, 2, 4), "i": ids}),
                           (lambda x, i: rg.gather_elements(x, i, 0), {"x": normal(r, 3, 3), "i": ids})],
        "ScatterElements": [(lambda x, i, u: rg.scatter_elements(x * x, i, u * u, 1, "add"),
                             {"x": normal(r, 2, 4), "i": ids, "u": normal(r, 2, 3)}),
                            (lambda x, i, u: rg.scatter_elements(x, i[:, :1], u, 1) * x,
                             {"x": normal(r, 3, 4), "i": ids, "u": normal(r, 2, 1)})],
    }


CASES.update({"GatherElements": lambda r: _elements(r)["GatherElements"],
              "ScatterElements": lambda r: _elements(r)["ScatterElements"]})
DOUBLE_BACKWARD += ["GatherElements", "ScatterElements"]

# Libraries some modules import at their top (retrograd.onnx.graph: onnx); without them those
# modules register no op, since every op is registered by `import retrograd` alone.
OPTIONAL_LIBRARIES = {"onnx", "onnxruntime", "torch", "cupy", "mpi4py", "jax", "matplotlib"}
DOUBLE_BACKWARD += ["TensorArrayWrite", "TensorArrayRead", "TensorArrayReadGrad", "TensorArrayWriteGrad",
                    "TensorArrayStack", "CustomGradient"]
DOUBLE_BACKWARD += ["ReluGrad", "Gelu", "GeluGrad", "Silu", "LeakyRelu", "Elu", "Softplus", "Erf", "Log1p", "Expm1", "Rsqrt",
                    "Max", "Min", "TopK", "LogSumExp", "Prod", "CumSum"]   # CumProd: tests/ops/test_cumulative.py


def _import_every_module() -> None:
    """Register every op the package defines, whatever the other test files imported."""
    for module in pkgutil.walk_packages(rg.__path__, "retrograd."):
        if module.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(module.name)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] not in OPTIONAL_LIBRARIES:
                raise


_import_every_module()


def _differentiable_ops() -> set[str]:
    return {t for t, opdef in rg.OPS.items() if opdef.grad is not None}


def _scale_loss(r):
    """rg.amp's loss scaling (float32 only, as a loss and its scale are): linear in the loss,
    so a large step is exact up to float32 rounding."""
    from retrograd.amp.ops import scale_loss
    eight = np.array([8.0], "float32")
    return [(lambda x: rg.cast(scale_loss(rg.cast(x, "float32"), rg.constant(eight)), "float64"),
             {"x": normal(r, 2, 3)}, {"eps": 1e-2, "rtol": 1e-3, "atol": 1e-3})]


CASES.update({"ScaleLoss": _scale_loss})


def _global_norm(r):
    """The clip's norm of every gradient as one op (issue 22)."""
    return [(lambda a, b: rg.optim.global_norm([a, b]), {"a": normal(r, 3, 4), "b": normal(r, 5)}),
            (lambda a: rg.optim.global_norm([a * a, a]), {"a": normal(r, 2, 3)})]


CASES.update({"GlobalNorm": _global_norm})


def _cases(op_type: str):
    r = np.random.default_rng(sum(map(ord, op_type)))
    for case in CASES[op_type](r):
        fn, inputs, options = case if len(case) == 3 else (*case, {})
        yield fn, inputs, options


def _case_ids(types):
    """(op type, case index) of every case of a registered op (an entry may run ahead of its op)."""
    return [(t, i) for t in types if t in CASES and t in rg.OPS for i, _ in enumerate(_cases(t))]


def _builds(op_type: str, fn):
    """``fn`` wrapped to assert it really builds an op of ``op_type`` (the table cannot lie)."""
    def wrapped(*vars_):
        block = rg.default_main_program().global_block()
        start = len(block.ops)
        out = fn(*vars_)
        built = {op.type for op in block.ops[start:]}
        assert op_type in built, f"the case for {op_type} built only {sorted(built)}"
        return out
    return wrapped


def test_every_differentiable_op_has_a_case():
    missing = _differentiable_ops() - set(CASES)
    assert not missing, f"ops registered with a gradient maker but no gradient-table entry: {sorted(missing)}"


def test_double_backward_set_is_differentiable():
    assert set(DOUBLE_BACKWARD) <= _differentiable_ops()


@pytest.mark.parametrize("op_type,index", _case_ids(sorted(CASES)))
def test_gradient_matches_finite_differences(op_type, index, backend):
    fn, inputs, options = list(_cases(op_type))[index]
    report = check_gradients(_builds(op_type, fn), inputs, **options, **backend.kwargs)
    float_inputs = {n for n, a in inputs.items() if np.asarray(a).dtype.kind == "f"}
    assert set(report) == float_inputs


def _objective(outs, seed: int):
    """A scalar mixing every output non-linearly, so second derivatives exercise each op's gradient."""
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    r = np.random.default_rng(seed)
    terms = []
    for out in outs:
        p = rg.constant(r.standard_normal([max(d, 1) for d in out.shape]), dtype="float64")
        terms.append(rg.sum(out * p + out * out * 0.25))
    return terms[0] if len(terms) == 1 else rg.add_n(terms)


def _first_gradients(fn):
    """``x -> d(objective(fn(x)))/dx`` for every float input: differentiating it is double backward."""
    def grads(*vars_):
        objective = _objective(fn(*vars_), seed=len(vars_))
        wrt = [v for v in vars_ if v.dtype == "float64"]
        found = [g for g in rg.gradients(objective, wrt) if g is not None]
        assert found, "no first-order gradient to differentiate"
        return found
    return grads


@pytest.mark.parametrize("op_type,index", _case_ids(DOUBLE_BACKWARD))
def test_double_backward_matches_finite_differences(op_type, index, backend):
    fn, inputs, options = list(_cases(op_type))[index]
    check_gradients(_first_gradients(_builds(op_type, fn)), inputs, **options, **backend.kwargs)
