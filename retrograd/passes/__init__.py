"""Whole-program rewrites: passes that read a program and write a faster, equivalent one.

Each pass takes a program, rewrites it in place and returns what it changed;
results stay those of the unrewritten program (the tests run both and
compare). Any engine may apply them; ``optimize_for_engine`` applies the
default list to a clone, which is what ``Executor(backend="onnxruntime")``
exports, so the user's program is never changed.

* ``fuse_optimizer_updates``: the ``AdamUpdate`` ops that share their
  hyper-parameters become one ``FusedAdamUpdate`` (one flat buffer in ONNX).
* ``fuse_linear_bias``: ``MatMul(x, w)`` + ``Add(y, b)`` as one ``SeqLinear(x, w, b)``
  (torch runs it as ``addmm``; the torch backend applies it to what it runs).
* ``fuse_conv_bias``: ``Conv(x, w)`` + ``Add(y, Reshape(b))`` as one ``ConvBias(x, w, b)``
  (torch runs it as one oneDNN convolution; the torch backend applies it to what it runs).
* ``expand_fused_ops``: whole-layer ops (``LSTMSequence``) back into the
  general ops they stand for (run by passes that schedule recurrences).
* ``fuse_recurrent_cells``: a step-by-step LSTM or GRU recurrence (``layers.lstm``,
  ``layers.gru``, ``rg.recurrent`` with such a cell) and its gradient as
  ``LSTMSequence`` / ``LSTMSequenceGrad`` (``GRUSequence`` / ``GRUSequenceGrad``;
  the executor runs it on its copy of a program when its backend has a vendor
  kernel: LSTM on torch CPU / CUDA, GRU on torch CUDA).
* ``cast_to_low_precision``: the forward computing in bfloat16 or float16 by
  op-type lists, with the casts as ops (``rg.amp.decorate`` runs it).
* ``fuse_linear_cross_entropy``: an output layer feeding
  ``softmax_cross_entropy`` as one ``LinearCrossEntropy`` op (the memory
  budget runs it when storing everything does not fit).

Example:
    ```python
    import retrograd as rg

    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        loss = rg.mean(rg.layers.fc(rg.data("x", [-1, 3]), 2, name="fc"))
        rg.optim.Adam(1e-3).minimize(loss)
    fast = rg.passes.optimize_for_engine(main)          # a rewritten clone
    rg.passes.fuse_optimizer_updates(main)              # or one pass, in place
    ```
"""
from __future__ import annotations

from typing import Callable

from ..ir.program import Program
from ..ir.verify import verify_program
from .expand_fused import expand_fused_ops  # noqa: F401  (the memory budget's first step)
from .fuse_updates import fuse_optimizer_updates
from .fuse_bias import fuse_conv_bias, fuse_linear_bias  # noqa: F401  (the torch backend's program_passes)
from .fuse_linear_loss import fuse_linear_cross_entropy  # noqa: F401  (the memory budget's output layers)
from .fuse_recurrent import fuse_recurrent_cells  # noqa: F401  (the executor's, on vendor-kernel backends)
from .for_test import make_test_program  # noqa: F401  (registers clone(for_test=True)'s pass)
from .mixed_precision import cast_to_low_precision  # noqa: F401  (rg.amp.decorate's rewrite)

PASSES: list[Callable[[Program], int]] = [fuse_optimizer_updates]


def optimize_for_engine(program: Program, fetch=()) -> Program:
    """A clone of ``program`` with every pass of ``PASSES`` applied (and verified).

    The user's program is never changed; ``Executor(backend="onnxruntime")``
    exports this clone.

    Args:
        program: The program to rewrite.
        fetch: Names of values a pass must keep computable by name.

    Returns:
        The rewritten clone (results equal the original's).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            loss = rg.mean(rg.layers.fc(rg.layers.fc(rg.data("x", [-1, 3]), 4, name="a"), 1, name="b"))
            rg.optim.Adam(1e-3).minimize(loss)
        fast = rg.passes.optimize_for_engine(main, [loss.name])
        types = [op.type for op in fast.global_block().ops]
        assert "FusedAdamUpdate" in types and "AdamUpdate" not in types
        assert "FusedAdamUpdate" not in [op.type for op in main.global_block().ops]   # main unchanged
        ```
    """
    del fetch   # no pass removes values yet; kept so callers pass what they will fetch
    rewritten = program.clone()
    changed = sum(p(rewritten) for p in PASSES)
    if changed:
        verify_program(rewritten)
    return rewritten


__all__ = ["PASSES", "optimize_for_engine", "fuse_optimizer_updates", "fuse_recurrent_cells", "fuse_linear_bias",
           "fuse_conv_bias", "cast_to_low_precision"]
