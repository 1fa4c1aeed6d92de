"""The pre-norm transformer block over batch-major ``[N, L, D]`` sequences.

::

    h = x + dropout(att(ln1(x)))            att: layers.multi_head_attention (causal by default)
    y = h + dropout(fc2(gelu(fc1(ln2(h)))))   fc1: D -> ffn_dim (4D by default), fc2: ffn_dim -> D

Parameters, with ``name`` the block's name: ``name.ln1.w/.b`` and
``name.ln2.w/.b`` (layer norms, 1 and 0), ``name.att.*`` (the attention's,
initialised like ``torch.nn.MultiheadAttention``), ``name.fc1.w/.b`` and
``name.fc2.w/.b`` (``layers.fc``: Xavier-uniform weights, zero biases).
Dropout is the identity in a test program (``main.clone(for_test=True)``).
"""
from __future__ import annotations

import numbers

from ..errors import ProgramError
from ..ir.builder import default_main_program
from ..ir.location import here
from ..ir.program import Var
from ..ops.math.activation import gelu
from ..ops.nn.softmax_dropout import dropout as dropout_op
from .attention import multi_head_attention
from .common import fc
from .norm import layer_norm


def _fail(layer: str, message: str) -> ProgramError:
    location = here()
    return ProgramError(f"{location + ': ' if location else ''}layers.transformer_block '{layer}': {message}")


def transformer_block(x: Var, num_heads: int, ffn_dim: int | None = None, causal: bool = True,
                      dropout: float = 0.0, name: str | None = "blk") -> Var:
    """One pre-norm transformer block (GPT-2's layout): attention then a GELU MLP, each residual.

    ``x [N, L, D]`` -> ``[N, L, D]``. ``num_heads`` must divide ``D``;
    ``ffn_dim`` (default ``4 * D``) is the MLP's hidden width; ``causal``
    makes every position attend only to itself and earlier ones (a language
    model); ``dropout`` applies to the attention's and the MLP's outputs. A
    second block with the same ``name`` shares the first one's parameters:
    name each block of a stack.

    Example::

        x = rg.data("x", [-1, 64, 128])                           # [N, L, D]
        for i in range(4):
            x = rg.layers.transformer_block(x, num_heads=4, dropout=0.1, name=f"blk{i}")
    """
    layer = name if name is not None else default_main_program().unique_name("blk")
    if not isinstance(x, Var) or x.ndim != 3 or x.shape[-1] < 0:
        shown = x.type_str() if isinstance(x, Var) else type(x).__name__
        raise _fail(layer, f"x must be [N, L, D] (batch-major) with a known D, got {shown}")
    width = x.shape[-1]
    if isinstance(num_heads, bool) or not isinstance(num_heads, numbers.Integral) or num_heads < 1:
        raise _fail(layer, f"num_heads must be a positive int, got {num_heads!r}")
    if width % num_heads:
        raise _fail(layer, f"num_heads={num_heads} does not divide the width D={width}")
    ffn_dim = 4 * width if ffn_dim is None else ffn_dim
    if isinstance(ffn_dim, bool) or not isinstance(ffn_dim, numbers.Integral) or ffn_dim < 1:
        raise _fail(layer, f"ffn_dim must be a positive int, got {ffn_dim!r}")
    if not 0.0 <= float(dropout) < 1.0:
        raise _fail(layer, f"dropout must be in [0, 1), got {dropout!r}")

    def dropped(h: Var) -> Var:
        return dropout_op(h, float(dropout)) if dropout else h

    h = layer_norm(x, name=f"{layer}.ln1")
    x = x + dropped(multi_head_attention(h, num_heads=int(num_heads), causal=causal, name=f"{layer}.att"))
    h = layer_norm(x, name=f"{layer}.ln2")
    h = fc(gelu(fc(h, int(ffn_dim), name=f"{layer}.fc1")), width, name=f"{layer}.fc2")
    return x + dropped(h)
