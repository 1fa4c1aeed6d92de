"""Multi-head attention over batch-major ``[N, L, D]`` sequences.

Parameters (``D`` the model width, ``name`` the layer's name)::

    name.w_q, name.w_k, name.w_v  [D, D]   in-projections, y = x @ w + b
    name.b_q, name.b_k, name.b_v  [D]
    name.w_o  [D, D], name.b_o [D]         the out-projection

Initialised as ``torch.nn.MultiheadAttention`` initialises its own (read from
torch's ``_reset_parameters``): the in-projections are Xavier-uniform over
torch's stacked ``in_proj_weight [3D, D]``, i.e. U(-a, a) with
a = sqrt(6 / (D + 3D)); the out-projection keeps ``nn.Linear``'s default,
kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(D), 1/sqrt(D)); every bias is
zero. torch stores ``in_proj_weight = [W_q; W_k; W_v]`` with y = x W^T: our
``w_q`` is ``W_q^T`` (copy transposed to compare, see tests/layers/test_attention.py).
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..errors import ProgramError, ShapeError
from ..ir.builder import default_main_program
from ..ir.location import here
from ..ir.program import Var
from ..ops.nn.attention import scaled_dot_product_attention
from ..ops.nn.heads import merge_heads, split_heads
from ..ops.array.creation import constant, create_parameter
from ..ops.recurrent.cells import seq_linear


def _fail(error, layer: str, message: str):
    """The layer's build-time error, at the user's line."""
    location = here()
    return error(f"{location + ': ' if location else ''}layers.multi_head_attention '{layer}': {message}")


def _check_sequence(x: Var, what: str, layer: str, width: int | None) -> None:
    if not isinstance(x, Var) or x.ndim != 3 or x.shape[-1] < 0:
        shown = x.type_str() if isinstance(x, Var) else type(x).__name__
        raise _fail(ProgramError, layer, f"{what} must be [N, L, D] (batch-major) with a known D, got {shown}")
    if x.dtype not in ("float32", "float64"):
        raise _fail(ProgramError, layer, f"{what} '{x.name}' must be float32 or float64, got {x.dtype}")
    if width is not None and x.shape[-1] != width:
        raise _fail(ShapeError, layer, f"{what} '{x.name}' {x.type_str()} must have the query's width D = {width}")


def _check_mask(mask: Var, target: tuple[int, ...], layer: str) -> None:
    fits = mask.ndim <= 4 and all(m == 1 or m < 0 or t < 0 or m == t
                                  for m, t in zip(mask.shape[::-1], target[::-1]))
    if not fits:
        raise _fail(ShapeError, layer, f"mask {mask.type_str()} does not broadcast to [N, heads, L, S] = "
                                       f"{list(target)}")


def multi_head_attention(q: Var, k: Var | None = None, v: Var | None = None, num_heads: int = 4,
                         mask=None, causal: bool = False, name: str | None = "att") -> Var:
    """Multi-head scaled dot-product attention, ``torch.nn.MultiheadAttention(batch_first=True)``.

    ``q [N, L, D]`` attends over ``k [N, S, D]`` (default ``q``: self-attention)
    with values ``v [N, S, D]`` (default ``k``). Each input is projected
    (``x @ w + b``), split into ``num_heads`` heads of ``D / num_heads``
    features, attended (``rg.scaled_dot_product_attention``, scale
    ``1/sqrt(D / num_heads)``), merged and projected by ``w_o``. ``mask``
    broadcasts to ``[N, heads, L, S]``: bool with True = attend (torch's
    ``attn_mask`` uses True = *not* allowed), or float added to the scores;
    ``causal=True`` hides later keys. Returns ``[N, L, D]``. Calling it again
    with the same ``name`` shares the parameters (give each layer its own).

    Example::

        x = rg.data("x", [-1, 16, 32])                                  # [N, L, D]
        h = rg.layers.multi_head_attention(x, num_heads=4, causal=True, name="att")
        pad = rg.data("keep", [-1, 1, 1, 16], dtype="bool")             # padding mask, True = real
        c = rg.layers.multi_head_attention(x, enc, num_heads=4, mask=pad, name="cross")
    """
    layer = name if name is not None else default_main_program().unique_name("att")
    _check_sequence(q, "q", layer, None)
    width = q.shape[-1]
    k = q if k is None else k
    v = k if v is None else v
    _check_sequence(k, "k", layer, width)
    _check_sequence(v, "v", layer, width)
    if isinstance(num_heads, bool) or not isinstance(num_heads, numbers.Integral) or num_heads < 1:
        raise _fail(ProgramError, layer, f"num_heads must be a positive int, got {num_heads!r}")
    if width % num_heads:
        raise _fail(ProgramError, layer, f"num_heads={num_heads} does not divide the width D={width}")
    if mask is not None:
        if not isinstance(mask, Var):
            array = np.asarray(mask)
            mask = constant(array, dtype="bool" if array.dtype == np.bool_ else q.dtype)
        _check_mask(mask, (q.shape[0], int(num_heads), q.shape[1], k.shape[1]), layer)
    in_bound = math.sqrt(6.0 / (width + 3 * width))
    out_bound = 1.0 / math.sqrt(width)

    def projection(x: Var, which: str, bound: float) -> Var:
        w = create_parameter(f"{layer}.w_{which}", [width, width], dtype=q.dtype, init=("uniform", -bound, bound))
        b = create_parameter(f"{layer}.b_{which}", [width], dtype=q.dtype, init="zeros")
        return seq_linear(x, w, b)

    heads = [split_heads(projection(x, which, in_bound), num_heads) for x, which in ((q, "q"), (k, "k"), (v, "v"))]
    attended = scaled_dot_product_attention(*heads, mask=mask, causal=causal)
    return projection(merge_heads(attended), "o", out_bound)
