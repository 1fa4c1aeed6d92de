"""Every op: schema, shape rule, kernel, gradient maker and ONNX lowering side by side.

One subpackage per family, one module per group of related ops; an op's whole story is in one
module (its ``defop``, shape rule, kernel, gradient maker and ``@lowers`` ONNX lowering)::

    core/       the machinery every family uses
                registry (defop, OPS, append_op, gradient makers), lowering (ONNX tables),
                shapes (shape-rule helpers), calls / subblocks / subblock_grad (what cond, do
                and the loops share), streams (random numbers per loop iteration)
    math/       elementwise: elementwise (arithmetic, comparisons, where, matmul, SumTo/ExpandAs),
                activation, special (erf, log1p, ...), logic, trig, rounding_division
    reduce/     reductions (sum, mean, prod, logsumexp), extrema (max/min, argmax, topk),
                cumulative (cumsum, cumprod)
    array/      creation (data, parameters, constants, fills), tensor (reshape, concat, slice,
                gather, cast, ...), shape_ops (pad, stack, tile, arange), indexing (x[...],
                scatter, update_slice), einsum, random_ops
    nn/         softmax_dropout (softmax, cross-entropy, one_hot, dropout), conv, pool,
                windows_onnx (sliding-window ONNX helpers), norm (layer/rms), batch_norm,
                attention, heads (multi-head layout), losses, linear_cross_entropy
    control/    cond (cond, switch_case), do, while_loop, loop_grad (its gradient), loop_stacks
                (per-iteration values kept for the backward), scan (scan, fori_loop, map),
                tensor_array, custom_gradient
    recurrent/  network (rg.recurrent, RecurrentNetwork), network_grad and network_grad_scan (its
                gradient), network_onnx, steps and outputs (the step block, per-step outputs),
                cells (LSTM/GRU units, seq_linear), lstm_sequence and gru_sequence (fused layers,
                vendor kernels), sequence_onnx, reverse_sequence
    optim/      the optimizers' update ops (updates) and the multi-tensor fused_adam

A new op goes into its family's module (or a new module there, imported below so that it
registers); a new family is a new subpackage. This package exports the op builders; ``rg``
re-exports them.
"""
from .core.registry import OPS, OpDef, append_op, defop, get_op_def, make_grad_ops  # noqa: F401
from .array.creation import (assign, constant, create_parameter, data, fill, fill_like, ones_like,
                             zeros_like)
from .math.elementwise import (abs, add, add_n, clip, div, equal, exp, greater, greater_equal,
                               less, less_equal, log, logical_and, logical_not, matmul, maximum,
                               minimum, mul, neg, pow, relu, sigmoid, sign, sqrt, square, sub,
                               tanh, where)
from .reduce.reductions import mean, sum  # noqa: F401
from .array.tensor import (cast, concat, gather, reshape, slice, split, squeeze, stop_gradient,
                           transpose, unsqueeze)
from .nn.softmax_dropout import (dropout, log_softmax, one_hot, softmax, softmax_cross_entropy)  # noqa: F401
from .recurrent.cells import gru_unit, lstm_unit, seq_linear  # noqa: F401
from .recurrent.network import recurrent, recurrent_net  # noqa: F401
from .math.trig import cos, sin  # noqa: F401
from .math.rounding_division import floor_divide, mod  # noqa: F401
from .recurrent.reverse_sequence import reverse_sequence  # noqa: F401
from .control.cond import cond, switch_case  # noqa: F401
from .control.do import do  # noqa: F401
from .control.while_loop import while_loop  # noqa: F401
from .nn.attention import scaled_dot_product_attention  # noqa: F401
from .nn import heads  # noqa: F401  (SplitHeads, MergeHeads: multi-head attention's layout ops)
from .nn.linear_cross_entropy import linear_cross_entropy  # noqa: F401
from .nn.norm import layer_norm, rms_norm  # noqa: F401
from .nn.batch_norm import batch_norm  # noqa: F401
from .nn.losses import binary_cross_entropy_with_logits, nll_loss  # noqa: F401
from .recurrent.lstm_sequence import lstm_sequence  # noqa: F401
from .recurrent.gru_sequence import gru_sequence  # noqa: F401
from .array.indexing import gather_elements, getitem, scatter, scatter_elements, update_slice  # noqa: F401
from .array.shape_ops import arange, broadcast_to, pad, stack, tile  # noqa: F401
from .array.einsum import einsum  # noqa: F401
from .nn.conv import conv1d, conv2d  # noqa: F401
from .nn.pool import avg_pool2d, max_pool2d  # noqa: F401
from .control.tensor_array import TensorArray  # noqa: F401
from .control.scan import fori_loop, map, scan  # noqa: F401
from .control.custom_gradient import custom_gradient  # noqa: F401
from .math.special import erf, expm1, log1p, rsqrt  # noqa: F401
from .math.logic import logical_or, not_equal  # noqa: F401
from .math.activation import elu, gelu, leaky_relu, silu, softplus  # noqa: F401
from .reduce.extrema import argmax, argmin, max, min, topk  # noqa: F401
from .reduce.reductions import logsumexp, prod  # noqa: F401
from .reduce.cumulative import cumprod, cumsum  # noqa: F401
from .array.random_ops import categorical, rand, rand_like, randint, randn, randn_like  # noqa: F401
