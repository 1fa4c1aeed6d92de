"""Layers: thin builders over ops that create their parameters, named ``<name>.<param>``.

Example:
    ```python
    import numpy as np
    import retrograd as rg

    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, -1], dtype="int64")                 # [T, N]
        e = rg.layers.embedding(ids, vocab=1000, dim=32, name="emb")   # emb.w [1000, 32]
        h = rg.layers.fc(e, 16, act="tanh", name="fc1")                # fc1.w [32, 16], fc1.b [16]
    exe = rg.Executor()
    exe.run(startup)
    (out,) = exe.run(main, feed={"ids": np.zeros((5, 2), "int64")}, fetch_list=[h])
    assert out.shape == (5, 2, 16)
    ```
"""
from .common import embedding, fc
from .rnn import gru, lstm, milstm  # noqa: F401
from .attention import multi_head_attention  # noqa: F401
from .transformer import transformer_block  # noqa: F401
from .norm import batch_norm, layer_norm, rms_norm  # noqa: F401
from .conv import conv1d, conv2d  # noqa: F401

__all__ = ["embedding", "fc", "gru", "lstm", "milstm", "batch_norm", "layer_norm", "rms_norm", "conv1d", "conv2d",
           "multi_head_attention", "transformer_block"]
# The modules stay importable (retrograd.layers.rnn) but are not attributes: rg.layers lists layers.
del common, rnn, norm, conv, attention, transformer  # noqa: F821
