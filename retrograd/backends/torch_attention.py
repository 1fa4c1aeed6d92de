"""torch's fused attention for ``ScaledDotProductAttention`` and its gradient op, on CPU.

The forward is ATen's flash attention for CPU,
``_scaled_dot_product_flash_attention_for_cpu`` (what
``torch.nn.functional.scaled_dot_product_attention`` runs there), which also
returns the rows' logsumexp; the gradient is its explicit backward op
``..._for_cpu_backward`` reading that logsumexp: a forward op and a gradient
op, as retrograd's are, with no ``torch.autograd`` involved.

It is used only where it computes exactly the op's semantics, else the op's
general formulation runs (``fused_*`` return None):

* the kernel takes 4-D ``[B, H, L, E]`` operands and a 2-D or 4-D float mask:
  other ranks are reshaped (a mask with batch axes that do not match is
  expanded), a bool mask becomes ``0 / -inf``;
* q, k and v must have one batch shape and one feature size (``E == Ev``);
* no empty axis (an empty key axis, or an empty batch folded into the heads axis, crashes the
  process with SIGFPE in torch 2.13): size 0 anywhere takes the general path;
* fully masked rows: the kernel gives zeros and a logsumexp of 0, as the op
  does (checked by tests/ops/test_attention.py against the general path).
"""
from __future__ import annotations

import math

_FORWARD = "_scaled_dot_product_flash_attention_for_cpu"
_BACKWARD = "_scaled_dot_product_flash_attention_for_cpu_backward"


def flash_ops(torch):
    """(forward, backward) ATen ops, or None when this torch lacks them."""
    aten = torch.ops.aten
    if not (hasattr(aten, _FORWARD) and hasattr(aten, _BACKWARD)):
        return None
    return getattr(aten, _FORWARD), getattr(aten, _BACKWARD)


def _fits(torch, q, k, v) -> bool:
    return (q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64)
            and q.shape[:-2] == k.shape[:-2] == v.shape[:-2] and q.shape[-1] == v.shape[-1]
            and q.numel() > 0 and k.numel() > 0 and v.numel() > 0)


def _batch4(batch) -> tuple[int, ...]:
    """The two leading axes of the kernel's 4-D layout for a batch shape."""
    if len(batch) <= 2:
        return (1,) * (2 - len(batch)) + tuple(batch)
    return (1, math.prod(batch))


def _mask4(torch, mask, batch, dtype):
    """The mask as the kernel takes it: float of ``dtype``, 2-D or 4-D, broadcasting alike."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, -math.inf)
    rank = len(batch) + 2
    mask = mask.reshape((1,) * (rank - mask.ndim) + tuple(mask.shape))
    tail = tuple(mask.shape[-2:])
    if all(d == 1 for d in mask.shape[:-2]):
        return mask.reshape(tail)
    if len(batch) <= 2:
        return mask.reshape(_batch4(mask.shape[:-2]) + tail)
    return mask.expand(tuple(batch) + tail).reshape((1, math.prod(batch)) + tail)


def _as4(x, batch):
    return x.reshape(_batch4(batch) + tuple(x.shape[-2:]))


def attention(torch, ops, q, k, v, mask, causal: bool, scale: float):
    if ops is None or not _fits(torch, q, k, v):
        return None
    batch = tuple(q.shape[:-2])
    out, lse = ops[0](_as4(q, batch), _as4(k, batch), _as4(v, batch), 0.0, bool(causal),
                      attn_mask=_mask4(torch, mask, batch, q.dtype), scale=float(scale))
    return out.reshape(q.shape), lse.reshape(q.shape[:-1])


def attention_grad(torch, ops, q, k, v, mask, out, lse, dout, causal: bool, scale: float):
    if ops is None or not _fits(torch, q, k, v) or dout.shape != out.shape:
        return None
    batch = tuple(q.shape[:-2])
    lse4 = lse.reshape(_batch4(batch) + (q.shape[-2],))
    dq, dk, dv = ops[1](_as4(dout, batch), _as4(q, batch), _as4(k, batch), _as4(v, batch), _as4(out, batch),
                        lse4, 0.0, bool(causal), attn_mask=_mask4(torch, mask, batch, q.dtype),
                        scale=float(scale))
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)
