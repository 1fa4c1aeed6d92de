"""Every op: schema, shape rule, kernel and gradient maker side by side, one module per family."""
from .registry import OPS, OpDef, append_op, defop, get_op_def, make_grad_ops  # noqa: F401
from .creation import (assign, constant, create_parameter, data, fill, fill_like,  # noqa: F401
                       ones_like, zeros_like)
from .math import (abs, add, add_n, clip, div, equal, exp, greater, greater_equal, less,  # noqa: F401
                   less_equal, log, logical_and, logical_not, matmul, maximum, minimum,
                   mul, neg, pow, relu, sigmoid, sign, sqrt, square, sub, tanh, where)
from .reduce import mean, sum  # noqa: F401
from .tensor import (cast, concat, gather, reshape, slice, split, squeeze,  # noqa: F401
                     stop_gradient, transpose, unsqueeze)
from .nn import dropout, log_softmax, one_hot, softmax, softmax_cross_entropy  # noqa: F401
from .rnn_cells import gru_unit, lstm_unit, seq_linear  # noqa: F401
from .recurrent import recurrent, recurrent_net  # noqa: F401
from .trig import cos, sin  # noqa: F401
from .rounding_division import floor_divide, mod  # noqa: F401
from .sequence import reverse_sequence  # noqa: F401
from .cond import cond, switch_case  # noqa: F401
from .do import do  # noqa: F401
from .while_loop import while_loop  # noqa: F401
from .attention import scaled_dot_product_attention  # noqa: F401
from . import heads  # noqa: F401  (SplitHeads, MergeHeads: multi-head attention's layout ops)
from .linear_cross_entropy import linear_cross_entropy  # noqa: F401
from .norm import layer_norm, rms_norm  # noqa: F401
from .batch_norm import batch_norm  # noqa: F401
from .losses import binary_cross_entropy_with_logits, nll_loss  # noqa: F401
from .lstm_sequence import lstm_sequence  # noqa: F401
from .gru_sequence import gru_sequence  # noqa: F401
from .indexing import gather_elements, getitem, scatter, scatter_elements, update_slice  # noqa: F401
from .shape_ops import arange, broadcast_to, pad, stack, tile  # noqa: F401
from .einsum import einsum  # noqa: F401
from .conv import conv1d, conv2d  # noqa: F401
from .pool import avg_pool2d, max_pool2d  # noqa: F401
from .tensor_array import TensorArray  # noqa: F401
from .scan import fori_loop, map, scan  # noqa: F401
from .custom_gradient import custom_gradient  # noqa: F401
from .special import erf, expm1, log1p, rsqrt  # noqa: F401
from .logic import logical_or, not_equal  # noqa: F401
from .activation import elu, gelu, leaky_relu, silu, softplus  # noqa: F401
from .extrema import argmax, argmin, max, min, topk  # noqa: F401
from .reduce import logsumexp, prod  # noqa: F401
from .cumulative import cumprod, cumsum  # noqa: F401
from .random_ops import categorical, rand, rand_like, randint, randn, randn_like  # noqa: F401
