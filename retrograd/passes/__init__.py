"""Whole-program rewrites: passes that read a program and write a faster, equivalent one.

Each pass takes a program, rewrites it in place and returns what it changed;
results stay those of the unrewritten program (the tests run both and
compare). Any engine may apply them; ``optimize_for_engine`` applies the
default list to a clone, which is what ``Executor(backend="onnxruntime")``
exports, so the user's program is never changed.

* ``fuse_optimizer_updates``: the ``AdamUpdate`` ops that share their
  hyper-parameters become one ``FusedAdamUpdate`` (one flat buffer in ONNX).
* ``expand_fused_ops``: whole-layer ops (``LSTMSequence``) back into the
  general ops they stand for (run by passes that schedule recurrences).

Example::

    fast = rg.passes.optimize_for_engine(main)          # a rewritten clone
    rg.passes.fuse_optimizer_updates(main)              # or one pass, in place
"""
from __future__ import annotations

from typing import Callable

from ..ir.program import Program
from ..ir.verify import verify_program
from .expand_fused import expand_fused_ops  # noqa: F401  (the memory budget's first step)
from .fuse_updates import fuse_optimizer_updates
from .for_test import make_test_program  # noqa: F401  (registers clone(for_test=True)'s pass)

PASSES: list[Callable[[Program], int]] = [fuse_optimizer_updates]


def optimize_for_engine(program: Program, fetch=()) -> Program:
    """A clone of ``program`` with every pass of ``PASSES`` applied (and verified).

    ``fetch`` (names) lists values a pass must keep computable by name.

    Example::

        fast = rg.passes.optimize_for_engine(main, ["loss"])
    """
    del fetch   # no pass removes values yet; kept so callers pass what they will fetch
    rewritten = program.clone()
    changed = sum(p(rewritten) for p in PASSES)
    if changed:
        verify_program(rewritten)
    return rewritten


__all__ = ["PASSES", "optimize_for_engine", "fuse_optimizer_updates"]
