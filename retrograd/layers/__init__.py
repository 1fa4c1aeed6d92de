"""Layers: thin builders over ops that create their parameters, named ``<name>.<param>``.

Example::

    h = rg.layers.fc(x, 16, act="tanh", name="fc1")     # params fc1.w [D, 16], fc1.b [16]
    e = rg.layers.embedding(ids, vocab=1000, dim=32, name="emb")
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
