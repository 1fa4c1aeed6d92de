"""Every op: schema, shape rule, kernel and gradient maker side by side, one module per family."""
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
from .array.indexing import getitem, scatter, update_slice  # noqa: F401
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
