"""The transformer character model (GPT-2's layout, as ``examples/gpt_chars.py``) and its
one-position step over a key/value cache, for generating text in one program.

The model, batch-major, over ids ``[N, L]`` at positions ``[L]``::

    x = embed.w[ids] + pos.w[positions]                         # [N, L, D], D = cfg.hidden
    x = rg.layers.transformer_block(x, cfg.heads, name=f"block{i}")   for i < cfg.layers
    logits = rg.layers.layer_norm(x, name="ln_f") @ out.w + out.b     # [N, L, V]

Parameters: ``embed.w [V, D]``, ``pos.w [max_positions, D]`` (learned
positions: a text is at most ``max_positions`` long), ``block<i>.*`` (the
block's: ``.ln1``, ``.att.w_q`` ..., ``.ln2``, ``.fc1``, ``.fc2``), ``ln_f.w/.b``,
``out.w [D, V]``, ``out.b [V]``. ``cfg`` is anything with ``hidden``, ``layers``,
``heads`` and ``vocab`` (``charlm.ModelConfig``).

``CachedStep`` computes the same logits one position at a time: the block's
layer norms and MLP through the same ``rg.layers`` calls (shared by name), the
attention written with the same projections, ``split_heads`` and
``scaled_dot_product_attention`` over a cache of every earlier position's keys
and values, ``[layers, N, heads, max_len, head_dim]``, written with
``rg.update_slice`` (positions not yet written are masked out). A text longer
than ``max_positions`` slides its window (``CachedStep``).

Example::

    ids, positions = rg.data("ids", [-1, -1], dtype="int64"), rg.data("pos", [-1], dtype="int64")
    logits = transformer_logits(ids, positions, cfg, max_positions=128)
"""
from __future__ import annotations

import retrograd as rg

from ..ops.nn.heads import merge_heads, split_heads
from ..ops.recurrent.cells import seq_linear
from ..ops.array.tensor import dim
from ..ir.location import count_as_user_code

count_as_user_code(__file__)     # the command's errors name this module's lines (ir/location.py)


def _embeddings(cfg, max_positions: int):
    table = rg.create_parameter("embed.w", [len(cfg.vocab), cfg.hidden], init=("normal", 0.0, 0.02))
    positions = rg.create_parameter("pos.w", [max_positions, cfg.hidden], init=("normal", 0.0, 0.02))
    return table, positions


def _head(cfg, x):
    """``[..., D]`` -> logits ``[..., V]``: the final layer norm and the output layer."""
    w = rg.create_parameter("out.w", [cfg.hidden, len(cfg.vocab)])
    b = rg.create_parameter("out.b", [len(cfg.vocab)], init="zeros")
    return seq_linear(rg.layers.layer_norm(x, name="ln_f"), w, b)


def transformer_logits(ids, positions, cfg, max_positions: int, dropout: float = 0.0):
    """Logits ``[N, L, V]`` of the model for ids ``[N, L]`` at positions ``[L]`` (each < ``max_positions``).

    Example::

        logits = transformer_logits(ids, rg.arange(0, 16), cfg, max_positions=128)   # ids [N, 16]
    """
    table, position_table = _embeddings(cfg, max_positions)
    x = rg.gather(table, ids) + rg.gather(position_table, positions)
    for i in range(cfg.layers):
        x = rg.layers.transformer_block(x, cfg.heads, causal=True, dropout=dropout, name=f"block{i}")
    return _head(cfg, x)


def time_major_logits(ids, cfg, max_positions: int, dropout: float = 0.0):
    """``charlm``'s layout: ids ``[T, N]`` (time-major, as the recurrent models read them) ->
    logits ``[T * N, V]``, row ``t * N + n`` for position ``t`` of stream ``n``.

    Example::

        ids = rg.data("chars", [64, -1], dtype="int64")
        logits = time_major_logits(ids, cfg, max_positions=64)      # what charlm.Net.logits holds
    """
    # A known length gives positions of a known size (a memory budget plans their sizes).
    positions = rg.arange(0, ids.shape[0]) if ids.shape[0] >= 0 else rg.arange(0, dim(ids, 0))
    logits = transformer_logits(rg.transpose(ids, [1, 0]), positions, cfg, max_positions, dropout)
    return rg.reshape(rg.transpose(logits, [1, 0, 2]), [-1, len(cfg.vocab)])


class CachedStep:
    """One position of ``transformer_logits`` for one stream over a key/value cache:
    ``step(ids, t, state) -> (logits [1, V], state)`` for the id ``ids[t]`` of the int64
    buffer ``ids``; ``state`` is ``[keys, values, offset]``, the caches
    ``[layers, 1, heads, max_len, head_dim]`` (max_len = min(text length, max_positions)) and
    the position of the cache's first entry in the text.

    A text longer than the ``max_positions`` the model has learned slides its window: when the
    cache is full, it is refilled with the last ``max_positions // 2`` ids at positions 0, 1, ...
    (a ``while_loop`` under a ``cond``) and the text goes on from there, as a model that
    recomputes everything would on that window.

    Example::

        step = CachedStep(cfg, max_positions=128)
        state = step.initial(total)                   # zeros, total = the text's length (a 0-d Var)
        logits, state = step(ids, t, state)
    """

    def __init__(self, cfg, max_positions: int):
        self.cfg = cfg
        self.max_positions = max_positions
        self.head_dim = cfg.hidden // cfg.heads

    def initial(self, total) -> list:
        """Zero caches for ``min(total, max_positions)`` positions (``total`` an int64 0-d Var),
        and the offset 0."""
        cfg = self.cfg
        slots = rg.minimum(total, rg.constant(self.max_positions, "int64"))
        along_time = rg.reshape(rg.cast(rg.arange(0, slots), "float32") * 0.0, [1, 1, 1, -1, 1])
        zeros = along_time + rg.fill([cfg.layers, 1, cfg.heads, 1, self.head_dim], 0.0)
        return [zeros, zeros, rg.constant(0, "int64")]

    def __call__(self, ids, t, state: list):
        keys, values, offset = state
        keys, values, offset = rg.cond(t - offset >= self.max_positions,
                                       lambda: self._refill(ids, t, keys, values),
                                       lambda: (keys, values, offset))
        logits, keys, values = self._position(ids[t], t - offset, keys, values)
        return logits, [keys, values, offset]

    def _refill(self, ids, t, keys, values):
        """The caches of ids ``t - keep .. t - 1`` at positions ``0 .. keep - 1`` (keep =
        max_positions // 2), and the new offset ``t - keep``."""
        keep = self.max_positions // 2
        offset = t - keep

        def one(j, keys, values):
            _, keys, values = self._position(ids[offset + j], j, keys, values)
            return j + 1, keys, values

        _, keys, values = rg.while_loop(lambda j, keys, values: j < keep, one,
                                        [rg.constant(0, "int64"), keys * 0.0, values * 0.0])
        return keys, values, offset

    def _position(self, id_, p, keys, values):
        """The logits ``[1, V]`` for ``id_`` (int64 0-d) at position ``p``, and the caches with
        its keys and values written at ``p``."""
        cfg = self.cfg
        table, position_table = _embeddings(cfg, self.max_positions)
        x = rg.gather(table, rg.reshape(id_, [1, 1])) + rg.reshape(position_table[p], [1, 1, cfg.hidden])
        written = rg.arange(0, dim(keys, 3)) <= p                           # [max_len]
        for i in range(cfg.layers):
            x, keys, values = self._block(x, p, i, keys, values, written)
        return rg.reshape(_head(cfg, x), [1, len(cfg.vocab)]), keys, values

    def _block(self, x, t, i, keys, values, written):
        """``rg.layers.transformer_block(x, name=f"block{i}")`` at position ``t``, its attention
        over the cached keys and values (this position's written into them first)."""
        cfg, name = self.cfg, f"block{i}"
        h = rg.layers.layer_norm(x, name=f"{name}.ln1")
        q, k, v = (split_heads(self._projection(h, f"{name}.att", which), cfg.heads) for which in "qkv")
        at = [i, 0, 0, t, 0]
        keys = rg.update_slice(keys, rg.reshape(k, [1, 1, cfg.heads, 1, self.head_dim]), at)
        values = rg.update_slice(values, rg.reshape(v, [1, 1, cfg.heads, 1, self.head_dim]), at)
        attended = rg.scaled_dot_product_attention(q, keys[i], values[i], mask=written)      # [1, heads, 1, hd]
        x = x + self._projection(merge_heads(attended), f"{name}.att", "o")
        h = rg.layers.layer_norm(x, name=f"{name}.ln2")
        h = rg.layers.fc(rg.gelu(rg.layers.fc(h, 4 * cfg.hidden, name=f"{name}.fc1")), cfg.hidden,
                         name=f"{name}.fc2")
        return x + h, keys, values

    def _projection(self, x, layer: str, which: str):
        """``x @ <layer>.w_<which> + <layer>.b_<which>``, the attention layer's parameters."""
        width = self.cfg.hidden
        w = rg.create_parameter(f"{layer}.w_{which}", [width, width])
        b = rg.create_parameter(f"{layer}.b_{which}", [width], init="zeros")
        return seq_linear(x, w, b)
