"""Neural-network ops: softmax, log_softmax, softmax cross-entropy, one-hot, dropout.

Kernels are the numerically stable forms (the row maximum is subtracted
before ``exp``); gradients are written with the builders users call, so the
second derivative of a softmax or a cross-entropy is one more ``gradients``
call away.
"""
from __future__ import annotations

import math

from ... import backend
from ...errors import ProgramError, ShapeError
from ...ir.builder import current_block
from ...ir.dtypes import canonical
from ...ir.program import Var, as_int
from ..array.creation import assign
from ..math.elementwise import exp
from ..reduce.reductions import sum as reduce_sum
from ..core.registry import append_op, defop
from ..core.lowering import lowers
from ..core.shapes import normalize_axis, require_float
from ..core.streams import random_key
from ..array.tensor import INT_DTYPES, check_ids, checked_ids_onnx, squeeze, unsqueeze


def _softmax_rule(ins, attrs):
    x = ins[0]
    require_float(x)
    if x.ndim == 0:
        raise ShapeError(f"softmax needs at least one axis, '{x.name}' is a scalar")
    normalize_axis(attrs["axis"], x.ndim)
    return [(x.shape, x.dtype)]


# --- Softmax / LogSoftmax ------------------------------------------------------------

def _softmax_grad(g):
    y, dy, axis = g.y, g.dy, g.attrs["axis"]
    return [y * (dy - reduce_sum(dy * y, axis=axis, keepdims=True))]


@defop("Softmax", infer=_softmax_rule, grad=_softmax_grad)
def _softmax(k, x):
    return k.backend.softmax(x, k.attrs["axis"])


@lowers("Softmax")
def _softmax_onnx(g):
    return [g.node("Softmax", g.ins, axis=normalize_axis(g.attrs["axis"], g.in_vars[0].ndim))]


def _log_softmax_grad(g):
    y, dy, axis = g.y, g.dy, g.attrs["axis"]
    return [dy - exp(y) * reduce_sum(dy, axis=axis, keepdims=True)]


@defop("LogSoftmax", infer=_softmax_rule, grad=_log_softmax_grad)
def _log_softmax(k, x):
    return k.backend.log_softmax(x, k.attrs["axis"])


@lowers("LogSoftmax")
def _log_softmax_onnx(g):
    return [g.node("LogSoftmax", g.ins, axis=normalize_axis(g.attrs["axis"], g.in_vars[0].ndim))]


def softmax(x: Var, axis: int = -1) -> Var:
    """``exp(x) / sum(exp(x), axis)``, computed without overflow.

    Example::

        probs = rg.softmax(logits)               # over the last axis
    """
    return append_op("Softmax", [x], {"axis": as_int(axis, "softmax: axis")})[0]


def log_softmax(x: Var, axis: int = -1) -> Var:
    """``x - log(sum(exp(x), axis))``, computed without overflow.

    Example::

        logp = rg.log_softmax(logits)
    """
    return append_op("LogSoftmax", [x], {"axis": as_int(axis, "log_softmax: axis")})[0]


# --- One-hot -----------------------------------------------------------------------

def _one_hot(xp, labels, depth: int, dtype, k=None):
    labels = check_ids(xp, labels, depth, "label", k)
    hot = xp.arange(depth, dtype=labels.dtype) == xp.expand_dims(labels, axis=-1)
    return xp.astype(hot, dtype)


def _one_hot_like_rule(ins, attrs):
    labels, like = ins
    _check_labels(labels, like)
    return [(like.shape, like.dtype)]


@defop("OneHotLike", inputs=("labels", "like"), infer=_one_hot_like_rule, nondiff=(0, 1), shape_only=(1,),
       grad=lambda g: [None, None])
def _one_hot_like(k, labels, like):
    """One-hot rows of ``labels`` with as many classes as ``like``'s last axis, in its dtype."""
    return _one_hot(k.xp, labels, like.shape[-1], like.dtype, k)


@lowers("OneHotLike")
def _one_hot_like_onnx(g):
    return [_one_hot_onnx_of(g, g.scalar_dim(g.ins[1], -1), g.out_vars[0].dtype)]


def _one_hot_onnx_of(g, depth: str, dtype: str) -> str:
    """``arange(depth) == labels[..., None]`` cast to ``dtype`` (labels outside [0, depth): the
    kernel's error, ``checked_ids_onnx``)."""
    classes = g.node("Range", [g.const(0, "int64"), depth, g.const(1, "int64")])
    labels = g.node("Unsqueeze", [checked_ids_onnx(g, 0, depth, "label"), g.const([-1], "int64")])
    return g.cast(g.node("Equal", [labels, classes]), dtype)


def one_hot_like(labels: Var, like: Var) -> Var:
    """One-hot ``labels`` shaped and typed like ``like`` (classes on its last axis)."""
    return append_op("OneHotLike", [labels, like])[0]


def _one_hot_rule(ins, attrs):
    labels = ins[0]
    if labels.dtype not in INT_DTYPES:
        raise ShapeError(f"labels '{labels.name}' must be int64 or int32, got {labels.dtype}")
    return [(labels.shape + (attrs["depth"],), attrs["dtype"])]


@defop("OneHot", inputs=("labels",), infer=_one_hot_rule, nondiff=(0,), grad=lambda g: [None])
def _one_hot_op(k, labels):
    return _one_hot(k.xp, labels, k.attrs["depth"], backend.dtype_of(k.xp, k.attrs["dtype"]), k)


@lowers("OneHot")
def _one_hot_onnx(g):
    return [_one_hot_onnx_of(g, g.const(g.attrs["depth"], "int64"), g.attrs["dtype"])]


def one_hot(labels: Var, depth: int, dtype: str = "float32") -> Var:
    """``labels [...]`` as one-hot rows ``[..., depth]``; a label outside ``[0, depth)`` fails the run.

    Example::

        targets = rg.one_hot(labels, 10)
    """
    if int(depth) < 1:
        raise ProgramError(f"one_hot of '{labels.name}': depth must be >= 1, got {depth}")
    return append_op("OneHot", [labels], {"depth": int(depth), "dtype": canonical(dtype)})[0]


# --- Softmax cross-entropy ------------------------------------------------------------

def _check_labels(labels: Var, logits: Var) -> tuple[int, ...]:
    """Labels ``[...]`` for logits ``[..., C]``: the merged leading shape."""
    require_float(logits, "logits")
    if labels.dtype not in INT_DTYPES:
        raise ShapeError(f"labels '{labels.name}' must be int64 or int32, got {labels.dtype}")
    if logits.ndim < 1 or labels.ndim != logits.ndim - 1:
        raise ShapeError(f"labels {labels.type_str()} must have the shape of logits {logits.type_str()} "
                         "without its last (class) axis; squeeze a trailing size-1 axis of the labels")
    shape = []
    for a, b in zip(logits.shape[:-1], labels.shape):
        if a >= 0 and b >= 0 and a != b:
            raise ShapeError(f"labels {labels.type_str()} do not match logits {logits.type_str()}")
        shape.append(a if a >= 0 else b)
    return tuple(shape)


def _xent_rule(ins, attrs):
    logits, labels = ins
    return [(_check_labels(labels, logits), logits.dtype)]


def _xent_grad(g):
    logits, labels = g.x
    return [softmax_cross_entropy_grad(logits, labels, g.dy), None]


def _labels_along(xp, labels):
    """``labels [...]`` as int64 ``[..., 1]``: an index along the class axis."""
    labels = labels if labels.dtype == xp.int64 else xp.astype(labels, xp.int64)
    return xp.expand_dims(labels, axis=-1)


@defop("SoftmaxCrossEntropy", inputs=("logits", "labels"), infer=_xent_rule, nondiff=(1,),
       grad=_xent_grad, row_wise=(0, 1))
def _softmax_cross_entropy(k, logits, labels):
    """``logsumexp(logits) - logits[label]`` per example, stable for large logits: the label's entry
    of the log-softmax, picked (``take_along_axis``, as PyTorch's ``nll_loss``), not a one-hot."""
    xp = k.xp
    if tuple(labels.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"labels have shape {list(labels.shape)}, logits {list(logits.shape)}: "
                         "labels must have the logits' shape without the class axis")
    labels = check_ids(xp, labels, logits.shape[-1], "label", k)
    if logits.shape[-1] == 0:       # no classes: no labels either (check_ids), nothing to pick
        return xp.zeros(tuple(labels.shape), dtype=logits.dtype)
    logp = k.backend.log_softmax(logits, -1)
    return -k.backend.take_along_axis(logp, _labels_along(xp, labels), -1)[..., 0]


@lowers("SoftmaxCrossEntropy")
def _softmax_cross_entropy_onnx(g):
    logits, labels = g.ins
    last = g.const([-1], "int64")
    shifted = g.node("Sub", [logits, g.node("ReduceMax", [logits, last], keepdims=1)])
    log_total = g.node("Log", [g.node("ReduceSum", [g.node("Exp", [shifted]), last], keepdims=0)])
    labels = checked_ids_onnx(g, 1, g.scalar_dim(logits, -1), "label")   # GatherElements wraps -1
    index = g.node("Unsqueeze", [labels, last])
    picked = g.node("Squeeze", [g.node("GatherElements", [shifted, index], axis=-1), last])
    return [g.node("Sub", [log_total, picked])]


def _xent_grad_rule(ins, attrs):
    logits, labels, dloss = ins
    rows = _check_labels(labels, logits)
    if dloss.dtype != logits.dtype or len(dloss.shape) != len(rows):
        raise ShapeError(f"dloss {dloss.type_str()} must be shaped as the labels {labels.type_str()}, "
                         f"in the logits' dtype {logits.dtype}")
    return [(logits.shape, logits.dtype)]


def _xent_grad_grad(g):
    """Of ``(softmax(logits) - onehot(labels)) * dloss[..., None]``: the softmax's Jacobian for the
    logits, the row sums for ``dloss``."""
    logits, labels, dloss = g.x
    probs = softmax(logits)
    scaled = g.dy * unsqueeze(dloss, -1)
    dlogits = probs * (scaled - reduce_sum(scaled * probs, axis=-1, keepdims=True))
    ddloss = reduce_sum(g.dy * (probs - one_hot_like(labels, logits)), axis=-1)
    return [dlogits, None, ddloss]


@defop("SoftmaxCrossEntropyGrad", inputs=("logits", "labels", "dloss"), infer=_xent_grad_rule,
       nondiff=(1,), grad=_xent_grad_grad)
def _softmax_cross_entropy_grad(k, logits, labels, dloss):
    """``(softmax(logits) - onehot(labels)) * dloss[..., None]`` as PyTorch's cross-entropy backward
    computes it: the softmax scaled by ``dloss``, then ``dloss`` taken off at each row's label
    (``Backend.add_along_axis``: a scatter, no one-hot)."""
    xp = k.xp
    if k.run.deferred_checks is not None:     # capturing a graph: the forward's check is deferred
        labels = check_ids(xp, labels, logits.shape[-1], "label", k)
    if logits.shape[-1] == 0:
        return xp.zeros(tuple(logits.shape), dtype=logits.dtype)
    scale = xp.expand_dims(dloss, axis=-1)
    grad = k.backend.softmax(logits, -1)
    grad *= scale
    return k.backend.add_along_axis(grad, _labels_along(xp, labels), -scale, -1)


@lowers("SoftmaxCrossEntropyGrad")
def _softmax_cross_entropy_grad_onnx(g):
    logits, labels, dloss = g.ins
    depth = g.scalar_dim(logits, -1)
    classes = g.node("Range", [g.const(0, "int64"), depth, g.const(1, "int64")])
    index = g.node("Unsqueeze", [g.cast(labels, "int64") if g.in_vars[1].dtype != "int64" else labels,
                                 g.const([-1], "int64")])
    hot = g.cast(g.node("Equal", [index, classes]), g.in_vars[0].dtype)
    scale = g.node("Unsqueeze", [dloss, g.const([-1], "int64")])
    return [g.node("Mul", [g.node("Sub", [g.node("Softmax", [logits], axis=-1), hot]), scale])]


def softmax_cross_entropy_grad(logits: Var, labels: Var, dloss: Var) -> Var:
    """The gradient of ``softmax_cross_entropy`` for the logits: ``(softmax(logits) -
    one_hot(labels)) * dloss[..., None]`` as one op (what ``append_backward`` builds).

    Example::

        from retrograd.ops.nn.softmax_dropout import softmax_cross_entropy_grad
        dlogits = softmax_cross_entropy_grad(logits, labels, dloss)     # dloss shaped as labels
    """
    return append_op("SoftmaxCrossEntropyGrad", [logits, labels, dloss], name="xent_grad")[0]


def softmax_cross_entropy(logits: Var, labels: Var) -> Var:
    """Per-example loss ``-log softmax(logits)[label]``: logits ``[..., C]`` (float),
    integer labels ``[...]`` in ``[0, C)``; returns ``[...]``. Labels get no gradient.

    Example::

        loss = rg.mean(rg.softmax_cross_entropy(logits, labels))   # logits [N, C], labels [N]

    Labels shaped ``[..., 1]`` (PaddlePaddle's layout) are squeezed to ``[...]``.
    """
    if (isinstance(labels, Var) and isinstance(logits, Var) and labels.ndim == logits.ndim >= 2
            and labels.shape[-1] == 1 and logits.shape[-1] != 1):
        labels = squeeze(labels, -1)
    return append_op("SoftmaxCrossEntropy", [logits, labels], name="xent")[0]


# --- Dropout ---------------------------------------------------------------------------

def _dropout_rule(ins, attrs):
    x = ins[0]
    require_float(x)
    return [(x.shape, x.dtype), (x.shape, x.dtype)]


def _dropout_grad(g):
    return [None if g.dy is None else g.dy * g.out[1]]


@defop("Dropout", infer=_dropout_rule, outputs=("out", "mask"), grad=_dropout_grad, random=True,
       test_mode=True)
def _dropout(k, x):
    """Inverted dropout; ``mask`` holds 0 or 1/(1-p). The mask depends on (seed, run id,
    loop iterations the op runs in) only: every run and every iteration draws a new
    one, and replaying the op for the same iteration within a run (recompute) gives
    the same one bit for bit (``streams.py``). In a test program (``is_test``) it is
    the identity, with a mask of ones."""
    xp, keep_prob = k.xp, 1.0 - k.attrs["p"]
    if k.attrs.get("is_test", False):
        return x, xp.ones_like(x)
    keep = k.backend.random_keep_mask(random_key(k, k.attrs["seed"]), x.shape, keep_prob)
    mask = xp.where(keep, xp.full(x.shape, 1.0 / keep_prob, dtype=x.dtype), xp.zeros_like(x))
    return x * mask, mask


@lowers("Dropout")
def _dropout_onnx(g):
    """The keyed generator's keep mask (``retrograd.run_id`` is a model input): the same mask as
    the kernels for the same run id."""
    x, dtype, keep_prob = g.ins[0], g.in_vars[0].dtype, 1.0 - g.attrs["p"]
    if g.attrs.get("is_test", False):
        return [g.node("Identity", [x]), g.fill(g.shape(x), 1, dtype)]
    threshold = min(int(math.floor(keep_prob * 2.0 ** 32)), 1 << 32)
    keep = g.node("Less", [g.random_bits(g.attrs["seed"], g.shape(x)), g.const(threshold, "int64")])
    zero = g.fill(g.shape(x), 0, dtype)
    mask = g.node("Where", [keep, g.node("Add", [zero, g.const(1.0 / keep_prob, dtype)]), zero])
    return [g.node("Mul", [x, mask]), mask]


def dropout(x: Var, p: float, seed: int | None = None) -> Var:
    """Zero each element with probability ``p`` and scale the rest by ``1/(1-p)``.

    The mask is drawn anew on every run of the program (from ``seed``, by
    default one taken from the program, and the run's id); the backward pass
    and any recomputation reuse the forward's mask. ``p=0`` is a plain copy.
    Inside a loop body or a recurrent step the op draws a new mask at every
    iteration (time step), and recomputing that iteration in the backward
    draws the same one. For one mask shared by all time steps (variational
    dropout), apply dropout to a tensor of ones outside the loop and multiply
    by it inside.

    Example::

        h = rg.dropout(h, 0.1)
    """
    p = float(p)
    if not 0.0 <= p < 1.0:
        raise ProgramError(f"dropout of '{x.name}': p must be in [0, 1), got {p}")
    if p == 0.0:
        return assign(x)
    if seed is None:
        seed = current_block().program.next_seed()
    out, mask = append_op("Dropout", [x], {"p": p, "seed": int(seed)})
    mask.stop_gradient = True
    return out
