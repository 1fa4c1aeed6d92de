"""Mixed precision as a program rewrite: bfloat16 or float16 compute, float32 master weights.

``rg.amp.decorate(optimizer, dtype)`` returns an optimizer whose ``minimize``
rewrites the forward program first (``rg.passes.cast_to_low_precision``): ops
whose type is in ``LOW`` compute in ``dtype``, ops in ``FLOAT32`` in float32,
all others in their inputs' widest dtype. Parameters and optimizer state stay
float32; a parameter's low-precision copy is one ``Cast`` per step; every
gradient reaches its update in float32. float16 adds dynamic loss scaling as
ops (``amp.loss_scale``, skipped steps), see ``retrograd/amp/ops.py``.

Example::

    with rg.program_guard(main, startup):
        ...
        opt = rg.amp.decorate(rg.optim.AdamW(1e-3), dtype="bfloat16")
        params_grads = opt.minimize(loss)
    print(main)                      # the Casts are in the program
"""
from . import ops  # noqa: F401  (registers AllFinite, SelectUpdates, UpdateLossScale, ScaleLoss)
from .optimizer import GOOD_STEPS_NAME, SCALE_NAME, MixedPrecisionOptimizer, decorate

# Ops computing in the low-precision dtype: the products (torch.autocast's lower_precision_fp list).
LOW = ["MatMul", "SeqLinear", "Conv", "Einsum", "ScaledDotProductAttention", "LSTMSequence", "GRUSequence"]

# Ops computing in float32: exponentials, reductions, norms and losses (autocast's fp32 list).
FLOAT32 = ["Softmax", "LogSoftmax", "LogSumExp", "LayerNorm", "RMSNorm", "BatchNorm", "SoftmaxCrossEntropy",
           "NLLLoss", "BinaryCrossEntropyWithLogits", "LinearCrossEntropy", "Mean", "Sum", "Exp", "Log",
           "Pow", "GlobalNorm"]

__all__ = ["decorate", "LOW", "FLOAT32", "MixedPrecisionOptimizer", "SCALE_NAME", "GOOD_STEPS_NAME"]
