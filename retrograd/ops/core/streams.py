"""Random streams of loop iterations: how random ops inside loops draw new numbers per iteration.

A random kernel (an op whose OpDef says ``random=True``) draws from the key
``(seed, run_id, *k.run.rng_path)`` (``random_key``). ``rng_path`` is empty
at the top level; an op that runs a block repeatedly (While, Scan,
RecurrentNetwork and their gradients) extends it around each iteration with
``(its loop key, the forward iteration index)``::

    While  (rng_id=17) iteration 3        -> rng_path (17, 3)
      inner While (rng_id=42) iteration 0 -> rng_path (17, 3, 42, 0)

so the body draws a new mask at every iteration, and re-running forward
iteration ``i`` later in the same run -- a reversed Scan over the body's
backward, a recurrent step recomputed in the backward, a checkpointed
segment replayed -- draws the very same one, bit for bit, as long as it
runs under the forward's key and index. Gradient makers therefore copy the
forward op's key to the ops that re-run its iterations.

The key is the op attribute ``rng_id``, taken from ``program.next_seed()``
when the op is built, and only when the block it repeats contains a random
op (directly or in nested blocks): loops without one keep their attributes
and pay nothing at run time.
"""
from __future__ import annotations

from ...ir.program import Block
from .registry import get_op_def

RNG_ATTR = "rng_id"


def contains_random(block: Block) -> bool:
    """True when an op of ``block`` or of a block nested in it is random."""
    return any(get_op_def(op.type).random or any(contains_random(sub) for sub in op.sub_blocks())
               for op in block.ops)


def stream_attrs(*blocks: Block) -> dict:
    """``{"rng_id": key}`` for an op repeating ``blocks`` if they hold a random op, else ``{}``."""
    if not any(contains_random(b) for b in blocks):
        return {}
    return {RNG_ATTR: blocks[0].program.next_seed()}


def copy_stream(src: dict, dst: dict) -> dict:
    """Give the attrs ``dst`` of an op re-running ``src``'s iterations the same loop key."""
    if RNG_ATTR in src:
        dst[RNG_ATTR] = src[RNG_ATTR]
    return dst


def stream(attrs: dict, index: int) -> tuple[int, int] | None:
    """What iteration ``index`` of a loop op with ``attrs`` adds to ``rng_path`` (None: nothing)."""
    key = attrs.get(RNG_ATTR)
    return None if key is None else (key, index)


def random_key(k, seed: int) -> list[int]:
    """The entropy a random kernel draws from: its seed, the run, the loop iterations it is in."""
    return [seed, k.run.run_id, *k.run.rng_path]
