"""Scaled dot-product attention: the op, its fused gradient op, and the mask op both use.

``out = softmax(scale * q @ k^T + mask) @ v`` over the last axis of the scores,
q ``[..., L, E]``, k ``[..., S, E]``, v ``[..., S, Ev]`` (leading axes
broadcast like ``matmul``'s). The mask broadcasts to ``[..., L, S]``: a bool
mask keeps the positions where it is True, a float mask is added to the
scores (a ``-inf`` entry masks its position); ``causal=True`` also masks every
key after the query's position (``s > l``, torch's top-left alignment). A
row whose every position is masked gives zeros, never NaN.

How it is computed (``Before/After`` of one batch entry)::

    ScaledDotProductAttention(q, k, v, mask?) -> out [L, Ev], lse [L]
        s = scale * q @ k^T (+ mask), masked -> -inf;  lse = logsumexp_s(s)  (0 on fully masked rows)
        out = exp(s - lse) @ v
    ScaledDotProductAttentionGrad(q, k, v, mask?, out, lse, dout) -> dq, dk, dv (, dmask)
        p = exp(s - lse);  dv = p^T @ dout;  ds = p * (dout @ v^T - rowsum(dout * out))
        dq = scale * ds @ k;  dk = scale * ds^T @ q;  dmask = ds

``lse`` is the forward's workspace (as ``LSTMUnit``'s gate activations): the
gradient op rebuilds the probabilities from it with one exp instead of a
second softmax. Both kernels are batched GEMMs around a stable softmax;
backends with a fused attention routine (torch's flash attention on CPU,
``backends/torch_attention.py``) run it instead where it honours these
semantics (``Backend.fused_attention``). The gradient op's outputs have the
broadcast batch shape; its maker sums them back to each input's shape.

The fused gradient op is an optimisation: its own gradient maker
(``_attention_grad_grad``) is written with ordinary ops (matmul, softmax,
where), so gradients of gradients work to any order.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import ProgramError, ShapeError
from ...ir.program import Var, as_float
from ..array.creation import constant
from ..core.lowering import lowers
from ..math.elementwise import matmul, maximum, sqrt, unbroadcast, where
from .softmax_dropout import softmax
from .norm import sum_present
from ..reduce.reductions import sum as reduce_sum
from ..core.registry import append_op, defop
from ..core.shapes import broadcast_shapes, require_float
from ..array.tensor import cast, dim

__all__ = ["scaled_dot_product_attention"]


# --- shape rule ------------------------------------------------------------------------------

def _merge(a: int, b: int, what: str) -> int:
    if a >= 0 and b >= 0 and a != b:
        raise ShapeError(f"{what} differ: {a} vs {b}")
    return a if a >= 0 else b


def _check_mask(mask: Var, target: tuple[int, ...], dtype: str) -> None:
    """``mask`` is bool or ``dtype`` and broadcasts to ``target`` ([..., L, S]) without growing it."""
    if mask.dtype not in ("bool", dtype):
        raise ShapeError(f"mask '{mask.name}' must be bool (True = attend) or {dtype} (added to the "
                         f"scores), got {mask.dtype}")
    fits = mask.ndim <= len(target) and all(
        m == 1 or m < 0 or t < 0 or m == t for m, t in zip(mask.shape[::-1], target[::-1]))
    if not fits:
        raise ShapeError(f"mask {mask.type_str()} does not broadcast to the scores "
                         f"{list(target)} ([..., L, S])")


def _attention_dims(ins) -> tuple[tuple[int, ...], int, int, int, int]:
    """(batch, L, S, E, Ev) of q, k, v (and the mask, checked against them)."""
    q, k, v = ins[:3]
    for name, x in zip("qkv", (q, k, v)):
        require_float(x, name)
        if x.ndim < 2:
            raise ShapeError(f"{name} '{x.name}' needs at least 2 axes [..., length, features], "
                             f"got {x.type_str()}")
    if not q.dtype == k.dtype == v.dtype:
        raise ShapeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    e = _merge(q.shape[-1], k.shape[-1], "feature sizes of q and k (E)")
    s = _merge(k.shape[-2], v.shape[-2], "lengths of k and v (S)")
    try:
        batch = broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ShapeError:
        raise ShapeError(f"the leading (batch) axes of q {q.type_str()}, k {k.type_str()} and "
                         f"v {v.type_str()} do not broadcast") from None
    if len(ins) == 4:
        _check_mask(ins[3], batch + (q.shape[-2], s), q.dtype)
    return batch, q.shape[-2], s, e, v.shape[-1]


def _attention_rule(ins, attrs):
    batch, length, _, _, ev = _attention_dims(ins)
    dtype = ins[0].dtype
    return [(batch + (length, ev), dtype), (batch + (length,), dtype)]


def _grad_rule(ins, attrs):
    q, k, v = ins[:3]
    batch, length, s, e, ev = _attention_dims(ins[:4] if attrs["has_mask"] else ins[:3])
    specs = [(batch + (length, e), q.dtype), (batch + (s, e), q.dtype), (batch + (s, ev), q.dtype)]
    if attrs["mask_grad"]:
        specs.append((batch + (length, s), q.dtype))
    return specs


# --- kernels (the general formulation, any Array API namespace) ----------------------------

def _scale(k, q) -> float:
    scale = k.attrs["scale"]
    if scale is not None:
        return scale
    return 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] else 1.0     # E = 0: the scores are 0 anyway


def causal_keep(xp, length: int, keys: int):
    """bool [L, S]: key ``s`` is visible from query ``l`` when ``s <= l`` (torch's ``is_causal``)."""
    return xp.arange(keys)[None, :] <= xp.arange(length)[:, None]


def _keep(xp, mask, causal: bool, length: int, keys: int):
    """The bool keep-mask of a bool mask and/or ``causal`` (None: nothing masked by them)."""
    keep = mask if mask is not None and mask.dtype == xp.bool else None
    if causal:
        tri = causal_keep(xp, length, keys)
        keep = tri if keep is None else keep & tri
    return keep


def _scores(k, q, key, mask):
    """``scale * q @ k^T (+ mask)`` with masked positions at ``-inf``."""
    xp, causal = k.xp, k.attrs["causal"]
    s = k.backend.matmul(q, key, transpose_y=True)
    s *= _scale(k, q)
    if mask is not None and mask.dtype != xp.bool:
        s = s + mask
    keep = _keep(xp, mask, causal, q.shape[-2], key.shape[-2])
    if keep is not None:
        s = xp.where(keep, s, xp.full((), -math.inf, dtype=s.dtype))     # a fill: no host copy (CUDA graphs)
    return s


def _stable_softmax(xp, s):
    """(probabilities, logsumexp) over the last axis; rows with no finite score give 0 and 0."""
    zero = xp.zeros((), dtype=s.dtype)
    if s.shape[-1] == 0:                       # no keys at all: every row is fully masked
        return s, xp.zeros(s.shape[:-1], dtype=s.dtype)
    top = xp.max(s, axis=-1, keepdims=True)
    top = xp.where(xp.isfinite(top), top, zero)
    e = xp.exp(s - top)
    total = xp.sum(e, axis=-1, keepdims=True)
    some = total > zero
    e /= xp.where(some, total, xp.ones((), dtype=s.dtype))
    lse = xp.where(some, top + xp.log(xp.where(some, total, xp.ones((), dtype=s.dtype))), zero)
    return e, lse[..., 0]


def _check_runtime(k, q, key, v, mask):
    """The checks the shape rule could not make on -1 dimensions (kernels refuse mismatches)."""
    if q.shape[-1] != key.shape[-1] or key.shape[-2] != v.shape[-2]:
        raise ValueError(f"q {list(q.shape)}, k {list(key.shape)}, v {list(v.shape)}: q and k need "
                         "one feature size E, k and v one length S")
    if mask is not None:
        batch = np.broadcast_shapes(tuple(q.shape[:-2]), tuple(key.shape[:-2]), tuple(v.shape[:-2]))
        target = tuple(batch) + (q.shape[-2], key.shape[-2])
        if np.broadcast_shapes(target, tuple(mask.shape)) != target:
            raise ValueError(f"mask {list(mask.shape)} does not broadcast to the scores {list(target)}")


def _attention_grad_maker(g):
    q, k, v = g.x[:3]
    mask = g.x[3] if len(g.x) == 4 else None
    out, lse = g.out
    if g.dout[0] is None:          # only lse has a gradient: nothing reads it differentiably
        return [None] * len(g.x)
    float_mask = mask is not None and mask.dtype != "bool"
    mask_grad = float_mask and g.wanted[3]
    attrs = {**g.attrs, "has_mask": mask is not None, "mask_grad": mask_grad}
    grads = append_op("ScaledDotProductAttentionGrad", [*g.x, out, lse, g.dout[0]], attrs,
                      name="attention_grad")
    dq, dk, dv = (unbroadcast(d, x, *(o for o in (q, k, v) if o is not x)) for d, x in zip(grads, (q, k, v)))
    if mask is None:
        return [dq, dk, dv]
    return [dq, dk, dv, unbroadcast(grads[3], mask, q, k, v) if mask_grad else None]


@defop("ScaledDotProductAttention", inputs=("q", "k", "v", "mask?"), outputs=("out", "lse"),
       infer=_attention_rule, grad=_attention_grad_maker, batch_rows=(0, 1, 2, 3), batch_broadcast=True,
       flops=lambda ins, outs, attrs: 4 * math.prod(ins[0]) * ins[1][-2])   # q k^T and p v
def _attention(k, q, key, v, mask=None):
    """``softmax(scale * q @ k^T + mask) @ v`` and the rows' logsumexp (the gradient's workspace)."""
    _check_runtime(k, q, key, v, mask)
    scale = _scale(k, q)
    fused = k.backend.fused_attention(q, key, v, mask, k.attrs["causal"], scale)
    if fused is not None:
        return fused
    p, lse = _stable_softmax(k.xp, _scores(k, q, key, mask))
    return k.backend.matmul(p, v), lse


@lowers("ScaledDotProductAttention")
def _attention_onnx(g):
    q, k, v = g.ins[:3]
    mask = g.ins[3] if len(g.ins) == 4 else None
    s = _scores_onnx(g, q, k, mask, g.in_vars[3] if mask else None)
    dtype = g.in_vars[0].dtype
    zero, one = g.const(0.0, dtype), g.const(1.0, dtype)
    last = g.const([-1], "int64")
    top = g.node("ReduceMax", [s, last], keepdims=1)
    top = g.node("Where", [g.node("IsInf", [top]), zero, top])
    e = g.node("Exp", [g.node("Sub", [s, top])])
    total = g.node("ReduceSum", [e, last], keepdims=1)
    some = g.node("Greater", [total, zero])
    total = g.node("Where", [some, total, one])
    lse = g.node("Where", [some, g.node("Add", [top, g.node("Log", [total])]), zero])
    return [g.node("MatMul", [g.node("Div", [e, total]), v]), g.node("Squeeze", [lse, last])]


@defop("ScaledDotProductAttentionGrad", inputs=("q", "k", "v", "mask?", "out", "lse", "dout"),
       outputs=("dq", "dk", "dv", "dmask?"), infer=_grad_rule,
       grad=lambda g: _attention_grad_grad(g))
def _attention_grad(k, q, key, v, *rest):
    """All input gradients of ScaledDotProductAttention in one kernel (broadcast batch shape)."""
    mask, (out, lse, dout) = (rest[0], rest[1:]) if k.attrs["has_mask"] else (None, rest)
    scale = _scale(k, q)
    if not k.attrs["mask_grad"]:
        fused = k.backend.fused_attention_grad(q, key, v, mask, out, lse, dout, k.attrs["causal"], scale)
        if fused is not None:
            return fused
    xp, mm = k.xp, k.backend.matmul
    p = xp.exp(_scores(k, q, key, mask) - lse[..., None])
    dv = mm(p, dout, transpose_x=True)
    ds = mm(dout, v, transpose_y=True)
    ds -= xp.sum(dout * out, axis=-1, keepdims=True)
    ds *= p
    dq = mm(ds, key)
    dq *= scale
    dk = mm(ds, q, transpose_x=True)
    dk *= scale
    return (dq, dk, dv, ds) if k.attrs["mask_grad"] else (dq, dk, dv)


@lowers("ScaledDotProductAttentionGrad")
def _attention_grad_onnx(g):
    q, k, v = g.ins[:3]
    has_mask = g.attrs["has_mask"]
    mask = g.ins[3] if has_mask else None
    out, lse, dout = g.ins[-3:]
    last = g.const([-1], "int64")
    s = _scores_onnx(g, q, k, mask, g.in_vars[3] if has_mask else None)
    p = g.node("Exp", [g.node("Sub", [s, g.node("Unsqueeze", [lse, last])])])
    scores_rank = max(g.in_vars[0].ndim, g.in_vars[1].ndim)
    full_rank = g.in_vars[-1].ndim
    dv = g.node("MatMul", [g.node("Transpose", [p], perm=_swap_last(scores_rank)), dout])
    dp = g.node("MatMul", [dout, g.node("Transpose", [v], perm=_swap_last(g.in_vars[2].ndim))])
    delta = g.node("ReduceSum", [g.node("Mul", [dout, out]), last], keepdims=1)
    ds = g.node("Mul", [g.node("Sub", [dp, delta]), p])
    scale = _scale_onnx(g)
    dq = g.node("Mul", [g.node("MatMul", [ds, k]), scale])
    dk = g.node("Mul", [g.node("MatMul", [g.node("Transpose", [ds], perm=_swap_last(full_rank)), q]), scale])
    return [dq, dk, dv] + ([ds] if g.attrs["mask_grad"] else [])


def _swap_last(ndim: int) -> list[int]:
    return list(range(ndim - 2)) + [ndim - 1, ndim - 2]


def _scale_onnx(g) -> str:
    dtype = g.in_vars[0].dtype
    if g.attrs["scale"] is not None:
        return g.const(g.attrs["scale"], dtype)
    size = g.node("Max", [g.cast(g.dim(g.ins[0], -1), dtype), g.const(1.0, dtype)])   # E = 0: as the kernel
    return g.node("Div", [g.const(1.0, dtype), g.node("Sqrt", [size])])


def _scores_onnx(g, q: str, k: str, mask: str | None, mask_var) -> str:
    """The kernels' ``_scores``: ``scale * q @ k^T (+ mask)``, masked positions at -inf."""
    kt = g.node("Transpose", [k], perm=_swap_last(g.in_vars[1].ndim))
    s = g.node("Mul", [g.node("MatMul", [q, kt]), _scale_onnx(g)])
    if mask is not None and mask_var.dtype != "bool":
        s = g.node("Add", [s, mask])
    keep = _keep_onnx(g, q, k, mask if mask is not None and mask_var.dtype == "bool" else None)
    if keep is not None:
        s = g.node("Where", [keep, s, g.const(-math.inf, g.in_vars[0].dtype)])
    return s


def _keep_onnx(g, q: str, k: str, keep: str | None) -> str | None:
    """A bool keep-mask ``keep`` combined with the causal one when the op is causal."""
    if not g.attrs["causal"]:
        return keep
    zero, one = g.const(0, "int64"), g.const(1, "int64")
    rows = g.node("Range", [zero, g.scalar_dim(q, -2), one])
    cols = g.node("Range", [zero, g.scalar_dim(k, -2), one])
    tri = g.node("LessOrEqual", [g.node("Unsqueeze", [cols, g.const([0], "int64")]),
                                 g.node("Unsqueeze", [rows, g.const([1], "int64")])])
    return tri if keep is None else g.node("And", [keep, tri])


# --- the mask as a bool tensor (for the ops-built formulation) --------------------------------

def _keep_rule(ins, attrs):
    q, k = ins[:2]
    target = (q.shape[-2], k.shape[-2])
    if len(ins) == 3:
        return [(broadcast_shapes(ins[2].shape, target), "bool")]
    return [(target, "bool")]


@defop("AttentionKeep", inputs=("q", "k", "mask?"), infer=_keep_rule, nondiff=(0, 1, 2), shape_only=(0, 1))
def _attention_keep(k, q, key, mask=None):
    """True where a query may attend to a key: the bool mask (a float mask: where it is not
    ``-inf``) and, with ``causal``, ``s <= l``; shape ``broadcast(mask, [L, S])``."""
    xp = k.xp
    keep = None
    if mask is not None:
        keep = mask if mask.dtype == xp.bool else mask > xp.full((), -math.inf, dtype=mask.dtype)
    if k.attrs["causal"]:
        tri = causal_keep(xp, q.shape[-2], key.shape[-2])
        keep = tri if keep is None else keep & tri
    return keep


@lowers("AttentionKeep")
def _attention_keep_onnx(g):
    mask = None
    if len(g.ins) == 3:
        mask = g.ins[2]
        if g.in_vars[2].dtype != "bool":
            mask = g.node("Greater", [mask, g.const(-math.inf, g.in_vars[2].dtype)])
    return [_keep_onnx(g, g.ins[0], g.ins[1], mask)]


def attention_keep(q: Var, k: Var, mask: Var | None, causal: bool) -> Var:
    """bool ``[..., L, S]``: which keys each query attends to (the mask's and ``causal``'s rule)."""
    return append_op("AttentionKeep", [q, k] + ([mask] if mask is not None else []),
                     {"causal": bool(causal)})[0]


# --- the same formulation from ordinary ops (gradients of the gradient) -----------------------

def _scale_var(q: Var, attrs) -> Var | float:
    """The scale as a number, or (E known only at run time) ``1 / sqrt(E)`` as a 0-d Var."""
    if attrs["scale"] is not None:
        return attrs["scale"]
    return 1.0 / sqrt(maximum(cast(dim(q, -1), q.dtype), 1.0))     # E = 0: as the kernel (not inf)


def attention_probs(q: Var, k: Var, mask: Var | None, causal: bool, scale) -> Var:
    """``softmax(scale * q @ k^T + mask)`` with masked positions (and fully masked rows) at 0,
    written with matmul, softmax and where, so it differentiates to any order."""
    s = matmul(q, k, transpose_y=True) * scale
    if mask is not None and mask.dtype != "bool":
        s = s + mask
    if mask is None and not causal:
        return softmax(s)
    keep = attention_keep(q, k, mask, causal)
    lowest = float(np.finfo(q.dtype).min)       # not -inf: a fully masked row stays finite
    return where(keep, softmax(where(keep, s, lowest)), 0.0)


def _attention_grad_grad(g):
    """Gradient of ScaledDotProductAttentionGrad w.r.t. q, k, v, mask and dout, written with ops.

    With p the probabilities, dp = dout @ v^T, delta = rowsum(dout * out) and
    ds = p * (dp - delta), the op returns dq = c ds k, dk = c ds^T q, dv = p^T dout
    (dmask = ds). Given their cotangents a, b, cv (e), with gs the cotangent of ds:
    gs = c a k^T + c q b^T + e;  gp = dout cv^T + gs (dp - delta) + go v^T;
    gdp = gs p;  gdelta = -rowsum(gs p);  go = gdelta dout (out = p v);
    g_scores = p (gp - rowsum(gp p)). These are total derivatives: the op's ``out``
    input (a function of q, k, v) gets none of its own, and ``lse`` none.
    """
    has_mask, attrs = g.attrs["has_mask"], g.attrs
    q, k, v = g.x[:3]
    mask = g.x[3] if has_mask else None
    out, _, dout = g.x[-3:]
    a, b, cv = g.dout[:3]
    e = g.dout[3] if attrs["mask_grad"] else None
    c = _scale_var(q, attrs)
    p = attention_probs(q, k, mask, attrs["causal"], c)
    dp = matmul(dout, v, transpose_y=True)
    centred = dp - reduce_sum(dout * out, axis=-1, keepdims=True)
    ds = p * centred
    gs = sum_present(None if a is None else matmul(a, k, transpose_y=True) * c,
              None if b is None else matmul(q, b, transpose_y=True) * c, e)
    gdp = gdelta = go = None
    if gs is not None:
        gdp = gs * p
        gdelta = -reduce_sum(gdp, axis=-1, keepdims=True)
        go = gdelta * dout
    gp = sum_present(None if cv is None else matmul(dout, cv, transpose_y=True),
              None if gs is None else gs * centred,
              None if go is None else matmul(go, v, transpose_y=True))
    g_scores = None if gp is None else p * (gp - reduce_sum(gp * p, axis=-1, keepdims=True))
    gq = sum_present(None if b is None else matmul(ds, b) * c,
              None if g_scores is None else matmul(g_scores, k) * c)
    gk = sum_present(None if a is None else matmul(ds, a, transpose_x=True) * c,
              None if g_scores is None else matmul(g_scores, q, transpose_x=True) * c)
    gv = sum_present(None if gdp is None else matmul(gdp, dout, transpose_x=True),
              None if go is None else matmul(p, go, transpose_x=True))
    gdout = sum_present(None if cv is None else matmul(p, cv),
                 None if gdp is None else matmul(gdp, v),
                 None if gdelta is None else gdelta * out)
    others = (q, k, v, dout)
    grads = [None if d is None else unbroadcast(d, x, *(o for o in others if o is not x))
             for d, x in zip((gq, gk, gv), (q, k, v))]
    gmask = None
    if has_mask and mask.dtype != "bool" and g_scores is not None:
        gmask = unbroadcast(g_scores, mask, q, k, v, dout)
    return grads + ([gmask] if has_mask else []) + [None, None,
                                                    None if gdout is None else unbroadcast(gdout, dout, q, k, v)]


# --- the builder ---------------------------------------------------------------------------------

def scaled_dot_product_attention(q: Var, k: Var, v: Var, mask=None, causal: bool = False,
                                 scale: float | None = None) -> Var:
    """``softmax(scale * q @ k^T + mask) @ v``, like ``torch.nn.functional.scaled_dot_product_attention``.

    Leading axes broadcast. A row with every key masked gives zeros (never
    NaN), and a zero gradient. The torch backend runs torch's fused attention.

    Args:
        q: The queries ``[..., L, E]``.
        k: The keys ``[..., S, E]``.
        v: The values ``[..., S, Ev]``.
        mask: None, or a mask broadcasting to ``[..., L, S]``: bool (True =
            attend) or float of q's dtype (added to the scores; ``-inf`` masks).
        causal: Mask the keys after each query (``s > l``).
        scale: The scores' scale; ``1/sqrt(E)`` by default.

    Returns:
        A Var ``[..., L, Ev]``.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            q = rg.data("q", [-1, 2, 3, 4])                # [N, heads, L, E]
            k = rg.data("k", [-1, 2, 3, 4])
            v = rg.data("v", [-1, 2, 3, 4])
            out = rg.scaled_dot_product_attention(q, k, v, causal=True)     # [N, 2, 3, 4]
        vv = np.random.rand(1, 2, 3, 4).astype("float32")
        feed = {"q": np.zeros((1, 2, 3, 4), "float32"), "k": np.zeros((1, 2, 3, 4), "float32"), "v": vv}
        (o,) = rg.Executor().run(main, feed=feed, fetch_list=[out])
        assert np.allclose(o[0, :, 0], vv[0, :, 0]) and np.allclose(o[0, :, 2], vv[0].mean(axis=1), atol=1e-6)
        ```
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Var):
            raise ProgramError(f"scaled_dot_product_attention: {name} must be a Var, got {type(x).__name__}")
    if mask is not None and not isinstance(mask, Var):
        array = np.asarray(mask)
        mask = constant(array, dtype="bool" if array.dtype == np.bool_ else q.dtype)
    if scale is None and q.ndim >= 1 and q.shape[-1] > 0:
        scale = 1.0 / math.sqrt(q.shape[-1])
    attrs = {"causal": bool(causal), "scale": None if scale is None else as_float(scale, "scale")}
    out, lse = append_op("ScaledDotProductAttention", [q, k, v] + ([mask] if mask is not None else []),
                         attrs, name="attention")
    lse.stop_gradient = True
    return out
