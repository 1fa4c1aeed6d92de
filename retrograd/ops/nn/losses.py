"""Losses beyond softmax cross-entropy: binary cross-entropy on logits, negative log-likelihood.

Both are elementwise / per example (torch's ``reduction="none"``); take
``rg.mean`` of them for the usual loss. Their gradients are written with the
builders users call, so second derivatives work.
"""
from __future__ import annotations

from ...errors import ShapeError
from ...ir.program import Var
from ..core.lowering import lowers
from ..math.elementwise import neg, sigmoid
from .softmax_dropout import one_hot_like
from ..core.registry import append_op, defop
from ..core.shapes import require_float
from ..array.tensor import INT_DTYPES, check_ids, checked_ids_onnx, unsqueeze


# --- Binary cross-entropy with logits ---------------------------------------------------------

def _bce_rule(ins, attrs):
    logits, targets = ins
    require_float(logits, "logits")
    require_float(targets, "targets")
    if logits.dtype != targets.dtype or logits.ndim != targets.ndim or any(
            a >= 0 and b >= 0 and a != b for a, b in zip(logits.shape, targets.shape)):
        raise ShapeError(f"targets {targets.type_str()} must have the shape and dtype of logits "
                         f"{logits.type_str()}")
    shape = tuple(a if a >= 0 else b for a, b in zip(logits.shape, targets.shape))
    return [(shape, logits.dtype)]


def _bce_grad(g):
    logits, targets = g.x
    return [g.dy * (sigmoid(logits) - targets), neg(g.dy * logits)]


@defop("BinaryCrossEntropyWithLogits", inputs=("logits", "targets"), infer=_bce_rule, grad=_bce_grad)
def _bce_with_logits(k, logits, targets):
    """``max(x, 0) - x * t + log1p(exp(-|x|))``: no overflow for large ``|x|``."""
    xp = k.xp
    return xp.maximum(logits, 0.0) - logits * targets + xp.log1p(xp.exp(-xp.abs(logits)))


@lowers("BinaryCrossEntropyWithLogits")
def _bce_with_logits_onnx(g):
    x, t = g.ins
    dtype = g.in_vars[0].dtype
    tail = g.node("Log", [g.node("Add", [g.const(1.0, dtype), g.node("Exp", [g.node("Neg", [g.node("Abs", [x])])])])])
    return [g.node("Add", [g.node("Sub", [g.node("Relu", [x]), g.node("Mul", [x, t])]), tail])]


def binary_cross_entropy_with_logits(logits: Var, targets: Var) -> Var:
    """Per element ``-(t * log sigmoid(x) + (1 - t) * log(1 - sigmoid(x)))``, computed stably
    (``torch.nn.functional.binary_cross_entropy_with_logits(..., reduction="none")``);
    ``targets`` (probabilities, same shape) get a gradient too.

    Example::

        loss = rg.mean(rg.binary_cross_entropy_with_logits(logits, labels))
    """
    return append_op("BinaryCrossEntropyWithLogits", [logits, targets], name="bce")[0]


# --- Negative log-likelihood ----------------------------------------------------------------

def _nll_rule(ins, attrs):
    log_probs, labels = ins
    require_float(log_probs, "log_probs")
    n, m = log_probs.shape[0] if log_probs.ndim else -1, labels.shape[0] if labels.ndim else -1
    if (log_probs.ndim != 2 or labels.ndim != 1 or labels.dtype not in INT_DTYPES
            or (n >= 0 and m >= 0 and n != m)):
        raise ShapeError(f"needs log_probs [N, C] and integer labels [N], got '{log_probs.name}': "
                         f"{log_probs.type_str()} and '{labels.name}': {labels.type_str()}")
    return [((n if n >= 0 else m,), log_probs.dtype)]


def _nll_grad(g):
    log_probs, labels = g.x
    return [-(one_hot_like(labels, log_probs) * unsqueeze(g.dy, -1)), None]


@defop("NLLLoss", inputs=("log_probs", "labels"), infer=_nll_rule, nondiff=(1,), grad=_nll_grad)
def _nll_loss(k, log_probs, labels):
    """``-log_probs[i, labels[i]]``; a label outside ``[0, C)`` fails the run."""
    xp = k.xp
    labels = check_ids(xp, labels, log_probs.shape[-1], "label", k)
    picked = xp.take_along_axis(log_probs, xp.expand_dims(xp.astype(labels, xp.int64), axis=-1), axis=-1)
    return -xp.reshape(picked, (log_probs.shape[0],))


@lowers("NLLLoss")
def _nll_loss_onnx(g):
    log_probs = g.ins[0]
    last = g.const([-1], "int64")
    labels = checked_ids_onnx(g, 1, g.scalar_dim(log_probs, -1), "label")
    index = g.node("Unsqueeze", [labels, last])
    return [g.node("Neg", [g.node("Squeeze", [g.node("GatherElements", [log_probs, index], axis=-1), last])])]


def nll_loss(log_probs: Var, labels: Var) -> Var:
    """Per example ``-log_probs[i, labels[i]]`` for ``log_probs [N, C]`` and integer ``labels [N]``
    (``torch.nn.functional.nll_loss(..., reduction="none")``); a label outside ``[0, C)``
    fails the run with an ExecutionError naming the op.

    Example::

        loss = rg.mean(rg.nll_loss(rg.log_softmax(logits), labels))
    """
    return append_op("NLLLoss", [log_probs, labels], name="nll")[0]
