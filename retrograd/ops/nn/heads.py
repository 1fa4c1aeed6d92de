"""Multi-head layout: ``[..., L, D] <-> [..., heads, L, D / heads]``, each op the other's gradient.

``split_heads`` gives every head its own axis (head ``h`` holds features
``h*Dh .. (h+1)*Dh``) so that ``scaled_dot_product_attention`` runs all heads
as one batch; ``merge_heads`` puts them side by side again. They are a
reshape and a transpose, as one op each because the batch and the length
may both be unknown (-1) when the model is built, which ``reshape`` cannot
express.
"""
from __future__ import annotations

from ...errors import ShapeError
from ...ir.program import Var
from ..core.lowering import lowers
from ..core.registry import append_op, defop


def _swap_length_and_heads(xp, x):
    perm = list(range(x.ndim))
    perm[-3], perm[-2] = perm[-2], perm[-3]
    return xp.permute_dims(x, tuple(perm))


def _split_heads_rule(ins, attrs):
    x, heads = ins[0], attrs["heads"]
    if x.ndim < 2:
        raise ShapeError(f"'{x.name}' needs axes [..., L, D], got {x.type_str()}")
    d = x.shape[-1]
    if d >= 0 and d % heads:
        raise ShapeError(f"{heads} heads do not divide the feature size {d} of '{x.name}'")
    return [(x.shape[:-2] + (heads, x.shape[-2], d // heads if d >= 0 else -1), x.dtype)]


@defop("SplitHeads", infer=_split_heads_rule, grad=lambda g: [merge_heads(g.dy)], batch_rows=(0,))
def _split_heads(k, x):
    """``[..., L, D] -> [..., heads, L, D / heads]``: head ``h`` holds features ``h*Dh .. (h+1)*Dh``."""
    heads = k.attrs["heads"]
    if x.shape[-1] % heads:
        raise ValueError(f"{heads} heads do not divide the feature size {x.shape[-1]}")
    split = k.xp.reshape(x, tuple(x.shape[:-1]) + (heads, x.shape[-1] // heads))
    return _swap_length_and_heads(k.xp, split)


@lowers("SplitHeads")
def _split_heads_onnx(g):
    x = g.in_vars[0]
    heads = g.attrs["heads"]
    width = x.shape[-1] // heads if x.shape[-1] >= 0 else -1
    split = g.node("Reshape", [g.ins[0], g.const([0] * (x.ndim - 1) + [heads, width], "int64")])
    perm = list(range(x.ndim + 1))
    perm[-3], perm[-2] = perm[-2], perm[-3]
    return [g.node("Transpose", [split], perm=perm)]


def split_heads(x: Var, heads: int) -> Var:
    """``x [..., L, D]`` as ``[..., heads, L, D / heads]`` (the inverse of ``merge_heads``).

    Example::

        qh = split_heads(q, 4)          # [N, L, 32] -> [N, 4, L, 8]
    """
    return append_op("SplitHeads", [x], {"heads": int(heads)})[0]


def _merge_heads_rule(ins, attrs):
    x = ins[0]
    if x.ndim < 3 or x.shape[-3] < 0:
        raise ShapeError(f"'{x.name}' needs axes [..., heads, L, Dh] with a known number of heads, "
                         f"got {x.type_str()}")
    width = x.shape[-3] * x.shape[-1] if x.shape[-1] >= 0 else -1
    return [(x.shape[:-3] + (x.shape[-2], width), x.dtype)]


@defop("MergeHeads", infer=_merge_heads_rule, grad=lambda g: [split_heads(g.dy, g.x[0].shape[-3])], batch_rows=(0,))
def _merge_heads(k, x):
    """``[..., heads, L, Dh] -> [..., L, heads * Dh]`` (the heads side by side)."""
    merged = _swap_length_and_heads(k.xp, x)
    return k.xp.reshape(merged, tuple(merged.shape[:-2]) + (merged.shape[-2] * merged.shape[-1],))


@lowers("MergeHeads")
def _merge_heads_onnx(g):
    x = g.in_vars[0]
    perm = list(range(x.ndim))
    perm[-3], perm[-2] = perm[-2], perm[-3]
    merged = g.node("Transpose", [g.ins[0]], perm=perm)
    return [g.node("Reshape", [merged, g.const([0] * (x.ndim - 2) + [g.out_vars[0].shape[-1]], "int64")])]


def merge_heads(x: Var) -> Var:
    """``x [..., heads, L, Dh]`` as ``[..., L, heads * Dh]`` (the inverse of ``split_heads``)."""
    return append_op("MergeHeads", [x])[0]
